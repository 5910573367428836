"""The re-run policy: which tests a job collects again, each in a run of the notebook for it alone.

A job runs the notebook once, in nbgrader's kernel, with every reference the chapter grades
hidden. In the learner's lab nothing is hidden, and a later exercise's cells fall back on the
reference of an earlier one the learner got wrong. So a test whose collection met another test's
hidden reference, or that the shared run never reached because it ended while collecting an
earlier test, is collected again by a run of its own (sandbox_runner.py as a script, with only
that test's reference hidden), exactly as in the learner's lab. What this module guarantees, for
autograder/jobs.py, which makes the runs:

* a test is re-run only when a run of it alone could give another result: never when its result is
  settled (`_settled`: it passed with less of the library than a run alone would have, or its
  answer is still the release's `raise NotImplementedError()`);
* a test neither collected nor re-run gets an empty `Collected` saying why the run ended (0);
* a re-run is told the visible verdicts of the tests before it as the shared run saw them, from
  that run only where it was clean for them (it called no other test's hidden reference); a test
  whose run hung or died counts as not passing, so its later cells fall back on the reference,
  which a re-run has.
"""

from __future__ import annotations

from frames import Collected, RunEnd


def needing_rerun(checked: list, collected: dict, end: RunEnd) -> list:
    """The checked tests to collect again, each on its own, in notebook order. A test that needs
    no re-run and has nothing collected gets its `Collected` (no outputs, why) in `collected`."""
    reruns = []
    for test in checked:
        own = {f"{m}.{n}" for m, n in test.hidden}
        got = collected.get(test.grade_id)
        called = got.called if got is not None else end.called
        ended_before = got is None and end.during_test and end.test != test.grade_id
        if (any(name not in own for name in called) or ended_before) and not _settled(got):
            # it met another test's hidden reference, or the run ended while collecting an
            # earlier test (a collection that a run of this test alone does not make)
            reruns.append(test)
        elif got is None:
            collected[test.grade_id] = Collected(None, end.problem or "the notebook's run ended before this test")
    return reruns


def visible_verdicts(checked: list, collected: dict) -> dict[str, bool]:
    """What later cells' yours_or_reference needs of the tests before: their visible verdicts
    from the first run when that run was clean for them; a test whose run hung or died
    counts as not passing (its later cells fall back on the reference, which a re-run has)."""
    visible = {}
    for test in checked:
        got = collected.get(test.grade_id)
        own = {f"{m}.{n}" for m, n in test.hidden}
        clean = got is not None and not any(name not in own for name in got.called)
        for call, judged in zip(test.calls, (got.judged or []) if clean and got.outputs is not None else []):
            if not call["hidden"]:
                visible[call["checker"].removeprefix("check_")] = bool(judged[0])
        if got is None or got.outputs is None:
            for call in test.calls:
                visible.setdefault(call["checker"].removeprefix("check_"), False)
    return visible


def earlier_verdicts(visible: dict[str, bool], test) -> dict[str, bool]:
    """The visible verdicts a re-run of `test` is told: every one but its own exercises'."""
    return {name: v for name, v in visible.items()
            if name not in {c["checker"].removeprefix("check_") for c in test.calls}}


def _settled(got: "Collected | None") -> bool:
    """A result a run on its own could not change: it passed with less of the library than that run
    would have, or the answer is still the release's `raise NotImplementedError()`."""
    if got is None or got.outputs is None:
        return False
    if got.judged and all(passed for passed, _ in got.judged):
        return True
    flat = [o for call in got.outputs for o in (call if isinstance(call, list) else [call])]
    return bool(flat) and all(isinstance(o, dict) and o.get("__error__") == "NotImplementedError" for o in flat)
