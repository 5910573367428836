"""Claims a chapter makes from numbers whose last digits depend on the machine.

PyTorch picks its CPU kernels by the processor it runs on (AVX-512, AVX2 or plain code) and by the
number of threads; each adds floating-point numbers in its own order, so the last digits of a
sum differ from one machine to the next, and training amplifies the difference. A trained loss,
an accuracy, a generated sentence or an error near machine precision is therefore not something a
notebook can promise digit for digit. What it can promise is the claim its text makes from that
number: "the 4-head model reaches at least 0.99 on every task", "the two agree to 1e-5".

The cell that prints such a number carries nbval's `nbval-ignore-output` tag (the learner sees
their own machine's digits), and it, or the cell after it, states the claim with `claim(...)`:
a line the learner reads, and an error for a maintainer whose run no longer supports the text.
tests/test_nbval_claims.py holds every chapter to that rule.

The Chinese edition runs the same code and prints each statement in Chinese, from the templates of
`checks/zh/claims.toml` (keyed by the statement's English, an f-string's replacement fields written
{0}, {1}, ...: transformer_lib/language.py); the measured numbers carry over as they are.
tests/test_zh_notebook_text.py names every statement without an entry.
"""

from __future__ import annotations

from .figure_text import record
from . import language as _language
from .language import CHINESE, CLAIMS_CATALOGUE, current_language, translate

# The failure's own sentence, with named fields (not a statement: looked up as it is).
FAILED = ("the chapter says {statement!r}, but this run does not support it{detail}. "
          "If you changed the code above, that may be why; otherwise please report it.")
MEASURED = " (measured: {measured})"


class ClaimFailed(AssertionError):
    """A claim the chapter's text makes does not hold on this run."""


def claim(holds: bool, statement: str, measured: str = "") -> None:
    """Print `✓ statement` when `holds`; raise ClaimFailed, naming what was measured, when not. In the
    Chinese edition both are in Chinese."""
    language = current_language()
    said = translate(statement, CLAIMS_CATALOGUE, language)
    if not holds:
        detail = _sentence(MEASURED, language).format(measured=measured) if measured else ""
        raise ClaimFailed(_sentence(FAILED, language).format(statement=said, detail=detail))
    line = f"✓ {said}"
    print(line)
    record("claim", line)


def claim_between(value: float, low: float | None, high: float | None, statement: str, measured: str = "") -> None:
    """`claim(low <= value <= high, statement)` for one measured number, with its range written where a
    test can read it.

    The prose beside such a claim says the number a learner sees ("about 0.83 here") and the guarantee
    the claim keeps on every machine ("at least 0.7"). tests/test_traceable_numbers.py reads `low` and
    `high` from this call (number literals, or None for no bound) and accepts a rounded "about" number in
    the chapter's prose only if it lies inside the range of a claim of the same notebook.
    """
    holds = (low is None or value >= low) and (high is None or value <= high)
    claim(holds, statement, measured or f"{value:.4g}")


def _sentence(english: str, language: str) -> str:
    """One of this module's own sentences in `language` (its entry in claims.toml, looked up as it is)."""
    if language != CHINESE:
        return english
    return _language.templates(CLAIMS_CATALOGUE).exact.get(english, english)
