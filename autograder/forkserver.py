"""A fork server for the job's nbgrader process (autograder/driver.py).

Importing nbgrader (nbconvert, traitlets, SQLAlchemy, jupyter_client) costs about 2.3 s of CPU,
as much as a small chapter's whole run. One process per grader (per Dask worker) imports it once
and forks a fresh copy for each job. What it guarantees:

* the copy has never seen another job's data: the server reads no notebook, it imports code and
  forks;
* the copy gets the job's environment, folder, pipes (its stdin, its stdout and the job's log as
  stderr) and memory limit (driver._grader_limits), in a session of its own, and is killed with
  its process group like the interpreter it replaces;
* `ZYGOTE.start` never raises: it gives None when there is no server (COURSE_NO_FORK_SERVER is
  set, or the server failed once in this process, which from then on starts drivers the plain
  way), and the job then starts an interpreter as before (`python driver.py --nbgrader-driver`).

The server is `python forkserver.py --nbgrader-zygote FD`, on one end of a Unix socket pair. A
request is a 4-byte big-endian length and JSON {"course", "chapter", "env"}, with the driver's
three descriptors passed alongside (SCM_RIGHTS); the answer is the driver's pid, as a line.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import isolation
from driver import _driver, _grader_limits

HERE = Path(__file__).resolve().parent


class _ForkedDriver:
    """What the job uses of a subprocess.Popen, for a driver forked by the server (not our child:
    the server reaps it)."""

    def __init__(self, pid: int, stdin, stdout):
        self.pid, self.stdin, self.stdout = pid, stdin, stdout

    def poll(self):
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return 0
        return None

    def kill(self) -> None:
        with contextlib.suppress(OSError):
            os.kill(self.pid, signal.SIGKILL)

    def wait(self, timeout: float | None = None):
        deadline = time.monotonic() + (timeout if timeout is not None else 10**9)
        while self.poll() is None:
            if time.monotonic() > deadline:
                raise subprocess.TimeoutExpired("nbgrader driver", timeout)
            time.sleep(0.02)
        for stream in (self.stdin, self.stdout):
            with contextlib.suppress(OSError):
                stream.close()
        return 0


class _Zygote:
    def __init__(self):
        import threading

        self.lock = threading.Lock()
        self.proc = None
        self.sock = None
        self.failed = False

    def _spawn(self) -> None:
        import socket

        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self.proc = subprocess.Popen([isolation.python_executable(), str(HERE / "forkserver.py"), "--nbgrader-zygote",
                                      str(child.fileno())], pass_fds=(child.fileno(),), stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                                     cwd=tempfile.gettempdir())
        child.close()
        self.sock = parent
        parent.settimeout(120)
        if parent.recv(6) != b"ready\n":
            raise RuntimeError("the nbgrader fork server did not start")

    def start(self, course: str, chapter: str, env: dict, log) -> "_ForkedDriver | None":
        import socket

        if os.environ.get("COURSE_NO_FORK_SERVER") or self.failed:
            return None
        with self.lock:
            try:
                if self.proc is None or self.proc.poll() is not None:
                    self._spawn()
                in_read, in_write = os.pipe()
                out_read, out_write = os.pipe()
                request = json.dumps({"course": course, "chapter": chapter, "env": env}).encode()
                try:
                    socket.send_fds(self.sock, [struct.pack(">I", len(request)) + request],
                                    [in_read, out_write, log.fileno()])
                    pid = int(self.sock.recv(32).decode().strip() or "0")
                finally:
                    os.close(in_read)
                    os.close(out_write)
                if pid <= 0:
                    raise RuntimeError("the fork server gave no process")
                return _ForkedDriver(pid, os.fdopen(in_write, "wb"), os.fdopen(out_read, "rb"))
            except Exception:
                with contextlib.suppress(Exception):
                    os.close(in_write)
                    os.close(out_read)
                if self.proc is not None:
                    with contextlib.suppress(Exception):
                        self.proc.kill()
                self.proc = None
                self.failed = True  # this process starts drivers the plain way from now on
                return None


ZYGOTE = _Zygote()  # one per grader process (per Dask worker)


def _zygote(fd: int) -> None:
    """The fork server: import what the driver needs, then fork one driver per request."""
    import socket

    from traitlets.config.loader import PyFileConfigLoader  # noqa: F401
    from nbgrader.apps import NbGraderAPI  # noqa: F401
    from nbgrader.coursedir import CourseDirectory  # noqa: F401
    import sandboxed_kernel  # noqa: F401  (nbgrader's preprocessors for the job's config)
    import feedback  # noqa: F401

    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps the drivers
    sock = socket.socket(fileno=fd)
    sock.sendall(b"ready\n")
    while True:
        try:
            head, fds, _, _ = socket.recv_fds(sock, 4, 3)
        except OSError:
            return
        if len(head) < 4:
            return  # the grader is gone
        size = struct.unpack(">I", head)[0]
        body = b""
        while len(body) < size:
            chunk = sock.recv(size - len(body))
            if not chunk:
                return
            body += chunk
        request = json.loads(body)
        pid = os.fork()
        if pid == 0:
            try:
                os.setsid()
                sock.close()
                for target, source in zip((0, 1, 2), fds):
                    os.dup2(source, target)
                for source in fds:
                    os.close(source)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                os.environ.clear()
                os.environ.update(request["env"])
                os.chdir(request["course"])
                _grader_limits()
                sys.stdin = os.fdopen(0, "r")
                sys.stdout = os.fdopen(1, "w")
                sys.stderr = os.fdopen(2, "w")
                _driver(request["course"], request["chapter"])
            finally:
                with contextlib.suppress(Exception):
                    sys.stdout.flush()
                os._exit(0)
        for source in fds:
            os.close(source)
        sock.sendall(f"{pid}\n".encode())


if __name__ == "__main__" and sys.argv[1:2] == ["--nbgrader-zygote"]:
    _zygote(int(sys.argv[2]))
