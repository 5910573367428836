"""The instructor's collect on Kubernetes: the one-server screen, with the hub's uids.

    cd /srv/course && python deploy/kubernetes/collect.py [--roster roster.csv] [CHAPTER ...]

Run from an instructor's Terminal, in the course directory. For each edition it hands the shared
exchange to deploy/hub/exchange.py's `collect_safely` (the same screen `sudo make collect` runs on
one server), with the uid each roster login's server runs as (course_config.py's `roster_uids`: no
/etc/passwd on Kubernetes) and the course's own checks of a submission (classhub.py's: a student of
that edition, holding that chapter's notebook). What passes is copied into a private staging
exchange, the time the exchange received it is recorded (classhub.py's autograder/received.json,
which `make grade`'s late rules read), and `nbgrader collect --update` takes it from there into
autograder/submitted/, a newer submission replacing an older one. Each entry set aside gets one
line, and stays in the exchange's `<course>/set-aside/` folder.

    python deploy/kubernetes/collect.py --dry-run [CHAPTER ...]   # what it would do; changes nothing

The exchange must be laid out as README.md (step 2) says, so that the screen may set entries aside:
the root root's, each course's folders the collecting instructor's.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shlex
import stat
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
COURSE = HERE.parent.parent  # the course directory this copy of the script belongs to
sys.path.insert(0, str(HERE.parent / "hub"))
import classhub  # noqa: E402  (the one server's course checks)
import exchange as exchange_rules  # noqa: E402  (the screen)


def _course_config():
    """course_config.py as a module: the hub's own roster reader and uids, not a copy of them."""
    spec = importlib.util.spec_from_file_location("course_config", HERE / "course_config.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


course_config = _course_config()


def read_people(roster: Path) -> list[dict]:
    if not roster.is_file():
        raise SystemExit(f"collect: no roster at {roster}: copy the hub's roster.csv there, or name it with --roster")
    try:
        people = course_config.read_roster(str(roster))
    except ValueError as exc:
        raise SystemExit(f"collect: {exc}") from None
    return [{"login": login, "role": role, "language": language} for login, (role, language) in people.items()]


def uids(people: list[dict]) -> dict[str, int]:
    try:
        return course_config.roster_uids(p["login"] for p in people)
    except ValueError as exc:  # the hub refuses the same roster
        raise SystemExit(f"collect: {exc}") from None


def layout_problems(exchange: Path, course_ids: list[str], owner: int) -> list[str]:
    """The one-server layout (exchange.py), with the course folders the collecting instructor's:
    on Kubernetes nobody is root, and only an inbound folder's owner may set entries aside."""
    problems = []
    for path, mode in exchange_rules.layout(exchange, course_ids):
        want = 0 if path == exchange else owner
        try:
            info = os.lstat(path)
        except FileNotFoundError:
            problems.append(f"{path} is missing")
            if path == exchange:
                break
            continue
        if not stat.S_ISDIR(info.st_mode):
            problems.append(f"{path} is not a folder")
        elif info.st_uid != want or stat.S_IMODE(info.st_mode) != mode:
            problems.append(f"{path} is uid {info.st_uid}, mode {stat.S_IMODE(info.st_mode):04o}; "
                            f"it must be uid {want}, mode {mode:04o}")
    return problems


def nbgrader_collect(course_id: str, chapter: str, staging: Path) -> list[str]:
    # --update: a resubmission replaces the one collected before
    return [sys.executable, "-m", "nbgrader", "collect", chapter, "--update",
            f"--CourseDirectory.course_id={course_id}", f"--Exchange.root={staging}"]


def collect(people: list[dict], chapters: list[str], exchange: Path, course: Path = COURSE,
            dry_run: bool = False, run=subprocess.run, say=print) -> int:
    uid_of = uids(people)
    problems = layout_problems(exchange, [course_id for course_id, _ in classhub.EDITIONS.values()], os.getuid())
    if problems and not dry_run:
        raise SystemExit(f"collect: the exchange is not laid out as README.md (step 2) says: {problems[0]}")
    for problem in problems:
        say(f"the exchange is not laid out as README.md (step 2) says: {problem}")
    staging = course / "autograder" / ".exchange-staging"
    hub = {"people": people, "exchange": str(exchange)}
    env = dict(os.environ)
    env.setdefault("JUPYTER_CONFIG_PATH", str(course / "autograder"))  # the instructor's server sets its own
    collected = set_aside = 0
    for language, (course_id, folder) in classhub.EDITIONS.items():
        aside = exchange / course_id / "set-aside"  # beside inbound/: setting aside is a rename
        if dry_run:
            say(f"would screen {exchange / course_id / 'inbound'} ({', '.join(chapters)}) into {staging}, "
                f"setting aside into {aside}, with the uids {uid_of}")
            for chapter in chapters:
                say("would run: " + shlex.join(nbgrader_collect(course_id, chapter, staging)))
            continue
        entries, lines = exchange_rules.collect_safely(exchange, course_id, chapters, uid_of, staging, aside,
                                                       judge=classhub._judge(hub, language, folder))
        # when the exchange received each one (autograder/received.json): make grade's late rules read it
        for line in lines + classhub.record_received(entries):
            say(line)
        for chapter in sorted({entry.chapter for entry in entries}):
            run(nbgrader_collect(course_id, chapter, staging), cwd=course, env=env, check=True)
        collected, set_aside = collected + len(entries), set_aside + len(lines)
    if not dry_run:
        say(f"collected {collected}, set aside {set_aside}")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("chapters", nargs="*", help="chapters to collect (default: every chapter)")
    ap.add_argument("--roster", type=Path, default=COURSE / "roster.csv", help="the hub's roster (login,name,role,language)")
    ap.add_argument("--exchange", type=Path, default=Path(os.environ.get("NBGRADER_EXCHANGE", "/srv/nbgrader/exchange")))
    ap.add_argument("--dry-run", action="store_true", help="say what would be screened and run; change nothing")
    args = ap.parse_args(argv)
    people = read_people(args.roster)
    known = sorted(p.name for p in (COURSE / "chapters").iterdir() if (p / f"{p.name}.ipynb").is_file())
    unknown = [c for c in args.chapters if c not in known]
    if unknown:
        raise SystemExit(f"collect: no chapter {', '.join(unknown)} (the chapters: {', '.join(known)})")
    return collect(people, args.chapters or known, args.exchange, dry_run=args.dry_run)


if __name__ == "__main__":
    sys.exit(main())
