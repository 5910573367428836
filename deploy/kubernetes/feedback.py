"""The instructor's feedback on Kubernetes: the one-server `make hub-feedback`, from the roster.

    cd /srv/course && python deploy/kubernetes/feedback.py [--roster roster.csv] [CHAPTER ...]

Run from an instructor's Terminal, in the course directory, after `make grade`. nbgrader's
release_feedback names each student's page by a hash of the secret their submission carries, and
reads that secret and the submission's timestamp from the page's folder; `make grade` writes the page
but not those two files, so `nbgrader release_feedback` alone stops with FileNotFoundError. As
classhub.py's `feedback` does on one server, this copies `timestamp.txt` and `submission_secret.txt`
from autograder/submitted/<login>/<chapter>/ into autograder/feedback/<login>/<chapter>/, skips (one
line each) a page not graded yet or graded from an older submission than the one collected now
(autograder/graded.json), and releases each edition's pages into its own course of the exchange
(`transformer-course`, `transformer-course-zh`) with classhub.py's own nbgrader step.

    python deploy/kubernetes/feedback.py --dry-run [CHAPTER ...]   # what it would release; changes nothing
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _collect():
    """collect.py as a module (the roster as the hub reads it; it imports classhub.py). Loaded by path:
    on sys.path this folder's feedback.py would hide autograder's feedback module."""
    spec = importlib.util.spec_from_file_location("course_collect", HERE / "collect.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


collect = _collect()
classhub = collect.classhub  # the one server's feedback rules and its nbgrader step

COURSE = collect.COURSE
PASSED_ON = ("timestamp.txt", "submission_secret.txt")  # what release_feedback reads beside each page


def graded_submissions(course: Path) -> dict:
    """autograder/graded.json's {login: {chapter: {"submission": sha256, ...}}} (autograder/regrade.py):
    what each page was graded from; {} without a usable record."""
    try:
        record = json.loads((course / "autograder" / "graded.json").read_text())
    except (OSError, ValueError):
        return {}
    submissions = record.get("submissions") if isinstance(record, dict) else None
    return submissions if isinstance(submissions, dict) else {}


def ready_pages(people: list[dict], chapters: list[str], course: Path = COURSE, dry_run: bool = False,
                say=print) -> dict[str, dict[str, list[str]]]:
    """{language: {chapter: [logins]}}: the pages graded from the submission collected now, with the two
    files release_feedback reads copied beside them (not in a dry run). The others get one line each."""
    submitted, pages = course / "autograder" / "submitted", course / "autograder" / "feedback"
    graded = graded_submissions(course)
    ready = {language: {} for language in classhub.EDITIONS}
    for person in people:
        login = person["login"]
        for chapter in chapters:
            folder, page = submitted / login / chapter, pages / login / chapter / f"{chapter}.html"
            if not all((folder / name).exists() for name in PASSED_ON):
                continue  # nothing collected (nbgrader collect copies both with each submission)
            if not page.exists():
                say(f"{login} / {chapter}: not graded yet (run make grade first)")
                continue
            notebook = folder / f"{chapter}.ipynb"
            entry = graded[login].get(chapter) if isinstance(graded.get(login), dict) else None
            if isinstance(entry, dict) and notebook.exists() and entry.get("submission") != classhub._digest(notebook):
                say(f"{login} / {chapter}: resubmitted since it was graded (run make grade first)")
                continue
            if not dry_run:
                for name in PASSED_ON:
                    shutil.copyfile(folder / name, page.parent / name)
            ready[person["language"]].setdefault(chapter, []).append(login)
    return ready


def left_out(course: Path, chapter: str, released: list[str], people: list[dict]) -> list[str]:
    """Every login but `released` that has a feedback folder for `chapter` or is on the roster:
    release_feedback takes every page it finds, and one without its two files stops it (a student of
    the other edition, one who resubmitted, one no longer on the roster)."""
    folders = course / "autograder" / "feedback"
    logins = {p.name for p in folders.iterdir() if (p / chapter).is_dir()} if folders.is_dir() else set()
    return sorted((logins | {p["login"] for p in people}) - set(released))


def feedback(people: list[dict], chapters: list[str], exchange: Path, course: Path = COURSE,
             dry_run: bool = False, release=classhub.exchange_step, say=print) -> int:
    ready = ready_pages(people, chapters, course, dry_run, say)
    released = 0
    for language, by_chapter in ready.items():
        course_id = classhub.EDITIONS[language][0]
        for chapter, logins in sorted(by_chapter.items()):
            if dry_run:
                say(f"would release {chapter} to {course_id} in {exchange}: {', '.join(logins)}")
                continue
            release("feedback", language, [chapter], exchange, exclude=left_out(course, chapter, logins, people))
            released += len(logins)
    if not dry_run:
        say(f"feedback released: {released} pages")
    elif not any(ready.values()):
        say("would release nothing: no page graded from the submission collected now")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("chapters", nargs="*", help="chapters whose feedback to release (default: every chapter)")
    ap.add_argument("--roster", type=Path, default=COURSE / "roster.csv", help="the hub's roster (login,name,role,language)")
    ap.add_argument("--exchange", type=Path, default=Path(os.environ.get("NBGRADER_EXCHANGE", "/srv/nbgrader/exchange")))
    ap.add_argument("--dry-run", action="store_true", help="say what would be released; change nothing")
    args = ap.parse_args(argv)
    if not args.roster.is_file():
        raise SystemExit(f"feedback: no roster at {args.roster}: copy the hub's roster.csv there, or name it with --roster")
    people = collect.read_people(args.roster)
    try:
        chapters = classhub._wanted(args.chapters)
        return feedback(people, chapters, args.exchange, dry_run=args.dry_run)
    except classhub.ClassError as exc:
        raise SystemExit(f"feedback: {exc}") from None


if __name__ == "__main__":
    sys.exit(main())
