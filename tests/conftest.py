"""A guard on the memory of each test process.

A CI run once ended with a test worker at 23 GiB killed by the kernel's OOM killer, with nothing in
the log to say which test grew it, and the run then ran out of time. Each pytest process (the main
one and every xdist worker) now watches its own resident memory. Past MEMORY_LIMIT it raises
MemoryGuardTripped in the main thread, where the test runs: that test fails with the line
it was at, unwinds and frees what it held, and the run goes on. A test stuck in native code that
keeps growing (past 1.5 x the limit, or still over it 60 s later) ends the process instead;
pytest-xdist then reports the test the worker crashed in. Either way the other worker and the
sandboxes keep their memory.
"""

import os
import signal
import threading
import time

MEMORY_LIMIT = int(os.environ.get("COURSE_TEST_MEMORY_LIMIT_GIB", "8")) * 2**30  # a worker runs at about 1.3 GiB
PAGE = os.sysconf("SC_PAGE_SIZE")


def _resident_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


class MemoryGuardTripped(MemoryError):
    """This test made its pytest process exceed the memory guard's limit (tests/conftest.py)."""


def _watch(main_thread_id: int) -> None:
    raised_at = None
    while True:
        time.sleep(1.0)
        try:
            resident = _resident_bytes()
        except OSError:
            return
        if resident <= MEMORY_LIMIT:
            raised_at = None
            continue
        if raised_at is None:
            # A signal interrupts the main thread even while it waits in a lock or a select (an
            # asynchronous exception would wait for its next bytecode); the handler raises there.
            signal.pthread_kill(main_thread_id, signal.SIGUSR1)
            raised_at = time.monotonic()
        elif resident > 1.5 * MEMORY_LIMIT or time.monotonic() - raised_at > 60:
            os._exit(70)


def _raise_in_main_thread(signum, frame):
    raise MemoryGuardTripped(f"this test took its pytest process past {MEMORY_LIMIT / 2**30:.0f} GiB "
                             "(tests/conftest.py)")


if not any(t.name == "course-memory-guard" for t in threading.enumerate()) and \
        threading.current_thread() is threading.main_thread():
    signal.signal(signal.SIGUSR1, _raise_in_main_thread)
    threading.Thread(target=_watch, args=(threading.main_thread().ident,), name="course-memory-guard",
                     daemon=True).start()


def pytest_configure(config):
    import suite_time  # noqa: PLC0415  (tests/ is on sys.path: pytest's rootdir-relative conftest import)

    suite_time.register(config)
    # Every grading run of the suite grades a copy of the same course: they share the grader's cache
    # (autograder/course.py grader_cache: kits and library copies, addressed by content), so each kit
    # is built once per run of the suite. Set here, in the controller, before pytest-xdist starts its
    # workers, which inherit it.
    if not hasattr(config, "workerinput") and "COURSE_GRADER_CACHE" not in os.environ:
        import tempfile

        cache = tempfile.mkdtemp(prefix="course-grader-cache-")
        os.chmod(cache, 0o755)  # the sandboxes read the library copies in it
        os.environ["COURSE_GRADER_CACHE"] = config.course_grader_cache = cache


def pytest_unconfigure(config):
    cache = getattr(config, "course_grader_cache", None)
    if cache:
        import shutil

        shutil.rmtree(cache, ignore_errors=True)
        os.environ.pop("COURSE_GRADER_CACHE", None)
