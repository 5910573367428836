"""nbgrader's exchange on a shared server, held against the students who write into it.

The exchange is the one folder every student writes into, so root treats it as hostile ground:

* **Its layout is root's.** `prepare` creates the exchange root and every course folder the hub
  serves (`inbound/`, `outbound/`, `feedback/`) before any student can log in, and `verify` refuses,
  naming the path, any of them that is a link, is not root's, or has another mode than these:

      exchange root       0755  students pass through; nobody else creates, renames or removes a course
      <course>/outbound   0755  released chapters, read by everyone
      <course>/inbound    3733  write without listing (nbgrader's 2733) plus the sticky bit: a student
                                cannot rename or remove an entry that is not theirs
      <course>/feedback   0711  pages fetched by a name only the submitter can compute

  nbgrader's own classes want a world-writable root (and its release makes it 0777 again); the
  course's classes in course_exchange.py only ask to pass through it.

* **Collect reads, never follows.** `collect_safely` walks each inbound entry through file
  descriptors (`O_NOFOLLOW`, `lstat`), and copies what it accepts, byte by byte, into a staging
  exchange only root can enter; nbgrader's collect then reads the staging copy. An entry is set
  aside, with one line saying why, when it is a link or holds one, holds a named pipe, socket or
  device, holds a file or folder that is not the student's (a hard link to someone else's file),
  is not owned by the student it names, or holds more than `COLLECT_MAX_FILES` files (50) or
  `COLLECT_MAX_MB` megabytes (20). One bad entry never stops the others.

* **The time is the server's.** A submission counts at the time the exchange received it: the
  latest change time (ctime, which only the kernel sets) of the entry and everything in it, as
  root reads it when collecting. The student's own `timestamp.txt` is kept as their claim; the
  staged copy carries the server's time, so nbgrader's late-submission rules apply to it.
"""

from __future__ import annotations

import datetime
import os
import pwd
import secrets
import shutil
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

# nbgrader's own timestamp format (nbgrader.exchange.abc.Exchange.timestamp_format)
TIMESTAMP_FORMAT = "%Y-%m-%d %H:%M:%S.%f %Z"
ROOT_MODE = 0o755
FOLDER_MODES = {"outbound": 0o755, "inbound": 0o3733, "feedback": 0o711}
MAX_DEPTH = 8


class ExchangeError(RuntimeError):
    """One line for the instructor, naming the path."""


# -- the layout ------------------------------------------------------------------------------------


def layout(root: Path, course_ids: list[str]) -> list[tuple[Path, int]]:
    """Every folder the exchange must have, with its mode, parents first."""
    folders = [(root, ROOT_MODE)]
    for course_id in course_ids:
        folders.append((root / course_id, 0o755))
        folders += [(root / course_id / name, mode) for name, mode in FOLDER_MODES.items()]
    return folders


def _problem(path: Path, mode: int) -> str | None:
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return f"the exchange folder {path} is missing: run `sudo make hub` to create it"
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        return f"{path} is not a folder but a {'link' if stat.S_ISLNK(info.st_mode) else 'file'}: move it aside and run `sudo make hub` again"
    if info.st_uid != 0:
        return (f"the exchange folder {path} belongs to {_name(info.st_uid)}, not root (a student may have taken "
                "it): move it aside and run `sudo make hub` again")
    if stat.S_IMODE(info.st_mode) != mode:
        return (f"the exchange folder {path} has mode {stat.S_IMODE(info.st_mode):04o}, not {mode:04o}: "
                f"`chmod {mode:04o} {path}` if you changed it yourself")
    return None


def verify(root: Path, course_ids: list[str]) -> None:
    for path, mode in layout(root, course_ids):
        problem = _problem(path, mode)
        if problem:
            raise ExchangeError(problem)


def prepare(root: Path, course_ids: list[str]) -> None:
    """Create what is missing (root's, with its mode), then verify everything: a folder that was
    already there is never changed, only refused."""
    for path, mode in layout(root, course_ids):
        if not os.path.lexists(path):
            path.mkdir(parents=path == root, exist_ok=True)
            os.chown(path, 0, 0)
            os.chmod(path, mode)  # mkdir's mode is masked by the umask and drops the sticky bit
    verify(root, course_ids)


