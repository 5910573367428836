"""Data kept and grades out (deploy/hub/backup.py, prune.py, lms.py; the Makefile's hub-backup, hub-prune,
grades-lms and the guards on clean-grading and hub-remove-accounts). Fast: a tiny course, hub state,
exchange and home in a temporary folder; no hub, no grading, no account made (the student-owned links
belong to `nobody`). The parts that chown need root and say so when skipped."""

import csv
import importlib
import json
import os
import pwd
import re
import shutil
import sqlite3
import stat
import subprocess
import sys
import tarfile
import time
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
HUB = ROOT / "deploy" / "hub"
CHAPTER = "02_self_attention"
ENTRY = f"exchange/transformer-course/inbound/wang+{CHAPTER}+2027-03-01 10:00:00.000000 UTC+abc"  # in the tarball
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: the student-owned files belong to nobody")


@pytest.fixture
def hub():
    """deploy/hub's backup, prune and lms modules (imported here, so that each test fails on its own
    where they do not exist)."""
    sys.path.insert(0, str(HUB))
    try:
        yield type("Hub", (), {name: importlib.import_module(name) for name in ("backup", "prune", "lms")})
    finally:
        sys.path.remove(str(HUB))


def _nobody() -> int:
    return pwd.getpwnam("nobody").pw_uid


