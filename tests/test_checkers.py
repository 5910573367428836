"""Every checker proven: it accepts the reference, rejects the blank stub, and names each
catalogued mistake. And the comparison itself: what it reports for unknown failures."""

import subprocess
import sys

import pytest
import torch

from transformer_lib.checks import REGISTRY, CheckFailed, get_checker
from transformer_lib.checks.core import Case, Checker, Mistake, describe_difference

CHECKERS = sorted(REGISTRY.values(), key=lambda c: c.name)
MISTAKES = [(c, m) for c in CHECKERS for m in c.mistakes]


def blank_stub(*args, **kwargs):
    raise NotImplementedError()


def test_registry_is_not_empty():
    assert len(CHECKERS) >= 7, sorted(REGISTRY)


@pytest.mark.parametrize("checker", CHECKERS, ids=lambda c: c.name)
@pytest.mark.parametrize("hidden", [False, True], ids=["visible", "hidden"])
def test_reference_passes(checker, hidden):
    verdict = checker.judge(checker.collect_outputs(checker.reference, hidden), hidden)
    assert verdict.passed, verdict.message


@pytest.mark.parametrize("checker", CHECKERS, ids=lambda c: c.name)
@pytest.mark.parametrize("hidden", [False, True], ids=["visible", "hidden"])
def test_blank_stub_is_rejected_as_not_implemented(checker, hidden):
    verdict = checker.judge(checker.collect_outputs(blank_stub, hidden), hidden)
    assert not verdict.passed
    assert "not implemented yet: your function still raises NotImplementedError. Replace the" in verdict.message


@pytest.mark.parametrize("checker", CHECKERS, ids=lambda c: c.name)
def test_checker_has_a_catalogue_and_hidden_cases(checker):
    assert len(checker.mistakes) >= 2, f"{checker.name} knows fewer than 2 mistakes"
    assert len(checker.cases(hidden=True)) > len(checker.cases()), f"{checker.name} has no hidden cases"
    names = [m.name for m in checker.mistakes]
    assert len(set(names)) == len(names)


@pytest.mark.parametrize("checker,mistake", MISTAKES, ids=[f"{c.name}-{m.name[:40]}" for c, m in MISTAKES])
@pytest.mark.parametrize("hidden", [False, True], ids=["visible", "hidden"])
def test_each_mistake_is_named(checker, mistake, hidden):
    verdict = checker.judge(checker.collect_outputs(mistake.implementation, hidden), hidden)
    assert not verdict.passed
    assert verdict.mistake == mistake.name, verdict.message
    assert mistake.name in verdict.message and mistake.fix in verdict.message


@pytest.mark.parametrize("checker", CHECKERS, ids=lambda c: c.name)
def test_cases_are_deterministic(checker):
    first = checker.collect_outputs(checker.reference, hidden=True)
    second = checker.collect_outputs(checker.reference, hidden=True)
    assert all(describe_difference(a, b) is None for a, b in zip(first, second))


@pytest.mark.parametrize("checker", CHECKERS, ids=lambda c: c.name)
def test_notebook_entry_point_raises_checkfailed_with_the_message(checker, capsys):
    checker(checker.reference, hidden=True)
    assert "\u2713" in capsys.readouterr().out
    with pytest.raises(CheckFailed, match="not implemented yet"):
        checker(blank_stub)
    with pytest.raises(CheckFailed, match="expected your function"):
        checker(42)


def test_outputs_judged_in_another_process(tmp_path):
    """The grader's path: a separate process records outputs, this one judges them."""
    checker = CHECKERS[0]
    script = (
        "import sys, torch\n"
        "from transformer_lib.checks import get_checker\n"
        f"c = get_checker({checker.name!r})\n"
        "torch.save(c.collect_outputs(c.reference, True), sys.argv[1])\n"
    )
    out = tmp_path / "outputs.pt"
    subprocess.run([sys.executable, "-c", script, str(out)], check=True)
    outputs = torch.load(out, weights_only=True)
    assert checker.judge(outputs, hidden=True).passed
    tampered = [o * 0 if isinstance(o, torch.Tensor) else o for o in outputs]
    if any(isinstance(o, torch.Tensor) for o in outputs):
        assert not checker.judge(tampered, hidden=True).passed


def test_get_checker_accepts_the_test_cell_alias():
    name = CHECKERS[0].name
    assert get_checker(f"check_{name}") is get_checker(name)
    with pytest.raises(KeyError, match="no checker named"):
        get_checker("check_nothing_like_this")


# -- the comparison's messages for failures no catalogue knows ---------------------------------

def _double(x):
    return 2 * x


toy = Checker(
    name="double",
    reference=_double,
    make_cases=lambda: [Case("small", (torch.arange(6.0).reshape(2, 3),)), Case("big", (torch.ones(4, 5),), hidden=True)],
    mistakes=[Mistake("adding instead of doubling", "multiply by 2", lambda x: x + 2)],
)


@pytest.mark.parametrize(
    "answer,expected_message",
    [
        (lambda x: (2 * x).T, r"wrong shape, expected \[2, 3\], got \[3, 2\]"),
        (lambda x: (2 * x).double(), r"wrong dtype, expected torch.float32, got torch.float64"),
        (lambda x: (2 * x).numpy(), r"expected a torch.Tensor, got a numpy array"),
        (lambda x: 2 * x + (x == 5), r"largest error 1 at index \[1, 2\]: expected 10, got 11"),
        (lambda x: x / 0 * 0 + 2 * x, r"NaN at index \[0, 0\]"),
        (lambda x: x[7], r"your function raised IndexError"),
        (lambda x: x + 2, r"looks like adding instead of doubling\. multiply by 2"),
        (lambda x: None, r"expected a torch.Tensor, got NoneType"),
    ],
)
def test_unknown_failures_say_what_differs(answer, expected_message):
    verdict = toy.judge(toy.collect_outputs(answer))
    assert not verdict.passed
    assert pytest.importorskip("re").search(expected_message, verdict.message), verdict.message


def test_inputs_modified_in_place_do_not_leak_between_calls():
    def doubling_in_place(x):
        return x.mul_(2)

    assert toy.judge(toy.collect_outputs(doubling_in_place, hidden=True), hidden=True).passed


def test_checkfailed_renders_without_a_traceback():
    lines = CheckFailed("softmax: looks like something")._render_traceback_()
    assert len(lines) == 1 and "looks like something" in lines[0]


def test_written_out_case_inputs_are_what_the_library_computes():
    """Cases may not call another exercise's reference (the grader runs each chapter with all of them
    hidden), so a few inputs are written out in the checkers; they must stay what the library gives."""
    from transformer_lib.checks import ch01, ch08
    from transformer_lib.static_vectors import cooccurrence_counts
    from transformer_lib.tokenization import train_bpe

    assert torch.equal(ch01.TINY_TEXT_COUNTS, cooccurrence_counts(torch.tensor([0, 1, 2, 1, 0, 2, 2]), 3, 2))
    assert ch08.TOY_MERGES_ALL == train_bpe(dict(ch08.TOY_COUNTS), 100)[0]
    train, _ = ch08._course_text()
    assert ch08.COURSE_MERGES_60 == train_bpe(train[:6000], 60)[0]
