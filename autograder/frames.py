"""The frames a sandboxed run sends the grader, and what the grader makes of them.

Two kinds of run send frames, both written by sandbox_runner.py's collector: nbgrader's kernel
(the collector loaded as an IPython extension, writing to a FIFO) and a re-run of one test on its
own (sandbox_runner.py as a script, writing to a pipe). A frame is one byte of kind, the payload's
length as 8 bytes big-endian, then the payload (sandbox_runner._frame):

* `C`, before each cell: JSON {"cell": the cell's index or "test <grade id>", "called": the hidden
  references called so far}; it restarts the per-cell clock;
* `R`, one test's outputs: the grade id, a NUL, then a torch.save archive of {"grade_id", "calls"
  (the outputs per checker call), "forbidden_seen", "hidden_called", "called_during"}. When the
  run asked for it (a reply channel), the grader answers with one JSON line
  {"visible_passed": {exercise: bool}}, the test's visible checks, which later cells'
  yours_or_reference use as in the learner's lab;
* `D`, at the end.

What this module guarantees (`read_frames`, `load`), used by autograder/jobs.py:

* The bytes come from a process the learner's code ran in, so nothing in them is trusted and no
  frame makes the grader raise. An `R` archive is opened with torch.load(weights_only=True) only
  after its entries are checked (stored, not compressed; bounded total size and count), then
  validated (core.validate_outputs: plain tensors and numbers, one per case) and only then judged
  (by the caller's `judge`). Anything else gives that test a `Collected` with no outputs and a
  problem saying why: scored 0.
* An `R` frame over MAX_OUTPUT_BYTES is not read: its first bytes name the test, which scores 0
  with a note, and the run goes on. Any other oversized frame, an unknown kind, a malformed
  progress frame, or outputs for a test the grader did not ask for (or a second time) stop the
  run, with a `RunEnd` saying so.
* Every run ends within limits: a cell that sends no frame for the per-cell limit plus
  WATCHDOG_GRACE (in nbgrader's kernel twice the limit plus 10 s: a test cell's collection, then
  its checks; the first cell also waits 60 s for the imports), or a run past the notebook's total
  limit plus 60 s, ends the reading with a `RunEnd` that says where it was.
* How a run of nbgrader's kernel ended does not depend on which the grader sees first, the
  driver's answer or the FIFO closing (tests/test_grading_frames.py); a driver that answers
  before any frame means the collector never started (None: the job collects with a re-run).
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import select
import struct
import subprocess
import time
import zipfile

MAX_OUTPUT_BYTES = 64 * 2**20  # outputs one test may send back
WATCHDOG_GRACE = 5  # seconds past the per-cell limit before the grader kills a run that ignores it


@dataclasses.dataclass
class Collected:
    """What one sandboxed run sent back for one test."""

    outputs: list | None  # per checker call: the validated outputs (None: see problem)
    problem: str = ""
    seen: list = dataclasses.field(default_factory=list)  # forbidden APIs called
    called: list = dataclasses.field(default_factory=list)  # hidden references called so far in the run
    called_during: list = dataclasses.field(default_factory=list)  # ... while this test's functions ran
    judged: list = dataclasses.field(default_factory=list)  # (passed, message) per checker call
    english: list = dataclasses.field(default_factory=list)  # each message in English (the report's)


@dataclasses.dataclass
class RunEnd:
    problem: str  # why the run ended early ("" when it ran to the end)
    called: list  # hidden references called before it ended
    during_test: bool = False  # it ended while collecting a test's outputs
    test: str = ""  # ... of this test


def read_frames(fd: int, reply_fd: int | None, proc: subprocess.Popen | None, tests: dict, load,
                cell_timeout: int, notebook_timeout: int, watch: int | None = None,
                on_first_frame=None) -> tuple[dict, RunEnd | None]:
    """Read one run's frames until it says it is done, ends, or overruns a limit. `proc` is the
    runner's process; with `watch` (nbgrader's driver, whose kernel sends the frames) the run
    is over once the driver has answered: a kernel whose collector never sent a frame then
    gives None (the caller collects with a separate run). `load(payload, test)` reads one `R`
    frame's archive (see `load`); `on_first_frame()` is called when the first bytes arrive."""
    per_cell = cell_timeout + WATCHDOG_GRACE
    if proc is None:  # nbgrader's kernel gives a test cell twice the limit (collection, then its checks)
        per_cell = 2 * cell_timeout + 10 + WATCHDOG_GRACE
    total_deadline = time.monotonic() + notebook_timeout + 60
    deadline = time.monotonic() + per_cell + 60  # the first cell also waits for the imports
    buffer = bytearray()
    last_cell, called = "the start", []
    cell_started = time.monotonic()
    connected = False
    skipping, skip_head = 0, bytearray()
    collected: dict[str, Collected] = {}

    def end(problem: str) -> tuple[dict, RunEnd]:
        during = bool(problem) and str(last_cell).startswith("test ")
        return collected, RunEnd(problem, called, during, str(last_cell)[5:] if during else "")

    def overran() -> str:
        where = last_cell if str(last_cell).startswith("test") else f"cell {last_cell}"
        return (f"{where} ran past the per-cell limit of {cell_timeout} s and did not stop "
                "when interrupted: the run was stopped")

    def kernel_ended() -> str:
        """Why nbgrader's kernel stopped sending before the collection was complete."""
        if time.monotonic() - cell_started >= cell_timeout:
            return overran()
        where = f"while running {last_cell}" if str(last_cell).startswith("test") else f"in cell {last_cell}"
        return (f"the notebook's process ended {where} before the test's outputs were sent "
                "(os._exit, a crash or the memory limit)")

    while True:
        now = time.monotonic()
        limit = min(deadline, total_deadline)
        if now >= limit:
            if limit == total_deadline:
                return end(f"the notebook ran past the grader's total limit (last at {last_cell})")
            return end(overran())
        ready, _, _ = select.select([fd] + ([watch] if watch is not None else []), [], [], min(1.0, limit - now))
        if not ready:
            continue
        if fd not in ready:  # the driver answered: the kernel's run is over
            if not connected:
                return collected, None
            if all(grade_id in collected for grade_id in tests):
                return end("")
            # nbgrader stopped the notebook (a cell that ignored its interrupt, a dead kernel)
            # before the collector's last frame: the same end as when the FIFO closes first,
            # whichever of the two this machine happens to see first
            return end(kernel_ended())
        try:
            chunk = os.read(fd, 1 << 20)
        except BlockingIOError:
            continue
        if not chunk:
            if proc is None:
                if not connected and watch is not None:
                    return collected, None
                return end(kernel_ended())
            code = proc.poll()
            if code is None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    code = proc.wait(timeout=5)
            where = f"while running {last_cell}" if str(last_cell).startswith("test") else f"in cell {last_cell}"
            return end(f"the notebook's process ended {where} before the test's outputs were sent "
                       f"(exit status {code}: os._exit, a crash or the memory limit)")
        if not connected and on_first_frame is not None:
            on_first_frame()
        connected = True
        buffer += chunk
        while True:
            if skipping:  # an oversized frame: keep its first bytes (the test's id), drop the rest
                if len(skip_head) < 256:
                    take = buffer[:256 - len(skip_head)]
                    skip_head += take
                drop = min(skipping, len(buffer))
                del buffer[:drop]
                skipping -= drop
                if skipping:
                    break
                grade_id = bytes(skip_head).partition(b"\0")[0].decode("utf-8", "replace")
                if grade_id not in tests or grade_id in collected:
                    return end("the run sent outputs the grader did not ask for: stopped")
                collected[grade_id] = Collected(None, f"the outputs were larger than {MAX_OUTPUT_BYTES // 2**20} MiB: "
                                                      "not read, scored 0", called=list(called))
                if reply_fd is not None:
                    with contextlib.suppress(OSError):
                        os.write(reply_fd, b'{"visible_passed": {}}\n')
                deadline = time.monotonic() + per_cell
                continue
            if len(buffer) < 9:
                break
            kind, size = bytes(buffer[:1]), struct.unpack(">Q", bytes(buffer[1:9]))[0]
            if size > MAX_OUTPUT_BYTES:
                if kind != b"R":
                    return end("the run sent a message that is not in the grader's format: stopped")
                del buffer[:9]
                skipping, skip_head = size, bytearray()
                continue
            if len(buffer) < 9 + size:
                break
            payload = bytes(buffer[9:9 + size])
            del buffer[:9 + size]
            if kind == b"C":
                try:
                    info = json.loads(payload)
                    last_cell = str(info["cell"])[:80]
                    called = [str(n)[:200] for n in info.get("called", [])][:100]
                except Exception:
                    return end("the run sent a malformed progress message: stopped")
                cell_started = time.monotonic()
                deadline = time.monotonic() + per_cell
            elif kind == b"R":
                head, _, body = payload.partition(b"\0")
                grade_id = head.decode("utf-8", "replace")
                if grade_id not in tests or grade_id in collected:
                    return end("the run sent outputs the grader did not ask for: stopped")
                got = load(body, tests[grade_id])
                called = got.called or called
                collected[grade_id] = got
                if reply_fd is not None:
                    visible = {}
                    for call, (passed, _) in zip(tests[grade_id].calls, got.judged or []):
                        if not call["hidden"]:
                            visible[call["checker"].removeprefix("check_")] = bool(passed and got.outputs is not None)
                    with contextlib.suppress(OSError):
                        os.write(reply_fd, (json.dumps({"visible_passed": visible}) + "\n").encode())
                deadline = time.monotonic() + per_cell
            elif kind == b"D":
                return end("")
            else:
                return end("the run sent a message that is not in the grader's format: stopped")


