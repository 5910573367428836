"""Deadlines (deploy/hub/schedule.py): a submission counts at the time the exchange received it, never
the time its own timestamp.txt claims, against the chapter's due date, the student's extension and the
late policy. Fast: no notebook is graded here. The grading run that shows the penalty in grades.csv,
the gradebook, report.csv and the feedback page is tests/test_grading_regrade.py's (chapter 02, a late
student with a forged timestamp.txt and a late student with an extension)."""

import csv
import datetime as dt
import json
import sys

import nbformat
import pytest
from nbgrader.api import Gradebook
from nbgrader.preprocessors import AssignLatePenalties
from traitlets.config import Config

from course_files import ROOT, course_cli, scratch_course, solution

sys.path.insert(0, str(ROOT / "autograder"))
import feedback  # noqa: E402
import jobs  # noqa: E402
import regrade  # noqa: E402

schedule = course_cli.schedule_module()
CHAPTER = "02_self_attention"
DUE = "2027-03-01 23:59 +08:00"  # 15:59 UTC
UTC = dt.timezone.utc


def _files(tmp_path, rows: str, extensions: str | None = None):
    path = tmp_path / "schedule.csv"
    path.write_text(rows)
    extra = None
    if extensions is not None:
        extra = tmp_path / "extensions.csv"
        extra.write_text(extensions)
    return path, extra


def _read(tmp_path, rows, extensions=None, logins=None):
    path, extra = _files(tmp_path, rows, extensions)
    return schedule.read_schedule(path, extra, chapters=[CHAPTER, "03_multi_head_attention"], logins=logins)


# -- the schedule's files ------------------------------------------------------------------------------

HEADER = "chapter,due,late_policy\n"
EXT = "login,chapter,due\n"
GOOD = HEADER + f"{CHAPTER},{DUE},per-hour:2\n"


@pytest.mark.parametrize("rows, extensions, line, says", [
    ("chapter,due\n", None, 1, "missing column late_policy"),
    (HEADER + f"{CHAPTER},2027-03-01 23:59,none\n", None, 2, "with a time zone (write it as 2027-03-01 23:59 +08:00)"),
    (HEADER + f"{CHAPTER},2027-02-30 23:59 +08:00,none\n", None, 2, "not a date and time that exists"),
    (HEADER + f"# a comment\n{CHAPTER},{DUE},per-week:3\n", None, 3, "unknown late_policy 'per-week:3' (none, cutoff"),
    (HEADER + f"{CHAPTER},{DUE},per-hour:-1\n", None, 2, "unknown late_policy"),
    (HEADER + f"99_nope,{DUE},none\n", None, 2, "no chapter '99_nope' in this course"),
    (GOOD + f"{CHAPTER},{DUE},cutoff\n", None, 3, "appears twice (first on line 2)"),
    (HEADER + f"{CHAPTER},,none\n", None, 2, "no due"),
    (GOOD, EXT + f"alice,03_multi_head_attention,{DUE}\n", 2, "has no due date in schedule.csv"),
    (GOOD, EXT + f"alice,{CHAPTER},2027-03-01 20:00 +08:00\n", 2, "is not later than the class's"),
    (GOOD, EXT + f"alice,{CHAPTER},2027-03-02 23:59 +08:00\nalice,{CHAPTER},2027-03-03 23:59 +08:00\n", 3,
     "appears twice"),
    (GOOD, EXT + f"Alice Smith,{CHAPTER},2027-03-02 23:59 +08:00\n", 2, "not a student's login on the roster"),
    (GOOD, EXT + f"mallory,{CHAPTER},2027-03-02 23:59 +08:00\n", 2, "not a student's login on the roster"),
])
def test_a_bad_row_is_one_line_naming_the_file_the_line_and_the_fix(tmp_path, rows, extensions, line, says):
    with pytest.raises(schedule.ScheduleError) as raised:
        _read(tmp_path, rows, extensions, logins={"alice", "bob"})
    message = str(raised.value)
    name = "extensions.csv" if extensions is not None else "schedule.csv"
    assert "\n" not in message and f"{name} line {line}: " in message and says in message, message


