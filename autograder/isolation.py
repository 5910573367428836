"""One isolation layer for every process that runs submitted code.

`wrap(spec, argv)` turns a command into one that runs confined. The grader uses it for both
places learner code runs: nbgrader's kernel (autograder/sandboxed_kernel.py) and the
independent check (autograder/sandbox_runner.py). Three modes, chosen once per machine
(`detect()`), and printed by `make grade`:

* **bubblewrap** (preferred; `bwrap`, the sandbox Flatpak relies on, Debian package
  `bubblewrap`). New PID, network, IPC, UTS and mount namespaces; the root file system is an
  empty tmpfs, remounted read-only, holding only read-only binds of /usr (and the /lib, /bin
  links), the few /etc files the dynamic linker needs, the Python installation, the virtual
  environment and the library copy the caller names (see autograder/hiding.py); a private
  size-limited tmpfs for /tmp (the working folder) and /dev/shm; a new /proc (it shows only the
  sandbox's processes) and a minimal /dev. The environment is cleared and replaced by the
  caller's. Run as root (CI, containers), bwrap keeps only the capabilities that `setpriv`
  needs to drop to an unprivileged uid of its own (one per job, so two jobs never share a uid)
  with an empty bounding set and no_new_privs; run as another user, bwrap maps that user to
  uid 65534 in a user namespace. `--die-with-parent` and the PID namespace make every process
  the sandbox started die with it.
* **fallback: unshare** (no usable bwrap, running as root): util-linux `unshare` gives new PID,
  network, IPC and UTS namespaces and `setpriv` the unprivileged uid, but the file system is the
  host's: files any user may read (the course, solutions/ included) are visible.
* **fallback: rlimits only** (neither): only the limits below and, as root, the dropped uid.
  `make grade` prints a loud warning in both fallback modes.

In every mode the command runs under resource limits set by `prlimit` after the uid change
(memory as RLIMIT_AS, CPU seconds, processes, file size, open files, no core files), in a
session of its own, and the caller kills the whole process group at its wall-clock limit.

`COURSE_ISOLATION=bwrap|unshare|rlimits` forces a mode (the tests use it to show what the
fallbacks do not protect).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import functools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

NOBODY = 65534
UID_BASE = int(os.environ.get("COURSE_SANDBOX_UID_BASE", "1000000"))
UID_COUNT = 4096
SANDBOX_TMP = "/tmp"  # the working folder inside the sandbox (a private tmpfs)


@dataclasses.dataclass(frozen=True)
class Limits:
    memory: int = 4 * 2**30  # RLIMIT_AS, bytes (torch with one thread needs about 0.7 GiB)
    cpu: int = 3600  # RLIMIT_CPU, seconds per process: a backstop, the wall clock comes first
    processes: int = 256  # RLIMIT_NPROC for the sandbox's own uid (threads count too)
    file_size: int = 64 * 2**20  # RLIMIT_FSIZE, bytes: the largest file the code may write
    open_files: int = 512
    tmp_size: int = 512 * 2**20  # size of the sandbox's /tmp (bubblewrap only)
    shm_size: int = 64 * 2**20  # size of the sandbox's private /dev/shm (bubblewrap only)

    def prlimit_args(self) -> list[str]:
        return [f"--as={self.memory}", f"--cpu={self.cpu}", f"--nproc={self.processes}",
                f"--fsize={self.file_size}", f"--nofile={self.open_files}", "--core=0"]


@dataclasses.dataclass
class SandboxSpec:
    """What one sandboxed command sees."""

    uid: int = NOBODY
    read_only: list[tuple[str, str]] = dataclasses.field(default_factory=list)  # (host path, path inside)
    read_write: list[tuple[str, str]] = dataclasses.field(default_factory=list)  # e.g. the kernel's socket folder
    hide: list[str] = dataclasses.field(default_factory=list)  # host paths that must not be visible (fallbacks chmod nothing; listed for verify())
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    cwd: str = SANDBOX_TMP
    limits: Limits = dataclasses.field(default_factory=Limits)


@dataclasses.dataclass(frozen=True)
class Isolation:
    mode: str  # "bubblewrap", "unshare", "rlimits"
    reason: str  # why this mode (and, for fallbacks, why not bubblewrap)

    @property
    def is_fallback(self) -> bool:
        return self.mode != "bubblewrap"

    def describe(self) -> str:
        if self.mode == "bubblewrap":
            return ("isolation: bubblewrap (new PID, network, IPC, UTS and mount namespaces; read-only root "
                    "with only the Python environment; unprivileged uid; memory, CPU, process and file-size limits)")
        if self.mode == "unshare":
            return ("isolation: FALLBACK unshare + setpriv + rlimits (" + self.reason + "). WARNING: submitted code "
                    "sees the host's file system: anything any user may read, solutions/ included, is visible to it. "
                    "Install bubblewrap (apt-get install bubblewrap).")
        return ("isolation: FALLBACK rlimits only (" + self.reason + "). WARNING: submitted code runs with network "
                "access and sees the host's file system and processes. Install bubblewrap (apt-get install bubblewrap).")


# -- which isolation this machine allows ----------------------------------------------------


def python_executable() -> str:
    """This interpreter's path as the sandbox sees it (the virtual environment's, normalised)."""
    return os.path.normpath(os.path.abspath(sys.executable))


def _python_roots() -> list[str]:
    """Folders the interpreter needs: the virtual environment and the Python it was made from."""
    roots = {os.path.realpath(sys.prefix), os.path.realpath(sys.base_prefix),
             os.path.dirname(os.path.dirname(os.path.realpath(sys.executable)))}
    roots.add(os.path.dirname(os.path.dirname(python_executable())))
    if os.path.realpath(sys.prefix) != os.path.normpath(sys.prefix):
        roots.add(os.path.normpath(sys.prefix))
    # drop folders inside other folders of the list
    ordered = sorted(roots, key=len)
    return [r for i, r in enumerate(ordered) if not any(r.startswith(o.rstrip("/") + "/") for o in ordered[:i])]


def _system_binds() -> list[str]:
    args = []
    for name in ["usr"]:
        args += ["--ro-bind", f"/{name}", f"/{name}"]
    for name in ["bin", "sbin", "lib", "lib32", "lib64", "libx32"]:
        path = Path("/") / name
        if path.is_symlink():
            args += ["--symlink", os.readlink(path), f"/{name}"]
        elif path.is_dir():
            args += ["--ro-bind", str(path), f"/{name}"]
    for name in ["/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime", "/etc/alternatives",
                 "/etc/nsswitch.conf"]:
        if os.path.exists(name):
            args += ["--ro-bind", name, name]
    return args


def _parents(path: str, made: set[str]) -> list[str]:
    """--dir for every parent of `path` not made yet, world-traversable (bwrap would copy modes)."""
    args = []
    parts = Path(path).parts[1:-1]
    current = ""
    for part in parts:
        current += "/" + part
        if current not in made and current not in ("/usr", "/tmp", "/dev", "/proc"):
            made.add(current)
            args += ["--perms", "0755", "--dir", current]
    return args


@functools.lru_cache(maxsize=None)
def _bwrap_version() -> tuple[int, ...]:
    try:
        text = subprocess.run([shutil.which("bwrap"), "--version"], capture_output=True, text=True, timeout=10).stdout
        return tuple(int(p) for p in text.split()[-1].split(".")[:3])
    except (OSError, ValueError, IndexError, subprocess.TimeoutExpired):
        return (0,)


def _bwrap_argv(spec: SandboxSpec, as_root: bool, passwd_fd: int | None) -> list[str]:
    bwrap = shutil.which("bwrap")
    recent = _bwrap_version() >= (0, 8)  # --size and --disable-userns came with bubblewrap 0.8
    argv = [bwrap, "--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try",
            "--die-with-parent", "--new-session", "--hostname", "sandbox"]
    if as_root:
        argv += ["--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--cap-add", "CAP_SETPCAP"]
    else:
        argv += ["--unshare-user", "--uid", str(NOBODY), "--gid", str(NOBODY)] + (["--disable-userns"] if recent else [])
    argv += _system_binds()
    # The private /tmp comes before the binds: a course or virtual environment that lives under
    # the host's /tmp (a CI clone, pytest's scratch courses) is then bound on top of it instead
    # of being hidden under it.
    shm_size = ["--size", str(spec.limits.shm_size)] if recent else []
    tmp_size = ["--size", str(spec.limits.tmp_size)] if recent else []
    argv += ["--proc", "/proc", "--dev", "/dev",
             "--perms", "1777", *shm_size, "--tmpfs", "/dev/shm",
             "--perms", "1777", *tmp_size, "--tmpfs", SANDBOX_TMP]
    made: set[str] = set()
    for root in _python_roots():
        argv += _parents(root, made) + ["--ro-bind", root, root]
    for src, dest in spec.read_only:
        argv += _parents(dest, made) + ["--ro-bind", src, dest]
    for src, dest in spec.read_write:
        argv += _parents(dest, made) + ["--bind", src, dest]
    if passwd_fd is not None:
        argv += ["--ro-bind-data", str(passwd_fd), "/etc/passwd"]
    argv += ["--remount-ro", "/", "--chdir", spec.cwd, "--clearenv"]
    for key, value in _sandbox_env(spec).items():
        argv += ["--setenv", key, value]
    return argv + ["--"]


def _sandbox_env(spec: SandboxSpec) -> dict[str, str]:
    env = {
        "PATH": os.pathsep.join([os.path.dirname(python_executable()), "/usr/local/bin", "/usr/bin", "/bin"]),
        "HOME": SANDBOX_TMP, "USER": "learner", "LOGNAME": "learner", "LANG": "C.UTF-8",
        "PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1", "MPLBACKEND": "Agg",
        "MPLCONFIGDIR": f"{SANDBOX_TMP}/.matplotlib", "IPYTHONDIR": f"{SANDBOX_TMP}/.ipython",
        "JUPYTER_RUNTIME_DIR": f"{SANDBOX_TMP}/.jupyter-runtime", "JUPYTER_DATA_DIR": f"{SANDBOX_TMP}/.jupyter",
        # One thread and two malloc arenas: torch then needs about 0.7 GiB of address space, not 6.
        "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MALLOC_ARENA_MAX": "2",
        "TMPDIR": SANDBOX_TMP,
    }
    env.update(spec.env)
    return env


def _drop_uid_argv(uid: int) -> list[str]:
    return [shutil.which("setpriv") or "/usr/bin/setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
            "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--"]


def _limits_argv(limits: Limits) -> list[str]:
    if os.geteuid() != 0:  # RLIMIT_NPROC counts every process of the (shared) user: leave room for theirs
        limits = dataclasses.replace(limits, processes=limits.processes + len(processes_of_uid(os.geteuid())))
    prlimit = shutil.which("prlimit")
    if prlimit:
        return [prlimit, *limits.prlimit_args(), "--"]
    # No prlimit: a few lines of Python set the same limits, then exec the command.
    code = ("import os,resource as r,sys;"
            f"[r.setrlimit(k,(v,v)) for k,v in ((r.RLIMIT_AS,{limits.memory}),(r.RLIMIT_CPU,{limits.cpu}),"
            f"(r.RLIMIT_NPROC,{limits.processes}),(r.RLIMIT_FSIZE,{limits.file_size}),"
            f"(r.RLIMIT_NOFILE,{limits.open_files}),(r.RLIMIT_CORE,0))];os.execvp(sys.argv[1],sys.argv[1:])")
    return [sys.executable, "-I", "-S", "-c", code]


def _probe(argv: list[str], **kw) -> tuple[bool, str]:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, **kw)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, str(exc)
    return proc.returncode == 0, (proc.stderr or proc.stdout).strip()[-300:]


@functools.lru_cache(maxsize=None)
def detect(forced: str | None = None) -> Isolation:
    """The strongest isolation this machine allows (probed once per process)."""
    forced = forced or os.environ.get("COURSE_ISOLATION", "auto")
    forced = {"bubblewrap": "bwrap"}.get(forced, forced)
    as_root = os.geteuid() == 0
    setpriv_ok = shutil.which("setpriv") is not None
    if forced in ("auto", "bwrap"):
        why = ""
        if shutil.which("bwrap") is None:
            why = "bwrap is not installed"
        elif as_root and not setpriv_ok:
            why = "setpriv (util-linux) is missing"
        else:
            spec = SandboxSpec(uid=UID_BASE + UID_COUNT - 1)
            ok, err = _probe(wrap(spec, ["/bin/true"], Isolation("bubblewrap", "")))
            if ok:
                return Isolation("bubblewrap", "")
            why = f"bwrap cannot create its namespaces here ({err or 'no message'})"
        if forced == "bwrap":
            raise RuntimeError(f"COURSE_ISOLATION=bwrap, but {why}")
        reason = why
    else:
        reason = f"COURSE_ISOLATION={forced}"
    if forced in ("auto", "unshare") and as_root and setpriv_ok and shutil.which("unshare"):
        probe = Isolation("unshare", reason)
        ok, err = _probe(wrap(SandboxSpec(uid=UID_BASE + UID_COUNT - 1), ["/bin/true"], probe))
        if ok:
            return _runs_python(probe)
        reason += f"; unshare failed ({err})"
    return _runs_python(Isolation("rlimits", reason))


def _runs_python(isolation: Isolation) -> Isolation:
    """A fallback must still run the interpreter as an unprivileged user; say so plainly if it cannot."""
    spec = SandboxSpec(uid=UID_BASE + UID_COUNT - 1)
    ok, err = _probe(wrap(spec, [python_executable(), "-I", "-c", "pass"], isolation), cwd=tempfile.gettempdir())
    if not ok:
        raise RuntimeError(
            f"cannot isolate submitted code on this machine: bubblewrap is unusable ({isolation.reason}) and the "
            f"fallback ({isolation.mode}) cannot run {python_executable()} as an unprivileged user ({err}). "
            "Install bubblewrap (apt-get install bubblewrap), or put the Python installation where any user may read it.")
    return isolation


def wrap(spec: SandboxSpec, argv: list[str], isolation: Isolation | None = None) -> list[str]:
    """The command line that runs `argv` confined as `spec` says, in this machine's isolation mode.

    bubblewrap: bwrap ... -- setpriv (as root) -- prlimit -- argv. The limits are set after the
    uid change, so RLIMIT_NPROC counts the sandbox's own processes, not root's."""
    isolation = isolation or detect()
    as_root = os.geteuid() == 0
    drop = _drop_uid_argv(spec.uid) if as_root else []
    limits = _limits_argv(spec.limits)
    if isolation.mode == "bubblewrap":
        return _bwrap_argv(spec, as_root, None) + drop + limits + list(argv)
    env = ["env", "-i", *[f"{k}={v}" for k, v in _sandbox_env(spec).items()]]
    if isolation.mode == "unshare":
        unshare = [shutil.which("unshare"), "--pid", "--fork", "--kill-child", "--mount-proc", "--net", "--ipc",
                   "--uts"]
        return unshare + drop + env + limits + list(argv)
    return drop + env + limits + list(argv)


def host_cwd(spec: SandboxSpec, isolation: Isolation | None = None) -> str | None:
    """Where to start the command on the host (bwrap changes directory itself)."""
    isolation = isolation or detect()
    if isolation.mode == "bubblewrap":
        return "/"
    return None  # the caller provides a scratch folder


# -- one unprivileged uid per job -------------------------------------------------------------


def _lock_dir() -> Path:
    for base in ["/run", tempfile.gettempdir()]:
        path = Path(base) / f"course-grading-uids-{os.geteuid()}"
        try:
            path.mkdir(mode=0o700, exist_ok=True)
            st = path.lstat()
            if st.st_uid == os.geteuid() and (st.st_mode & 0o077) == 0 and not path.is_symlink():
                return path
        except OSError:
            continue
    raise RuntimeError("no private folder for the sandbox uid locks")


@contextlib.contextmanager
def job_uid():
    """An unprivileged uid no other running job on this machine holds (root only; else 65534)."""
    if os.geteuid() != 0:
        yield NOBODY
        return
    folder = _lock_dir()
    start = (os.getpid() * 7) % UID_COUNT
    for i in range(UID_COUNT):
        uid = UID_BASE + (start + i) % UID_COUNT
        handle = open(folder / str(uid), "w")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            handle.close()
            continue
        try:
            kill_uid(uid)  # nothing of an earlier holder may survive into this job
            yield uid
        finally:
            kill_uid(uid)
            handle.close()
        return
    raise RuntimeError("every sandbox uid is in use")


def uid_in_use(uid: int) -> bool:
    """Whether a running job holds `uid` now (its processes are that job's, not leftovers)."""
    if os.geteuid() != 0:
        return False
    try:
        with open(_lock_dir() / str(uid), "w") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return False
    except OSError:
        return True


def processes_of_uid(uid: int) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.stat(f"/proc/{entry}").st_uid == uid:
                    pids.append(int(entry))
            except OSError:
                pass
    return pids


def kill_uid(uid: int) -> None:
    """SIGKILL every process of a sandbox uid (used as root, before and after each job)."""
    if os.geteuid() != 0 or uid < UID_BASE:
        return
    for _ in range(5):
        pids = processes_of_uid(uid)
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL a command started with start_new_session=True, and with it (die-with-parent,
    PID namespace) everything it started."""
    with contextlib.suppress(OSError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(OSError):
        proc.kill()
    with contextlib.suppress(Exception):
        proc.wait(timeout=10)


# -- what the sandbox guarantees, checked from inside ------------------------------------------

PROBE = r'''
import json, os, socket, subprocess, sys, time
secret_paths = json.loads(sys.argv[1])
out = {}
out["uid"] = os.getuid()
out["euid"] = os.geteuid()
try:
    r = subprocess.run(["mount", "-o", "remount,bind,rw", "/"], capture_output=True, timeout=10)
    out["mount"] = r.returncode == 0
except Exception:
    out["mount"] = False
def can_write(path):
    try:
        with open(os.path.join(path, ".course-probe"), "w") as f:
            f.write("x")
        os.unlink(os.path.join(path, ".course-probe"))
        return True
    except OSError:
        return False
out["root_writable"] = can_write("/")
out["shm_writable"] = can_write("/dev/shm")
out["tmp_writable"] = can_write("/tmp")
out["readable_secrets"] = [p for p in secret_paths if os.path.exists(p) and (os.access(p, os.R_OK))]
try:
    out["interfaces"] = sorted(l.split(":")[0].strip() for l in open("/proc/net/dev").read().splitlines()[2:])
except OSError:
    out["interfaces"] = None
try:
    socket.create_connection(("1.1.1.1", 53), timeout=3).close()
    out["network"] = True
except OSError:
    out["network"] = False
out["pids"] = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
out["environ_keys"] = sorted(os.environ)
parent_env = None
for pid in out["pids"]:
    if pid != os.getpid():
        try:
            parent_env = open(f"/proc/{pid}/environ", "rb").read()[:50]
        except OSError:
            pass
out["other_environ_readable"] = parent_env is not None and len(parent_env) > 0
children = [subprocess.Popen(["sleep", "600"], start_new_session=True) for _ in range(3)]
out["sleep_pids"] = [c.pid for c in children]
print(json.dumps(out), flush=True)
'''


def verify(spec: SandboxSpec, secrets: list[str], isolation: Isolation | None = None, confine=None) -> dict:
    """Run a probe inside a sandbox made from `spec`; returns guarantee -> (held, detail).

    Guarantees: not root, no mount, read-only root, private /dev/shm, no network, no view of
    `secrets` (host paths: solutions/, the gradebook, ...), only the sandbox's processes in /proc,
    no other process's environment, and `sleep` children gone once the sandbox ends."""
    import json

    isolation = isolation or detect()
    command = [python_executable(), "-I", "-c", PROBE, json.dumps(secrets)]
    argv = confine(command) if confine is not None else wrap(spec, command, isolation)
    marker = f"course-probe-{os.getpid()}-{time.monotonic_ns()}"
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                            start_new_session=True, cwd=host_cwd(spec, isolation) or tempfile.gettempdir(),
                            env={**os.environ, "COURSE_PROBE": marker})
    line = proc.stdout.readline()
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        pass
    kill_group(proc)
    result = json.loads(line or b"{}")
    time.sleep(0.3)
    survivors = [pid for pid in (processes_of_uid(spec.uid) if os.geteuid() == 0 else [])]
    if not survivors:
        # as another user (or in the rlimits fallback), look for the probe's sleeps by command line
        survivors = [p for p in _sleepers()]
    if result.get("sleep_pids") and survivors:
        for pid in survivors:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
    return {
        "not root": (result.get("uid", 0) != 0 and result.get("euid", 0) != 0, f"uid {result.get('uid')}"),
        "mount fails": (result.get("mount") is False, "mount -o remount,rw / " + ("failed" if result.get("mount") is False else "succeeded")),
        "read-only root": (result.get("root_writable") is False, "/ is " + ("read-only" if result.get("root_writable") is False else "writable")),
        "private /dev/shm": (isolation.mode == "bubblewrap" and confine is None,
                             "a private tmpfs" if isolation.mode == "bubblewrap" and confine is None else "the host's /dev/shm"),
        "no network": (result.get("network") is False and result.get("interfaces") in (["lo"], []),
                       f"interfaces {result.get('interfaces')}, outside connection {'made' if result.get('network') else 'refused'}"),
        "secrets hidden": (not result.get("readable_secrets"), f"readable: {result.get('readable_secrets')}"),
        "own PID namespace": (bool(result.get("pids")) and max(result.get("pids", [10**9])) < 50,
                              f"/proc shows {len(result.get('pids', []))} processes"),
        "no other environment": (not result.get("other_environ_readable") and "COURSE_PROBE" not in result.get("environ_keys", []),
                                 "scrubbed environment"),
        "children die": (not survivors, f"{len(survivors)} sleep processes survived"),
    }


def _sleepers() -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmd = open(f"/proc/{entry}/cmdline", "rb").read().split(b"\0")
                env = open(f"/proc/{entry}/environ", "rb").read() if os.geteuid() == 0 else b""
            except OSError:
                continue
            if cmd[:2] == [b"sleep", b"600"] and b"COURSE_PROBE" in env:
                pids.append(int(entry))
    return pids
