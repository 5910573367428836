"""The class's deadlines: when each chapter is due, what a late submission costs, who has more time.

Two CSV files beside the roster, read by `make hub-release` (the due date shown to students) and by
`make grade` (the late penalty); a line starting with `#` is a comment:

    deploy/hub/schedule.csv       chapter,due,late_policy
                                  02_self_attention,2027-03-01 23:59 +08:00,per-hour:2
    deploy/hub/extensions.csv     login,chapter,due
                                  alice,02_self_attention,2027-03-04 23:59 +08:00

`due` is a date and time with its time zone (`+08:00`, `-05:00`, `Z` or `UTC`). `late_policy` is
`none` (graded as usual, marked late), `per-hour:N` or `per-day:N` (N points off for every started
hour or day late, never below 0) or `cutoff` (0 after the due date). A chapter with no row has no due
date. An extension is the student's own due date for that chapter, later than the class's.

A submission counts at the time the course's server received it (autograder/received.json, which
`make collect` writes), never the time the student's own timestamp.txt claims: a student's process
writes that file and can write any time in it.

`read_schedule` guarantees what it returns is complete and unambiguous; anything else is a
`ScheduleError` naming the file, the line and the fix, in one line (as deploy/hub/roster.py does).
Nothing here imports nbgrader or torch: `classhub.py release` and the grader's main process both use
it, and the grading jobs get plain data from it (`SubmissionTime.for_job`).
"""

from __future__ import annotations

import csv
import datetime as dt
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

SCHEDULE = Path("deploy") / "hub" / "schedule.csv"
EXTENSIONS = Path("deploy") / "hub" / "extensions.csv"
RECEIVED = Path("autograder") / "received.json"
SCHEDULE_COLUMNS = ("chapter", "due", "late_policy")
EXTENSION_COLUMNS = ("login", "chapter", "due")
POLICY = re.compile(r"^(none|cutoff|per-(hour|day):(\d+(\.\d+)?))$")
DUE = re.compile(r"^(\d{4})-(\d{2})-(\d{2})[ T](\d{1,2}):(\d{2})(?::(\d{2}))?\s*(Z|UTC|([+-])(\d{2}):?(\d{2}))$", re.I)
LOGIN = re.compile(r"^[a-z][a-z0-9_-]{0,31}$")  # roster.LOGIN
# nbgrader's timestamp format (nbgrader.exchange.abc.Exchange.timestamp_format), in UTC
NBGRADER_TIME = "%Y-%m-%d %H:%M:%S.%f UTC"
# A claim this much earlier than the server's time is not a slow clock or a slow copy.
FORGED_AFTER_SECONDS = 120


class ScheduleError(ValueError):
    """One line for the instructor: the file, the line and the fix."""


@dataclass(frozen=True)
class Deadline:
    chapter: str
    due: dt.datetime  # this student's due date (an extension's when they have one), aware
    policy: str  # none, cutoff, per-hour:N, per-day:N
    class_due: dt.datetime  # the chapter's due date for the class

    @property
    def extended(self) -> bool:
        return self.due != self.class_due


@dataclass
class Schedule:
    chapters: dict[str, tuple[dt.datetime, str]] = field(default_factory=dict)  # chapter -> (due, policy)
    extensions: dict[tuple[str, str], dt.datetime] = field(default_factory=dict)  # (login, chapter) -> due

    def deadline(self, chapter: str, login: str | None = None) -> Deadline | None:
        """`login`'s deadline for `chapter` (the class's when login is None); None: no due date."""
        if chapter not in self.chapters:
            return None
        due, policy = self.chapters[chapter]
        return Deadline(chapter, self.extensions.get((login, chapter), due), policy, due)


# -- reading the files ------------------------------------------------------------------------------


def parse_due(text: str) -> dt.datetime:
    """'2027-03-01 23:59 +08:00' -> an aware datetime; ValueError says what is wrong."""
    found = DUE.match(text.strip())
    if not found:
        raise ValueError(f"{text!r} is not a date and time with a time zone (write it as 2027-03-01 23:59 +08:00)")
    year, month, day, hour, minute, second, _, sign, zone_hours, zone_minutes = found.groups()
    offset = dt.timedelta(hours=int(zone_hours or 0), minutes=int(zone_minutes or 0)) * (-1 if sign == "-" else 1)
    try:
        return dt.datetime(int(year), int(month), int(day), int(hour), int(minute), int(second or 0),
                           tzinfo=dt.timezone(offset))
    except ValueError as exc:  # 2027-02-30, 25:00, an offset of a day or more
        raise ValueError(f"{text!r} is not a date and time that exists ({exc})") from None


