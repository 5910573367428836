"""Old resubmissions out of the exchange's inbound folders, on request.

    sudo make hub-prune          # python3 deploy/hub/prune.py

nbgrader's collect copies an inbound entry and leaves it there, so every resubmission stays in
`inbound/` for the whole term. For each course in the exchange, student and chapter, this keeps

* the newest entry, by the time the exchange received it (the latest change time of the entry and
  all it holds, as `make collect` reckons it: the next collect takes this one), and
* the entry `make collect` last took (`autograder/received.json` names it: its grade came from it),

and moves every other one into `<course>/pruned/`, a folder only root can enter, one line each.
It renames only (an entry that is a link moves as the link), reads no file, and follows nothing.
Delete `pruned/` yourself once `make hub-backup` holds it.
"""

from __future__ import annotations

import os
import secrets
import stat
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import backup  # noqa: E402  (the walk that never follows; where the exchange is)

DIR_FLAGS = backup.DIR_FLAGS


class PruneError(RuntimeError):
    """One line for the instructor."""


def received_at(inbound_fd: int, name: str) -> int:
    """The latest ctime of the entry and everything in it (nanoseconds)."""
    st = os.stat(name, dir_fd=inbound_fd, follow_symlinks=False)
    latest = st.st_ctime_ns
    if stat.S_ISDIR(st.st_mode) and (fd := backup.open_dir(name, inbound_fd, st)) is not None:
        try:
            latest = max([latest] + [info.st_ctime_ns for *_, info in backup.walk(fd)])
        finally:
            os.close(fd)
    return latest


def _root_folder(parent_fd: int, name: str, make: bool) -> int:
    """A descriptor of root's folder `name` (0700 when made here); a link or someone else's is refused."""
    if make:
        try:
            os.mkdir(name, 0o700, dir_fd=parent_fd)
            os.chown(name, 0, 0, dir_fd=parent_fd, follow_symlinks=False)
        except FileExistsError:
            pass
    st = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != 0:
        kind = "a link" if stat.S_ISLNK(st.st_mode) else "not a folder of root's"
        raise PruneError(f"{name} is {kind}")
    fd = backup.open_dir(name, parent_fd, st)
    if fd is None:
        raise PruneError(f"{name} changed while it was being opened")
    if make and st.st_mode & 0o077:
        os.fchmod(fd, 0o700)  # what it holds is students' work: root's alone
    return fd


def _groups(inbound_fd: int) -> dict[tuple[str, str], list[tuple[int, str]]]:
    """(student, chapter) -> [(received, entry name)] of the entries named as nbgrader names them."""
    groups: dict = {}
    for name in os.listdir(inbound_fd):
        parts = name.split("+")
        if len(parts) < 3:
            continue  # not a submission's name: make collect sets it aside
        try:
            groups.setdefault((parts[0], parts[1]), []).append((received_at(inbound_fd, name), name))
        except FileNotFoundError:
            continue
    return groups


def _shown(name: str) -> str:
    """A student's entry name as one line of the terminal (no newline or escape in it)."""
    return name if name.isprintable() else ascii(name)


def _move(inbound_fd: int, pruned_fd: int, name: str) -> None:
    target = name
    while True:
        try:
            os.stat(target, dir_fd=pruned_fd, follow_symlinks=False)
            target = f"{name}.{secrets.token_hex(2)}"
        except FileNotFoundError:
            break
    os.rename(name, target, src_dir_fd=inbound_fd, dst_dir_fd=pruned_fd)  # rename never follows a link


def prune_course(course_fd: int, course_id: str, collected: dict, out=print) -> tuple[int, int]:
    """Prune one course's inbound/; returns (moved, kept)."""
    inbound_fd = _root_folder(course_fd, "inbound", make=False)
    pruned_fd = None
    moved = kept = 0
    try:
        for (student, chapter), entries in sorted(_groups(inbound_fd).items()):
            newest = max(entries)[1]
            taken = collected.get(student, {}).get(chapter, {}).get("entry")
            keep = {newest, taken}
            for _, name in sorted(entries):
                if name in keep:
                    kept += 1
                    continue
                pruned_fd = pruned_fd if pruned_fd is not None else _root_folder(course_fd, "pruned", make=True)
                try:
                    _move(inbound_fd, pruned_fd, name)
                except FileNotFoundError:
                    continue  # its student removed it meanwhile
                moved += 1
                out(f"moved {course_id}/inbound/{_shown(name)} to {course_id}/pruned/ ({student} / {chapter}: "
                    "neither the newest nor the collected one)")
    finally:
        os.close(inbound_fd)
        if pruned_fd is not None:
            os.close(pruned_fd)
    return moved, kept


def prune(exchange: Path, received: dict, out=print) -> tuple[int, int]:
    """Every course folder of the exchange that has an inbound/; returns (moved, kept)."""
    collected = received.get("submissions", {}) if isinstance(received, dict) else {}
    try:
        root_fd = os.open(exchange, DIR_FLAGS)
    except FileNotFoundError:
        raise PruneError(f"no exchange at {exchange}") from None
    moved = kept = 0
    try:
        for course_id in sorted(os.listdir(root_fd)):
            st = os.stat(course_id, dir_fd=root_fd, follow_symlinks=False)
            if not stat.S_ISDIR(st.st_mode) or st.st_uid != 0:
                continue  # set aside by make hub's checks, not a course of root's
            course_fd = backup.open_dir(course_id, root_fd, st)
            if course_fd is None:
                continue
            try:
                m, k = prune_course(course_fd, course_id, collected, out)
                moved, kept = moved + m, kept + k
            except FileNotFoundError:
                continue  # no inbound/: not a course folder
            except PruneError as exc:
                out(f"{course_id}: not pruned: {exc}")
            finally:
                os.close(course_fd)
    finally:
        os.close(root_fd)
    out(f"pruned {moved} old submissions into each course's pruned/ (root only); kept {kept}: the newest "
        "and the collected one of each student and chapter")
    return moved, kept


def main() -> int:
    if os.geteuid() != 0:
        print("prune.py: make hub-prune must run as root (sudo make hub-prune): the inbound folders are root's",
              file=sys.stderr)
        return 1
    try:
        hub = backup.read_json(backup.state_dir() / "class.json")
        exchange = Path(hub.get("exchange") or os.environ.get("COURSE_EXCHANGE") or "/srv/nbgrader/exchange")
        prune(exchange, backup.read_json(backup.ROOT / "autograder" / "received.json"))
        return 0
    except (PruneError, backup.BackupError) as exc:
        print(f"prune.py: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