# -- reading an entry ------------------------------------------------------------------------------


def _name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


@dataclass
class Limits:
    max_files: int = field(default_factory=lambda: int(os.environ.get("COLLECT_MAX_FILES") or 50))
    max_bytes: int = field(default_factory=lambda: int(float(os.environ.get("COLLECT_MAX_MB") or 20) * 1_000_000))


class SetAside(Exception):
    """Why an entry is not collected (the rest of one line)."""


@dataclass
class Entry:
    name: str
    student: str
    chapter: str
    files: dict[str, bytes]  # relative path -> content
    received: float  # the server's time: the latest ctime of the entry and all it holds
    claimed: str | None = None  # the student's own timestamp.txt

    @property
    def received_text(self) -> str:
        return datetime.datetime.fromtimestamp(self.received, datetime.timezone.utc).strftime(TIMESTAMP_FORMAT)


_KINDS = {stat.S_IFIFO: "a named pipe", stat.S_IFSOCK: "a socket", stat.S_IFCHR: "a device",
          stat.S_IFBLK: "a device", stat.S_IFLNK: "a symbolic link"}


def _walk(folder_fd: int, prefix: str, uid: int, limits: Limits, found: dict, depth: int) -> float:
    """Read every regular file under the open folder into `found`; returns the latest ctime seen."""
    if depth > MAX_DEPTH:
        raise SetAside(f"its folders nest deeper than {MAX_DEPTH}")
    latest = os.fstat(folder_fd).st_ctime
    for item in sorted(os.listdir(folder_fd)):
        where = f"{prefix}{item}"
        info = os.stat(item, dir_fd=folder_fd, follow_symlinks=False)
        kind = stat.S_IFMT(info.st_mode)
        if kind in _KINDS:
            raise SetAside(f"it holds {_KINDS[kind]} ({_shown(where)})")
        if info.st_uid != uid:
            raise SetAside(f"it holds {_shown(where)}, which belongs to {_name(info.st_uid)}")
        if len(found) + 1 > limits.max_files:
            raise SetAside(f"it holds more than {limits.max_files} files")
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0)
        if kind == stat.S_IFDIR:
            fd = os.open(item, flags | os.O_DIRECTORY, dir_fd=folder_fd)
            try:
                found[where + "/"] = b""
                latest = max(latest, _walk(fd, where + "/", uid, limits, found, depth + 1))
            finally:
                os.close(fd)
            continue
        fd = os.open(item, flags, dir_fd=folder_fd)
        try:
            opened = os.fstat(fd)
            if (opened.st_ino, opened.st_dev) != (info.st_ino, info.st_dev) or not stat.S_ISREG(opened.st_mode):
                raise SetAside(f"{_shown(where)} changed while it was being read")
            budget = limits.max_bytes - sum(len(v) for v in found.values())
            with os.fdopen(os.dup(fd), "rb") as f:
                content = f.read(budget + 1)
            if len(content) > budget:
                raise SetAside(f"it holds more than {limits.max_bytes / 1e6:g} MB")
            found[where] = content
            latest = max(latest, os.fstat(fd).st_ctime)  # after reading: a change made meanwhile counts
        finally:
            os.close(fd)
    return latest