def parse_policy(text: str) -> str:
    policy = text.strip().lower()
    if not POLICY.match(policy):
        raise ValueError(f"unknown late_policy {text!r} (none, cutoff, per-hour:N or per-day:N, "
                         "N the points off per started hour or day)")
    return policy


def _rows(path: Path, columns: tuple[str, ...]):
    """(line number, {column: text}) for each row that is not blank or a comment."""
    try:
        text = path.read_text(encoding="utf-8-sig")  # a spreadsheet's "CSV UTF-8" starts with a BOM
    except UnicodeDecodeError:
        raise ScheduleError(f"{path}: not UTF-8 text; save it as CSV UTF-8") from None
    lines = [(n, line) for n, line in enumerate(text.splitlines(), start=1)
             if line.strip() and not line.lstrip().startswith("#")]
    if not lines:
        return
    header = [cell.strip().lower() for cell in next(csv.reader([lines[0][1]]))]
    missing = [c for c in columns if c not in header]
    if missing:
        raise ScheduleError(f"{path} line {lines[0][0]}: missing column{'s' if len(missing) > 1 else ''} "
                            f"{', '.join(missing)} (the first line that is not a comment must be {','.join(columns)})")
    for number, line in lines[1:]:
        row = next(csv.reader([line]))
        fields = {c: (row[header.index(c)].strip() if header.index(c) < len(row) else "") for c in columns}
        empty = [c for c in columns if not fields[c]]
        if empty:
            raise ScheduleError(f"{path} line {number}: no {' and no '.join(empty)}")
        yield number, fields


def _schedule_rows(path: Path, chapters: list[str] | None) -> dict[str, tuple[dt.datetime, str]]:
    rows, first = {}, {}
    for number, fields in _rows(path, SCHEDULE_COLUMNS):
        where, chapter = f"{path} line {number}", fields["chapter"]
        if chapters is not None and chapter not in chapters:
            raise ScheduleError(f"{where}: no chapter {chapter!r} in this course (the chapters: {', '.join(chapters)})")
        if chapter in first:
            raise ScheduleError(f"{where}: {chapter} appears twice (first on line {first[chapter]}); keep one row")
        try:
            rows[chapter] = (parse_due(fields["due"]), parse_policy(fields["late_policy"]))
        except ValueError as exc:
            raise ScheduleError(f"{where}: {exc}") from None
        first[chapter] = number
    return rows


def _extension_rows(path: Path, schedule: dict, logins: set[str] | None) -> dict[tuple[str, str], dt.datetime]:
    rows, first = {}, {}
    for number, fields in _rows(path, EXTENSION_COLUMNS):
        where, login, chapter = f"{path} line {number}", fields["login"], fields["chapter"]
        if not LOGIN.match(login) or (logins is not None and login not in logins):
            raise ScheduleError(f"{where}: {login!r} is not a student's login on the roster")
        if chapter not in schedule:
            raise ScheduleError(f"{where}: {chapter} has no due date in schedule.csv, so there is nothing to "
                                "extend (give it a row there first)")
        if (login, chapter) in first:
            raise ScheduleError(f"{where}: {login}'s extension for {chapter} appears twice "
                                f"(first on line {first[(login, chapter)]}); keep one row")
        try:
            due = parse_due(fields["due"])
        except ValueError as exc:
            raise ScheduleError(f"{where}: {exc}") from None
        if due <= schedule[chapter][0]:
            raise ScheduleError(f"{where}: {login}'s due date {fields['due']} is not later than the class's "
                                f"({_when(schedule[chapter][0])}); an extension gives more time")
        rows[(login, chapter)] = due
        first[(login, chapter)] = number
    return rows


