"""What a term cannot lose, in one tarball; and the guard that stops a command deleting it unsaved.

    sudo make hub-backup                     # python3 deploy/hub/backup.py backup [--to DIR]
    make clean-grading                       # refused unless a backup is newer than the grades, or CONFIRM=1
    sudo make hub-remove-accounts            # refused unless a backup is newer than the homes, or CONFIRM=1
    sudo make hub-backup hub-remove-accounts # both in one go

The tarball, `transformer-course-YYYYmmddTHHMMSSZ.tar.gz` (UTC), mode 0600, goes into BACKUP_DIR
(default /var/backups/transformer-course, made 0700; a folder others may write is refused). It holds

    course/autograder/gradebook.db       through sqlite3's backup API: a consistent copy, even mid-grading
    course/autograder/submitted/, feedback/, graded.json, received.json, grades.csv, report.csv
    course/deploy/hub/schedule.csv, extensions.csv   the deadlines the penalties came from
    hub-state/                           HUB_STATE (deploy/hub/state): the hub's database (backup API
                                         again), passwords, first passwords, created accounts, class.json;
                                         not proxy/ (npm's, which `make hub` installs again)
    exchange/                            COURSE_EXCHANGE (/srv/nbgrader/exchange), set-aside/ and pruned/ too
    homes/LOGIN/                         the home of each person in class.json, without ~/.cache

Root reads what students wrote, so nothing is followed: every folder is opened through its parent's
descriptor with O_NOFOLLOW and must be the folder lstat saw, a link is stored as a link, a named
pipe, socket or device is left out with one line, and a file is read through the descriptor that
was checked. Its modification time is when the backup began: whatever changed after that is not in
it, which is what the guard compares.

Standard library only (it reads class.json, not nbgrader): it runs on a server whose venv is gone.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import grp
import json
import os
import pwd
import re
import shutil
import sqlite3
import stat
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
DEFAULT_BACKUPS = "/var/backups/transformer-course"
NAME = re.compile(r"^transformer-course-\d{8}T\d{6}Z(-\d+)?\.tar\.gz$")
MAX_DEPTH = 64
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
KINDS = {stat.S_IFIFO: "a named pipe", stat.S_IFSOCK: "a socket", stat.S_IFCHR: "a device", stat.S_IFBLK: "a device"}
GRADING = ["gradebook.db", "submitted", "feedback", "graded.json", "received.json", "grades.csv", "report.csv"]
# What `make clean-grading` deletes that only the backup could give back (submitted/ it leaves).
CLEANED = ["gradebook.db", "feedback", "graded.json", "received.json", "grades.csv", "report.csv"]
HUB_DATABASE = "secrets/jupyterhub.sqlite"
TARGETS = {"clean-grading": "clean-grading", "remove-accounts": "hub-remove-accounts"}  # the make targets guarded


class BackupError(RuntimeError):
    """One line for the instructor."""


# -- where things are (as classhub.state_dir() and exchange_dir(), without importing nbgrader) ------


def state_dir() -> Path:
    return Path(os.environ.get("HUB_STATE") or HERE / "state").resolve()


def read_json(path: Path) -> dict | list:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise BackupError(f"cannot read {path} ({exc.__class__.__name__}: {exc}): run this as root") from None


@dataclass
class Sources:
    course: Path
    state: Path
    exchange: Path
    homes: dict[str, Path] = field(default_factory=dict)  # login -> home
    no_account: list[str] = field(default_factory=list)


def homes_of(logins: list[str], lookup: Callable = pwd.getpwnam) -> tuple[dict[str, Path], list[str]]:
    homes, missing = {}, []
    for login in logins:
        try:
            homes[login] = Path(lookup(login).pw_dir)
        except KeyError:
            missing.append(login)  # an account removed by hand
    return homes, missing


def sources(course: Path = ROOT, lookup: Callable = pwd.getpwnam) -> Sources:
    state = state_dir()
    hub = read_json(state / "class.json")
    exchange = Path(hub.get("exchange") or os.environ.get("COURSE_EXCHANGE") or "/srv/nbgrader/exchange")
    homes, missing = homes_of([person["login"] for person in hub.get("people", [])], lookup)
    return Sources(course, state, exchange, homes, missing)


# -- reading without following --------------------------------------------------------------------


def open_dir(name: str, dir_fd: int, seen: os.stat_result) -> int | None:
    """The folder `name` under `dir_fd`, if it is still the one lstat saw (not swapped for a link)."""
    try:
        fd = os.open(name, DIR_FLAGS, dir_fd=dir_fd)
    except OSError:
        return None
    opened = os.fstat(fd)
    if (opened.st_dev, opened.st_ino) != (seen.st_dev, seen.st_ino):
        os.close(fd)
        return None
    return fd


def walk(dir_fd: int, prefix: str = "", skip: frozenset = frozenset(),
         on_skip: Callable[[str, str], None] = lambda path, why: None, depth: int = 0) -> Iterator:
    """(relative path, name, parent descriptor, lstat) of everything under an open folder, parents
    first. Each folder is entered through its parent's descriptor, never through a link."""
    for name in sorted(os.listdir(dir_fd)):
        path = prefix + name
        if path in skip:
            continue
        try:
            info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            continue  # removed while we read
        yield path, name, dir_fd, info
        if not stat.S_ISDIR(info.st_mode):
            continue
        if depth >= MAX_DEPTH:  # a student's folder chain could otherwise use up every descriptor
            on_skip(path + "/", f"what is inside is left out: folders nest deeper than {MAX_DEPTH}")
            continue
        sub = open_dir(name, dir_fd, info)
        if sub is None:
            on_skip(path + "/", "it changed while it was being read")
            continue
        try:
            yield from walk(sub, path + "/", skip, on_skip, depth + 1)
        finally:
            os.close(sub)


