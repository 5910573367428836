"""Run a learner's notebook and record what their functions return at the graded test cells.
Nothing is judged here: the grader judges the outputs in its own process.

The grader (autograder/jobs.py) starts this script confined by autograder/isolation.py, with a
copy of transformer_lib in which the reference implementations being graded are stubs
(autograder/hiding.py):

    python -I sandbox_runner.py PLAN.json NOTEBOOK.json

The code cells run in order, as in the notebook. At each graded test cell named in the plan the
function each checker call names is looked up and run on the checker's cases; other test cells
are skipped. Everything goes to the grader through one pipe (a file descriptor named in the plan)
as frames: b"C" + cell index before each cell (the grader's watchdog restarts its per-cell clock
on it), b"R" + one test's outputs saved with torch.save, b"D" at the end. The grader reads a
bounded number of bytes, loads them with torch.load(weights_only=True) and validates them
(core.validate_outputs) before judging.

After each test the grader answers on a second pipe whether the function passed the test's
*visible* checks, and `yours_or_reference` in later cells hands on the learner's function or the
reference exactly as it would in the learner's lab (the reference is hidden here, so a wrong
answer's later cells fail; the grader then re-runs the tests after it, each on its own with only
its own reference hidden: the runner reports which hidden references were called).

The learner's code shares this process, so it could write to the pipe itself, or patch anything
here: that gains nothing, because whatever reaches the grader is judged as that learner's answer,
and the reference it would need to fake a right one is not in this sandbox.
"""

import json
import os
import select
import signal
import struct
import sys


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


def main(plan_path: str, notebook_path: str) -> None:
    with open(plan_path) as f:
        plan = json.load(f)
    with open(notebook_path) as f:
        nb = json.load(f)
    out_fd, in_fd = int(plan["fd_out"]), plan.get("fd_in")
    per_cell = int(plan["cell_timeout"])

    import io

    import matplotlib

    matplotlib.use("Agg")  # no display; plt.show() becomes a no-op
    import torch
    from IPython.core.interactiveshell import InteractiveShell
    from traitlets.config import Config

    import transformer_lib.checks as checks
    import transformer_lib.checks.core as core
    from transformer_lib.checks import get_checker
    from transformer_lib.checks.core import _plain

    try:
        from transformer_lib._grading_hidden import CALLED, COUNTS
    except ImportError:  # a copy hiding nothing
        CALLED, COUNTS = [], {}

    # checker name -> (the function judged at its test cell, or None for any, passed its visible checks);
    # a re-run starts with the verdicts the grader already has for earlier tests
    visible = {name: (None, bool(passed)) for name, passed in plan.get("visible", {}).items()}
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

    config = Config()
    config.HistoryManager.enabled = False
    shell = InteractiveShell.instance(config=config)
    signal.signal(signal.SIGALRM, _on_alarm)

    targets = {t["grade_id"]: t for t in plan["tests"]}
    skip = set(plan.get("skip", []))
    done = 0
    for index, cell in enumerate(nb["cells"]):
        if done == len(targets):
            break
        if cell.get("cell_type") != "code":
            continue
        grade_id = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
        if grade_id in targets:
            _frame(out_fd, b"C", json.dumps({"cell": f"test {grade_id}", "called": list(CALLED)}).encode())
            test = targets[grade_id]
            before = dict(COUNTS)
            try:
                calls, seen, functions = _collect(test, shell, per_cell, torch, get_checker, _plain)
            except BaseException as exc:  # the checker itself failed here (its cases need a hidden reference, say)
                signal.alarm(0)
                calls, seen, functions = [_error(exc) for _ in test["calls"]], set(), [None] * len(test["calls"])
            record = {"grade_id": grade_id, "calls": calls, "forbidden_seen": sorted(seen),
                      "hidden_called": list(CALLED),
                      "called_during": [n for n in CALLED if COUNTS.get(n, 0) > before.get(n, 0)]}
            del calls
            for i, call in enumerate(record["calls"]):
                size = _tensor_bytes(call, torch)
                if size > MAX_OUTPUT_BYTES:
                    record["calls"][i] = _error(OutputsTooLarge(
                        f"the outputs were larger than {MAX_OUTPUT_BYTES // 2**20} MiB ({size / 2**20:,.0f} MiB)"))
            try:
                buffer = io.BytesIO()
                buffer.write(grade_id.encode() + b"\0")
                torch.save(record, buffer)
            except BaseException as exc:  # outputs too big for the sandbox's memory, say: this test alone fails
                record["calls"] = [_error(exc) for _ in test["calls"]]
                buffer = io.BytesIO()
                buffer.write(grade_id.encode() + b"\0")
                torch.save(record, buffer)
            del record
            _frame(out_fd, b"R", buffer.getbuffer())
            del buffer
            done += 1
            if in_fd is not None and done < len(targets):
                reply = _read_reply(int(in_fd), per_cell + 60)
                for call, fn in zip(test["calls"], functions):
                    name = call["checker"].removeprefix("check_")
                    if not call["hidden"] and name in reply.get("visible_passed", {}):
                        visible[name] = (fn, bool(reply["visible_passed"][name]))
            continue
        if grade_id in skip:
            continue
        _frame(out_fd, b"C", json.dumps({"cell": index, "called": list(CALLED)}).encode())
        try:
            signal.alarm(per_cell)
            shell.run_cell(cell.get("source", ""), silent=True, store_history=False)
        except CellTimeout:
            pass
        finally:
            signal.alarm(0)
    _frame(out_fd, b"D", json.dumps({"collected": done, "expected": len(targets)}).encode())
    os._exit(0)  # no atexit handler, no finaliser of the learner's runs after the outputs


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