def read_schedule(path: str | Path, extensions: str | Path | None = None, chapters: list[str] | None = None,
                  logins: set[str] | None = None) -> Schedule:
    """The schedule at `path` and the extensions at `extensions`; a missing file is an empty one.
    `chapters` and `logins`, when given, are the only ones a row may name."""
    path = Path(path)
    rows = _schedule_rows(path, chapters) if path.exists() else {}
    extra = Path(extensions) if extensions else None
    return Schedule(rows, _extension_rows(extra, rows, logins) if extra and extra.exists() else {})


def load(root: str | Path, chapters: list[str] | None = None, logins: set[str] | None = None) -> Schedule:
    """The course's own schedule.csv and extensions.csv (deploy/hub/ under `root`)."""
    return read_schedule(Path(root) / SCHEDULE, Path(root) / EXTENSIONS, chapters, logins)


# -- when a submission was received ------------------------------------------------------------------


@dataclass(frozen=True)
class Received:
    received: dt.datetime  # the server's time, aware (UTC)
    claimed: str | None  # the text of the student's own timestamp.txt
    entry: str  # the inbound entry's name


def parse_nbgrader_time(text: str) -> dt.datetime:
    """nbgrader's '2026-12-06 03:00:00.123456 UTC' (or any zone nbgrader writes) -> aware UTC."""
    try:
        return dt.datetime.strptime(text.strip(), NBGRADER_TIME).replace(tzinfo=dt.timezone.utc)
    except ValueError:
        from nbgrader.utils import parse_utc  # a zone name or offset, as nbgrader's exchange may write

        return parse_utc(text).replace(tzinfo=dt.timezone.utc)


def read_received(path: str | Path) -> dict[tuple[str, str], Received]:
    """autograder/received.json ({} when there is none: a learner grading their own work)."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise ScheduleError(f"{path}: unreadable ({type(exc).__name__}); run make collect again") from None
    found = {}
    submissions = data.get("submissions", {}) if isinstance(data, dict) else None
    if not isinstance(submissions, dict) or not all(isinstance(c, dict) for c in submissions.values()):
        raise ScheduleError(f"{path}: not the record make collect writes "
                            '({"submissions": {login: {chapter: ...}}}); run make collect again')
    for login, chapters in submissions.items():
        for chapter, entry in chapters.items():
            try:
                found[(login, chapter)] = Received(parse_nbgrader_time(entry["received"]), entry.get("claimed"),
                                                   str(entry.get("entry", "")))
            except (KeyError, TypeError, ValueError, AttributeError, OverflowError):
                raise ScheduleError(f"{path}: {login} / {chapter} has no readable received time; "
                                    "run make collect again") from None
    return found


@dataclass(frozen=True)
class SubmissionTime:
    """One submission's server time against its deadline (None: the chapter has no due date)."""

    received: Received
    deadline: Deadline | None

    @property
    def seconds_late(self) -> float:
        if self.deadline is None:
            return 0.0
        return max(0.0, (self.received.received - self.deadline.due).total_seconds())

    def claimed_early(self) -> float | None:
        """How many seconds the student's timestamp.txt claims before the server's time, when it
        claims more than FORGED_AFTER_SECONDS earlier; None otherwise (or when it says nothing)."""
        if not self.received.claimed:
            return None
        try:
            claimed = parse_nbgrader_time(self.received.claimed)
        except (ValueError, OverflowError, ImportError, AttributeError, TypeError):  # not a time: no claim
            return None
        early = (self.received.received - claimed).total_seconds()
        return early if early > FORGED_AFTER_SECONDS else None

    def for_job(self) -> dict:
        """What a grading job needs (plain data: jobs run on Dask workers too): the server's time and
        due date in nbgrader's format, the policy, and the feedback page's line in each language."""
        deadline = self.deadline
        return {"received": self.received.received.astimezone(dt.timezone.utc).strftime(NBGRADER_TIME),
                "due": deadline.due.astimezone(dt.timezone.utc).strftime(NBGRADER_TIME) if deadline else None,
                "policy": deadline.policy if deadline else None,
                "notice": {language: self.notice(language) for language in ("en", "zh")}}

    def digest_part(self) -> dict:
        """What of this submission's time its grade depends on (autograder/regrade.py): a new time,
        due date, extension or policy grades it again, so that its feedback page says so too."""
        job = self.for_job()
        return {key: job[key] for key in ("received", "due", "policy")}

    def _received_here(self) -> dt.datetime:
        """The server's time in the due date's own zone (the one the instructor wrote)."""
        return self.received.received.astimezone(self.deadline.due.tzinfo if self.deadline else dt.timezone.utc)

    def notice(self, language: str) -> str:
        """The line on the student's feedback page: when the server received it, against the due date."""
        received = _when(self._received_here())
        if self.deadline is None:
            return (f"**提交时间。** 课程服务器在 {received} 收到了这份提交。" if language == "zh" else
                    f"**When it was received.** The course's server received this submission at {received}.")
        due = _when(self.deadline.due)
        if language == "zh":
            whose = "（你的延期）" if self.deadline.extended else ""
            verdict = (f"迟交 {duration(self.seconds_late, 'zh')}；迟交规则：{policy_words(self.deadline.policy, 'zh')}。"
                       if self.seconds_late else "按时提交。")
            return f"**提交时间。** 课程服务器在 {received} 收到了这份提交，截止时间是 {due}{whose}：{verdict}"
        whose = " (your extension)" if self.deadline.extended else ""
        verdict = (f"late by {duration(self.seconds_late)}; the late rule: {policy_words(self.deadline.policy)}."
                   if self.seconds_late else "on time.")
        return (f"**When it was received.** The course's server received this submission at {received}; it was "
                f"due at {due}{whose}: {verdict}")

    def report_notes(self, penalty: float | None) -> list[str]:
        """The grading report's notes (English, for the instructor)."""
        notes = []
        early = self.claimed_early()
        if early is not None:
            notes.append(f"timestamp.txt claims {self.received.claimed!r}, {duration(early)} before the exchange "
                         f"received it ({_when(self._received_here(), seconds=True)}): graded by the exchange's time")
        if self.seconds_late and self.deadline is not None:
            whose = " (extension)" if self.deadline.extended else ""
            notes.append(f"late by {duration(self.seconds_late)}: received {_when(self._received_here())}, due "
                         f"{_when(self.deadline.due)}{whose}; {self.deadline.policy}: "
                         f"{f'{penalty:g} points off' if penalty else 'no points off'}")
        return notes

    def csv_fields(self, penalty: float | None) -> dict[str, str]:
        """grades.csv's columns for it: received, due, late_by (H:MM:SS), late_policy, penalty."""
        deadline = self.deadline
        return {"received": _when(self._received_here(), seconds=True),
                "due": _when(deadline.due) if deadline else "",
                "late_by": clock(self.seconds_late) if self.seconds_late else "",
                "late_policy": deadline.policy if deadline else "",
                "penalty": f"{penalty or 0:g}" if deadline else ""}


