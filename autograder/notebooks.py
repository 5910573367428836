"""Build the solution notebooks from their jupytext sources, and check they are in sync.

Each chapter is authored as a jupytext percent file, `solutions/NN_name/NN_name.py`
(reviewable as text, nbgrader metadata in the `# %%` headers). This script turns it
into `solutions/NN_name/NN_name.ipynb` and executes it, so the committed notebook
carries the outputs nbval compares.

    python autograder/notebooks.py build [CHAPTER ...]   # convert + execute, print run times
    python autograder/notebooks.py check                 # fail if any .ipynb differs from its .py
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time
from pathlib import Path

import jupytext
import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parent.parent
SOLUTIONS = ROOT / "solutions"
CELL_TIMEOUT = 300


def chapters() -> list[str]:
    return sorted(p.name for p in SOLUTIONS.iterdir() if p.is_dir() and (p / f"{p.name}.py").exists())


def source_path(chapter: str) -> Path:
    return SOLUTIONS / chapter / f"{chapter}.py"


def notebook_path(chapter: str) -> Path:
    return SOLUTIONS / chapter / f"{chapter}.ipynb"


def read_source(chapter: str) -> nbformat.NotebookNode:
    """The notebook the .py describes: cells and metadata, no outputs yet."""
    nb = jupytext.read(source_path(chapter))
    seen: dict[str, int] = {}
    for cell in nb.cells:
        cell.metadata.pop("lines_to_next_cell", None)
        # Ids from the cell's content keep diffs small when a cell is inserted.
        digest = hashlib.sha1(f"{cell.cell_type}:{cell.source}".encode()).hexdigest()[:10]
        seen[digest] = seen.get(digest, 0) + 1
        cell.id = digest if seen[digest] == 1 else f"{digest}-{seen[digest]}"
    nb.metadata.pop("jupytext", None)
    nb.metadata["kernelspec"] = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}
    nb.metadata["language_info"] = {"name": "python"}
    nb.nbformat, nb.nbformat_minor = 4, 5
    return nb


def _cell_signature(cell) -> tuple:
    return (cell.cell_type, cell.source.strip(), repr(cell.metadata.get("nbgrader")), tuple(cell.metadata.get("tags", [])))


def differences(chapter: str) -> list[str]:
    """What differs between the .py source and the committed .ipynb (empty when in sync)."""
    nb_path = notebook_path(chapter)
    if not nb_path.exists():
        return [f"{nb_path.relative_to(ROOT)} is missing: run `make notebooks`"]
    want = [_cell_signature(c) for c in read_source(chapter).cells]
    have = [_cell_signature(c) for c in nbformat.read(nb_path, as_version=4).cells]
    problems = []
    if len(want) != len(have):
        problems.append(f"{chapter}: the .py has {len(want)} cells, the .ipynb {len(have)}")
    for i, (w, h) in enumerate(zip(want, have)):
        if w != h:
            first_line = (w[1].splitlines() or [""])[0][:60]
            problems.append(f"{chapter}: cell {i} differs (source starts {first_line!r})")
            break
    return problems


def build(chapter: str) -> float:
    """Convert and execute one chapter; returns the execution time in seconds."""
    nb = read_source(chapter)
    client = NotebookClient(
        nb,
        timeout=CELL_TIMEOUT,
        kernel_name="python3",
        record_timing=False,
        resources={"metadata": {"path": str(SOLUTIONS / chapter)}},
    )
    start = time.perf_counter()
    client.execute()
    elapsed = time.perf_counter() - start
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.metadata.pop("execution", None)
    nbformat.validate(nb)
    nbformat.write(nb, notebook_path(chapter))
    return elapsed


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["build", "check"])
    parser.add_argument("chapters", nargs="*", help="chapter folders, e.g. 02_self_attention (default: all)")
    args = parser.parse_args(argv)
    os.environ.setdefault("PYTHONHASHSEED", "0")
    # One thread per kernel, as under `make test`, where two notebooks run at once on two
    # cores: more threads than cores make small ops spin-wait, and the thread count can
    # change the last digits of a float reduction that nbval compares.
    os.environ["OMP_NUM_THREADS"] = "1"
    for name in ("COURSE_LANG", "JPY_SESSION_NAME"):  # the solutions' outputs are English (transformer_lib/language.py)
        os.environ.pop(name, None)
    selected = args.chapters or chapters()
    unknown = sorted(set(selected) - set(chapters()))
    if unknown:
        parser.error(f"no jupytext source for {unknown}; chapters are {chapters()}")
    if args.command == "check":
        problems = [p for ch in selected for p in differences(ch)]
        for p in problems:
            print(p, file=sys.stderr)
        return 1 if problems else 0
    for chapter in selected:
        print(f"{chapter}: executed in {build(chapter):.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
