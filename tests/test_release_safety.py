"""`make release` never overwrites a learner's work without an explicit force flag."""

import subprocess
import sys

import nbformat
import pytest

from course_files import ROOT, course_cli, scratch_course

CHAPTER = "02_self_attention"
pytestmark = pytest.mark.slow


def _release_cli(root, *args):
    return subprocess.run([sys.executable, str(root / "autograder" / "course.py"), "--root", str(root), "release",
                           *args, CHAPTER], capture_output=True, text=True)


# Each kind of work in one edition: what counts as work does not depend on the language
# (course.learner_work), and each pair costs two releases of the chapter.
@pytest.mark.parametrize("work, edition", [("edited answer", "English"), ("cells run", "Chinese")])
def test_release_refuses_to_overwrite_a_learners_notebook(tmp_path, work, edition):
    course = scratch_course(tmp_path, [CHAPTER])
    course_cli.release(course, [CHAPTER])
    folder = tmp_path / "chapters" / (course_cli.CHINESE if edition == "Chinese" else "")
    path = folder / CHAPTER / f"{CHAPTER}.ipynb"
    assert course_cli.learner_work(path) == []  # a clean release is not a learner's work
    nb = nbformat.read(path, as_version=4)
    if work == "edited answer":
        answer = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("solution"))
        answer.source = answer.source.replace("raise NotImplementedError()", "return x @ w_q, x @ w_k, x @ w_v")
    else:
        code = next(c for c in nb.cells if c.cell_type == "code")
        code.execution_count = 1
        code.outputs = [nbformat.v4.new_output("stream", name="stdout", text="hello\n")]
    nbformat.write(nb, path)
    before = path.read_bytes()

    refused = _release_cli(tmp_path)
    assert refused.returncode == 1
    assert "holds a learner's work" in refused.stderr and "FORCE=1" in refused.stderr, refused.stderr
    assert path.read_bytes() == before, "the learner's notebook was changed"

    forced = _release_cli(tmp_path, "--force")
    assert forced.returncode == 0, forced.stderr
    assert course_cli.learner_work(path) == []


def test_the_makefile_passes_force_only_when_asked():
    makefile = (ROOT / "Makefile").read_text()
    assert "$(if $(FORCE),--force,)" in makefile
