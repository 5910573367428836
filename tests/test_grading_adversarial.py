"""A hostile class, graded in one `make grade`-equivalent run: every adversarial submission of
autograder/adversarial/build.py (built from the release of chapter 02), with an honest correct
student graded first and an honest wrong student graded last. Each submission must get the
score and the notes its case expects; the course must be unchanged afterwards, no process of
the sandboxes may survive, and no feedback page may show a hidden test.

Three of its submissions are graded again on a Dask cluster, which must give exactly the grades
the class got here, and nbgrader's own autograde must refuse to run on this course."""

import csv
import hashlib
import html
import os
import re
import resource
import shutil
import socket
import subprocess
import sys
import threading
import time
import types

import pytest
from nbgrader.api import Gradebook

from course_files import ROOT, course_cli, hidden_lines, scratch_course

sys.path.insert(0, str(ROOT / "autograder"))
import isolation  # noqa: E402
from adversarial import build as adversarial  # noqa: E402

pytestmark = pytest.mark.slow

CHAPTER = adversarial.CHAPTER
# A hang costs about three times this (the collector's copy, then the test cell, which nbgrader
# gives twice the limit) instead of 120 s; chapter 02's slowest honest cell takes well under a second.
CELL_TIMEOUT = 10
CASES = {case.student: case for case, _ in adversarial.cases(9, ROOT)}
MAX_POINTS = sum(adversarial.TESTS.values())  # the chapter's points: every test of chapter 02
SECRET = "the grader's database password"


def _tree_hash(course) -> dict:
    """path -> sha256 of every tracked file of the repository, of transformer_lib and of the scratch course."""
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout.split(b"\0")
    paths = {ROOT / p.decode() for p in tracked if p}
    paths |= {p for p in (ROOT / "transformer_lib").rglob("*") if p.is_file() and "__pycache__" not in p.parts}
    paths |= {p for folder in ("solutions", "autograder") for p in (course.root / folder).glob("*")
              if p.is_file() and p.suffix in (".py", ".ipynb")}
    paths |= set((course.root / "solutions").rglob("*.ipynb"))
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() if p.exists() else None for p in sorted(paths)}


