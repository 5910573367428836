"""nbgrader's kernel, confined: an nbgrader Execute preprocessor whose kernel runs in the sandbox.

`nbgrader autograde` itself runs in the grader's job process (autograder/jobs.py), on a private
copy of the course that holds only this one submission and a gradebook with no solutions; it
reads the notebook and writes that private gradebook. Only the kernel runs the learner's code,
and it is started through autograder/isolation.py like the independent check: unprivileged,
no network, a read-only root with only the Python environment and a copy of transformer_lib
without the chapter's reference answers, limits on memory, CPU, processes and file size, and a
PID namespace that takes every process the kernel started with it.

The kernel also loads the grader's collector (sandbox_runner.load_ipython_extension) when the job
asks for it: the same run then sends the outputs of the learner's functions at each checked test
cell to the grader, so each submission's notebook runs once. Code cells tagged skip-when-grading
(training runs no graded test depends on, tests/test_grading_mode.py) are not run: their output
says so, in the autograded notebook and the feedback.

The kernel talks to nbgrader over Unix sockets (ZeroMQ's ipc transport) in a folder that is the
only host folder the sandbox may write to. The run stops after the last graded cell: nothing later
changes a score, and the feedback does not show those cells' outputs. Interrupts go as messages (the kernel's own process
raises KeyboardInterrupt); a kernel that does not answer an interrupt, dies (os._exit) or runs
past the notebook's total limit is stopped, and every cell from there on gets an error output
saying why, so nbgrader scores what ran and grading goes on.

The job passes the sandbox's description in the environment variable COURSE_KERNEL_SANDBOX (a
JSON file; see jobs.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from jupyter_client.manager import AsyncKernelManager
from nbclient.exceptions import CellControlSignal, CellTimeoutError, DeadKernelError
from nbformat.notebooknode import NotebookNode
from nbgrader.preprocessors import Execute

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import isolation  # noqa: E402
from feedback import SKIPPED_TEXT  # noqa: E402

SPEC_VARIABLE = "COURSE_KERNEL_SANDBOX"
# Grading mode: a code cell tagged so (a training run, a demonstration) is not run while grading.
# tests/test_grading_mode.py checks that no later cell up to the last graded test reads a name
# such a cell defines, so no score can depend on it.
SKIP_TAG = "skip-when-grading"


def _load_spec() -> dict:
    path = os.environ.get(SPEC_VARIABLE)
    if not path:
        raise RuntimeError(f"{SPEC_VARIABLE} is not set: the sandboxed kernel runs only under `make grade`")
    with open(path) as f:
        return json.load(f)


def sandbox_spec(spec: dict) -> isolation.SandboxSpec:
    return isolation.SandboxSpec(
        uid=spec["uid"],
        read_only=[tuple(p) for p in spec["read_only"]],
        read_write=[tuple(p) for p in spec["read_write"]],
        limits=isolation.Limits(**spec["limits"]),
        env=spec.get("env", {}),
    )


class SandboxedKernelManager(AsyncKernelManager):
    """A kernel manager whose kernel runs in the grader's sandbox and talks over ipc sockets."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._course_spec = _load_spec()
        channel = self._course_spec["channel"]
        self.transport = "ipc"
        self.ip = os.path.join(channel, "k")
        self.connection_file = os.path.join(channel, "kernel.json")

    def write_connection_file(self, **kwargs):
        super().write_connection_file(**kwargs)
        if os.geteuid() == 0:  # the kernel runs as the job's own uid and must read it
            os.chown(self.connection_file, self._course_spec["uid"], self._course_spec["uid"])

    def format_kernel_cmd(self, extra_arguments=None):
        cmd = super().format_kernel_cmd(extra_arguments)
        if os.path.realpath(cmd[0]) == os.path.realpath(sys.executable):
            cmd[0] = isolation.python_executable()
        if self._course_spec.get("collect"):  # the grader's collector (sandbox_runner.py), loaded before any cell
            cmd = cmd + ["--IPKernelApp.extensions=sandbox_runner"]
        return isolation.wrap(sandbox_spec(self._course_spec), cmd, isolation.detect(self._course_spec["isolation"]))

    async def _async_pre_start_kernel(self, **kw):
        cmd, kw = await super()._async_pre_start_kernel(**kw)
        self.kernel_spec.interrupt_mode = "message"  # a signal would reach bwrap, not the kernel
        return cmd, kw

    async def _async_launch_kernel(self, kernel_cmd, **kw):
        kw["stdout"] = subprocess.DEVNULL
        kw["stderr"] = subprocess.DEVNULL
        kw["stdin"] = subprocess.DEVNULL
        kw["cwd"] = self._course_spec["channel"]
        kw["env"] = {"PATH": os.environ.get("PATH", os.defpath)}
        kw["start_new_session"] = True
        await super()._async_launch_kernel(kernel_cmd, **kw)


