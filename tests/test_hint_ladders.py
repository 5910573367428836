"""Hints that stop short, and exercises that ask for real work.

DESIGN.md's rule: a ladder of at most three rungs (the idea; the plan in words and shapes, no
code; one key expression), no hint with more than one line of the answer's code, and neither the
task text nor the prose just above it listing the answer's statements in order.

"A line of the answer" is compared after normalising names and spacing: every statement of the
solution region is parsed, the names it binds or reads locally become `_`, and it is printed back
by `ast.unparse`; the code a hint or the prose shows (`<code>` and backtick fragments, fenced
blocks) goes through the same treatment. So renaming `scores` to `s` in a hint does not hide a
copied line, and spacing never matters. The tests read the jupytext sources, so they run without
executing a notebook; `tests/test_release.py` keeps the executed notebooks in sync with them.
"""

from __future__ import annotations

import ast
import builtins
import html
import re
import textwrap
from functools import lru_cache

import jupytext
import pytest

from course_files import CHAPTERS, ROOT, is_solution_cell, is_test_cell, nbgrader_meta

RUNGS = ["Hint 1 — the idea", "Hint 2 — the plan", "Hint 3 — one key expression"]
# Names that mean the same thing in every answer, kept when normalising; every other name is
# a local or a course helper and becomes `_`.
KEPT_NAMES = {"torch", "F", "nn", "math", "np", "itertools", "collections"} | set(dir(builtins))
# An answer's statement counts only if it computes something: `return _` or `_ = []` is not a
# line of the answer anyone can copy, `_[:, :-1]` is.
MIN_STATEMENT_CHARS = 6
COMPUTING = (ast.Call, ast.Subscript, ast.BinOp, ast.Compare, ast.BoolOp, ast.UnaryOp, ast.comprehension, ast.Lambda)
MINUTES = re.compile(r"\*\*Difficulty\*\*[^\n]*?about (\d+) minutes")


@lru_cache(maxsize=None)
def source_notebook(chapter: str):
    return jupytext.read(ROOT / "solutions" / chapter / f"{chapter}.py")


class _Anonymise(ast.NodeTransformer):
    def visit_Name(self, node):
        return ast.copy_location(ast.Name(id=node.id if node.id in KEPT_NAMES else "_", ctx=node.ctx), node)

    def visit_arg(self, node):
        node.arg = "_"
        return node

    def visit_keyword(self, node):  # keep the keyword (dim=...), anonymise its value
        self.generic_visit(node)
        return node


def normalise(node: ast.AST) -> str:
    tree = _Anonymise().visit(ast.parse(ast.unparse(node)))
    return re.sub(r"\s+", "", ast.unparse(tree))


def _regions(solution_source: str) -> list[str]:
    """Every solution region of an answer cell (a class may have one per method)."""
    return re.findall(r"### BEGIN SOLUTION\n(.*?)[ \t]*### END SOLUTION", solution_source, re.S)


def answer_statements(solution_source: str) -> list[str]:
    """The normalised statements of a solution region, each one line of the answer: simple
    statements whole, compound ones by their header (the `for` target and iterable, the `if` test)."""
    out = []
    for node in (n for region in _regions(solution_source) for n in ast.walk(ast.parse(textwrap.dedent(region)))):
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Return, ast.Expr)):
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
                continue  # a docstring or a bare string
            value = node.value if not isinstance(node, ast.Expr) else node.value
            if value is None:
                continue
            expression = value  # the right-hand side: what was computed, whatever it is called
        elif isinstance(node, (ast.For, ast.comprehension)):
            expression = node.iter
        elif isinstance(node, (ast.If, ast.While)):
            expression = node.test
        else:
            continue
        text = normalise(expression)
        if len(text) >= MIN_STATEMENT_CHARS and any(isinstance(n, COMPUTING) for n in ast.walk(expression)):
            out.append(text)
    return sorted(set(out))


def code_fragments(text: str) -> list[str]:
    """The code a piece of markdown shows: fenced blocks, `<code>` elements and backtick spans."""
    fragments = re.findall(r"```(?:python)?\n(.*?)```", text, re.S)
    text = re.sub(r"```.*?```", " ", text, flags=re.S)
    fragments += [html.unescape(re.sub(r"<[^>]+>", "", f)) for f in re.findall(r"<code>(.*?)</code>", text, re.S)]
    fragments += re.findall(r"`([^`\n]+)`", text)
    return fragments


def _parse(fragment: str):
    for candidate in (fragment, fragment.strip().rstrip(".,;:")):
        try:
            return ast.parse(textwrap.dedent(candidate))
        except SyntaxError:
            continue
    return None


def shown_statements(text: str) -> str:
    """Every parseable code fragment of `text`, normalised, one after the other."""
    parts = []
    for fragment in code_fragments(text):
        tree = _parse(fragment)
        if tree is not None:
            parts.append(re.sub(r"\s+", "", ast.unparse(_Anonymise().visit(tree))))
    return "\n".join(parts)


def is_code(fragment: str) -> bool:
    """A fragment that computes something: a call, an index, an assignment, a loop or a lambda.
    Names, attributes, numbers and shapes such as `[B, L - 1, V]` are words, not code."""
    tree = _parse(fragment)
    if tree is None:
        return False
    computing = (ast.Call, ast.Subscript, ast.Assign, ast.AugAssign, ast.For, ast.Lambda, ast.ListComp,
                 ast.GeneratorExp, ast.DictComp, ast.SetComp, ast.Return)
    return any(isinstance(node, computing) for node in ast.walk(tree))