def submission_times(root: str | Path, chapters: list[str]) -> dict[tuple[str, str], SubmissionTime]:
    """Every submission autograder/received.json knows, against the course's schedule. {} without
    received.json (a learner grading their own work): grading is then exactly as before."""
    received = read_received(Path(root) / RECEIVED)
    if not received:
        return {}
    schedule = load(root, chapters)
    return {(login, chapter): SubmissionTime(when, schedule.deadline(chapter, login))
            for (login, chapter), when in received.items()}


# -- words -------------------------------------------------------------------------------------------


def _when(moment: dt.datetime, seconds: bool | None = None) -> str:
    """'2027-03-01 23:59 +08:00' (seconds shown when it has any, or when asked)."""
    show = seconds if seconds is not None else bool(moment.second or moment.microsecond)
    offset = moment.strftime("%z")
    zone = "UTC" if offset in ("+0000", "") else f"{offset[:3]}:{offset[3:]}"
    return moment.strftime("%Y-%m-%d %H:%M:%S" if show else "%Y-%m-%d %H:%M") + f" {zone}"


def clock(seconds: float) -> str:
    """H:MM:SS, hours unbounded (a spreadsheet reads it as a duration)."""
    whole = math.ceil(seconds)
    return f"{whole // 3600}:{whole % 3600 // 60:02d}:{whole % 60:02d}"


def duration(seconds: float, language: str = "en") -> str:
    """'1 d 2 h 5 min 3 s', '40 s' (Chinese: '1 天 2 小时 5 分钟 3 秒'); a started second counts."""
    whole = math.ceil(seconds)
    units = [(86400, "d", "天"), (3600, "h", "小时"), (60, "min", "分钟"), (1, "s", "秒")]
    parts = []
    for size, en, zh in units:
        if whole >= size:
            parts.append(f"{whole // size} {zh if language == 'zh' else en}")
            whole %= size
    return " ".join(parts) or ("0 秒" if language == "zh" else "0 s")


