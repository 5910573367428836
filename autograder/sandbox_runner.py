"""Run a learner's notebook code and record what their functions return. Nothing is judged here.

The grader (autograder/course.py) starts this script in a separate, locked-down process:
isolated interpreter (`python -I`), empty working directory, scrubbed environment, CPU
and memory limits, a wall-clock limit and, where `unshare` allows it, no network and a
read-only file system except that working directory.

    python -I sandbox_runner.py NOTEBOOK PLAN.json OUTPUTS.pt

The code cells run in order, as in the notebook. Where the notebook has a graded test
cell, its checker calls are *not* executed; instead the function each call names is
looked up at that point and run on
the checker's cases. The outputs go to OUTPUTS.pt as plain tensors and numbers; the
grader reads them with `torch.load(weights_only=True)` and judges them in its own process.
"""

import json
import signal
import sys


class CellTimeout(BaseException):
    """A BaseException, so that no `except Exception` in the learner's code (or in the
    checker's per-case loop) can swallow it and keep an endless loop going."""


def _on_alarm(signum, frame):
    raise CellTimeout("cell took longer than the grader's per-cell limit")


def main(notebook_path: str, plan_path: str, outputs_path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")  # no display; plt.show() becomes a no-op
    import nbformat
    import torch
    from IPython.core.interactiveshell import InteractiveShell

    from transformer_lib.checks import get_checker

    plan = json.load(open(plan_path))
    per_cell_seconds = int(plan["cell_timeout"])
    tests = {t["grade_id"]: t["calls"] for t in plan["tests"]}

    nb = nbformat.read(notebook_path, as_version=4)
    shell = InteractiveShell.instance()
    signal.signal(signal.SIGALRM, _on_alarm)
    results: dict = {}
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
        if grade_id in tests:
            calls = []
            for call in tests[grade_id]:
                checker = get_checker(call["checker"])
                try:
                    signal.alarm(per_cell_seconds)
                    fn = eval(call["function"], shell.user_ns)
                    outputs = checker.collect_outputs(fn, call["hidden"])
                except BaseException as exc:  # a missing name, a timeout: the learner's problem
                    outputs = {"__type__": "error", "__error__": f"{type(exc).__name__}: {exc}"}
                finally:
                    signal.alarm(0)
                calls.append(outputs)
            results[grade_id] = calls
            if len(results) == len(tests):
                break  # nothing after the last graded cell can change a verdict
            continue
        try:
            signal.alarm(per_cell_seconds)
            shell.run_cell(cell.source, silent=True, store_history=False)
        except CellTimeout:
            pass
        finally:
            signal.alarm(0)
    torch.save(results, outputs_path)


if __name__ == "__main__":
    main(*sys.argv[1:4])
