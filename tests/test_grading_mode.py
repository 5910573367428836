"""Grading mode: code cells tagged `skip-when-grading` (a training run, a demonstration) are not run
while grading (autograder/sandboxed_kernel.py, autograder/sandbox_runner.py). That is safe only if
no score can depend on them. Checked on each chapter's source, statically:

* a tagged cell is never a graded cell, and comes before the chapter's last graded test (after it
  nothing runs while grading anyway, so a tag there would only mislead);
* what a tagged cell may have changed is *tainted*: every name it binds, and every name bound by a
  plain assignment earlier that it reads (calling `train(model, ...)` changes `model` in place).
  Up to the last graded test, no cell that runs may read a tainted name before binding it anew.
  Functions, classes and modules a tagged cell merely calls are not tainted.

And the grader's side: only the release's own tagged cells are skipped (a learner's edit runs).
"""

import ast
import sys

import pytest

from course_files import CHAPTERS, ROOT, nbgrader_meta, solution

sys.path.insert(0, str(ROOT / "autograder"))
import jobs  # noqa: E402

TAG = jobs.SKIP_TAG


def _bound_and_read(tree: ast.AST) -> tuple[set, set, set]:
    """(names bound by plain assignment, names bound by def/class/import, names read) by a statement
    at the notebook's top level. Inside a function only its free names count as read (its
    parameters and locals are its own)."""
    assigned, defined, read = set(), set(), set()
    if isinstance(tree, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        defined.add(tree.name)
        inner = ast.Module(body=list(tree.body), type_ignores=[])
        local = {a.arg for a in ast.walk(tree) if isinstance(a, ast.arg)}
        local |= {n.id for n in ast.walk(inner) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
        free = {n.id for n in ast.walk(inner) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)} - local
        outer = [*getattr(tree, "decorator_list", []), *getattr(tree, "bases", [])]
        if not isinstance(tree, ast.ClassDef):
            outer += [d for d in tree.args.defaults + tree.args.kw_defaults if d is not None]
        return assigned, defined, free | {n.id for o in outer for n in ast.walk(o) if isinstance(n, ast.Name)}
    if isinstance(tree, ast.Assign) and isinstance(tree.value, ast.Call) and \
            getattr(tree.value.func, "id", getattr(tree.value.func, "attr", "")) == "yours_or_reference":
        # `x_impl = yours_or_reference(x, check_x)` binds a function, which no later call changes
        defined.update(n.id for t in tree.targets for n in ast.walk(t) if isinstance(n, ast.Name))
        read.update(n.id for n in ast.walk(tree.value) if isinstance(n, ast.Name))
        return assigned, defined, read
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (assigned if isinstance(node.ctx, ast.Store) else read).add(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            defined.update((a.asname or a.name).split(".")[0] for a in node.names)
    for node in ast.walk(tree):  # a comprehension's or lambda's own variables are not the notebook's
        if isinstance(node, (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
            for gen in node.generators:
                own = {n.id for n in ast.walk(gen.target) if isinstance(n, ast.Name)}
                assigned -= own
                read -= own
        elif isinstance(node, ast.Lambda):
            own = {a.arg for a in ast.walk(node.args) if isinstance(a, ast.arg)}
            read -= own
    return assigned, defined, read


def _code(cell) -> str:
    # IPython magics and shell lines are not Python: blank them for the analysis
    return "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in cell.source.splitlines())


def problems(cells) -> list[str]:
    graded = [i for i, c in enumerate(cells) if nbgrader_meta(c).get("grade") and not nbgrader_meta(c).get("solution")]
    last = max(graded)
    found, tainted, plain = [], set(), set()
    for i, cell in enumerate(cells):
        if cell.cell_type != "code" or i > last:
            continue
        statements = ast.parse(_code(cell)).body
        if TAG in cell.metadata.get("tags", []):
            if nbgrader_meta(cell):
                found.append(f"cell {i} is an nbgrader cell and tagged {TAG}")
            for statement in statements:
                assigned, defined, read = _bound_and_read(statement)
                tainted |= assigned | defined | (read & plain)
            continue
        used = set()
        for statement in statements:  # in order: a name bound anew before it is read is clean
            assigned, defined, read = _bound_and_read(statement)
            used |= read & tainted
            tainted -= assigned | defined
            plain |= assigned
            plain -= defined
        if used:
            found.append(f"cell {i} reads {sorted(used)}, which a skipped cell before it may have set or changed")
    return found


def _tagged_after_last_test(cells) -> list[int]:
    graded = [i for i, c in enumerate(cells) if nbgrader_meta(c).get("grade") and not nbgrader_meta(c).get("solution")]
    return [i for i, c in enumerate(cells) if i > max(graded) and TAG in c.metadata.get("tags", [])]


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_no_graded_test_depends_on_a_cell_skipped_while_grading(chapter):
    cells = solution(chapter).cells
    assert problems(cells) == []
    assert _tagged_after_last_test(cells) == [], "cells after the last graded test never run while grading"


def test_the_check_catches_a_dependency():
    import nbformat

    def code(source, tags=()):
        return nbformat.v4.new_code_cell(source, metadata={"tags": list(tags)})

    test = nbformat.v4.new_code_cell("check_x(x)", metadata={"nbgrader": {"grade": True, "solution": False,
                                                                           "grade_id": "t", "points": 1}})
    model = code("model = Model()")
    train = code("losses = train(model, data)", [TAG])
    assert problems([model, train, code("print(losses[-1])"), test]) == \
        ["cell 2 reads ['losses'], which a skipped cell before it may have set or changed"]
    assert problems([model, train, code("model(x)"), test]) == \
        ["cell 2 reads ['model'], which a skipped cell before it may have set or changed"]
    assert problems([model, train, code("model = Model()\nmodel(x)"), test]) == []  # bound anew first
    assert problems([code("import torch"), code("torch.manual_seed(0)\nsample(model)", [TAG]), code("torch.ones(1)"),
                     test]) == []  # a module it calls is not tainted


def test_the_grader_skips_only_the_releases_own_tagged_cells():
    training = "losses = train(model, data)"
    notebook = {"cells": [
        {"cell_type": "code", "source": training, "metadata": {}},  # the learner dropped the tag: skipped anyway
        {"cell_type": "code", "source": training + "  # changed", "metadata": {"tags": [TAG]}},  # edited: runs
        {"cell_type": "code", "source": "answer = 42", "metadata": {"tags": [TAG, "other"]}},  # a tag added: dropped
    ]}
    jobs._grading_mode(notebook, [training])
    assert [c["metadata"].get("tags") for c in notebook["cells"]] == [[TAG], [], ["other"]]