def policy_words(policy: str, language: str = "en") -> str:
    found = POLICY.match(policy)
    if policy == "cutoff":
        return "截止时间之后收到的提交记 0 分" if language == "zh" else "a submission received after the due date scores 0"
    if found and found.group(2):
        points, unit = f"{float(found.group(3)):g}", found.group(2)
        if language == "zh":
            name = "小时" if unit == "hour" else "天"
            return f"每迟交一{name}扣 {points} 分（不足一{name}按一{name}计），最低 0 分"
        return f"{points} points off for every started {unit} late, never below 0"
    return "迟交不扣分，只标为迟交" if language == "zh" else "no points off, marked late"


# -- showing the due date to students (classhub.py release) -------------------------------------------

DUE_CELL_ID = "course-due-date"
DUE_CELL_MARK = {"course": {"due_date": True}}  # the stamp's cell metadata: found again on the next release


def due_text(deadline: Deadline, language: str = "en") -> str:
    """The released notebook's first cell: the class's due date and what a late submission costs."""
    if language == "zh":
        return (f"**截止时间：{_when(deadline.class_due)}。** 以课程服务器收到提交的时间为准：请在此之前在 "
                f"**Assignments** 标签页中点击 **Submit**（提交）。迟交：{policy_words(deadline.policy, 'zh')}。"
                "如果老师给了你延期，以你的延期为准。")
    return (f"**Due: {_when(deadline.class_due)}.** What counts is when the course's server receives your "
            f"submission: press **Submit** in the **Assignments** tab before then. Late: "
            f"{policy_words(deadline.policy)}. An extension your instructor gave you counts instead.")


def stamp_release(notebook: str | Path, deadline: Deadline | None, language: str = "en") -> bool:
    """Put the due date in the released notebook's first cell (the exchange's outbound copy, which
    students fetch; never chapters/, which is committed). Replaces an earlier stamp; removes it when
    the chapter no longer has a due date. Returns whether the notebook changed."""
    path = Path(notebook)
    data = json.loads(path.read_text(encoding="utf-8"))
    cells = [c for c in data.get("cells", []) if c.get("metadata", {}).get("course", {}).get("due_date") is not True]
    if deadline is not None:
        cell = {"cell_type": "markdown", "metadata": DUE_CELL_MARK, "source": due_text(deadline, language)}
        if (data.get("nbformat"), data.get("nbformat_minor", 0)) >= (4, 5):  # cell ids exist from nbformat 4.5
            cell = {"id": DUE_CELL_ID, **cell}
        cells.insert(0, cell)
    if cells == data.get("cells"):
        return False
    data["cells"] = cells
    work = path.with_name(f".{path.name}.tmp")
    work.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    work.chmod(path.stat().st_mode & 0o777)
    work.replace(path)
    return True


def main(argv=None) -> int:
    """`python deploy/hub/schedule.py check [--roster roster.csv]`: read both files, say what is wrong."""
    import argparse
    import sys

    root = Path(__file__).resolve().parent.parent.parent
    parser = argparse.ArgumentParser(description="check deploy/hub/schedule.csv and extensions.csv")
    parser.add_argument("step", choices=["check"])
    parser.add_argument("--roster", help="also check that every extension names a student on this roster")
    args = parser.parse_args(argv)
    chapters = sorted(p.name for p in (root / "chapters").iterdir() if (p / f"{p.name}.ipynb").is_file())
    try:
        logins = None
        if args.roster:
            sys.path.insert(0, str(Path(__file__).resolve().parent))
            from roster import read_roster

            logins = {p.login for p in read_roster(args.roster) if not p.is_instructor}
        schedule = load(root, chapters, logins)
    except (ScheduleError, ValueError) as exc:
        print(f"schedule: {exc}", file=sys.stderr)
        return 1
    for chapter, (due, policy) in sorted(schedule.chapters.items()):
        print(f"{chapter}: due {_when(due)}, late policy {policy}")
    print(f"{len(schedule.chapters)} chapters with a due date, {len(schedule.extensions)} extensions")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