def exercises(chapter: str):
    """(grade_id, hint blocks, the task's prose, the solution cell's source) for every exercise."""
    nb = source_notebook(chapter)
    for index, cell in enumerate(nb.cells):
        if not is_solution_cell(cell):
            continue
        start = max([i for i in range(index) if is_test_cell(nb.cells[i])], default=-1)
        markdown = "\n".join(c.source for c in nb.cells[start + 1:index] if c.cell_type == "markdown")
        hints = re.findall(r"<details>(.*?)</details>", markdown, re.S)
        prose = re.sub(r"<details>.*?</details>", " ", markdown, flags=re.S)
        docstrings = [ast.get_docstring(n) or "" for n in ast.walk(ast.parse(cell.source))
                      if isinstance(n, (ast.FunctionDef, ast.ClassDef))]
        yield nbgrader_meta(cell)["grade_id"], hints, prose + "\n" + "\n".join(docstrings), cell.source


def copied(statements: list[str], shown: str) -> list[str]:
    return [s for s in statements if s in shown]


def _report(problems: list[str]) -> None:
    assert not problems, f"{len(problems)} problem(s):\n" + "\n".join(problems)


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_hint_ladders_have_the_three_rungs_in_order(chapter):
    problems = []
    for grade_id, hints, _, _ in exercises(chapter):
        titles = [html.unescape(re.sub(r"<[^>]+>", "", re.search(r"<summary>(.*?)</summary>", h, re.S).group(1))).strip()
                  for h in hints]
        if not (2 <= len(titles) <= 3 and titles == RUNGS[:len(titles)]):
            problems.append(f"{chapter}/{grade_id}: hints must be {RUNGS} (two or three rungs, in order), "
                            f"found {titles}")
    _report(problems)


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_the_idea_and_the_plan_hold_no_code(chapter):
    problems = []
    for grade_id, hints, _, _ in exercises(chapter):
        for rung, hint in zip(RUNGS[:2], hints):
            code = [f for f in code_fragments(hint) if is_code(f)]
            if code:
                problems.append(f"{chapter}/{grade_id}: '{rung}' is words and shapes, not code; it shows {code}")
    _report(problems)


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_no_hint_holds_more_than_one_line_of_the_answer(chapter):
    problems = []
    for grade_id, hints, _, solution_source in exercises(chapter):
        given = copied(answer_statements(solution_source), shown_statements("\n".join(hints)))
        if len(given) > 1:
            problems.append(f"{chapter}/{grade_id}: the hints give {len(given)} lines of the answer: {given}")
        if len(hints) == 3:
            code = [f for f in code_fragments(hints[2]) if is_code(f)]
            if len(code) > 1:
                problems.append(f"{chapter}/{grade_id}: the last rung is one key expression, it shows {code}")
    _report(problems)


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_the_task_does_not_list_the_answer(chapter):
    problems = []
    for grade_id, _, prose, solution_source in exercises(chapter):
        given = copied(answer_statements(solution_source), shown_statements(prose))
        if len(given) > 1:
            problems.append(f"{chapter}/{grade_id}: the task's text shows {len(given)} lines of the answer: {given}")
    _report(problems)


# ------------------------------------------------------------------------- the checker proves it can fail

SOLUTION = '''def f(logits, tokens):
    ### BEGIN SOLUTION
    predictions = logits[:, :-1]  # shifted
    targets = tokens[:, 1:]
    return torch.nn.functional.cross_entropy(predictions.reshape(-1, logits.shape[-1]), targets.reshape(-1))
    ### END SOLUTION
'''


def test_a_renamed_copy_of_a_line_is_still_a_copy():
    statements = answer_statements(SOLUTION)
    hint = "<code>scores = x[:, :-1]</code> and <code>y = t[:,1:]</code>"
    assert len(copied(statements, shown_statements(hint))) == 2


def test_words_shapes_and_one_expression_pass():
    statements = answer_statements(SOLUTION)
    assert not copied(statements, shown_statements("Drop the last prediction: <code>[B, L-1, V]</code>."))
    assert len(copied(statements, shown_statements("`logits[:, :-1]`"))) == 1
    assert not is_code("[B, L - 1, V]") and not is_code("d_model") and is_code("x.reshape(-1)")


# ------------------------------------------------------------------------- depth, and time shown honestly

def _logical_lines(solution_source: str) -> int:
    return sum(1 for region in _regions(solution_source) for node in ast.walk(ast.parse(textwrap.dedent(region)))
               if isinstance(node, ast.stmt) and not isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.Pass))
               and not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)))


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_every_chapter_has_two_exercises_of_real_work(chapter):
    long = [g for g, _, _, source in exercises(chapter) if _logical_lines(source) >= 6]
    assert len(long) >= 2, f"{chapter}: exercises whose answer takes 6 statements or more: {long}"


def test_at_least_eighty_graded_exercises():
    counts = {ch: sum(is_test_cell(c) for c in source_notebook(ch).cells) for ch in CHAPTERS}
    assert sum(counts.values()) >= 80, counts


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_the_chapter_start_says_the_total_time_of_its_exercises(chapter):
    nb = source_notebook(chapter)
    text = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    minutes = [int(m) for m in MINUTES.findall(text)]
    n_exercises = sum(1 for _ in exercises(chapter))
    assert len(minutes) == n_exercises, f"{chapter}: {n_exercises} exercises, {len(minutes)} with minutes shown"
    intro = next(c.source for c in nb.cells if c.cell_type == "markdown")
    total = sum(minutes)
    assert re.search(rf"\b{total} minutes\b", intro), (
        f"{chapter}: the exercises take about {total} minutes in all; the first cell should say so ('{total} minutes')")