def _sandbox_processes() -> list[str]:
    """Processes of a sandbox or a grading job that no running job owns. Another grading run (a test
    file beside this one under `make test`) has live sandboxes: their uid is locked by its job, and its
    job folder ("course-job-...") still exists; a leftover of this run has neither."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            uid = os.stat(f"/proc/{entry}").st_uid
            cmd = open(f"/proc/{entry}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if isolation.UID_BASE <= uid < isolation.UID_BASE + isolation.UID_COUNT or "sleep 3600" in cmd \
                or "course-job-" in cmd:
            job_folders = re.findall(r"\S*/course-job-[^/\s]+", cmd)
            in_pool = isolation.UID_BASE <= uid < isolation.UID_BASE + isolation.UID_COUNT
            if (in_pool and isolation.uid_in_use(uid)) or any(os.path.isdir(f) for f in job_folders):
                continue
            found.append(f"{entry} uid {uid}: {cmd[:120]}")
    return found


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    course = scratch_course(tmp_path_factory.mktemp("hostile"), [CHAPTER])
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    connections = []

    def accept():
        while True:
            try:
                conn, address = listener.accept()
            except OSError:
                return
            connections.append(address)
            conn.close()

    threading.Thread(target=accept, daemon=True).start()
    built = adversarial.build(course.submitted, listener.getsockname()[1], course.root)
    names = sorted(c.student for c in built)
    assert names[0] == "a_honest_correct" and names[-1] == "zz_honest_wrong", "honest correct first, honest wrong last"
    before = _tree_hash(course)
    os.environ["COURSE_SECRET"] = SECRET  # in the grader's environment: no sandbox may see it
    order = []
    started = time.monotonic()
    try:
        report = course_cli.grade(course, cell_timeout=CELL_TIMEOUT,
                                  log=lambda text: (order.append(text), print(text, flush=True)))
    finally:
        del os.environ["COURSE_SECRET"]
        listener.close()
    seconds = time.monotonic() - started
    time.sleep(1)
    return types.SimpleNamespace(course=course, report=report, before=before, after=_tree_hash(course),
                                 leftovers=_sandbox_processes(), connections=connections, seconds=seconds,
                                 log=order, peak_rss=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)


def _cell_scores(course, student):
    with Gradebook(course.db_url, "transformer-course") as gb:
        nb = gb.find_submission_notebook(CHAPTER, CHAPTER, student)
        return {g.name: g.score for g in nb.grades}


# The isolation guarantee (isolation.verify's name) each probing submission relies on: where the
# machine could not give it (a fallback isolation), the case says so and is not judged.
NEEDS = {"network": ["no network"], "read_secrets": ["secrets hidden", "no other environment"],
         "write_course": ["read-only root"], "sleep_children": ["children die"]}


@pytest.mark.parametrize("student", sorted(CASES))
def test_each_submission_scores_as_expected_with_its_note(graded, student):
    case = CASES[student]
    missing = [g for g in NEEDS.get(student, []) if not graded.report.guarantees.get(g, (False, ""))[0]]
    if missing:
        pytest.skip(f"{case.attack}: not checked, this machine's isolation does not give {missing}")
    scores = _cell_scores(graded.course, student)
    assert scores == case.scores, f"{case.attack}: {graded.report.notes.get((student, CHAPTER))}"
    assert graded.report.scores[(student, CHAPTER)] == (case.total, MAX_POINTS)
    notes = graded.report.notes.get((student, CHAPTER), [])
    if case.quiet:
        assert notes == [], f"{case.attack}: an honest or harmless submission gets no note"
    for test, pattern in case.notes.items():
        mine = notes if test == "*" else [n for n in notes if n.startswith(f"'{test}'")]
        assert any(re.search(pattern, n) for n in mine), f"{case.attack}: no note on {test} matching {pattern!r}: {notes}"


def test_the_honest_students_are_graded_first_and_last_and_right(graded):
    names = [s for s, _ in graded.report.scores]
    assert names[0] == "a_honest_correct" or sorted(names)[0] == "a_honest_correct"
    assert graded.report.scores[("a_honest_correct", CHAPTER)] == (MAX_POINTS, MAX_POINTS)
    assert graded.report.scores[("zz_honest_wrong", CHAPTER)] == (1.0, MAX_POINTS)
    submitted = [line.split("] ")[1].split(" / ")[0] for line in graded.log if line.startswith("[")]
    assert submitted, "progress lines name each graded submission"


MARKERS = ("pwned", "def _always(self, outputs")  # what the adversarial submissions try to write


def test_the_course_is_unchanged_afterwards(graded):
    """Every tracked file, transformer_lib and the scratch course hash the same before and after.
    The scratch course and the files the attacks aim at are compared strictly. A change elsewhere in
    the repository counts as grading's when the new content holds what a submission tries to write
    (anything a sandbox wrote would); other changes come from whoever else is editing the
    repository meanwhile (on CI, a fresh clone, there are none) and are only reported."""
    changed = [p for p in graded.before if graded.before[p] != graded.after.get(p)]
    exclusive = str(graded.course.root)
    targets = {str(ROOT / "transformer_lib" / "checks" / "core.py")} | {str(p) for p in (ROOT / "autograder").glob("*.py")}
    by_grading = [p for p in changed if p.startswith(exclusive) or p in targets
                  or (os.path.exists(p) and any(m.encode() in open(p, "rb").read() for m in MARKERS))]
    assert not by_grading, f"grading changed {by_grading}"
    for folder in (graded.course.root, ROOT):
        for name in ("pwned.txt", "autograder/pwned.txt", "solutions/pwned.txt"):
            assert not (folder / name).exists(), f"a submission wrote {folder / name}"
    if changed:
        print(f"\nchanged during the run by another process (no submission's payload in them): {changed}")


def test_no_sandbox_process_survives(graded):
    assert graded.leftovers == [], graded.leftovers


def test_no_submission_reached_the_network(graded):
    assert graded.connections == [], "a sandbox connected to the grading machine"


def test_feedback_shows_no_hidden_test_and_no_live_student_html(graded):
    from transformer_lib.checks import get_checker

    checkers = [get_checker(n) for n in adversarial.ANSWERS]
    visible = {c.name for ch in checkers for c in ch.cases() if not c.hidden}
    hidden_names = {c.name for ch in checkers for c in ch.cases(hidden=True) if c.hidden and c.name not in visible
                    and (len(c.name) >= 10 or " " in c.name)}
    hidden_descriptions = {c.describe() for ch in checkers for c in ch.cases(hidden=True) if c.hidden}
    for student in CASES:
        page = graded.course.feedback / student / CHAPTER / f"{CHAPTER}.html"
        raw = page.read_text()
        text = html.unescape(re.sub(r"<[^>]+>", "", raw))
        assert "BEGIN HIDDEN TESTS" not in text, student
        for line in hidden_lines(CHAPTER):
            assert line not in text, f"{student}: hidden test line {line!r} in the feedback"
        for secret in hidden_names | hidden_descriptions:
            assert secret not in text, f"{student}: hidden case {secret!r} in the feedback"
        for live in (r"<script[^>]*>[^<]*PWNED", r"<img[^>]*onerror", r"<b>bold</b>"):
            assert not re.search(live, raw), f"{student}: the student's {live!r} reached the feedback as live HTML"
        assert SECRET not in text


def test_grades_and_report_are_written_for_everyone(graded):
    rows = list(csv.DictReader(open(graded.course.root / "autograder" / "grades.csv")))
    assert {r["student_id"] for r in rows} >= set(CASES)
    report = {r["student"]: r for r in csv.DictReader(open(graded.course.root / "autograder" / "report.csv"))}
    assert set(report) >= set(CASES)
    assert float(report["zz_honest_wrong"]["score"]) == 1.0


def test_the_grader_stays_small(graded):
    """A 2 GiB tensor returned by a submission once took the grader to 4.4 GiB; outputs are now
    bounded (64 MiB a test) and the sandbox's own memory is limited."""
    assert graded.peak_rss < 3 * 2**30, f"the grading process peaked at {graded.peak_rss / 2**30:.1f} GiB"