def load(payload: bytes, test, judge) -> Collected:
    """torch.load(weights_only=True) on bytes from the sandbox, inside a guard; then validation,
    then judging (`judge(test, outputs)`: (passed, message) per checker call, and each message in
    English), here in the grader's process."""
    import torch
    from transformer_lib.checks import get_checker
    from transformer_lib.checks.core import validate_outputs

    def bad(why: str, *names) -> Collected:
        return Collected(None, f"the outputs file was malformed or oddly typed ({why}): scored 0", *names)

    try:
        with zipfile.ZipFile(io.BytesIO(payload)) as archive:
            infos = archive.infolist()
            if sum(i.file_size for i in infos) > 4 * MAX_OUTPUT_BYTES or len(infos) > 100_000 or \
                    any(i.compress_type != zipfile.ZIP_STORED for i in infos):
                return bad("unexpected archive contents")
        data = torch.load(io.BytesIO(payload), weights_only=True, map_location="cpu")
    except Exception as exc:
        return bad(f"it could not be read back safely: {type(exc).__name__}")
    if type(data) is not dict or type(data.get("calls")) is not list or data.get("grade_id") != test.grade_id:
        return bad("not the grader's format")
    names = []
    for key in ("forbidden_seen", "hidden_called", "called_during"):
        value = data.get(key, [])
        if type(value) is not list or not all(type(v) is str for v in value):
            return bad(f"{key} is not a list of names")
        names.append([v[:200] for v in value[:100]])
    if len(data["calls"]) != len(test.calls):
        return bad("wrong number of checks", *names)
    outputs = []
    for call, outs in zip(test.calls, data["calls"]):
        checker = get_checker(call["checker"])
        if type(outs) is dict:
            problem = validate_outputs([outs], 1)
            if problem or outs.get("__type__") != "error":
                return bad(problem or "not the grader's format", *names)
            outputs.append(outs)
            continue
        problem = validate_outputs(outs, len(checker.cases(call["hidden"])))
        if problem:
            return bad(problem, *names)
        outputs.append(outs)
    got = Collected(outputs, "", *names)
    got.judged, got.english = judge(test, outputs)
    return got