def _top(path: Path) -> tuple[int, os.stat_result] | None:
    """A descriptor of `path`'s parent (root's folders: links there are the administrator's) and
    `path`'s own lstat; None when it is not there."""
    try:
        parent = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        return parent, os.stat(path.name, dir_fd=parent, follow_symlinks=False)
    except FileNotFoundError:
        os.close(parent)
        return None


def latest_change(paths: list[Path], skip: frozenset = frozenset()) -> tuple[int, Path | None]:
    """The latest change time (ctime, set by the kernel alone) of these paths and all they hold."""
    latest, where = 0, None
    for path in paths:
        top = _top(path)
        if top is None:
            continue
        parent, info = top
        try:
            found = [("", info)]
            if stat.S_ISDIR(info.st_mode) and (fd := open_dir(path.name, parent, info)) is not None:
                try:
                    found += [(rel, st) for rel, _, _, st in walk(fd, "", skip)]
                finally:
                    os.close(fd)
            for rel, st in found:
                if st.st_ctime_ns > latest:
                    latest, where = st.st_ctime_ns, path / rel if rel else path
        finally:
            os.close(parent)
    return latest, where


# -- the tarball ----------------------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def _user(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return ""


@functools.lru_cache(maxsize=None)
def _group(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return ""


class _Exact:
    """A file read as exactly `size` bytes: tarfile wrote that size in the header already, so a file
    that shrinks while it is read is padded with zeros (and said), one that grows is cut."""

    def __init__(self, f, size: int):
        self.f, self.left, self.short = f, size, False

    def read(self, n: int = -1) -> bytes:
        n = self.left if n < 0 else min(n, self.left)
        data = self.f.read(n)
        while len(data) < n and (more := self.f.read(n - len(data))):
            data += more
        if len(data) < n:
            self.short, data = True, data + b"\0" * (n - len(data))
        self.left -= n
        return data


def _info(arc: str, st: os.stat_result) -> tarfile.TarInfo:
    info = tarfile.TarInfo(arc)
    info.mode, info.uid, info.gid, info.mtime = stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid, st.st_mtime
    info.uname, info.gname = _user(st.st_uid), _group(st.st_gid)
    return info


class Archive:
    """A tar being written, with what went into it and one line per thing left out."""

    def __init__(self, tar: tarfile.TarFile):
        self.tar, self.files, self.bytes, self.lines = tar, 0, 0, []

    def skipped(self, arc: str, why: str) -> None:
        shown = arc if arc.isprintable() else ascii(arc)  # a student's file name, as one line
        self.lines.append(f"left out {shown}: {why}")

    def add(self, arc: str, name: str, dir_fd: int, st: os.stat_result) -> None:
        kind = stat.S_IFMT(st.st_mode)
        info = _info(arc, st)
        if kind == stat.S_IFDIR:
            info.type = tarfile.DIRTYPE
            self.tar.addfile(info)
        elif kind == stat.S_IFLNK:  # the link itself, as the student made it; never what it points at
            info.type, info.linkname = tarfile.SYMTYPE, os.readlink(name, dir_fd=dir_fd)
            self.tar.addfile(info)
        elif kind == stat.S_IFREG:
            self._file(info, name, dir_fd, st)
        else:
            self.skipped(arc, KINDS.get(kind, "not a file, folder or link"))

    def _file(self, info: tarfile.TarInfo, name: str, dir_fd: int, st: os.stat_result) -> None:
        try:
            fd = os.open(name, FILE_FLAGS, dir_fd=dir_fd)
        except OSError as exc:
            return self.skipped(info.name, f"it could not be opened ({exc.strerror})")
        with os.fdopen(fd, "rb") as f:
            opened = os.fstat(fd)
            if not stat.S_ISREG(opened.st_mode) or (opened.st_dev, opened.st_ino) != (st.st_dev, st.st_ino):
                return self.skipped(info.name, "it changed while it was being read")
            info.size = opened.st_size
            exact = _Exact(f, opened.st_size)
            self.tar.addfile(info, exact)
        if exact.short:
            self.lines.append(f"{info.name} shrank while it was read: kept with zeros at its end")
        self.files, self.bytes = self.files + 1, self.bytes + info.size

    def add_tree(self, arc: str, path: Path, skip: frozenset = frozenset()) -> bool:
        """`path` (a file, a folder and all it holds, or a link) as `arc`; False when it is not there."""
        top = _top(path)
        if top is None:
            return False
        parent, st = top
        try:
            self.add(arc, path.name, parent, st)
            if stat.S_ISLNK(st.st_mode):
                self.lines.append(f"{arc} is a link to {os.readlink(path)}: kept as a link, not followed")
            if not stat.S_ISDIR(st.st_mode):
                return True
            fd = open_dir(path.name, parent, st)
            if fd is None:
                self.skipped(arc, "it changed while it was being read")
                return True
            try:
                for rel, name, dir_fd, info in walk(fd, "", skip, lambda p, why: self.skipped(f"{arc}/{p}", why)):
                    self.add(f"{arc}/{rel}", name, dir_fd, info)
            finally:
                os.close(fd)
            return True
        finally:
            os.close(parent)

    def add_sqlite(self, arc: str, path: Path) -> bool:
        """A SQLite database copied with sqlite3's backup API: what was committed when it ran, even
        while the hub or `make grade` writes (a raw copy could catch half a transaction)."""
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return False
        if not stat.S_ISREG(st.st_mode):
            return self.add_tree(arc, path)
        work = Path(tempfile.mkdtemp(prefix="course-backup-"))  # 0700: the copy holds grades
        try:
            source, copy = sqlite3.connect(path), sqlite3.connect(work / path.name)
            try:
                source.backup(copy)
            finally:
                source.close()
                copy.close()
            info = _info(arc, st)
            info.size = (work / path.name).stat().st_size
            with open(work / path.name, "rb") as f:
                self.tar.addfile(info, f)
            self.files, self.bytes = self.files + 1, self.bytes + info.size
            return True
        finally:
            shutil.rmtree(work)


def parts(src: Sources) -> list[tuple[str, Path, str, frozenset]]:
    """(name in the tarball, path, how, what to leave out) for everything a backup holds."""
    grading = src.course / "autograder"
    found = [(f"course/autograder/{name}", grading / name, "sqlite" if name.endswith(".db") else "tree", frozenset())
             for name in GRADING]
    found += [(f"course/deploy/hub/{name}", src.course / "deploy" / "hub" / name, "tree", frozenset())
              for name in ("schedule.csv", "extensions.csv")]
    # The hub's database goes through the backup API; a stray journal beside that copy would undo it.
    database = frozenset(HUB_DATABASE + end for end in ("", "-journal", "-wal", "-shm"))
    found += [("hub-state", src.state, "tree", frozenset({"proxy"}) | database),
              (f"hub-state/{HUB_DATABASE}", src.state / HUB_DATABASE, "sqlite", frozenset()),
              ("exchange", src.exchange, "tree", frozenset())]
    found += [(f"homes/{login}", home, "tree", frozenset({".cache"})) for login, home in sorted(src.homes.items())]
    return found


def plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def human(size: float) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if size < 1000 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    return ""


def backup_folder(folder: Path) -> int:
    """A descriptor of the backups' folder, made 0700 if missing; one that others could write (or
    a link) is refused: whoever writes there could swap a backup."""
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = os.lstat(folder)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        found = "a link" if stat.S_ISLNK(st.st_mode) else f"mode {stat.S_IMODE(st.st_mode):04o}, owner {_user(st.st_uid)}"
        raise BackupError(f"{folder} must be a folder of {_user(os.geteuid()) or 'root'}'s that nobody else can write "
                          f"(it is {found}): choose another BACKUP_DIR")
    return os.open(folder, DIR_FLAGS)


def _create(folder_fd: int, started: float) -> tuple[str, int]:
    """A new file's name (timestamped; -2, -3... within the same second) and its descriptor, 0600."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(started))
    for n in range(1, 100):
        name = f"transformer-course-{stamp}{'' if n == 1 else f'-{n}'}.tar.gz"
        try:
            os.stat(name, dir_fd=folder_fd, follow_symlinks=False)
            continue  # taken
        except FileNotFoundError:
            pass
        try:
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            return name, os.open(f".{name}.partial", flags, 0o600, dir_fd=folder_fd)
        except FileExistsError:
            continue
    raise BackupError("too many backups made within one second")


def backup(src: Sources, folder: Path, out=print) -> Path:
    """Write the tarball; print what it holds, what it left out and its size; return its path."""
    for _, path, _, _ in parts(src):
        if folder.resolve().is_relative_to(path.resolve()):  # it would hold itself, and every earlier backup
            raise BackupError(f"{folder} is inside {path}, which the backup holds: choose another BACKUP_DIR")
    folder_fd = backup_folder(folder)
    started_ns = time.time_ns()
    name, fd = _create(folder_fd, started_ns / 1e9)
    partial = f".{name}.partial"
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "wb") as raw, tarfile.open(fileobj=raw, mode="w:gz", compresslevel=6,
                                                       format=tarfile.PAX_FORMAT) as tar:
            archive = Archive(tar)
            for arc, path, how, skip in parts(src):
                files, size = archive.files, archive.bytes
                there = archive.add_sqlite(arc, path) if how == "sqlite" else archive.add_tree(arc, path, skip)
                out(f"  {arc}: {plural(archive.files - files, 'file')}, {human(archive.bytes - size)}" if there
                    else f"  {arc}: not there ({path})")
            for login in src.no_account:
                out(f"  homes/{login}: not there (no such account)")
        for line in archive.lines:
            out(line)
        # Only a finished backup gets a name the guard counts, and its time is when it began.
        os.rename(partial, name, src_dir_fd=folder_fd, dst_dir_fd=folder_fd)
        os.utime(name, ns=(started_ns, started_ns), dir_fd=folder_fd, follow_symlinks=False)
        size = os.stat(name, dir_fd=folder_fd, follow_symlinks=False).st_size
    except BaseException:
        try:
            os.unlink(partial, dir_fd=folder_fd)
        except FileNotFoundError:
            pass
        raise
    finally:
        os.close(folder_fd)
    out(f"backup: {folder / name} ({human(size)}; {plural(archive.files, 'file')}, {human(archive.bytes)} "
        "before compression; mode 0600)")
    return folder / name


# -- the guard ------------------------------------------------------------------------------------


@dataclass
class Backup:
    path: Path
    began_ns: int


def newest_backup(folder: Path) -> Backup | None:
    """The newest finished backup in `folder` that is a plain file of this user's (root's)."""
    try:
        names = os.listdir(folder)
    except (FileNotFoundError, NotADirectoryError, PermissionError):  # PermissionError: not root's backups
        return None
    found = []
    for name in names:
        try:
            st = os.lstat(folder / name)
        except FileNotFoundError:
            continue
        if NAME.match(name) and stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid() and st.st_size > 0:
            found.append(Backup(folder / name, st.st_mtime_ns))
    return max(found, key=lambda b: b.began_ns, default=None)


def _when(ns: int) -> str:
    return datetime.datetime.fromtimestamp(ns / 1e9).astimezone().strftime("%Y-%m-%d %H:%M:%S %z")


def at_stake(what: str, course: Path, state: Path,
             lookup: Callable = pwd.getpwnam) -> tuple[str, list[Path], frozenset]:
    """What the command `what` deletes: (in words, the paths, what inside them the backup leaves out)."""
    if what == "clean-grading":
        return ("the class's grades (autograder/gradebook.db, grades.csv, report.csv, feedback/, graded.json, "
                "received.json)"), [course / "autograder" / name for name in CLEANED], frozenset()
    logins = read_json(state / "secrets" / "created-accounts.json") or []
    homes, _ = homes_of(list(logins), lookup)
    shown = ", ".join(sorted(homes)[:5]) + (", ..." if len(homes) > 5 else "")
    return f"the homes of {plural(len(homes), 'account')} ({shown})", list(homes.values()), frozenset({".cache"})


def guard(what: str, confirmed: bool, course: Path, state: Path, backups: Path,
          lookup: Callable = pwd.getpwnam) -> tuple[bool, str]:
    """(go on?, one line): go on when nothing is at stake, when CONFIRM=1, or when the newest backup
    began after the last change to what `what` deletes."""
    words, paths, skip = at_stake(what, course, state, lookup)
    target = TARGETS[what]
    changed_ns, where = latest_change(paths, skip)
    if where is None:
        return True, ""
    if confirmed:
        return True, f"make {target}: CONFIRM=1: deleting {words} without a backup"
    newest = newest_backup(backups)
    if newest and newest.began_ns > changed_ns:
        return True, f"make {target}: {newest.path} (made {_when(newest.began_ns)}) holds {words}"
    why = (f"no backup in {backups}" if newest is None else
           f"the newest backup, {newest.path.name} (made {_when(newest.began_ns)}), is older than {where} "
           f"(changed {_when(changed_ns)})")
    sudo = "sudo " if target.startswith("hub-") else ""
    return False, (f"make {target} would delete {words}, and {why}: run `sudo make hub-backup {target}` (a backup, "
                   f"then this), or `{sudo}make {target} CONFIRM=1` to delete without one")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="step", required=True)
    sub.add_parser("backup", help="one tarball of what the term cannot lose").add_argument(
        "--to", default=os.environ.get("BACKUP_DIR") or DEFAULT_BACKUPS, help=f"the folder (default {DEFAULT_BACKUPS})")
    check = sub.add_parser("guard", help="refuse, in one line, to delete what no backup holds")
    check.add_argument("what", choices=sorted(TARGETS))
    check.add_argument("--confirmed", action="store_true", help="CONFIRM=1: delete anyway")
    check.add_argument("--backups", default=os.environ.get("BACKUP_DIR") or DEFAULT_BACKUPS)
    args = parser.parse_args(argv)
    try:
        if args.step == "guard":
            ok, line = guard(args.what, args.confirmed, ROOT, state_dir(), Path(args.backups))
            if line:
                print(line, file=sys.stdout if ok else sys.stderr)
            return 0 if ok else 1
        if os.geteuid() != 0:
            raise BackupError("make hub-backup must run as root (sudo make hub-backup): it reads every student's home")
        backup(sources(), Path(args.to))
        return 0
    except BackupError as exc:
        print(f"backup.py: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
