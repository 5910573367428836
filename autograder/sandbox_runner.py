"""Record what a learner's functions return at the graded test cells. Nothing is judged here: the
grader judges the outputs in its own process.

The recording (`Collector`) runs in two places, always confined by autograder/isolation.py with a
copy of transformer_lib in which the reference implementations being graded are stubs
(autograder/hiding.py):

* inside nbgrader's sandboxed kernel, as an IPython extension (`load_ipython_extension`): the one
  run of the notebook that gives nbgrader its autograded notebook also gives the grader the
  outputs, collected just before each checked test cell runs;
* as a script, for a re-run of one test on its own:

      python -I sandbox_runner.py PLAN.json NOTEBOOK.json

  The code cells run in order in a plain IPython shell; test cells are not run (their outputs are
  collected in their place); cells tagged skip-when-grading are not run.

At each graded test cell named in the plan the function each checker call names is looked up and
run on the checker's cases. Everything goes to the grader through one pipe or FIFO as frames:
b"C" + cell before each cell (the grader's watchdog restarts its per-cell clock on it), b"R" + one
test's outputs saved with torch.save, b"D" at the end. The grader reads a bounded number of bytes,
loads them with torch.load(weights_only=True) and validates them (core.validate_outputs) before
judging.

After each test the grader answers whether the function passed the test's *visible* checks, and
`yours_or_reference` in later cells hands on the learner's function or the reference exactly as it
would in the learner's lab (the reference is hidden here, so a wrong answer's later cells fail;
the grader then re-runs the tests after it, each on its own with only its own reference hidden:
the frames report which hidden references were called).

The learner's code shares this process, so it could write to the pipe itself, or patch anything
here: that gains nothing, because whatever reaches the grader is judged as that learner's answer,
and the reference it would need to fake a right one is not in this sandbox.
"""

import contextlib
import io
import json
import os
import select
import signal
import struct
import sys
import time
import warnings


class CellTimeout(BaseException):
    """A BaseException, so that no `except Exception` in the learner's code (or in the
    checker's per-case loop) can swallow it and keep an endless loop going."""


def _on_alarm(signum, frame):
    raise CellTimeout("the cell ran past the grader's per-cell limit")


def _frame(fd: int, kind: bytes, payload) -> None:
    for data in (kind + struct.pack(">Q", len(payload)), payload):
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]


def _read_reply(fd: int, timeout: float) -> dict:
    data = b""
    while not data.endswith(b"\n"):
        ready, _, _ = select.select([fd], [], [], timeout)
        if not ready:
            return {}
        chunk = os.read(fd, 65536)
        if not chunk:
            return {}
        data += chunk
    return json.loads(data)


def _error(exc: BaseException) -> dict:
    return {"__type__": "error", "__error__": f"{type(exc).__name__}: {exc}"[:2000]}


MAX_OUTPUT_BYTES = 64 * 2**20  # the grader reads no more of one test (jobs.MAX_OUTPUT_BYTES)


class OutputsTooLarge(Exception):
    pass


