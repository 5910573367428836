"""The Python that every person's server runs, in a folder every account can read.

The course's own venv is often out of the students' reach: made from a Python under /root (as
pyenv installs it), or inside a clone that only root can enter. A student's server then cannot
start at all. So `make hub` builds, under the servers' folder (`HUB_SERVERS`, by default
/srv/transformer-course), a venv of the system's Python of the same version whose packages are
the course venv's, linked file by file (hard links: a second or two and no extra disk; a copy when
the two folders are on different file systems), with its own copy of `transformer_lib` (the full
library, or the one with the graded answers hidden) and of course_exchange.py. Students can read
it and write none of it. A changed venv or library gives a new folder; the old ones are removed.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Callable

HERE = Path(__file__).resolve().parent


class ServersError(RuntimeError):
    """One line for the instructor."""


def servers_dir() -> Path:
    return Path(os.environ.get("HUB_SERVERS") or "/srv/transformer-course")


def others_can_enter(path: Path) -> bool:
    """Whether an account with no special rights can reach `path` (every folder on the way searchable)."""
    path = path.resolve()
    return all(os.stat(folder).st_mode & 0o001 for folder in [path, *path.parents])


def system_python() -> Path:
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    for folder in ("/usr/bin", "/usr/local/bin"):
        candidate = Path(folder) / f"python{version}"
        if candidate.exists() and others_can_enter(candidate.parent) and os.stat(candidate).st_mode & 0o001:
            return candidate
    raise ServersError(f"the class's servers need a python{version} every account can run (in /usr/bin or "
                       f"/usr/local/bin), and this server has none: install it (e.g. `apt-get install python{version} "
                       f"python{version}-venv`), or make the course venv with the system's Python")


def _site_packages(prefix: Path) -> Path:
    return prefix / Path(sysconfig.get_path("purelib", vars={"base": str(prefix)})).relative_to(prefix)


def _digest(venv_site: Path, library: Path, answers: str) -> str:
    digest = hashlib.sha256(f"{sys.version}\0answers={answers}\0".encode())
    for entry in sorted(os.scandir(venv_site), key=lambda e: e.name):
        digest.update(f"{entry.name}\0{entry.stat(follow_symlinks=False).st_mtime_ns}\0".encode())
    files = [*library.rglob("*.py"), *library.rglob("*.toml"), *library.rglob("*.gz"), HERE / "course_exchange.py"]
    if answers != "visible":  # which answers are hidden follows the solutions' graded tests
        files += library.parent.glob("solutions/*/*.ipynb")
    for path in sorted(files):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:12]


def _link_tree(source: Path, target: Path, skip: Callable[[str], bool] = lambda name: False) -> None:
    """Hard links of every file of `source` under `target` (a copy across file systems)."""
    target.mkdir(parents=True, exist_ok=True)
    for entry in os.scandir(source):
        if skip(entry.name):
            continue
        destination = target / entry.name
        if entry.is_dir(follow_symlinks=False):
            _link_tree(Path(entry.path), destination)
        elif entry.is_symlink():
            os.symlink(os.readlink(entry.path), destination)
        else:
            try:
                os.link(entry.path, destination)
            except OSError:  # another file system, or links refused: a copy
                shutil.copy2(entry.path, destination)


def build(venv: Path, library: Path, answers: str = "visible",
          write_library: Callable[[Path], None] | None = None) -> Path:
    """The servers' venv for the course venv `venv` (its prefix) and the library folder `library`;
    returns its python. `write_library(site_packages)` writes transformer_lib there (default: a
    copy of `library`, answers included); `answers` names what it writes, so another gives another venv."""
    base = servers_dir()
    base.mkdir(mode=0o755, parents=True, exist_ok=True)
    if not others_can_enter(base):
        raise ServersError(f"the servers' folder {base} is not reachable by every account (a folder on its way "
                           "is closed): set HUB_SERVERS to a folder under /srv or /opt")
    venv_site = _site_packages(venv)
    target = base / f"python-{_digest(venv_site, library, answers)}"
    python = target / "bin" / "python"
    if not (target / ".complete").exists():
        work = base / f".building-{os.getpid()}"
        shutil.rmtree(work, ignore_errors=True)
        proc = subprocess.run([str(system_python()), "-m", "venv", "--without-pip", str(work)], capture_output=True, text=True)
        if proc.returncode != 0:
            raise ServersError(f"could not make the servers' venv with {system_python()}: {proc.stderr.strip()[-300:]}")
        site = _site_packages(work)
        shutil.rmtree(site)
        # The editable install points into the course folder, which students may not reach.
        _link_tree(venv_site, site, skip=lambda name: "editable" in name and "transformer_lib" in name)
        for shared in ("share/jupyter", "etc/jupyter"):
            if (venv / shared).is_dir():
                _link_tree(venv / shared, work / shared)
        if write_library is not None:
            write_library(site)
        else:
            shutil.copytree(library, site / "transformer_lib", ignore=shutil.ignore_patterns("__pycache__"))
        shutil.copy(HERE / "course_exchange.py", site / "course_exchange.py")
        for folder in [work, *work.rglob("*")]:
            if folder.is_dir() and not folder.is_symlink():
                os.chmod(folder, 0o755)
        (work / ".complete").touch()
        shutil.rmtree(target, ignore_errors=True)
        os.rename(work, target)
    for old in base.glob("python-*"):
        if old != target:
            shutil.rmtree(old, ignore_errors=True)
    _check(python)
    return python


def _check(python: Path) -> None:
    """The servers' python imports what a server needs, run as an account with no rights at all."""
    code = "import jupyterhub.singleuser, nbgrader, course_exchange, transformer_lib.checks"
    proc = subprocess.run(["runuser", "-u", "nobody", "--", str(python), "-c", code],
                          capture_output=True, text=True, cwd="/", env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/nonexistent"})
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise ServersError(f"the servers' Python {python} does not start for other accounts: {last}")
