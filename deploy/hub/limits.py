"""Per-student limits for a class's servers without systemd: memory, processes, CPU share.

`make hub` runs each person's server as their own Unix account (JupyterHub's LocalProcessSpawner).
One student's runaway notebook (a fork bomb, a tensor bigger than the machine, a loop on every
core) must not take the class down, so `LimitedSpawner` puts each server, and everything it starts,
in cgroups of its own, `course-<login>` under the hub's own cgroup (cgroup v2 where the kernel
offers the controllers there, else cgroup v1), and sets rlimits as a floor that holds even where
no cgroup can be made:

    HUB_MEM_LIMIT   memory of a person's server and its kernels together (4G; as for SystemdSpawner)
    HUB_PIDS_LIMIT  their processes and threads (512)
    HUB_CPU_SHARE   their share of the CPUs when the machine is busy, in cpu.shares units (1024:
                    every student the same, and the same as any other process group)

A server's cgroups go when it stops or dies (whatever is left in them is killed first), and when the
hub exits. `describe()` is the one line `make hub` prints about which of these is in force.
"""

from __future__ import annotations

import asyncio
import atexit
import functools
import os
import resource
import signal
import time
from pathlib import Path

from jupyterhub.spawner import LocalProcessSpawner
from traitlets import Dict, Integer, default

CONTROLLERS = ("memory", "pids", "cpu")
UNITS = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}  # as SystemdSpawner's MemoryMax and JupyterHub read them


# -- the settings -----------------------------------------------------------------------------------


def parse_bytes(text: str) -> int:
    text = text.strip().upper()
    try:
        return int(float(text[:-1]) * UNITS[text[-1]]) if text[-1:] in UNITS else int(text)
    except (KeyError, ValueError):
        raise ValueError(f"HUB_MEM_LIMIT={text!r} is not a size (e.g. 4G, 512M)") from None


def settings() -> tuple[int, int, int]:
    """(memory in bytes, processes, cpu share) from the environment, with the course's defaults."""
    try:
        pids, share = int(os.environ.get("HUB_PIDS_LIMIT", "512")), int(os.environ.get("HUB_CPU_SHARE", "1024"))
    except ValueError:
        raise ValueError("HUB_PIDS_LIMIT and HUB_CPU_SHARE are whole numbers (e.g. 512, 1024)") from None
    return parse_bytes(os.environ.get("HUB_MEM_LIMIT", "4G")), pids, share


def _size(n: int) -> str:
    for unit in "TGMK":
        if n % UNITS[unit] == 0:
            return f"{n // UNITS[unit]}{unit}"
    return str(n)


# -- where the cgroups go ---------------------------------------------------------------------------


def _mounts() -> dict[str, tuple[str, str]]:
    """{controller: (mount point, root of the mount)} for cgroup v1; key "" for the cgroup2 mount."""
    found = {}
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        after = fields.index("-")
        kind, options = fields[after + 1], fields[after + 3].split(",")
        for name in [""] if kind == "cgroup2" else options if kind == "cgroup" else []:
            found.setdefault(name, (fields[4], fields[3]))
    return found


def _own_groups() -> dict[str, str]:
    """{controller: this process's cgroup path}; key "" for its cgroup v2 path."""
    groups = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, names, path = line.split(":", 2)
        for name in names.split(",") if names else [""]:
            groups[name] = path
    return groups


def _folder(mount: tuple[str, str], path: str) -> Path:
    point, root = mount
    # In a container without a cgroup namespace the mount shows a subtree and /proc the full path.
    if root != "/" and (path == root or path.startswith(root + "/")):
        path = path[len(root):]
    return Path(point) / path.lstrip("/")


