"""Where the suite's time went, in one line at the end of `make test`.

pytest's `--durations=25` names the slowest tests; this plugin adds the sum by part of the suite
(the lab in a browser, nbval on the solutions, the other-CPU passes, grading, everything else)
and by chapter, so that a maintainer sees which part grew. Times are worker-seconds: the setup,
call and teardown of every test, summed over the workers (two under `make test`), so the parts
add up to about twice the wall time when both workers are busy to the end.

Loaded by tests/conftest.py; under pytest-xdist it runs in the controller, which receives every
worker's reports.
"""

from __future__ import annotations

import re
import time
from collections import defaultdict

# (part, how a test's node id starts): the first match wins.
PARTS = [
    ("browser", ("tests/test_browser.py", "tests/test_lab.py", "tests/test_release_runs.py", "tests/test_hub.py")),
    ("nbval", ("solutions/",)),
    ("other CPUs", ("tests/test_other_cpus",)),
    ("grading", ("tests/test_grading", "tests/test_sandbox.py")),
]
CHAPTER = re.compile(r"\b(\d\d_[a-z_]+?)(?=[/\].]|$)")


def part_of(nodeid: str) -> str:
    for part, prefixes in PARTS:
        if nodeid.startswith(prefixes):
            return part
    return "everything else"


def chapter_of(nodeid: str) -> str | None:
    found = CHAPTER.search(nodeid)
    return found.group(1) if found else None


class SuiteTime:
    def __init__(self):
        self.started = time.monotonic()
        self.by_part: dict[str, float] = defaultdict(float)
        self.by_chapter: dict[str, float] = defaultdict(float)

    def pytest_runtest_logreport(self, report):
        self.by_part[part_of(report.nodeid)] += report.duration
        chapter = chapter_of(report.nodeid)
        if chapter:
            self.by_chapter[chapter] += report.duration

    def pytest_terminal_summary(self, terminalreporter):
        total = sum(self.by_part.values())
        if total < 1:
            return
        wall = time.monotonic() - self.started
        parts = " · ".join(f"{part} {self.by_part.get(part, 0):.0f} s"
                           for part in [p for p, _ in PARTS] + ["everything else"])
        terminalreporter.write_line(f"where the time went (worker-seconds): {parts} · total {total:.0f} s "
                                    f"in {wall / 60:.1f} min of wall time")
        if self.by_chapter:
            chapters = ", ".join(f"{name[:2]} {seconds:.0f} s" for name, seconds in sorted(self.by_chapter.items()))
            terminalreporter.write_line(f"tests named after a chapter, by chapter: {chapters}")


def register(config) -> None:
    if not hasattr(config, "workerinput"):  # the controller (or a run without xdist), not a worker
        config.pluginmanager.register(SuiteTime(), "course-suite-time")
