"""The independent check's sandbox: the learner's code runs, records outputs, and can touch nothing else."""

import os

import nbformat
import pytest

from course_files import course_cli

LEARNER_CODE = '''
import os, socket, torch

def _try(action):
    try:
        action()
        return True
    except Exception:
        return False

wrote_outside = _try(lambda: open({outside!r}, "w").write("graded!"))
reached_network = _try(lambda: socket.create_connection(("127.0.0.1", {port}), timeout=2))
saw_secret = "COURSE_SECRET" in os.environ

def softmax(x):
    if wrote_outside or reached_network or saw_secret:
        return x  # a wrong answer, so the verdict tells us the sandbox leaked
    return torch.softmax(x, dim=-1)
'''


def _notebook(path, *sources, test_id="softmax_test"):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(s) for s in sources]
    nb.cells.append(nbformat.v4.new_code_cell("check_softmax(softmax)", metadata={"nbgrader": {"grade": True, "grade_id": test_id}}))
    nb.cells.append(nbformat.v4.new_code_cell("softmax = None  # later cells rebind names; the check must not see this"))
    nbformat.write(nb, path)
    return path


def test_sandbox_isolates_the_learner_code(tmp_path, monkeypatch):
    import socket

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    monkeypatch.setenv("COURSE_SECRET", "the gradebook password")
    outside = tmp_path / "written_by_the_learner.txt"
    nb = _notebook(tmp_path / "sub.ipynb", LEARNER_CODE.format(outside=str(outside), port=listener.getsockname()[1]))
    tests = {"softmax_test": [course_cli.CheckerCall("check_softmax", "softmax", False)]}
    outputs, problem = course_cli.run_sandbox(nb, tests, cell_timeout=60)
    listener.close()
    assert problem == ""
    isolation = course_cli._isolation(tmp_path)
    if not isolation:
        pytest.skip("this machine allows no namespaces: the sandbox runs without isolation")
    assert course_cli.judge_tests(tests, outputs, problem) == {}, "the sandbox let the learner's code out"
    assert not outside.exists()


def test_endless_loop_and_missing_function_are_reported_not_hung(tmp_path):
    nb = _notebook(tmp_path / "sub.ipynb", "import torch\nwhile True:\n    pass", "def softmax(x):\n    while True:\n        pass")
    tests = {"softmax_test": [course_cli.CheckerCall("check_softmax", "softmax", False)],
             "other_test": [course_cli.CheckerCall("check_softmax", "not_defined_anywhere", False)]}
    outputs, problem = course_cli.run_sandbox(nb, tests, cell_timeout=3)
    failures = course_cli.judge_tests(tests, outputs, problem)
    assert "CellTimeout" in failures["softmax_test"]
    assert "never reached" in failures["other_test"] or "NameError" in failures["other_test"]


def test_checker_calls_are_read_from_the_test_source():
    calls = course_cli.checker_calls("check_softmax(softmax)\n### BEGIN HIDDEN TESTS\ncheck_softmax(softmax, hidden=True)\n### END HIDDEN TESTS")
    assert [(c.checker, c.function, c.hidden) for c in calls] == [("check_softmax", "softmax", False), ("check_softmax", "softmax", True)]


def test_the_isolation_test_can_fail(tmp_path, monkeypatch):
    """Without namespaces the learner's write succeeds, and the probe above would catch it."""
    monkeypatch.setattr(course_cli, "_isolation", lambda scratch: [])
    outside = tmp_path / "written_by_the_learner.txt"
    nb = _notebook(tmp_path / "sub.ipynb", LEARNER_CODE.format(outside=str(outside), port=9))
    tests = {"softmax_test": [course_cli.CheckerCall("check_softmax", "softmax", False)]}
    outputs, problem = course_cli.run_sandbox(nb, tests, cell_timeout=60)
    assert outside.exists()
    assert "softmax_test" in course_cli.judge_tests(tests, outputs, problem)