@functools.cache
def hub_groups() -> tuple[str, dict[str, Path]]:
    """("v2" or "v1", {controller: the hub's own cgroup folder}) for the controllers it can use,
    ("", {}) where none. Cached: the answer is the hub's, and v2 below moves the hub itself."""
    try:
        mounts, own = _mounts(), _own_groups()
    except OSError:
        return "", {}
    if "" in mounts and "" in own:
        base = _folder(mounts[""], own[""])
        if base.name == "hub" and set(CONTROLLERS) <= set(_read(base.parent / "cgroup.subtree_control").split()):
            base = base.parent  # a hub restarted in the leaf an earlier one moved it to (below)
        if set(CONTROLLERS) <= set(_read(base / "cgroup.controllers").split()) and os.access(base, os.W_OK):
            try:
                _delegate_v2(base, mounts[""][0])
                return "v2", dict.fromkeys(CONTROLLERS, base)
            except OSError:
                pass
    v1 = {name: _folder(mounts[name], own[name]) for name in CONTROLLERS if name in mounts and name in own}
    v1 = {name: folder for name, folder in v1.items() if os.access(folder, os.W_OK)}
    return ("v1", v1) if v1 else ("", {})


def _delegate_v2(base: Path, mount_point: str) -> None:
    """cgroup v2 hands a group's controllers to its children only while no process sits in the group
    itself (the root excepted): move the hub's group's processes into a leaf `hub` next to the
    students' groups first, as systemd's delegation does."""
    if set(CONTROLLERS) <= set(_read(base / "cgroup.subtree_control").split()):
        return
    if base != Path(mount_point) and _read(base / "cgroup.procs").split():
        leaf = base / "hub"
        leaf.mkdir(exist_ok=True)
        for pid in _read(base / "cgroup.procs").split():
            try:
                (leaf / "cgroup.procs").write_text(pid)
            except ProcessLookupError:
                pass
    (base / "cgroup.subtree_control").write_text(" ".join(f"+{name}" for name in CONTROLLERS))


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


# -- one server's cgroups ---------------------------------------------------------------------------