def read_entry(inbound_fd: int, name: str, uid_of: dict[str, int], limits: Limits) -> Entry:
    """One inbound entry, read without following a link; SetAside says why it cannot be taken."""
    parts = name.split("+")
    if len(parts) < 3:
        raise SetAside("its name is not a submission's (student+chapter+time+code)")
    student, chapter = parts[0], parts[1]
    info = os.stat(name, dir_fd=inbound_fd, follow_symlinks=False)
    if stat.S_ISLNK(info.st_mode):
        raise SetAside("it is a symbolic link")
    if not stat.S_ISDIR(info.st_mode):
        raise SetAside(f"it is {_KINDS.get(stat.S_IFMT(info.st_mode), 'a file')}, not a folder")
    if student not in uid_of:
        raise SetAside(f"{student} is not a student on the roster")
    if info.st_uid != uid_of[student]:
        raise SetAside(f"it claims to be {student}'s but was written by {_name(info.st_uid)}")
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(name, flags, dir_fd=inbound_fd)
    except OSError:
        raise SetAside("it changed while it was being read") from None
    try:
        files: dict[str, bytes] = {}
        received = _walk(fd, "", uid_of[student], limits, files, 0)
    finally:
        os.close(fd)
    claimed = files.get("timestamp.txt")
    return Entry(name, student, chapter, files, received,
                 claimed.decode("utf-8", "replace").strip()[:64] if claimed is not None else None)


# -- collecting --------------------------------------------------------------------------------------


def _shown(name: str) -> str:
    """A student's file name as one line of the instructor's terminal (no newline or escape in it)."""
    return name if name.isprintable() else ascii(name)


def _set_aside(inbound: Path, name: str, aside: Path) -> Path:
    aside.mkdir(mode=0o700, exist_ok=True)
    target = aside / name
    while os.path.lexists(target):
        target = aside / f"{name}.{secrets.token_hex(2)}"
    os.rename(inbound / name, target)  # the entry itself, link or not: rename never follows
    return target


def _stage(entry: Entry, inbound: Path) -> str:
    """Write the accepted entry into the staging inbound, named and stamped with the server's time."""
    staged = f"{entry.student}+{entry.chapter}+{entry.received_text}+{secrets.token_urlsafe(6)}"
    folder = inbound / staged
    folder.mkdir(mode=0o755)
    for relative, content in entry.files.items():
        target = folder / relative
        if relative.endswith("/"):
            target.mkdir(mode=0o755, exist_ok=True)
            continue
        target.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        target.write_bytes(content)
        os.chmod(target, 0o644)
    (folder / "timestamp.txt").write_text(entry.received_text)
    return staged


def collect_safely(exchange_root: Path, course_id: str, chapters: list[str], uid_of: dict[str, int],
                   staging: Path, aside: Path, judge: Callable[[Entry], str | None] | None = None,
                   limits: Limits | None = None) -> tuple[list[Entry], list[str]]:
    """Screen `course_id`'s inbound entries of `chapters` and stage, for each student and chapter,
    the newest entry (by the server's time) that passes; `staging` becomes an exchange root holding
    only those, for nbgrader's collect. `judge` adds the course's own checks (the right notebook).
    Returns the staged entries and one line per entry set aside."""
    limits = limits or Limits()
    inbound = exchange_root / course_id / "inbound"
    staged_inbound = staging / course_id / "inbound"
    staging.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(staging, 0o700)  # holds copies of every student's work
    if (staging / course_id).exists():
        shutil.rmtree(staging / course_id)  # what an earlier collect staged is in submitted/ now
    staged_inbound.mkdir(parents=True)
    newest: dict[tuple[str, str], Entry] = {}
    lines = []
    if not inbound.is_dir():
        return [], lines
    inbound_fd = os.open(inbound, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        for name in sorted(os.listdir(inbound_fd)):
            parts = name.split("+")
            if len(parts) >= 3 and parts[1] not in chapters:
                continue
            try:
                entry = read_entry(inbound_fd, name, uid_of, limits)
                why = judge(entry) if judge else None
                if why:
                    raise SetAside(why)
            except (SetAside, OSError) as exc:
                why = str(exc) if isinstance(exc, SetAside) else f"it could not be read ({exc.strerror})"
                where = _set_aside(inbound, name, aside)
                lines.append(f"set aside {course_id}/inbound/{_shown(name)}: {why} (now in {where.parent})")
                continue
            key = (entry.student, entry.chapter)
            if key not in newest or entry.received > newest[key].received:
                newest[key] = entry
    finally:
        os.close(inbound_fd)
    for entry in newest.values():
        _stage(entry, staged_inbound)
    return sorted(newest.values(), key=lambda e: (e.student, e.chapter)), lines