def test_the_schedule_reads_comments_time_zones_and_extensions(tmp_path):
    found = _read(tmp_path, "# the class's dates\n" + GOOD + f"03_multi_head_attention,2027-03-08 16:00 Z,cutoff\n",
                  EXT + f"# one student\nalice,{CHAPTER},2027-03-03 23:59 +08:00\n")
    class_due = dt.datetime(2027, 3, 1, 15, 59, tzinfo=UTC)
    assert found.deadline(CHAPTER).due == class_due and found.deadline(CHAPTER).policy == "per-hour:2"
    alice, bob = found.deadline(CHAPTER, "alice"), found.deadline(CHAPTER, "bob")
    assert alice.extended and alice.due == class_due + dt.timedelta(days=2) and alice.class_due == class_due
    assert not bob.extended and bob.due == class_due
    assert found.deadline("03_multi_head_attention").policy == "cutoff"
    assert found.deadline("04_positional_encoding") is None, "a chapter with no row has no due date"


def test_the_committed_examples_read_and_give_no_chapter_a_due_date():
    found = schedule.load(ROOT, course_cli.Course(ROOT).chapters())
    assert found.chapters == {} and found.extensions == {}
    assert (ROOT / schedule.SCHEDULE).read_text().count("\n# 0") >= 4, "examples of each policy, commented out"


# -- the server's time, not the student's claim -------------------------------------------------------


def _received(tmp_path, entries: dict) -> None:
    (tmp_path / "autograder").mkdir(exist_ok=True)
    (tmp_path / "autograder" / "received.json").write_text(json.dumps({"submissions": entries}))


def _entry(received: str, claimed: str | None = None) -> dict:
    return {CHAPTER: {"received": received, "claimed": claimed, "entry": f"x+{CHAPTER}+{received}+abc"}}


def _class(tmp_path):
    """alice: 1 h 30 min late, her timestamp.txt claims 7 h earlier; carol: as late, with an
    extension; bob: on time."""
    (tmp_path / "deploy" / "hub").mkdir(parents=True)
    (tmp_path / schedule.SCHEDULE).write_text(GOOD)
    (tmp_path / schedule.EXTENSIONS).write_text(EXT + f"carol,{CHAPTER},2027-03-02 23:59 +08:00\n")
    _received(tmp_path, {"alice": _entry("2027-03-01 17:29:00.000000 UTC", "2027-03-01 10:00:00.000000 UTC"),
                         "carol": _entry("2027-03-01 17:29:00.000000 UTC", "2027-03-01 17:28:59.000000 UTC"),
                         "bob": _entry("2027-03-01 15:00:00.000000 UTC", "2027-03-01 15:00:00.000000 UTC")})
    return schedule.submission_times(tmp_path, [CHAPTER])


def test_lateness_counts_from_the_server_time_and_a_forged_claim_is_noted(tmp_path):
    times = _class(tmp_path)
    alice, carol, bob = (times[(s, CHAPTER)] for s in ("alice", "carol", "bob"))
    assert alice.seconds_late == 5400 and carol.seconds_late == 0 and bob.seconds_late == 0
    assert alice.claimed_early() == pytest.approx(7 * 3600 + 29 * 60)
    assert carol.claimed_early() is None, "a second's difference is a clock, not a forgery"
    notes = alice.report_notes(4.0)
    assert any(n.startswith("timestamp.txt claims '2027-03-01 10:00:00.000000 UTC', 7 h 29 min before") for n in notes)
    assert any(n.startswith("late by 1 h 30 min: received 2027-03-02 01:29 +08:00, due 2027-03-01 23:59 +08:00; "
                            "per-hour:2: 4 points off") for n in notes), notes
    assert carol.report_notes(0.0) == [] and bob.report_notes(0.0) == []
    assert alice.for_job()["received"] == "2027-03-01 17:29:00.000000 UTC", "the server's time goes to the job"
    assert carol.for_job()["due"] == "2027-03-02 15:59:00.000000 UTC", "with her extension"
    assert "your extension" in carol.notice("en") and "on time" in carol.notice("en")
    assert "迟交 1 小时 30 分钟" in alice.notice("zh") and "每迟交一小时扣 2 分" in alice.notice("zh")
    assert alice.csv_fields(4.0) == {"received": "2027-03-02 01:29:00 +08:00", "due": "2027-03-01 23:59 +08:00",
                                     "late_by": "1:30:00", "late_policy": "per-hour:2", "penalty": "4"}


