"""Resubmissions: a later submission replaces the earlier one, and `make grade` grades only the
submissions new or changed since its last run; the others keep their grades and feedback
(autograder/regrade.py). One class of three on chapter 02, graded six times over: from scratch, after
a resubmission, with the record's digest of a notebook tampered, unchanged (one submission deleted),
with --all and with a corrupted record. The class has deadlines (deploy/hub/schedule.py, and
tests/test_deadlines.py for the rest): alice's submission reached the exchange 1 h 30 min late although
her timestamp.txt claims it was early, carol's as late but within her extension, bob's on time."""

import csv
import json

import nbformat
import pytest
from nbgrader.api import Gradebook

from course_files import course_cli, released, scratch_course, solution

pytestmark = pytest.mark.slow

CHAPTER = "02_self_attention"
CELL_TIMEOUT = 15
STUDENTS = ("alice", "bob", "carol")  # the solution, the blank release, the solution


def _submit(course, student, nb):
    """What nbgrader collect --update does with a later submission: the folder is replaced."""
    import shutil

    folder = course.submitted / student / CHAPTER
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    nbformat.write(nb, folder / f"{CHAPTER}.ipynb")


def _grade(course, **kwargs):
    lines = []
    report = course_cli.grade(course, cell_timeout=CELL_TIMEOUT, jobs=2, log=lines.append, **kwargs)
    return report, "\n".join(lines)


def _page(course, student):
    return course.feedback / student / CHAPTER / f"{CHAPTER}.html"


def _rows(course, name, key):
    with open(course.root / "autograder" / name) as f:
        return {r[key]: r for r in csv.DictReader(f) if r.get("assignment", r.get("chapter")) == CHAPTER}


def _gradebook_score(course, student):
    with Gradebook(course.db_url, "transformer-course") as gb:
        return gb.find_submission(CHAPTER, student).score


def _record(course):
    return json.loads((course.root / "autograder" / "graded.json").read_text())


def _deadlines(course):
    """02 due 23:59 +08:00 (15:59 UTC), 2 points per started hour late; carol's extension a day later;
    the exchange's times in autograder/received.json, as make collect writes it."""
    (course.root / "deploy" / "hub").mkdir(parents=True)
    (course.root / "deploy" / "hub" / "schedule.csv").write_text(
        f"chapter,due,late_policy\n{CHAPTER},2027-03-01 23:59 +08:00,per-hour:2\n")
    (course.root / "deploy" / "hub" / "extensions.csv").write_text(
        f"login,chapter,due\ncarol,{CHAPTER},2027-03-02 23:59 +08:00\n")
    times = {"alice": ("2027-03-01 17:29:00.000000 UTC", "2027-03-01 10:00:00.000000 UTC"),
             "carol": ("2027-03-01 17:29:00.000000 UTC", "2027-03-01 17:29:00.000000 UTC"),
             "bob": ("2027-03-01 15:00:00.000000 UTC", "2027-03-01 15:00:00.000000 UTC")}
    (course.root / "autograder" / "received.json").write_text(json.dumps({"submissions": {
        s: {CHAPTER: {"received": r, "claimed": c, "entry": f"{s}+{CHAPTER}+{c}+x"}} for s, (r, c) in times.items()}}))


def _check_deadlines(course, full):
    """alice pays 4 points (two started hours) in the gradebook, grades.csv, report.csv and on her page,
    and her forged timestamp.txt is named; carol's extension spares her alone; bob was on time."""
    grades, report = _rows(course, "grades.csv", "student_id"), _rows(course, "report.csv", "student")
    alice = grades["alice"]
    assert float(alice["late_submission_penalty"] or 0) == 4.0 and float(alice["score"]) == full - 4, alice
    assert (alice["received"], alice["late_by"], alice["penalty"]) == ("2027-03-02 01:29:00 +08:00", "1:30:00", "4")
    assert float(report["alice"]["score"]) == full - 4
    assert "timestamp.txt claims '2027-03-01 10:00:00.000000 UTC'" in report["alice"]["notes"]
    assert "late by 1 h 30 min" in report["alice"]["notes"]
    for student in ("bob", "carol"):
        assert (grades[student]["late_by"], float(grades[student]["late_submission_penalty"] or 0)) == ("", 0.0)
        assert "late by" not in report[student]["notes"] and "timestamp.txt" not in report[student]["notes"]
    assert grades["carol"]["due"] == "2027-03-02 23:59 +08:00"
    with Gradebook(course.db_url, "transformer-course") as gb:
        late, kept = gb.find_submission(CHAPTER, "alice"), gb.find_submission(CHAPTER, "carol")
        assert late.late_submission_penalty == 4.0 and late.total_seconds_late == 5400
        assert str(late.timestamp) == "2027-03-01 17:29:00" and kept.total_seconds_late == 0
    page = _page(course, "alice").read_text()
    assert "Late submission penalty (Score: -4.0)" in page and "late by 1 h 30 min" in page
    page = _page(course, "carol").read_text()
    assert "Late submission penalty" not in page and "(your extension): on time" in page