def _tensor_bytes(value, torch) -> int:
    """Bytes of the tensors in one call's outputs, counted before torch.save tries to copy them
    (saving 2 GiB into memory fails differently from one Python to the next)."""
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, dict):
        return sum(_tensor_bytes(v, torch) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(_tensor_bytes(v, torch) for v in value)
    return 0


class Collector:
    """What both ways of running a notebook share: at each graded test cell, the outputs of the
    learner's functions on the checker's cases go to the grader as a frame; its answer (did they
    pass the visible checks?) decides what `yours_or_reference` hands on in later cells."""

    def __init__(self, plan: dict, out_fd: int, in_fd):
        import torch

        import transformer_lib.checks as checks
        import transformer_lib.checks.core as core
        from transformer_lib.checks import get_checker
        from transformer_lib.checks.core import _plain

        try:
            from transformer_lib._grading_hidden import CALLED, COUNTS
        except ImportError:  # a copy hiding nothing
            CALLED, COUNTS = [], {}
        self.torch, self.get_checker, self.plain = torch, get_checker, _plain
        self.called, self.counts = CALLED, COUNTS
        self.out_fd, self.in_fd = out_fd, in_fd
        self.per_cell = int(plan["cell_timeout"])
        self.targets = {t["grade_id"]: t for t in plan["tests"]}
        self.done: list[str] = []
        # checker name -> (the function judged at its test cell, or None for any, passed its visible checks);
        # a re-run starts with the verdicts the grader already has for earlier tests
        visible = {name: (None, bool(passed)) for name, passed in plan.get("visible", {}).items()}
        self.visible = visible
        original = core.yours_or_reference

        def yours_or_reference(fn, checker):
            known = visible.get(checker.name)
            if known is None or (known[0] is not None and known[0] is not fn):
                return original(fn, checker)
            name = getattr(fn, "__name__", checker.name)
            if known[1]:
                print(f"using your `{name}`")
                return fn
            print(f"your `{name}` does not pass its check yet: using the reference")
            return checker.fallback if checker.fallback is not None else checker.reference

        core.yours_or_reference = checks.yours_or_reference = yours_or_reference
        signal.signal(signal.SIGALRM, _on_alarm)

    @property
    def finished(self) -> bool:
        return len(self.done) == len(self.targets)

    def progress(self, cell) -> None:
        """Before each cell: the grader's watchdog restarts its per-cell clock."""
        _frame(self.out_fd, b"C", json.dumps({"cell": cell, "called": list(self.called)}).encode())

    def end(self) -> None:
        _frame(self.out_fd, b"D", json.dumps({"collected": len(self.done), "expected": len(self.targets)}).encode())

    def test(self, grade_id: str, shell) -> None:
        """Collect one test's outputs, send them, and wait for the grader's answer."""
        self.progress(f"test {grade_id}")
        functions = self._send_outputs(grade_id, shell, self.per_cell)
        self._after_test(grade_id, functions)

    def test_in_child(self, grade_id: str, shell) -> None:
        """The same from a forked copy of this process (in the kernel): the learner's functions see
        the hidden cases there only, so nothing they keep or print reaches a later cell or the
        feedback; and a function that ignores the time limit is killed with its copy."""
        self.progress(f"test {grade_id}")
        test = self.targets[grade_id]
        functions = []
        for call in test["calls"]:
            try:
                functions.append(eval(call["function"], shell.user_ns))
            except BaseException:
                functions.append(None)
        limit = self.per_cell + 2  # the copy's own alarm comes first; the kernel gives a test cell twice the limit
        sys.stdout.flush()
        sys.stderr.flush()
        done_read, done_write = os.pipe()
        with warnings.catch_warnings():  # 3.12+ warns about fork in a threaded process; the copy uses no thread
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
        if pid == 0:  # the copy: never touches the kernel's sockets, prints nowhere, ends with os._exit
            try:
                os.close(done_read)
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, 1)
                os.dup2(devnull, 2)
                sys.stdout = sys.stderr = open(os.devnull, "w")
                shell.display_pub.publish = lambda *args, **kwargs: None
                self._send_outputs(grade_id, shell, self.per_cell, progress=lambda: os.write(done_write, b"w"))
                os.write(done_write, b"1")
            finally:
                os._exit(0)
        os.close(done_write)
        state, deadline = b"", time.monotonic() + limit
        try:
            while time.monotonic() < deadline and not state.endswith(b"1"):
                ready, _, _ = select.select([done_read], [], [], min(0.5, max(0.0, deadline - time.monotonic())))
                if ready:
                    chunk = os.read(done_read, 8)
                    if not chunk:
                        break  # the copy ended
                    if b"w" in chunk and b"w" not in state:  # it is writing its frame: let it finish
                        deadline = max(deadline, time.monotonic() + 30)
                    state += chunk
        except KeyboardInterrupt:  # interrupted while waiting: the copy goes, the test scores what it sent
            pass
        finally:
            os.close(done_read)
            sent = state.endswith(b"1")
            if not sent:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
        if not sent and b"w" in state:  # killed halfway through its frame: the stream is cut, send nothing more
            self.out_fd = os.open(os.devnull, os.O_WRONLY)
        elif not sent:
            why = (f"CellTimeout: the test ran past the grader's per-cell limit of {self.per_cell} s and did not stop "
                   "when interrupted" if time.monotonic() >= deadline else
                   "the process collecting this test ended before its outputs were sent (os._exit, a crash or the "
                   "memory limit)")
            self._send_record(grade_id, {"grade_id": grade_id, "calls": [{"__type__": "error", "__error__": why}
                                                                          for _ in test["calls"]],
                                         "forbidden_seen": [], "hidden_called": list(self.called), "called_during": []})
        self._after_test(grade_id, functions)

    def _send_outputs(self, grade_id: str, shell, per_cell: int, progress=None) -> list:
        """Run the test's functions on its cases and send one R frame; the functions looked up.
        `progress` is called just before the frame is written."""
        torch = self.torch
        test = self.targets[grade_id]
        before = dict(self.counts)
        try:
            calls, seen, functions = _collect(test, shell, per_cell, torch, self.get_checker, self.plain)
        except BaseException as exc:  # the checker itself failed here (its cases need a hidden reference, say)
            signal.alarm(0)
            calls, seen, functions = [_error(exc) for _ in test["calls"]], set(), [None] * len(test["calls"])
        record = {"grade_id": grade_id, "calls": calls, "forbidden_seen": sorted(seen),
                  "hidden_called": list(self.called),
                  "called_during": [n for n in self.called if self.counts.get(n, 0) > before.get(n, 0)]}
        del calls
        for i, call in enumerate(record["calls"]):
            size = _tensor_bytes(call, torch)
            if size > MAX_OUTPUT_BYTES:
                record["calls"][i] = _error(OutputsTooLarge(
                    f"the outputs were larger than {MAX_OUTPUT_BYTES // 2**20} MiB ({size / 2**20:,.0f} MiB)"))
        if progress is not None:
            progress()
        self._send_record(grade_id, record)
        return functions

    def _send_record(self, grade_id: str, record: dict) -> None:
        torch = self.torch
        try:
            buffer = io.BytesIO()
            buffer.write(grade_id.encode() + b"\0")
            torch.save(record, buffer)
        except BaseException as exc:  # outputs too big for the sandbox's memory, say: this test alone fails
            record["calls"] = [_error(exc) for _ in record["calls"]]
            buffer = io.BytesIO()
            buffer.write(grade_id.encode() + b"\0")
            torch.save(record, buffer)
        del record
        _frame(self.out_fd, b"R", buffer.getbuffer())
        del buffer

    def _after_test(self, grade_id: str, functions: list) -> None:
        test = self.targets[grade_id]
        self.done.append(grade_id)
        if self.in_fd is not None and not self.finished:
            reply = _read_reply(int(self.in_fd), self.per_cell + 60)
            for call, fn in zip(test["calls"], functions):
                name = call["checker"].removeprefix("check_")
                if not call["hidden"] and name in reply.get("visible_passed", {}):
                    self.visible[name] = (fn, bool(reply["visible_passed"][name]))


