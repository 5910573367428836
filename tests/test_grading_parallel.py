"""Parallel and cluster grading give exactly the serial grades.

The same job function (autograder/jobs.py) runs in `make grade`'s own threads (`--jobs N`) and on
a Dask cluster (`--scheduler ADDRESS`); a distributed.LocalCluster stands in for a department's
cluster here. The course is graded serially through the command line first (`--jobs 1`, as
`make grade JOBS=1` runs it, which also shows the isolation line), then on the cluster; the
scores, the notes and what the gradebook holds must match."""

import shutil
import subprocess
import sys

import pytest
from nbgrader.api import Gradebook

from course_files import ROOT, course_cli, scratch_course

sys.path.insert(0, str(ROOT / "autograder"))
from adversarial import build as adversarial  # noqa: E402

pytestmark = pytest.mark.slow

CHAPTER = adversarial.CHAPTER
STUDENTS = ["a_honest_correct", "import_reference", "zz_honest_wrong"]


def _gradebook(course) -> dict:
    with Gradebook(course.db_url, "transformer-course") as gb:
        out = {}
        for student in STUDENTS:
            nb = gb.find_submission_notebook(CHAPTER, CHAPTER, student)
            out[student] = ({g.name: g.score for g in nb.grades}, {c.name: c.comment for c in nb.comments})
        return out


def _report(course) -> str:
    return (course.root / "autograder" / "report.csv").read_text()


@pytest.fixture(scope="module")
def serial(tmp_path_factory):
    course = scratch_course(tmp_path_factory.mktemp("serial"), [CHAPTER])
    adversarial.build(course.submitted, 9, course.root, STUDENTS)
    out = subprocess.run([sys.executable, str(ROOT / "autograder" / "course.py"), "--root", str(course.root), "grade",
                          "--jobs", "1", "--cell-timeout", "30"], capture_output=True, text=True, timeout=1800)
    assert out.returncode == 0, out.stderr[-3000:]
    return course, out.stdout


def test_make_grade_says_which_isolation_it_used(serial):
    _, stdout = serial
    assert "isolation: " in stdout
    assert "grading 3 submissions with 1 parallel jobs" in stdout


def test_a_dask_cluster_grades_exactly_as_the_serial_run(serial, tmp_path):
    distributed = pytest.importorskip("distributed")
    course, _ = serial
    other = scratch_course(tmp_path / "cluster", [CHAPTER])
    shutil.copytree(course.submitted, other.submitted)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
        report = course_cli.grade(other, cell_timeout=30, scheduler=cluster.scheduler_address)
    assert "isolation: " in report.isolation
    assert _gradebook(other) == _gradebook(course)
    assert _report(other) == _report(course)
    assert (other.root / "autograder" / "grades.csv").read_text() == (course.root / "autograder" / "grades.csv").read_text()
    for student in STUDENTS:
        assert (other.feedback / student / CHAPTER / f"{CHAPTER}.html").exists()


def test_autograde_outside_make_grade_refuses_to_run_unsandboxed(serial):
    """Formgrader's autograde button (or `nbgrader autograde` by hand) would run the kernel without
    the sandbox: with the course's configuration it refuses, and says to use `make grade`."""
    course, _ = serial
    proc = course.nbgrader("autograde", CHAPTER, "--student", "a_honest_correct", "--force", check=False)
    assert proc.returncode != 0
    assert "make grade" in proc.stdout + proc.stderr