def test_a_regrade_grades_only_what_changed(tmp_path):
    course = scratch_course(tmp_path / "course", [CHAPTER])
    for student, nb in zip(STUDENTS, (solution(CHAPTER), released(CHAPTER), solution(CHAPTER))):
        _submit(course, student, nb)
    _deadlines(course)

    # 1. From scratch: no record yet, every submission graded.
    first, log = _grade(course)
    assert first.graded == {(s, CHAPTER) for s in STUDENTS} and not first.kept
    assert "no record of an earlier grading" in log and "grading 3 submissions with 2 parallel jobs" in log, log
    full = first.scores[("alice", CHAPTER)][1]
    assert full > 0 and first.scores[("alice", CHAPTER)] == first.scores[("carol", CHAPTER)] == (full, full)
    assert first.scores[("bob", CHAPTER)][0] == 0
    record = _record(course)["submissions"]
    bob = record["bob"][CHAPTER]
    assert bob["score"] == 0 and bob["result"]["scores"] and bob["result"]["notes"], \
        "the record holds the judged result: scores per test and the report's notes"
    assert "feedback" not in bob["result"] and "autograded" not in bob["result"]
    pages = {s: (_page(course, s).stat().st_mtime_ns, _page(course, s).read_bytes()) for s in STUDENTS}
    report_rows = _rows(course, "report.csv", "student")
    _check_deadlines(course, full)

    # 2. bob resubmits, now with the solution: he alone is graded; alice and carol keep everything.
    _submit(course, "bob", solution(CHAPTER))
    second, log = _grade(course)
    assert "grading 3 submissions (1 new or changed; 2 unchanged since the last run keep their grades and feedback)" \
        in log and "grading 1 submissions with 2 parallel jobs" in log, log
    assert second.graded == {("bob", CHAPTER)} and second.kept == {("alice", CHAPTER), ("carol", CHAPTER)}
    for student in ("alice", "carol"):
        assert (_page(course, student).stat().st_mtime_ns, _page(course, student).read_bytes()) == pages[student]
    assert pages["bob"][1] != _page(course, "bob").read_bytes()
    assert second.scores == {(s, CHAPTER): (full, full) for s in STUDENTS}
    assert float(_rows(course, "grades.csv", "student_id")["bob"]["score"]) == full == _gradebook_score(course, "bob")
    rows = _rows(course, "report.csv", "student")
    assert set(rows) == set(STUDENTS) and float(rows["bob"]["score"]) == full and rows["bob"]["notes"] == ""
    assert rows["alice"] == report_rows["alice"] and rows["carol"] == report_rows["carol"]
    assert _record(course)["submissions"]["bob"][CHAPTER]["score"] == full
    _check_deadlines(course, full)  # alice and carol kept: their times, penalty and notes with them

    # 3. The record's digest of carol's notebook no longer matches her file: she is graded again.
    tampered = _record(course)
    tampered["submissions"]["carol"][CHAPTER]["submission"] = "0" * 64
    (course.root / "autograder" / "graded.json").write_text(json.dumps(tampered))
    third, log = _grade(course)
    assert third.graded == {("carol", CHAPTER)} and "1 new or changed; 2 unchanged" in log, log

    # 4. Nothing changed but carol's submission, deleted from submitted/: nothing graded, she drops out of
    # the record and the reports, which are complete for the others.
    import shutil

    shutil.rmtree(course.submitted / "carol")
    fourth, log = _grade(course)
    assert not fourth.graded and "grading 0 submissions with" in log and "0 new or changed; 2 unchanged" in log, log
    assert "carol" not in _record(course)["submissions"] and set(_record(course)["submissions"]) == {"alice", "bob"}
    assert set(_rows(course, "report.csv", "student")) == {"alice", "bob"}
    assert set(_rows(course, "grades.csv", "student_id")) >= {"alice", "bob"}
    assert fourth.scores == {(s, CHAPTER): (full, full) for s in ("alice", "bob")}
    everyone = {("alice", CHAPTER), ("bob", CHAPTER)}

    # 5. --all (make grade FORCE=1): every submission graded again.
    fifth, log = _grade(course, regrade_all=True)
    assert fifth.graded == everyone and "grading 2 submissions with" in log, log

    # 6. A corrupted record: everything graded, said in one line, no crash.
    (course.root / "autograder" / "graded.json").write_text('{"version": 1, "submissions": {"alice": ')
    sixth, log = _grade(course)
    said = [line for line in log.splitlines() if "record of the last grading" in line]
    assert len(said) == 1 and "grading every submission" in said[0], log
    assert sixth.graded == everyone and sixth.scores == fourth.scores
    assert set(_record(course)["submissions"]) == {"alice", "bob"}, "the record is whole again"


def test_a_record_entry_is_kept_only_while_its_digests_match():
    """regrade.unchanged: the unit the grader's decision rests on."""
    import regrade

    record = regrade.empty()
    digest = regrade.Digest("a" * 64, "g")
    regrade.put(record, ("s", "c"), digest, {"scores": {"t": [1.0, 1.0]}, "notes": [], "feedback": "<html>",
                                            "autograded": None, "log": "x"}, 1.0, 1.0, [], _missing(), _missing())
    assert regrade.unchanged(record, ("s", "c"), digest)
    assert not regrade.unchanged(record, ("s", "c"), digest._replace(submission="b" * 64))
    assert not regrade.unchanged(record, ("s", "c"), digest._replace(grading="other"))
    assert not regrade.unchanged(record, ("t", "c"), digest)
    assert set(record["submissions"]["s"]["c"]["result"]) == {"scores", "notes"}


def _missing():
    from pathlib import Path

    return Path("/nonexistent/page.html")
