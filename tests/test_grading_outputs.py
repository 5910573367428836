"""What the grader accepts back from a sandbox: the outputs of one test, read defensively.

The bytes come from a process the learner's code ran in, so they may be anything. They are
loaded with torch.load(weights_only=True) only after the archive's entries are checked (no
compression, bounded sizes), then validated (plain tensors and numbers, the expected number
of cases), then judged here. Anything else scores the test 0 with a note."""

import io
import sys
import zipfile

import pytest
import torch

from course_files import ROOT

sys.path.insert(0, str(ROOT / "autograder"))
import jobs  # noqa: E402

from transformer_lib.checks import get_checker  # noqa: E402
from transformer_lib.attention import softmax as reference_softmax  # noqa: E402

TEST = jobs.TestPlan(grade_id="softmax_test", points=2.0, answer_id="softmax",
                     calls=[{"checker": "check_softmax", "function": "softmax", "hidden": False}],
                     hidden=[("transformer_lib.attention", "softmax")], forbidden=[], checker_names=["check_softmax"])


def _job():
    job = jobs._Job.__new__(jobs._Job)
    job.kit = types_kit()
    return job


def types_kit():
    class Kit:
        hidden_cases = {}
        secrets = []
    return Kit()


def _payload(calls, **extra) -> bytes:
    buffer = io.BytesIO()
    torch.save({"grade_id": "softmax_test", "calls": calls, "forbidden_seen": [], "hidden_called": [],
                "called_during": [], **extra}, buffer)
    return buffer.getvalue()


def _right_outputs():
    return get_checker("softmax").collect_outputs(reference_softmax)


def test_right_outputs_are_judged_right():
    got = _job()._load(_payload([_right_outputs()]), TEST)
    assert got.outputs is not None and got.judged == [(True, got.judged[0][1])]


def test_wrong_outputs_are_judged_wrong_with_the_diagnosis():
    wrong = [x if not isinstance(x, torch.Tensor) else x * 2 for x in _right_outputs()]
    got = _job()._load(_payload([wrong]), TEST)
    assert got.outputs is not None and got.judged[0][0] is False


@pytest.mark.parametrize("make, why", [
    (lambda: b"PK\x03\x04" + b"\xff" * 100, "could not be read back safely"),
    (lambda: b"not a zip at all", "could not be read back safely"),
    (lambda: _payload([[torch.nn.Parameter(t) if isinstance(t, torch.Tensor) else t for t in _right_outputs()]]),
     "object of type torch.nn.parameter.Parameter"),
    (lambda: _payload([_right_outputs()[:-1]]), "expected outputs for"),
    (lambda: _payload([_right_outputs(), _right_outputs()]), "wrong number of checks"),
    (lambda: _payload([_right_outputs()], grade_id="another_test"), "not the grader's format"),
    (lambda: _payload([_right_outputs()], hidden_called=[3]), "hidden_called is not a list of names"),
])
def test_anything_else_scores_zero_with_a_note(make, why):
    got = _job()._load(make(), TEST)
    assert got.outputs is None and "malformed or oddly typed" in got.problem and why in got.problem, got.problem


def test_compressed_or_oversized_archives_are_not_loaded():
    good = _payload([_right_outputs()])
    source = zipfile.ZipFile(io.BytesIO(good))
    squeezed = io.BytesIO()
    with zipfile.ZipFile(squeezed, "w", compression=zipfile.ZIP_DEFLATED) as target:
        for info in source.infolist():
            target.writestr(info.filename, source.read(info))
    got = _job()._load(squeezed.getvalue(), TEST)
    assert got.outputs is None and "unexpected archive contents" in got.problem


def test_a_class_outside_the_allowlist_is_never_unpickled():
    class Sneaky(int):
        def __reduce__(self):
            return (print, ("this must never run in the grader",))

    buffer = io.BytesIO()
    torch.save({"grade_id": "softmax_test", "calls": [[Sneaky(1)]]}, buffer)
    got = _job()._load(buffer.getvalue(), TEST)
    assert got.outputs is None and "could not be read back safely" in got.problem