def test_without_received_json_nothing_changes(tmp_path):
    (tmp_path / "deploy" / "hub").mkdir(parents=True)
    (tmp_path / schedule.SCHEDULE).write_text(GOOD)
    assert schedule.submission_times(tmp_path, [CHAPTER]) == {}
    assert regrade.grading_digest("kit", 15, None, "bubblewrap") == \
        regrade.grading_digest("kit", 15, None, "bubblewrap", None), "no server time: the digest it always was"
    (tmp_path / "autograder").mkdir()
    (tmp_path / "autograder" / "received.json").write_text('{"submissions": {"alice": {"02_self_attention": {}}}}')
    with pytest.raises(schedule.ScheduleError, match="alice / 02_self_attention has no readable received time"):
        schedule.submission_times(tmp_path, [CHAPTER])


def test_a_bad_schedule_stops_make_grade_before_anything_is_graded(tmp_path, capsys):
    course = scratch_course(tmp_path / "course", [CHAPTER])
    (course.submitted / "alice" / CHAPTER).mkdir(parents=True)
    nbformat.write(solution(CHAPTER), course.submitted / "alice" / CHAPTER / f"{CHAPTER}.ipynb")
    _received(course.root, {"alice": _entry("2027-03-01 17:29:00.000000 UTC")})
    (course.root / "deploy" / "hub").mkdir(parents=True)
    (course.root / schedule.SCHEDULE).write_text(HEADER + f"{CHAPTER},{DUE},per-hour:two\n")
    assert course_cli.main(["--root", str(course.root), "grade", "--cell-timeout", "5"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("make grade: ") and "schedule.csv line 2: unknown late_policy 'per-hour:two'" in err
    assert len(err.splitlines()) == 1 and not (course.root / "autograder" / "grades.csv").exists()


def test_an_extension_grades_only_that_students_submission_again(tmp_path):
    """The grading digest holds the server time, due date and policy: a new extension changes carol's
    digest alone, so the next make grade grades her again and her page and row lose the penalty."""
    before = _class(tmp_path)
    (tmp_path / schedule.EXTENSIONS).write_text(EXT + f"carol,{CHAPTER},2027-03-02 23:59 +08:00\n"
                                                f"alice,{CHAPTER},2027-03-02 23:59 +08:00\n")
    after = schedule.submission_times(tmp_path, [CHAPTER])

    def digest(times, student):
        return regrade.grading_digest("kit", 15, None, "bubblewrap", times[(student, CHAPTER)].digest_part())

    assert digest(before, "alice") != digest(after, "alice")
    assert digest(before, "bob") == digest(after, "bob") and digest(before, "carol") == digest(after, "carol")
    assert after[("alice", CHAPTER)].seconds_late == 0


# -- the penalty: the late policy as nbgrader's late-submission plugin ---------------------------------


@pytest.mark.parametrize("policy, score, late, penalty", [
    ("per-hour:2", 10.0, 5400, 4.0),  # two started hours
    ("per-hour:2", 10.0, 3600, 2.0),
    ("per-hour:2", 3.0, 5400, 3.0),  # never below 0
    ("per-day:5", 10.0, 86401, 10.0),
    ("per-day:0.5", 10.0, 60, 0.5),
    ("cutoff", 7.0, 1, 7.0),
    ("none", 7.0, 99999, None),
    ("per-hour:2", 10.0, 0, None),
])
def test_the_plugin_applies_the_late_policy(policy, score, late, penalty):
    assert feedback.LatePenalty(policy=policy).late_submission_penalty("s", score, late) == penalty


def _job(tmp_path, monkeypatch, late: dict, language: str = "en"):
    """A job's private course (the parts _stamp and _late_penalty use), with a gradebook holding one
    assignment of two 5-point tests."""
    from alembic.script import ScriptDirectory
    from nbgrader.dbutil import ALEMBIC_DIR

    # nbgrader asks a new gradebook's schema version of the alembic command (5 s on a busy machine)
    head = ScriptDirectory(ALEMBIC_DIR).get_current_head()
    monkeypatch.setattr("nbgrader.api.get_alembic_version", lambda: head)
    course = tmp_path / "job"
    (course / "submitted" / "student" / CHAPTER).mkdir(parents=True)
    url = f"sqlite:///{course / 'gradebook.db'}"
    with Gradebook(url, "transformer-course") as gb:
        gb.add_assignment(CHAPTER)
        gb.add_notebook(CHAPTER, CHAPTER)
        for name in ("t1", "t2"):
            gb.add_grade_cell(name, CHAPTER, CHAPTER, max_score=5, cell_type="code")
    job = jobs._Job.__new__(jobs._Job)
    job.course, job.language, job.result = course, language, {}
    job.kit = type("Kit", (), {"chapter": CHAPTER, "course_id": "transformer-course"})()
    job.spec = jobs.JobSpec(student="alice", chapter=CHAPTER, submission=b"", kit=job.kit, late=late)
    return job, url


@pytest.mark.filterwarnings("ignore:Object of type")  # nbgrader's own autoflush notices (the grader hides them too)
def test_nbgrader_computes_the_penalty_from_the_server_time_the_job_stamps(tmp_path, monkeypatch):
    """What the job does before nbgrader's autograde (the server's time as timestamp.txt, the student's
    due date in the gradebook), then what autograde does with them: nbgrader's own timestamp reading and
    its AssignLatePenalties, with the course's plugin configured as the job configures it."""
    from nbgrader.coursedir import CourseDirectory

    alice = _class(tmp_path)[("alice", CHAPTER)]
    job, url = _job(tmp_path, monkeypatch, alice.for_job())
    folder = job.course / "submitted" / "student" / CHAPTER
    job._stamp(folder)
    assert (folder / "timestamp.txt").read_text() == "2027-03-01 17:29:00.000000 UTC"
    timestamp = CourseDirectory().get_existing_timestamp(str(folder))
    with Gradebook(url, "transformer-course") as gb:  # as nbgrader's Autograde.init_assignment does
        gb.update_or_create_student("student")
        submission = gb.update_or_create_submission(CHAPTER, "student", timestamp=timestamp)
        for grade in gb.find_submission_notebook(CHAPTER, CHAPTER, "student").grades:
            grade.auto_score = 5.0
        gb.db.commit()
        assert submission.total_seconds_late == 5400
    config = Config()
    exec(job._late_config(), {"c": config})
    assert config.SafeOutputs.notice.startswith("**When it was received.**")
    resources = {"nbgrader": {"notebook": CHAPTER, "assignment": CHAPTER, "student": "student", "db_url": url}}
    AssignLatePenalties(config=config).preprocess(nbformat.v4.new_notebook(), resources)
    with Gradebook(url, "transformer-course") as gb:
        assert gb.find_submission_notebook(CHAPTER, CHAPTER, "student").late_submission_penalty == 4.0

        # The grader's verdicts replace the kernel's scores; a cutoff then takes what is left.
        job.spec.late = {**job.spec.late, "policy": "cutoff"}
        nb = gb.find_submission_notebook(CHAPTER, CHAPTER, "student")
        nb.grades[0].auto_score = 0.0
        assert job._late_penalty(gb, nb) == 5.0 and job.result == {}


def test_the_chinese_page_names_nbgraders_penalty_line_in_chinese():
    page = '<li class="late-penalty">Late submission penalty (Score: -4.0)</li>'
    assert feedback.page_in_language(page, "zh") == '<li class="late-penalty">迟交扣分（得分：-4.0）</li>'


# -- grades.csv and report.csv --------------------------------------------------------------------------


def test_grades_csv_gets_the_time_columns_and_the_report_the_score_after_the_penalty(tmp_path):
    times = _class(tmp_path)
    report = course_cli.Report()
    for student in ("alice", "bob", "carol", "dave"):
        report.scores[(student, CHAPTER)] = (10.0, 10.0)
    report.late = {(s, CHAPTER): (times[(s, CHAPTER)], 4.0 if s == "alice" else 0.0) for s in ("alice", "bob", "carol")}
    path = tmp_path / "grades.csv"
    path.write_text("assignment,duedate,student_id,late_submission_penalty,score\n"
                    + "".join(f"{CHAPTER},,{s},0.0,10.0\n" for s in ("alice", "bob", "carol", "dave")))
    course_cli._add_time_columns(path, report)
    rows = {r["student_id"]: r for r in csv.DictReader(open(path))}
    assert list(rows["alice"])[-5:] == ["received", "due", "late_by", "late_policy", "penalty"]
    assert (rows["alice"]["late_by"], rows["alice"]["penalty"]) == ("1:30:00", "4")
    assert (rows["carol"]["due"], rows["carol"]["late_by"], rows["carol"]["penalty"]) == ("2027-03-02 23:59 +08:00", "", "0")
    assert rows["dave"]["received"] == "" and rows["dave"]["score"] == "10.0", "no server time: nbgrader's row as it was"
    assert report.final(("alice", CHAPTER)) == (6.0, 10.0) and report.final(("dave", CHAPTER)) == (10.0, 10.0)
    learner = course_cli.Report(scores={("dave", CHAPTER): (10.0, 10.0)})
    before = path.read_text()
    course_cli._add_time_columns(path, learner)
    assert path.read_text() == before, "without a server time, grades.csv is nbgrader's own"


def test_the_report_names_the_late_the_forged_and_the_unrecorded(tmp_path, monkeypatch):
    times = _class(tmp_path)
    report = course_cli.Report(scores={(s, CHAPTER): (11.0, 11.0) for s in ("alice", "bob", "carol", "dave")})
    monkeypatch.setattr(course_cli, "_penalties", lambda course, keys: {k: 4.0 if k[0] == "alice" else 0.0 for k in keys})
    course_cli._lateness(None, report, times, log=print)
    assert [n.split(",")[0] for n in report.notes[("alice", CHAPTER)]] == [
        "timestamp.txt claims '2027-03-01 10:00:00.000000 UTC'", "late by 1 h 30 min: received 2027-03-02 01:29 +08:00"]
    assert ("bob", CHAPTER) not in report.notes and ("carol", CHAPTER) not in report.notes
    assert report.notes[("dave", CHAPTER)] == ["no server time in autograder/received.json: graded without a due date"]
    assert report.final(("alice", CHAPTER)) == (7.0, 11.0) and report.scores[("alice", CHAPTER)] == (11.0, 11.0)
    assert "7/11*" in course_cli.format_table(report, [CHAPTER], ["alice"]).splitlines()[1], "the table: after it"


# -- showing the due date to students (classhub.py release) --------------------------------------------


def test_the_released_notebook_says_when_it_is_due(tmp_path):
    path = tmp_path / f"{CHAPTER}.ipynb"
    nbformat.write(solution(CHAPTER), path)
    cells = len(solution(CHAPTER).cells)
    found = _read(tmp_path, GOOD)
    assert schedule.stamp_release(path, found.deadline(CHAPTER), "zh")
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    assert len(nb.cells) == cells + 1 and nb.cells[0].id == schedule.DUE_CELL_ID
    assert nb.cells[0].source.startswith("**截止时间：2027-03-01 23:59 +08:00。**")
    assert not schedule.stamp_release(path, found.deadline(CHAPTER), "zh"), "stamped once, not twice"
    assert schedule.stamp_release(path, None) and len(nbformat.read(path, as_version=4).cells) == cells