def main(plan_path: str, notebook_path: str) -> None:
    """A re-run: the notebook's code cells in a plain IPython shell, test cells not run."""
    with open(plan_path) as f:
        plan = json.load(f)
    with open(notebook_path) as f:
        nb = json.load(f)
    import matplotlib

    matplotlib.use("Agg")  # no display; plt.show() becomes a no-op
    from IPython.core.interactiveshell import InteractiveShell
    from traitlets.config import Config

    collector = Collector(plan, int(plan["fd_out"]), plan.get("fd_in"))
    config = Config()
    config.HistoryManager.enabled = False
    shell = InteractiveShell.instance(config=config)
    skip = set(plan.get("skip", []))
    for index, cell in enumerate(nb["cells"]):
        if collector.finished:
            break
        if cell.get("cell_type") != "code":
            continue
        grade_id = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
        if grade_id in collector.targets:
            collector.test(grade_id, shell)
            continue
        if grade_id in skip or GRADING_SKIP_TAG in cell.get("metadata", {}).get("tags", []):
            continue
        collector.progress(index)
        try:
            signal.alarm(collector.per_cell)
            shell.run_cell(cell.get("source", ""), silent=True, store_history=False)
        except CellTimeout:
            pass
        finally:
            signal.alarm(0)
    collector.end()
    os._exit(0)  # no atexit handler, no finaliser of the learner's runs after the outputs


