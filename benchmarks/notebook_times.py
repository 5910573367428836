"""Execute every solution notebook and print how long each takes, against the course's budgets.

    .venv/bin/python benchmarks/notebook_times.py [CHAPTER ...]

Budgets (DESIGN.md): each notebook at most 90 s, the whole course at most 12 minutes, on the
2-core CI machine. Kernels get one thread each, as under `make test`. Nothing is written back: the committed notebooks are left as they are.
"""

import os
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parent.parent
PER_NOTEBOOK, WHOLE_COURSE = 90.0, 12 * 60.0


def main(chapters: list[str]) -> int:
    os.environ["OMP_NUM_THREADS"] = "1"  # as `make test` and `make notebooks` run them
    chapters = chapters or sorted(p.name for p in (ROOT / "solutions").iterdir() if (p / f"{p.name}.ipynb").exists())
    total, over = 0.0, []
    for chapter in chapters:
        nb = nbformat.read(ROOT / "solutions" / chapter / f"{chapter}.ipynb", as_version=4)
        start = time.perf_counter()
        NotebookClient(nb, timeout=600, kernel_name="python3",
                       resources={"metadata": {"path": str(ROOT / "solutions" / chapter)}}).execute()
        elapsed = time.perf_counter() - start
        total += elapsed
        if elapsed > PER_NOTEBOOK:
            over.append(chapter)
        print(f"{chapter:32s} {elapsed:6.1f} s  ({elapsed / PER_NOTEBOOK:.0%} of the {PER_NOTEBOOK:.0f} s budget)", flush=True)
    print(f"{'whole course':32s} {total:6.1f} s  ({total / WHOLE_COURSE:.0%} of the {WHOLE_COURSE:.0f} s budget)")
    if over:
        print(f"over budget: {', '.join(over)}")
    return 1 if over or total > WHOLE_COURSE else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