def _weight(share: int) -> int:
    """cgroup v2's cpu.weight for a cpu.shares value: the default is 100 where cpu.shares' is 1024."""
    return min(10000, max(1, share * 100 // 1024))


def _limit_files(version: str, controller: str, memory: int, pids: int, share: int) -> list[tuple[str, str]]:
    if version == "v2":
        return {"memory": [("memory.max", str(memory)), ("memory.swap.max", "0")],
                "pids": [("pids.max", str(pids))],
                "cpu": [("cpu.weight", str(_weight(share)))]}[controller]
    # memory.memsw (memory and swap together) must stay at or above the memory limit at each write:
    # lift it, set the limit, then bring it down to the limit, so swap is no way around it.
    return {"memory": [("memory.memsw.limit_in_bytes", "-1"), ("memory.limit_in_bytes", str(memory)),
                       ("memory.memsw.limit_in_bytes", str(memory))],
            "pids": [("pids.max", str(pids))],
            "cpu": [("cpu.shares", str(share))]}[controller]


def make_groups(login: str, memory: int, pids: int, share: int) -> dict[str, str]:
    """{controller: folder} of `login`'s server's new cgroups, each with its limit set."""
    version, bases = hub_groups()
    made = {}
    try:
        for controller, base in bases.items():
            folder = base / f"course-{login}"
            folder.mkdir(exist_ok=True)
            made[controller] = str(folder)
            for name, value in _limit_files(version, controller, memory, pids, share):
                swap = name.startswith("memory.memsw") or name == "memory.swap.max"
                if not swap or (folder / name).exists():  # a kernel without swap accounting has no swap files
                    (folder / name).write_text(value)
    except OSError:
        release(made.values())
        raise
    _made.update(made.values())
    return made


def release(folders, timeout: float = 5.0) -> list[str]:
    """Kill whatever is still in these cgroups and remove them; returns those still there."""
    # Only the course's own groups: everything in a group given here is killed.
    left = [Path(f) for f in dict.fromkeys(folders) if Path(f).name.startswith("course-") and Path(f).exists()]
    for folder in left:
        if (folder / "pids.max").exists():  # no new process can start in it: the kill below outruns a fork bomb
            _write_quietly(folder / "pids.max", "0")
    deadline = time.monotonic() + timeout
    while left:
        for folder in list(left):
            for pid in _read(folder / "cgroup.procs").split():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except ProcessLookupError:
                    pass
            try:
                folder.rmdir()
                left.remove(folder)
                _made.discard(str(folder))
            except FileNotFoundError:
                left.remove(folder)
            except OSError:
                pass  # busy until the processes killed above have exited
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    return [str(folder) for folder in left]


def _write_quietly(path: Path, value: str) -> None:
    try:
        path.write_text(value)
    except OSError:
        pass


_made: set[str] = set()  # this hub's groups still there; removed at exit, should a stop not have run
atexit.register(lambda: release(list(_made)))


# -- the spawner ------------------------------------------------------------------------------------


class LimitedSpawner(LocalProcessSpawner):
    """LocalProcessSpawner with each server in cgroups of its own, and rlimits as a floor."""

    pids_limit = Integer(help="Processes and threads of a person's server (HUB_PIDS_LIMIT, 512).").tag(config=True)
    cpu_share = Integer(help="CPU share under contention, in cpu.shares units (HUB_CPU_SHARE, 1024).").tag(config=True)
    cgroups = Dict(help="{controller: folder} of this server's cgroups; kept across a hub restart.")

    @default("mem_limit")  # Spawner's own setting, which LocalProcessSpawner leaves unenforced
    def _default_mem_limit(self):
        return settings()[0]

    @default("pids_limit")
    def _default_pids_limit(self):
        return settings()[1]

    @default("cpu_share")
    def _default_cpu_share(self):
        return settings()[2]

    async def start(self):
        await self._release()  # a group an earlier server of this person left behind
        try:
            self.cgroups = make_groups(self.user.name, self.mem_limit, self.pids_limit, self.cpu_share)
        except OSError as exc:
            self.log.warning("no cgroups for %s's server (%s): rlimits only", self.user.name, exc)
            self.cgroups = {}
        return await super().start()

    def make_preexec_fn(self, name):
        become_user = super().make_preexec_fn(name)
        join = [os.path.join(folder, "cgroup.procs") for folder in dict.fromkeys(self.cgroups.values())]
        # RLIMIT_NPROC counts every process and thread of the account on the machine, the pids cgroup
        # only the server's: with the cgroup it is a looser floor, without it the limit itself.
        nproc = self.pids_limit * (2 if "pids" in self.cgroups else 1)
        memory = None if "memory" in self.cgroups else self.mem_limit  # per process: only where no cgroup counts them all

        def preexec():
            # Still root, in the child, before it execs: all it starts inherits the groups and limits.
            for procs in join:
                with open(procs, "w") as f:
                    f.write(str(os.getpid()))
            resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
            if memory:
                resource.setrlimit(resource.RLIMIT_DATA, (memory, memory))
            become_user()

        return preexec

    async def poll(self):
        status = await super().poll()
        if status is not None and self.cgroups:
            await self._release()  # the server died: its kernels and leftovers go with it
        return status

    async def stop(self, now=False):
        await super().stop(now=now)
        await self._release()

    async def _release(self):
        if self.cgroups:
            left = await asyncio.to_thread(release, list(self.cgroups.values()))
            if left:
                self.log.warning("cgroups of %s's server still busy: %s", self.user.name, ", ".join(left))
            self.cgroups = {name: folder for name, folder in self.cgroups.items() if folder in left}

    def get_state(self):
        state = super().get_state()
        if self.cgroups:
            state["cgroups"] = self.cgroups
        return state

    def load_state(self, state):
        super().load_state(state)
        self.cgroups = state.get("cgroups", {})


def describe() -> str:
    """One line: which limits each person's server runs under here."""
    memory, pids, share = settings()
    version, bases = hub_groups()
    parts = []
    if "memory" in bases:
        parts.append(f"memory {_size(memory)}")
    if "pids" in bases:
        parts.append(f"{pids} processes")
    if "cpu" in bases:
        parts.append(f"cpu weight {_weight(share)}" if version == "v2" else f"cpu shares {share}")
    floor = [f"{pids * (2 if 'pids' in bases else 1)} processes per account"]
    if "memory" not in bases:
        floor.append(f"memory {_size(memory)} per process")
    if not bases:
        return f"rlimits only: {', '.join(floor)}; no CPU share (no cgroup this hub may write)"
    missing = [name for name in CONTROLLERS if name not in bases]
    return (f"cgroup {version}: {', '.join(parts)}; rlimits as a floor: {', '.join(floor)}"
            + (f" (no {', '.join(missing)} cgroup here)" if missing else ""))
