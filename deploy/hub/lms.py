"""The class's grades in the CSV forms Canvas and Moodle import, next to nbgrader's grades.csv.

    make grades-lms [ROSTER=roster.csv] [CHAPTERS="02_self_attention ..."]

reads `autograder/grades.csv` (nbgrader export, one row per student and chapter: `score` is after the
late penalty) and `autograder/report.csv` (a row for every submission graded), and writes, one row per
student of the roster (ROSTER, or the class's roster from `make hub`), one column per chapter:

* `autograder/grades-canvas.csv`, Canvas's Gradebook import. Its header and second row are those
  of Canvas's own Gradebook export (lib/gradebook_exporter.rb): `Student,ID,SIS User ID,SIS Login
  ID,Section`, one column per assignment, then a `    Points Possible` row. Canvas's importer
  (app/models/gradebook_importer.rb) needs the header's first cell to contain "Student", its second
  "ID", and "Section" right after the SIS columns; it finds each student by ID, then SIS User ID,
  then SIS Login ID, then name. The roster's login goes in `SIS Login ID` (the same login LTI 1.3
  hands the hub); ID, SIS User ID and Section stay empty. A chapter column matches the Canvas
  assignment of that exact name, or becomes a new assignment with the Points Possible given.
* `autograder/grades-moodle.csv`, Moodle's "Import grades from CSV": `Username,Full name`, then one
  column per chapter. Map `Username` to *username* and each chapter to its grade item.
  Moodle's file has no place for maximum points: give each grade item the maximum this command
  prints (an item Moodle creates from the file is out of 100).

A student with no submission gets no grade, not 0: an empty cell for Canvas, `-` for Moodle (an
empty cell would make a new Moodle grade item hold an empty grade; `-` is "no grade" to both of
Moodle's paths and is what its own export writes). A submission that scored 0 gets 0. Both files
are UTF-8 with a byte-order mark: Excel opens a file without one as the local code page (王小明
becomes mojibake), Moodle strips it (csv_import_reader) and Canvas's importer only looks for
"Student" inside the first cell, as its own export can carry one too.
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(HERE))
import backup  # noqa: E402  (where the hub's state is, without nbgrader)
from roster import RosterError, read_roster  # noqa: E402

CANVAS_COLUMNS = ["Student", "ID", "SIS User ID", "SIS Login ID", "Section"]
MOODLE_COLUMNS = ["Username", "Full name"]
POINTS_POSSIBLE = "    Points Possible"  # as Canvas's export writes it; its importer looks for the words


class LmsError(RuntimeError):
    """One line for the instructor."""


def number(value: float) -> str:
    """At most two decimals, as Canvas shows them, without trailing zeros: 9, 6.5, 0.33."""
    return f"{round(value, 2):.2f}".rstrip("0").rstrip(".")


def text(value: str) -> str:
    """A name as a spreadsheet shows it: a leading = + - @ would make Excel read a formula."""
    return "'" + value if value[:1] in ("=", "+", "-", "@", "\t", "\r") else value


def read_grades(grades: Path, report: Path) -> tuple[dict, dict]:
    """({(student, chapter): score after the penalty, for submissions only}, {chapter: max points})."""
    try:
        with open(grades, newline="", encoding="utf-8") as f:
            rows = list(csv.DictReader(f))
    except FileNotFoundError:
        raise LmsError(f"no {grades}: run `make grade` first") from None
    graded = set()
    if report.exists():
        with open(report, newline="", encoding="utf-8") as f:
            graded = {(row["student"], row["chapter"]) for row in csv.DictReader(f)}
    scores, maxima = {}, {}
    for row in rows:
        key = (row["student_id"], row["assignment"])
        maxima[row["assignment"]] = float(row["max_score"] or 0)
        # nbgrader's export gives a student who never submitted a 0 with no timestamp; a graded
        # submission is in report.csv (outside a hub its timestamp may be empty too).
        if key in graded or row.get("timestamp", "-") != "":
            scores[key] = float(row["score"] or 0)
    return scores, maxima


def students(roster: Path | None) -> list[tuple[str, str]]:
    """(login, name) of each student, in roster order: the ROSTER file, or the class's (class.json)."""
    if roster is not None:
        return [(p.login, p.name) for p in read_roster(roster) if not p.is_instructor]
    people = backup.read_json(backup.state_dir() / "class.json").get("people")
    if not people:
        raise LmsError("no roster: give one (make grades-lms ROSTER=roster.csv), or start the class with make hub")
    return [(p["login"], p["name"]) for p in people if p["role"] == "student"]


def canvas_rows(people, chapters, scores, maxima) -> list[list[str]]:
    rows = [CANVAS_COLUMNS + chapters,
            [POINTS_POSSIBLE, "", "", "", ""] + [number(maxima.get(c, 0)) for c in chapters]]
    for login, name in people:
        cells = [number(scores[login, c]) if (login, c) in scores else "" for c in chapters]
        rows.append([text(name), "", "", login, ""] + cells)
    return rows


def moodle_rows(people, chapters, scores) -> list[list[str]]:
    rows = [MOODLE_COLUMNS + chapters]
    for login, name in people:
        rows.append([login, text(name)] + [number(scores[login, c]) if (login, c) in scores else "-" for c in chapters])
    return rows


def write(path: Path, rows: list[list[str]]) -> None:
    work = path.with_name(path.name + ".tmp")
    with open(work, "w", newline="", encoding="utf-8-sig") as f:  # utf-8-sig: the byte-order mark
        csv.writer(f).writerows(rows)  # RFC 4180: CRLF, quotes only where needed
    work.replace(path)


def export(course: Path, people: list[tuple[str, str]], chapters: list[str] | None = None,
           out=print) -> tuple[Path, Path]:
    grading = course / "autograder"
    scores, maxima = read_grades(grading / "grades.csv", grading / "report.csv")
    unknown = sorted(set(chapters or []) - set(maxima))
    if unknown:
        raise LmsError(f"no chapter {', '.join(unknown)} in grades.csv (it has {', '.join(sorted(maxima)) or 'none'})")
    # By default the chapters someone handed in: a chapter no one has submitted yet would become an
    # empty assignment in the LMS.
    chapters = chapters or sorted({chapter for _, chapter in scores} & set(maxima))
    logins = {login for login, _ in people}
    for student in sorted({s for s, _ in scores} - logins):
        out(f"{student} has grades but is not a student on the roster: left out")
    canvas, moodle = grading / "grades-canvas.csv", grading / "grades-moodle.csv"
    write(canvas, canvas_rows(people, chapters, scores, maxima))
    write(moodle, moodle_rows(people, chapters, scores))
    out(f"wrote {canvas} (Canvas: Grades > Import) and {moodle} (Moodle: Grades > Import > CSV file): "
        f"{len(people)} students, {len(chapters)} chapters")
    if chapters:
        out("maximum points, for Moodle's grade items: " + ", ".join(f"{c} {number(maxima[c])}" for c in chapters))
    return canvas, moodle


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--roster", type=Path, help="the roster CSV (default: the class's, from make hub)")
    parser.add_argument("chapters", nargs="*", help="these chapters (default: every chapter someone submitted)")
    args = parser.parse_args(argv)
    try:
        export(ROOT, students(args.roster), args.chapters)
        return 0
    except (LmsError, RosterError, backup.BackupError) as exc:
        print(f"lms.py: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