class NotebookStopped(Exception):
    pass


class SandboxedExecute(Execute):
    """nbgrader's Execute with the kernel above, a cap on each cell's output while it runs, and
    a stop that keeps the notebook gradable when the kernel cannot go on."""

    def __init__(self, **kwargs):
        kwargs["kernel_manager_class"] = SandboxedKernelManager
        super().__init__(**kwargs)
        spec = _load_spec()
        self._output_cap = int(spec.get("output_bytes", 2 * 2**20))
        self._budget = float(spec.get("notebook_timeout", 3600))
        self._stop_after = int(spec.get("stop_after", 10**9))
        if spec.get("collect"):
            # A test cell first has the learner's functions run on the checker's cases (the grader's
            # collector, with the per-cell limit of its own), then runs its own checks: twice the limit.
            self.timeout_func = self._timeout_of

    def _timeout_of(self, cell) -> int:
        meta = cell.metadata.get("nbgrader", {})
        return 2 * self.timeout + 10 if meta.get("grade") and not meta.get("solution") else self.timeout

    # -- output cap ----------------------------------------------------------------------------

    def output(self, outs, msg, display_id, cell_index):
        size = len(json.dumps(msg.get("content", {}), default=str))
        used = self._used.get(cell_index, 0) + size
        self._used[cell_index] = used
        if used > self._output_cap:
            if cell_index not in self._capped:
                self._capped.add(cell_index)
                outs.append(NotebookNode(output_type="stream", name="stdout",
                                         text=f"\n[output cut: more than {self._output_cap // 1024} KiB]\n"))
            return None
        return super().output(outs, msg, display_id, cell_index)

    # -- running the cells ---------------------------------------------------------------------

    def preprocess_cell(self, cell, resources, index):
        if index > self._stop_after:  # after the last graded cell nothing changes a score: not run
            return cell, resources
        if cell.cell_type == "code" and SKIP_TAG in cell.metadata.get("tags", []):
            cell.outputs = [NotebookNode(output_type="stream", name="stdout", text=SKIPPED_TEXT)]
            return cell, resources
        if time.monotonic() > self._deadline:
            raise NotebookStopped(f"the notebook ran past the grader's total limit of {self._budget:.0f} s")
        self._current = index
        return super().preprocess_cell(cell, resources, index)

    def preprocess(self, nb, resources=None, km=None):
        self._used, self._capped = {}, set()
        self._current = -1
        self._deadline = time.monotonic() + self._budget
        try:
            return super().preprocess(nb, resources, km)
        except (DeadKernelError, CellTimeoutError, NotebookStopped, CellControlSignal, RuntimeError, TimeoutError) as exc:
            reason = self._why(exc)
            self.log.warning("kernel stopped at cell %s: %s", self._current, reason)
            self._mark_rest(nb, max(self._current, 0), reason)
            return nb, resources

    @staticmethod
    def _why(exc: BaseException) -> str:
        if isinstance(exc, DeadKernelError):
            return "the kernel died (the process exited or was killed) while running this cell"
        if isinstance(exc, CellTimeoutError):
            return "this cell ran past the per-cell limit and the kernel did not respond to the interrupt"
        if isinstance(exc, NotebookStopped):
            return str(exc)
        return f"the kernel stopped: {type(exc).__name__}: {str(exc)[:200]}"

    @staticmethod
    def _mark_rest(nb, start: int, reason: str) -> None:
        for i, cell in enumerate(nb.cells):
            if i < start or cell.cell_type != "code":
                continue
            text = reason if i == start else f"not run: {reason} (cell {start})"
            cell.outputs = list(cell.get("outputs", [])) + [
                NotebookNode(output_type="error", ename="GradingStopped", evalue=text,
                             traceback=[f"GradingStopped: {text}"])]
