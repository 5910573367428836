"""What nbval does not compare, and why: every skipped output is either non-deterministic by nature
(a timing, a progress bar, a random draw) or followed by the claim the chapter makes from it.

A cell tagged `nbval-ignore-output` must also carry one of the reasons below as a tag, or it (or
the next code cell) must call `claim(...)` or `claim_between(...)` (transformer_lib/claims.py). Nothing else turns
nbval's comparison off: no `nbval-skip`, no lax mode, no notebook-wide switch.
"""

import re

import pytest

from course_files import CHAPTERS, ROOT, solution

CLAIM = re.compile(r"\bclaim(?:_between)?\(")

# Outputs that differ from run to run whatever the machine: they are never compared.
REASONS = {
    "timing": "prints a wall-clock or CPU time, or shows a progress bar",
}


def ignored_cells(chapter):
    """(index, first line, why) for every code cell whose output nbval does not compare."""
    code = [(i, c) for i, c in enumerate(solution(chapter).cells) if c.cell_type == "code"]
    found = []
    for position, (index, cell) in enumerate(code):
        tags = cell.metadata.get("tags", [])
        if "nbval-ignore-output" not in tags:
            continue
        reasons = [t for t in tags if t in REASONS]
        following = code[position + 1][1].source if position + 1 < len(code) else ""
        if CLAIM.search(cell.source):
            why = "claim in the cell"
        elif CLAIM.search(following):
            why = "claim in the next cell"
        elif reasons:
            why = reasons[0]
        else:
            why = None
        found.append((index, cell.source.strip().splitlines()[0][:70], why))
    return found


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_every_output_nbval_skips_is_noise_or_followed_by_a_claim(chapter):
    unexplained = [f"cell {i} ({first!r})" for i, first, why in ignored_cells(chapter) if why is None]
    assert not unexplained, (
        f"{chapter}: nbval ignores the output of {', '.join(unexplained)} with no reason: tag it "
        f"{sorted(REASONS)} if its output is noise by nature, or state the claim it supports with claim(...)")


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_nothing_else_switches_nbval_off(chapter):
    nb = solution(chapter)
    assert not any(k.startswith("nbval") for k in nb.metadata), f"{chapter}: notebook-wide nbval metadata"
    for index, cell in enumerate(nb.cells):
        tags = set(cell.metadata.get("tags", []))
        assert not tags & {"nbval-skip", "nbval-ignore-all", "skip"}, f"{chapter} cell {index} is skipped by nbval"
        assert not re.search(r"#\s*NBVAL_(SKIP|IGNORE)", cell.source), f"{chapter} cell {index}: NBVAL comment"


def test_the_suite_compares_strictly():
    makefile = (ROOT / "Makefile").read_text()
    assert "--nbval " in makefile and "--nbval-lax" not in makefile


def test_claims_pass_and_fail():
    from transformer_lib.claims import ClaimFailed, claim

    claim(True, "it holds")
    with pytest.raises(ClaimFailed, match="this run does not support it.*measured: 0.5"):
        claim(False, "accuracy >= 0.9", measured="0.5")