def _link(target: Path, link: Path) -> None:
    """A link as a student makes it: theirs, pointing outside what is backed up."""
    link.symlink_to(target)
    os.lchown(link, _nobody(), -1)


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _database(path: Path, rows: list[int]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with sqlite3.connect(path) as db:
        db.execute("create table grades (score)")
        db.executemany("insert into grades values (?)", [(r,) for r in rows])
    db.close()


def _term(tmp_path: Path, hub):
    """A course folder, hub state, exchange and one home as a term leaves them, with what a student
    can plant: links out of their folders (one to a secret) and a named pipe."""
    course, state, exchange, home = (tmp_path / name for name in ("course", "state", "exchange", "home-wang"))
    outside = _write(tmp_path / "outside" / "secret.txt", "SECRET of another account")
    grading = course / "autograder"
    _database(grading / "gradebook.db", [7])
    _write(grading / "submitted" / "wang" / CHAPTER / f"{CHAPTER}.ipynb", "{}")
    _write(grading / "feedback" / "wang" / CHAPTER / f"{CHAPTER}.html", "<p>7/11</p>")
    for name in ("graded.json", "received.json"):
        _write(grading / name, "{}")
    for name in ("grades.csv", "report.csv"):
        _write(grading / name, "assignment,student_id,score\n")
    _write(course / "deploy" / "hub" / "schedule.csv", "chapter,due,late_policy\n")
    secrets = state / "secrets"
    _database(secrets / "jupyterhub.sqlite", [1])
    _write(secrets / "jupyterhub.sqlite-journal", "a hot journal that would undo the copy")
    for name, text in [("passwords.dbm", "x"), ("first-passwords.csv", "login,name,first password\n"),
                       ("created-accounts.json", '["wang"]')]:
        _write(secrets / name, text)
    _write(state / "class.json", json.dumps({"exchange": str(exchange), "people": [{"login": "wang"}]}))
    _write(state / "proxy" / "node_modules" / "big.js", "npm's")
    entry = tmp_path / ENTRY
    _write(entry / f"{CHAPTER}.ipynb", "{}")
    _link(outside, entry / "timestamp.txt")
    os.mkfifo(entry / "pipe")
    _write(home / CHAPTER / f"{CHAPTER}.ipynb", "{}")
    _write(home / ".cache" / "pip" / "wheel", "cached")
    _link(outside.parent, home / "escape")
    sources = hub.backup.Sources(course, state, exchange, {"wang": home})
    return sources, outside


@as_root
def test_backup_keeps_the_term_and_follows_no_link(tmp_path, hub):
    sources, outside = _term(tmp_path, hub)
    writer = sqlite3.connect(sources.course / "autograder" / "gradebook.db", isolation_level=None)
    writer.execute("begin immediate")  # make grade mid-transaction: the copy holds what was committed
    writer.execute("insert into grades values (99)")
    lines, began = [], time.time_ns()
    try:
        path = hub.backup.backup(sources, tmp_path / "backups", out=lines.append)
    finally:
        writer.execute("rollback")
        writer.close()

    assert hub.backup.NAME.match(path.name) and [p.name for p in path.parent.iterdir()] == [path.name]
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert began <= path.stat().st_mtime_ns <= time.time_ns()  # the time it began: what the guard compares
    with tarfile.open(path) as tar:
        members = {m.name: m for m in tar.getmembers()}
        contents = b"".join(tar.extractfile(m).read() for m in members.values() if m.isfile())
        restored = tmp_path / "restored.db"
        restored.write_bytes(tar.extractfile(members["course/autograder/gradebook.db"]).read())
    for name in ["course/autograder/submitted/wang/02_self_attention/02_self_attention.ipynb",
                 "course/autograder/feedback/wang/02_self_attention/02_self_attention.html",
                 "course/autograder/graded.json", "course/autograder/received.json", "course/autograder/grades.csv",
                 "course/autograder/report.csv", "course/deploy/hub/schedule.csv", "hub-state/class.json",
                 "hub-state/secrets/passwords.dbm", "hub-state/secrets/first-passwords.csv",
                 "hub-state/secrets/created-accounts.json", "hub-state/secrets/jupyterhub.sqlite",
                 "homes/wang/02_self_attention/02_self_attention.ipynb"]:
        assert members[name].isfile(), name
    with sqlite3.connect(restored) as copy:  # committed rows only, and a whole database
        assert copy.execute("select score from grades").fetchall() == [(7,)]
        assert copy.execute("pragma integrity_check").fetchall() == [("ok",)]
    copy.close()
    # Links are kept as links, never followed; nothing of the secret they point at is in the tarball.
    for name in ["homes/wang/escape", f"{ENTRY}/timestamp.txt"]:
        assert members[name].issym() and members[name].uid == _nobody(), name
    assert members["homes/wang/escape"].linkname == str(outside.parent)
    assert not [n for n in members if n.startswith("homes/wang/escape/")] and b"SECRET" not in contents
    assert not [n for n in members if "proxy" in n or ".cache" in n or n.endswith("-journal")]
    left_out = [line for line in lines if line.startswith("left out")]
    assert left_out == [f"left out {ENTRY}/pipe: a named pipe"], lines
    assert "  homes/wang: 1 file, 2 B" in lines
    said = rf"backup: {re.escape(str(path))} \(\d+(\.\d)? k?B; \d+ files, .* before compression; mode 0600\)"
    assert re.fullmatch(said, lines[-1]), lines[-1]


def test_backup_refuses_a_folder_others_can_write_or_inside_what_it_holds(tmp_path, hub):
    sources = hub.backup.Sources(tmp_path / "course", tmp_path / "state", tmp_path / "exchange", {"wang": tmp_path / "home"})
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(hub.backup.BackupError, match="nobody else can write"):
        hub.backup.backup(sources, shared, out=lambda line: None)
    assert list(shared.iterdir()) == []
    with pytest.raises(hub.backup.BackupError, match="is inside .*home, which the backup holds"):
        hub.backup.backup(sources, tmp_path / "home" / "backups", out=lambda line: None)


def _make(course: Path, *args: str, state: Path | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAKE") and k not in ("MFLAGS", "CONFIRM", "BACKUP_DIR")}
    env["HUB_STATE"] = str(state or course / "state")
    return subprocess.run(["make", "--no-print-directory", *args], cwd=course, env=env, capture_output=True, text=True,
                          timeout=60)


def test_clean_grading_refuses_to_delete_grades_no_backup_holds(tmp_path, hub):
    """The Makefile's own recipe, run in a copy of the course that holds only it and backup.py."""
    course = tmp_path / "course"
    (course / "deploy" / "hub").mkdir(parents=True)
    shutil.copy(ROOT / "Makefile", course / "Makefile")
    shutil.copy(HUB / "backup.py", course / "deploy" / "hub" / "backup.py")
    backups = f"BACKUP_DIR={tmp_path / 'backups'}"
    gradebook = course / "autograder" / "gradebook.db"
    _database(gradebook, [7])
    _write(course / "autograder" / "feedback" / "wang" / CHAPTER / f"{CHAPTER}.html", "7/11")

    refused = _make(course, "clean-grading", backups)
    assert refused.returncode != 0 and gradebook.exists()
    said = [line for line in refused.stderr.splitlines() if not line.startswith("make:")]
    assert len(said) == 1 and said[0].startswith("make clean-grading would delete the class's grades"), refused.stderr
    assert f"no backup in {tmp_path / 'backups'}" in said[0] and "sudo make hub-backup clean-grading" in said[0]
    assert "make clean-grading CONFIRM=1" in said[0]

    hub.backup.backup(hub.backup.Sources(course, tmp_path / "state", tmp_path / "exchange"), tmp_path / "backups",
                      out=lambda line: None)
    _write(course / "autograder" / "feedback" / "ada" / CHAPTER / f"{CHAPTER}.html", "graded after the backup")
    stale = _make(course, "clean-grading", backups)
    assert stale.returncode != 0 and gradebook.exists()
    assert "is older than" in stale.stderr and "feedback/ada" in stale.stderr, stale.stderr

    hub.backup.backup(hub.backup.Sources(course, tmp_path / "state", tmp_path / "exchange"), tmp_path / "backups",
                      out=lambda line: None)
    done = _make(course, "clean-grading", backups)
    assert done.returncode == 0, done.stderr
    assert "holds the class's grades" in done.stdout and not gradebook.exists()

    _database(gradebook, [8])
    confirmed = _make(course, "clean-grading", backups, "CONFIRM=1")
    assert confirmed.returncode == 0 and "CONFIRM=1" in confirmed.stdout and not gradebook.exists()


def test_remove_accounts_refuses_to_delete_homes_no_backup_holds(tmp_path, hub):
    home, state, backups = tmp_path / "home-wang", tmp_path / "state", tmp_path / "backups"
    _write(home / CHAPTER / f"{CHAPTER}.ipynb", "{}")
    _write(home / ".cache" / "pip" / "old-wheel", "cached")
    _write(state / "secrets" / "created-accounts.json", '["wang"]')
    lookup = {"wang": type("Account", (), {"pw_dir": str(home)})}.__getitem__

    def guard(confirmed=False):
        return hub.backup.guard("remove-accounts", confirmed, tmp_path / "course", state, backups, lookup)

    ok, line = guard()
    assert not ok and line.startswith("make hub-remove-accounts would delete the homes of 1 account (wang), and no backup")
    assert guard(confirmed=True)[0]
    hub.backup.backup(hub.backup.Sources(tmp_path / "course", state, tmp_path / "exchange", {"wang": home}), backups,
                      out=lambda line: None)
    assert guard()[0]
    _write(home / ".cache" / "pip" / "wheel", "a cache changed since: not what the backup is for")
    assert guard()[0]
    _write(home / "notes.md", "written after the backup")
    ok, line = guard()
    assert not ok and "notes.md" in line
    # The Makefile checks before classhub removes anything (make -n prints, runs nothing).
    recipe = _make(ROOT, "-n", "hub-remove-accounts", state=state).stdout.splitlines()
    assert [i for i, l in enumerate(recipe) if "backup.py guard" in l and "remove-accounts" in l] == [0], recipe
    assert "classhub.py remove-accounts" in recipe[1]


def _entry(student: str, day: int, code: str) -> str:
    return f"{student}+{CHAPTER}+2027-03-{day:02d} 10:00:00.000000 UTC+{code}"


@as_root
def test_prune_keeps_the_newest_and_the_collected_and_moves_links_as_links(tmp_path, hub):
    course_dir = tmp_path / "exchange" / "transformer-course"
    inbound = course_dir / "inbound"
    outside = _write(tmp_path / "outside" / "secret.txt", "SECRET")
    link, collected, middle, newest = (_entry("wang", day, code) for day, code in ((9, "link"), (1, "a"), (2, "b"), (3, "c")))
    inbound.mkdir(parents=True)
    _link(outside.parent, inbound / link)  # received first, whatever its name claims
    for name in (collected, middle, newest):  # received in this order (the change times the kernel set)
        time.sleep(0.02)
        _write(inbound / name / f"{CHAPTER}.ipynb", "{}")
    _write(inbound / _entry("ada", 1, "z") / f"{CHAPTER}.ipynb", "{}")
    _write(inbound / "not a submission", "x")
    theirs = tmp_path / "exchange" / "a-students-folder"  # not root's: not a course, left alone
    for code in ("a", "b"):
        _write(theirs / "inbound" / _entry("eve", 1, code) / "x", "")
    os.chown(theirs, _nobody(), -1)
    lines = []

    moved, kept = hub.prune.prune(tmp_path / "exchange", {"submissions": {"wang": {CHAPTER: {"entry": collected}}}},
                                  out=lines.append)

    assert (moved, kept) == (2, 3)
    assert sorted(p.name for p in inbound.iterdir()) == sorted([collected, newest, _entry("ada", 1, "z"), "not a submission"])
    pruned = course_dir / "pruned"
    assert stat.S_IMODE(pruned.stat().st_mode) == 0o700 and pruned.stat().st_uid == 0
    assert sorted(p.name for p in pruned.iterdir()) == sorted([middle, link])
    assert (pruned / link).is_symlink() and os.readlink(pruned / link) == str(outside.parent)
    assert outside.read_text() == "SECRET" and len(list((theirs / "inbound").iterdir())) == 2
    assert lines == [f"moved transformer-course/inbound/{name} to transformer-course/pruned/ (wang / {CHAPTER}: neither "
                     "the newest nor the collected one)" for name in (link, middle)] + [  # oldest first
        "pruned 2 old submissions into each course's pruned/ (root only); kept 3: the newest and the collected one "
        "of each student and chapter"]


def _gradebook(course: Path, monkeypatch) -> None:
    """A gradebook as `make grade` leaves it, exported by nbgrader's own CSV exporter: wang late (11 - 2
    points), lee graded 0 with no timestamp (no hub), bob 6.5, eve not on the roster; chapter 03 has no
    submission at all."""
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")  # nbgrader runs alembic
    import datetime

    from nbgrader.api import Gradebook
    from nbgrader.plugins.export import CsvExportPlugin

    grading = course / "autograder"
    grading.mkdir(parents=True)
    with warnings.catch_warnings(), Gradebook(f"sqlite:///{grading / 'gradebook.db'}", "transformer-course") as gb:
        warnings.simplefilter("ignore")
        for chapter, points in ((CHAPTER, 11), ("03_multi_head_attention", 8)):
            gb.add_assignment(chapter)
            gb.add_notebook(chapter, chapter)
            gb.add_grade_cell("a_test", chapter, chapter, max_score=points - 3, cell_type="code")
            gb.add_grade_cell("b_test", chapter, chapter, max_score=3, cell_type="code")
        for student, (a, b, penalty) in {"wang": (8, 3, 2.0), "lee": (0, 0, 0.0), "bob": (3.5, 3, 0.0), "eve": (1, 0, 0.0)}.items():
            gb.add_student(student)
            gb.add_submission(CHAPTER, student, timestamp=datetime.datetime(2027, 3, 2) if student == "wang" else None)
            notebook = gb.find_submission_notebook(CHAPTER, CHAPTER, student)
            for grade, score in zip(sorted(notebook.grades, key=lambda g: g.name), (a, b)):
                grade.auto_score = score
            notebook.late_submission_penalty = penalty
        gb.db.commit()
        exporter = CsvExportPlugin()
        exporter.to = str(grading / "grades.csv")
        exporter.export(gb)
    _write(grading / "report.csv", "student,chapter,score,max_score,notes\n" + "".join(
        f"{s},{CHAPTER},{score},11.0,\n" for s, score in (("bob", 6.5), ("eve", 1.0), ("lee", 0.0), ("wang", 9.0))))


def _rows(path: Path) -> list[list[str]]:
    raw = path.read_bytes()
    assert raw.startswith(b"\xef\xbb\xbf") and b"\r\n" in raw and b"\n" not in raw.replace(b"\r\n", b"")
    return list(csv.reader(raw.decode("utf-8-sig").splitlines()))


def _canvas_reads(header: list[str]) -> bool:
    """Canvas's importer (app/models/gradebook_importer.rb: row_has_student_headers?, update_column_count,
    header?): "Student" and "ID" first, SIS User ID and SIS Login ID next, then "Section"."""
    return (len(header) > 3 and "Student" in header[0] and "ID" in header[1] and re.search(r"SIS\s+User\s+ID", header[2])
            and re.search(r"SIS\s+Login\s+ID", header[3]) and "Section" in header[4])


def test_grades_for_canvas_and_moodle(tmp_path, hub, monkeypatch):
    course = tmp_path / "course"
    _gradebook(course, monkeypatch)
    roster = _write(tmp_path / "roster.csv", "login,name,role,language\nada,Ada Lovelace,instructor,en\n"
                    "wang,王小明,student,zh\nlee,Lee Chen,student,en\nbob,\"Bob, Jr.\",student,en\n"
                    "ghost,=SUM(A1),student,en\n")
    lines = []
    canvas, moodle = hub.lms.export(course, hub.lms.students(roster), out=lines.append)

    assert canvas == course / "autograder" / "grades-canvas.csv" and moodle == course / "autograder" / "grades-moodle.csv"
    rows = _rows(canvas)
    assert rows[0] == ["Student", "ID", "SIS User ID", "SIS Login ID", "Section", CHAPTER] and _canvas_reads(rows[0])
    assert rows[1] == ["    Points Possible", "", "", "", "", "11"]
    assert rows[2:] == [["王小明", "", "", "wang", "", "9"], ["Lee Chen", "", "", "lee", "", "0"],
                        ["Bob, Jr.", "", "", "bob", "", "6.5"], ["'=SUM(A1)", "", "", "ghost", "", ""]]
    assert _rows(moodle) == [["Username", "Full name", CHAPTER], ["wang", "王小明", "9"], ["lee", "Lee Chen", "0"],
                             ["bob", "Bob, Jr.", "6.5"], ["ghost", "'=SUM(A1)", "-"]]
    assert "eve has grades but is not a student on the roster: left out" in lines
    assert lines[-1] == f"maximum points, for Moodle's grade items: {CHAPTER} 11"

    hub.lms.export(course, hub.lms.students(roster), [CHAPTER, "03_multi_head_attention"], out=lines.append)
    rows = _rows(canvas)
    assert rows[1][-2:] == ["11", "8"] and [row[-1] for row in rows[2:]] == ["", "", "", ""]
    assert [row[-1] for row in _rows(moodle)[1:]] == ["-"] * 4
    with pytest.raises(hub.lms.LmsError, match="no chapter 99_nothing in grades.csv"):
        hub.lms.export(course, hub.lms.students(roster), ["99_nothing"], out=lines.append)
