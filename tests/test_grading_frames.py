"""How the grader reads the frames that nbgrader's sandboxed kernel sends (autograder/jobs.py,
`_Job._read_frames`). When nbgrader stops the notebook (a test cell that ignores its interrupt, a
kernel that dies), two things reach the grader: nbgrader's driver answers, and the kernel's FIFO
closes. Which comes first depends on the machine's timing; the end of the run, and so which later
tests are re-run on their own, must not. CI once saw the driver first under load, and a test that
the re-run would have scored got 0 ("the notebook's run ended before this test")."""

import os
import sys
import threading
import time
import types

import pytest

from course_files import ROOT

sys.path.insert(0, str(ROOT / "autograder"))
import jobs  # noqa: E402
from sandbox_runner import _frame  # noqa: E402

CELL_TIMEOUT = 1
TESTS = {"first_test": None, "second_test": None}  # only the ids are read on this path


def _job() -> "jobs._Job":
    job = object.__new__(jobs._Job)
    job.spec = types.SimpleNamespace(cell_timeout=CELL_TIMEOUT, notebook_timeout=60)
    return job


def _kernel_stops_in(last_cell: str, driver_first: bool, hung: bool) -> "jobs.RunEnd":
    """A kernel run whose last progress frame names `last_cell`, after which nbgrader stops it:
    after the per-cell limit if `hung`, at once otherwise; the driver answering before the FIFO
    closes if `driver_first`."""
    frames_read, frames_write = os.pipe()
    driver_read, driver_write = os.pipe()
    _frame(frames_write, b"C", b'{"cell": "%s", "called": []}' % last_cell.encode())

    def nbgrader_stops():
        time.sleep(CELL_TIMEOUT + 0.2 if hung else 0.05)
        first, second = ((lambda: os.write(driver_write, b'{"done": true}\n'), lambda: os.close(frames_write))
                         if driver_first else
                         (lambda: os.close(frames_write), lambda: os.write(driver_write, b'{"done": true}\n')))
        first()
        time.sleep(0.5)  # the grader has seen the first one alone
        second()

    stopper = threading.Thread(target=nbgrader_stops)
    stopper.start()
    try:
        collected, end = _job()._read_frames(frames_read, None, None, TESTS, watch=driver_read)
    finally:
        stopper.join()
        for fd in (frames_read, driver_read, driver_write):
            os.close(fd)
    assert collected == {}
    return end


@pytest.mark.parametrize("driver_first", [False, True], ids=["fifo_closes_first", "driver_answers_first"])
def test_a_test_cell_that_ignores_its_interrupt_ends_the_run_during_that_test(driver_first):
    end = _kernel_stops_in("test first_test", driver_first, hung=True)
    assert end.problem.startswith("test first_test ran past the per-cell limit"), end.problem
    assert end.during_test and end.test == "first_test", "the tests after it are re-run on their own"


@pytest.mark.parametrize("driver_first", [False, True], ids=["fifo_closes_first", "driver_answers_first"])
def test_a_kernel_that_dies_in_a_plain_cell_says_so_for_the_tests_after_it(driver_first):
    end = _kernel_stops_in("7", driver_first, hung=False)
    assert end.problem.startswith("the notebook's process ended in cell 7"), end.problem
    assert not end.during_test


def test_a_driver_that_answers_before_any_frame_means_the_collector_never_started():
    frames_read, frames_write = os.pipe()
    driver_read, driver_write = os.pipe()
    os.write(driver_write, b'{"done": true}\n')
    try:
        collected, end = _job()._read_frames(frames_read, None, None, TESTS, watch=driver_read)
    finally:
        for fd in (frames_read, frames_write, driver_read, driver_write):
            os.close(fd)
    assert (collected, end) == ({}, None)