def load_ipython_extension(shell) -> None:
    """The same collection inside nbgrader's sandboxed kernel, so that one run of the notebook both
    gives nbgrader its autograded notebook and sends the grader the outputs it judges.

    The plan (PLAN_NAME, beside the kernel's connection file) names two FIFOs in the kernel's channel folder and lists the
    code cells nbgrader will run (sha256 of each source, with its index): each cell is recognised
    as it arrives, the outputs of a test cell are collected just before the test cell itself runs,
    and the hidden references the test cell's own checks call are not counted as the learner's."""
    try:
        from ipykernel.kernelapp import IPKernelApp

        channel = os.path.dirname(IPKernelApp.instance().abs_connection_file)
    except Exception:
        return
    path = os.path.join(channel, PLAN_NAME)
    if not os.path.exists(path):
        return
    import ctypes
    import hashlib

    # Not dumpable: the copies forked for each test (and anything the learner starts) cannot read
    # this process's memory or /proc/<pid>/environ, as no process may read another's in a sandbox.
    with contextlib.suppress(Exception):
        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 4

    with open(path) as f:
        plan = json.load(f)
    out_fd = os.open(plan["fifo_out"], os.O_WRONLY)  # the grader holds the other ends open already
    in_fd = os.open(plan["fifo_in"], os.O_RDONLY)
    collector = Collector(plan, out_fd, in_fd)
    cells = [(sha, index, grade_id) for sha, index, grade_id in plan["cells"]]
    state = {"next": 0, "restore": None}

    def locate(source: str):
        digest = hashlib.sha256(source.encode()).hexdigest()
        for position in range(state["next"], len(cells)):
            if cells[position][0] == digest:
                state["next"] = position + 1
                return cells[position][1], cells[position][2]
        return None, None

    def before(info) -> None:
        if collector.finished:
            return
        index, grade_id = locate(getattr(info, "raw_cell", "") or "")
        if grade_id in collector.targets and grade_id not in collector.done:
            collector.test_in_child(grade_id, shell)
            state["restore"] = (list(collector.called), dict(collector.counts))
            if collector.finished:
                collector.end()
            return
        collector.progress(index if index is not None else "an unlisted cell")

    def after(result) -> None:
        if state["restore"] is not None:  # the test cell's own checks call its hidden reference: not the learner
            called, counts = state["restore"]
            collector.called[:] = called
            collector.counts.clear()
            collector.counts.update(counts)
            state["restore"] = None

    shell.events.register("pre_run_cell", before)
    shell.events.register("post_run_cell", after)


PLAN_NAME = "collect-plan.json"  # in the kernel's channel folder (jobs.py writes it)
GRADING_SKIP_TAG = "skip-when-grading"  # sandboxed_kernel.SKIP_TAG: not run while grading


def _collect(test, shell, per_cell, torch, get_checker, _plain):
    """Run the function each checker call names on the checker's cases (one time limit for the
    whole test cell, as in the notebook)."""
    forbidden = set(test.get("forbidden", []))
    seen: set = set()
    modes = _recorders(torch, forbidden, seen) if forbidden else []
    calls, functions = [], []
    timed_out = False
    signal.alarm(per_cell)
    try:
        for call in test["calls"]:
            checker = get_checker(call["checker"])
            try:
                fn = eval(call["function"], shell.user_ns)
            except BaseException as exc:
                calls.append(_error(exc))
                functions.append(None)
                continue
            functions.append(fn)
            outputs = []
            try:
                cases = checker.cases(call["hidden"])
            except Exception as exc:  # the cases need a reference hidden in this run: the grader re-runs the test
                calls.append(_error(exc))
                continue
            for case in cases:
                if timed_out:
                    outputs.append({"__type__": "error", "__error__": "CellTimeout: the test ran past the grader's per-cell limit"})
                    continue
                try:
                    for mode in modes:
                        mode.__enter__()
                    try:
                        with torch.no_grad():
                            outputs.append(_plain(checker._call(fn, case)))
                    finally:
                        for mode in reversed(modes):
                            mode.__exit__(None, None, None)
                except CellTimeout as exc:
                    timed_out = True
                    outputs.append(_error(exc))
                except NotImplementedError:
                    outputs.append({"__error__": "NotImplementedError", "__type__": "error"})
                except BaseException as exc:  # the learner's bug (SystemExit and KeyboardInterrupt included)
                    outputs.append(_error(exc))
            calls.append(outputs)
    finally:
        signal.alarm(0)
    return calls, seen, functions


def _recorders(torch, forbidden: set, seen: set) -> list:
    """Context managers that note forbidden calls, at the Python API level and at the operator level."""
    from torch.overrides import TorchFunctionMode, resolve_name
    from torch.utils._python_dispatch import TorchDispatchMode

    api = {name for name in forbidden if not name.startswith("aten.")}
    ops = {name.removeprefix("aten.") for name in forbidden if name.startswith("aten.")}

    class Functions(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            try:
                name = resolve_name(func)
            except Exception:
                name = None
            if name in api:
                seen.add(name)
            return func(*args, **(kwargs or {}))

    class Operators(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            packet = getattr(getattr(func, "overloadpacket", None), "__name__", "")
            if packet in ops:
                seen.add(f"aten.{packet}")
            return func(*args, **(kwargs or {}))

    return [m for m, wanted in ((Functions(), api), (Operators(), ops)) if wanted]


if __name__ == "__main__":
    main(*sys.argv[1:3])