def test_isolation_is_named_and_checked(graded):
    assert graded.report.isolation.startswith("isolation: ")
    print(f"\n{graded.report.isolation}\nsuite graded {len(CASES)} submissions in {graded.seconds:.0f} s")
    missing = {name: detail for name, (held, detail) in graded.report.guarantees.items() if not held}
    if missing and isolation.detect().is_fallback:
        pytest.skip(f"not checked on this machine ({isolation.detect().mode} isolation): {missing}")
    assert not missing, missing


DASK_STUDENTS = ["a_honest_correct", "import_reference", "zz_honest_wrong"]


def _gradebook_rows(course, students) -> dict:
    with Gradebook(course.db_url, "transformer-course") as gb:
        out = {}
        for student in students:
            nb = gb.find_submission_notebook(CHAPTER, CHAPTER, student)
            out[student] = ({g.name: g.score for g in nb.grades}, {c.name: c.comment for c in nb.comments})
        return out


def _csv_rows(path, key, students) -> list:
    return sorted((r for r in csv.DictReader(open(path)) if r[key] in students), key=lambda r: r[key])


def test_a_dask_cluster_grades_exactly_as_the_threads_did(graded, tmp_path):
    """The same job function (autograder/jobs.py) runs in `make grade`'s threads (`--jobs N`) and on a
    Dask cluster (`--scheduler ADDRESS`); a distributed.LocalCluster stands in for a department's
    cluster. Three of this class's submissions (a right one, one that uses the reference, an honest
    wrong one with re-runs) graded on it get exactly the scores, comments, notes, grades.csv rows
    and feedback pages they got in this class's threads."""
    distributed = pytest.importorskip("distributed")
    other = scratch_course(tmp_path / "cluster", [CHAPTER])
    for student in DASK_STUDENTS:
        shutil.copytree(graded.course.submitted / student, other.submitted / student)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
        report = course_cli.grade(other, cell_timeout=CELL_TIMEOUT, scheduler=cluster.scheduler_address)
    assert "isolation: " in report.isolation
    assert _gradebook_rows(other, DASK_STUDENTS) == _gradebook_rows(graded.course, DASK_STUDENTS)
    for name, key in (("report.csv", "student"), ("grades.csv", "student_id")):
        assert _csv_rows(other.root / "autograder" / name, key, DASK_STUDENTS) == \
            _csv_rows(graded.course.root / "autograder" / name, key, DASK_STUDENTS), name
    for student in DASK_STUDENTS:
        page = f"{student}/{CHAPTER}/{CHAPTER}.html"
        assert (other.feedback / page).read_text() == (graded.course.feedback / page).read_text(), page


def test_autograde_outside_make_grade_refuses_to_run_unsandboxed(graded):
    """Formgrader's autograde button (or `nbgrader autograde` by hand) would run the kernel without
    the sandbox: with the course's configuration it refuses, and says to use `make grade`."""
    proc = graded.course.nbgrader("autograde", CHAPTER, "--student", "a_honest_correct", "--force", check=False)
    assert proc.returncode != 0
    assert "make grade" in proc.stdout + proc.stderr
