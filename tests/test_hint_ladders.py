"""Hints that stop short, and exercises that ask for real work.

Every test here is fast: it reads the jupytext sources and the Chinese twins (no notebook is
executed; `tests/test_release.py` keeps the executed notebooks in sync with the sources), so
`make test-fast` runs them all.

The rule (README, "Conventions every chapter follows"): a ladder of at most three rungs, "Hint 1 —
the idea", "Hint 2 — the plan" (words and shapes, no code, not the answer's calls in the order it
makes them) and "Hint 3 — the key step" (a smaller analogous example on other tensors, the one API
page to read, or the question that unlocks the step: never the answer's expression).

Two checks keep hints from holding the answer:

* *Tokens* (`test_no_hint_holds_eight_tokens_of_the_answer`, both editions): the answer's code
  (the `### BEGIN SOLUTION` regions, comments and docstrings removed) is split by Python's
  `tokenize`, a hint's text (tags stripped, entities unescaped) by a regex that splits code the same
  way (identifiers, numbers, string literals, operators; prose words become identifiers, other
  characters separate); no hint may hold a run of `MAX_RUN + 1` = 8 consecutive tokens of the answer.
  Spacing, line breaks and markup never matter; renaming does (see the next check).
* *Lines* (`test_no_hint_holds_more_than_one_line_of_the_answer`): a line of the answer is compared
  after normalising names and spacing: every statement of the solution region is parsed, the names
  it binds or reads locally become `_`, and it is printed back by `ast.unparse`; the code a hint or
  the prose shows (`<code>` and backtick fragments, fenced blocks) goes through the same treatment,
  so renaming `scores` to `s` does not hide a copied line. All hints together hold at most one.
"""

from __future__ import annotations

import ast
import builtins
import html
import io
import re
import textwrap
import tokenize
import tomllib
from functools import lru_cache

import jupytext
import pytest

from course_files import CHAPTERS, ROOT, is_solution_cell, is_test_cell, nbgrader_meta, notebook_builder

RUNGS = ["Hint 1 — the idea", "Hint 2 — the plan", "Hint 3 — the key step"]
RUNGS_ZH = ["提示 1：思路", "提示 2：步骤", "提示 3：关键一步"]
EDITIONS = ["en", "zh"]
# The longest run of the answer's consecutive tokens a hint may hold.
MAX_RUN = 7
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


@lru_cache(maxsize=None)
def edition_notebook(chapter: str, edition: str):
    """The chapter's source notebook in one edition: for "zh", every markdown cell that has a Chinese
    twin (`NN_name.zh.toml`, keyed by the cell's id) shows the twin (tests/test_translations.py
    checks that every cell has one)."""
    nb = notebook_builder.read_source(chapter)
    if edition == "zh":
        path = ROOT / "solutions" / chapter / f"{chapter}.zh.toml"
        entries = tomllib.loads(path.read_text(encoding="utf-8")).get("cell", []) if path.exists() else []
        twins = {t["id"]: t["zh"].strip("\n") for t in entries}
        for cell in nb.cells:
            if cell.cell_type == "markdown" and cell.id in twins:
                cell.source = twins[cell.id]
    return nb


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


def exercises(chapter: str, edition: str = "en"):
    """(grade_id, hint blocks, the task's prose, the solution cell's source) for every exercise."""
    nb = source_notebook(chapter) if edition == "en" else edition_notebook(chapter, edition)
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


def _titles(hints: list[str]) -> list[str]:
    return [html.unescape(re.sub(r"<[^>]+>", "", re.search(r"<summary>(.*?)</summary>", h, re.S).group(1))).strip()
            for h in hints]


@pytest.mark.parametrize("edition", EDITIONS)
@pytest.mark.parametrize("chapter", CHAPTERS)
def test_hint_ladders_have_the_three_rungs_in_order(chapter, edition):
    rungs = RUNGS if edition == "en" else RUNGS_ZH
    problems = []
    for grade_id, hints, _, _ in exercises(chapter, edition):
        titles = _titles(hints)
        if not (2 <= len(titles) <= 3 and titles == rungs[:len(titles)]):
            problems.append(f"{chapter}/{grade_id} ({edition}): hints must be {rungs} (two or three rungs, in order), "
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
    _report(problems)


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_the_task_does_not_list_the_answer(chapter):
    problems = []
    for grade_id, _, prose, solution_source in exercises(chapter):
        given = copied(answer_statements(solution_source), shown_statements(prose))
        if len(given) > 1:
            problems.append(f"{chapter}/{grade_id}: the task's text shows {len(given)} lines of the answer: {given}")
    _report(problems)


# ------------------------------------------------------------------------- no run of 8 tokens of the answer

# Drop what is not code a learner would copy: layout, comments and the end marker.
_LAYOUT = {tokenize.NEWLINE, tokenize.NL, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER, tokenize.COMMENT}
# Prose split the way `tokenize` splits code: string literals (a quote after a letter is an
# apostrophe, not a string), identifiers (ASCII: Chinese characters around inline code separate
# tokens, as spaces do), numbers, operators longest first. Every other character separates.
_HINT_TOKEN = re.compile(r"""
    (?<![A-Za-z0-9_])[rRbBfFuU]{0,2}(?:"(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*')
  | [A-Za-z_][A-Za-z0-9_]*
  | (?:\d[\d_]*(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?[jJ]?
  | \*\*=|//=|>>=|<<=|\.\.\.|->|:=|==|!=|<=|>=|\*\*|//|<<|>>|[-+*/%&|^@]=
  | [-+*/%@&|^~<>=.,:;()\[\]{}]
""", re.X)


def answer_tokens(solution_source: str) -> list[list[str]]:
    """The tokens of each solution region of an answer cell, comments and docstrings removed."""
    out = []
    for region in _regions(solution_source):
        code = textwrap.dedent(region)
        docstrings = set()
        for node in ast.walk(ast.parse(code)):
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
                docstrings |= set(range(node.lineno, node.end_lineno + 1))
        out.append([t.string for t in tokenize.generate_tokens(io.StringIO(code).readline)
                    if t.type not in _LAYOUT and not (t.type == tokenize.STRING and t.start[0] in docstrings)])
    return out


def hint_tokens(hint: str) -> list[str]:
    """The tokens of a hint's text: its title dropped, tags stripped, entities unescaped."""
    text = re.sub(r"<summary>.*?</summary>", " ", hint, flags=re.S)
    text = html.unescape(re.sub(r"</?[A-Za-z][^>]*>", " ", text))
    return _HINT_TOKEN.findall(text)


def longest_shared_run(hint: list[str], answers: list[list[str]]) -> list[str]:
    """The longest run of consecutive tokens of `hint` that is also a run of one of `answers`."""
    best: list[str] = []
    for answer in answers:
        where: dict[str, list[int]] = {}
        for j, token in enumerate(answer):
            where.setdefault(token, []).append(j)
        previous: dict[int, int] = {}  # answer position -> length of the run ending there
        for i, token in enumerate(hint):
            current = {j: previous.get(j - 1, 0) + 1 for j in where.get(token, [])}
            for length in current.values():
                if length > len(best):
                    best = hint[i - length + 1:i + 1]
            previous = current
    return best


def token_problems(chapter: str, edition: str, found) -> list[str]:
    """`chapter/exercise (rung, edition): tokens` for every hint that holds 8 tokens of its answer in a row."""
    problems = []
    for grade_id, hints, _, solution_source in found:
        answers = answer_tokens(solution_source)
        for rung, hint in enumerate(hints, start=1):
            run = longest_shared_run(hint_tokens(hint), answers)
            if len(run) > MAX_RUN:
                problems.append(f"{chapter}/{grade_id} (rung {rung}, {edition}): {len(run)} tokens of the answer: "
                                f"{' '.join(run)}")
    return problems


@pytest.mark.parametrize("edition", EDITIONS)
@pytest.mark.parametrize("chapter", CHAPTERS)
def test_no_hint_holds_eight_tokens_of_the_answer(chapter, edition):
    _report(token_problems(chapter, edition, exercises(chapter, edition)))



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


def _a_real_answer_line():
    """The longest line (in tokens) of a real exercise's answer, and that exercise."""
    chapter = "01_static_to_contextual"
    grade_id, _, _, source = next(e for e in exercises(chapter) if e[0] == "cooccurrence_counts")
    lines = [line.split("#")[0].strip() for region in _regions(source) for line in region.splitlines()]
    return chapter, grade_id, source, max(lines, key=lambda line: len(hint_tokens(line)))


def _ladder(last: str) -> list[str]:
    return [f"<details><summary>{RUNGS[0]}</summary>Count every pair.</details>",
            f"<details><summary>{RUNGS[1]}</summary>A <code>[V, V]</code> matrix of zeros.</details>",
            f"<details><summary>{RUNGS[2]}</summary>{last}</details>"]


def test_a_hint_that_is_the_answers_line_is_rejected():
    chapter, grade_id, source, line = _a_real_answer_line()
    assert len(hint_tokens(line)) > MAX_RUN, line
    problems = token_problems(chapter, "en", [(grade_id, _ladder(f"Use <code>{html.escape(line)}</code>."), "", source)])
    assert len(problems) == 1 and problems[0].startswith(f"{chapter}/{grade_id} (rung 3, en): "), problems
    assert " ".join(hint_tokens(line)) in problems[0]


def test_a_reflowed_copy_in_chinese_prose_is_rejected():
    """Spaces, line breaks, markup, entities and Chinese around the code do not hide a copy."""
    chapter, grade_id, source, line = _a_real_answer_line()
    tokens = hint_tokens(line)
    reflowed = "".join(f"<code>{html.escape(t)}</code>" + ("\n" if k % 3 == 2 else "  ") for k, t in enumerate(tokens))
    problems = token_problems(chapter, "zh", [(grade_id, _ladder(f"先写{reflowed}，再看结果。"), "", source)])
    assert len(problems) == 1 and problems[0].startswith(f"{chapter}/{grade_id} (rung 3, zh): "), problems


def test_an_analogous_example_and_an_api_page_pass():
    chapter, grade_id, source, _ = _a_real_answer_line()
    fine = ("On a toy: <code>torch.zeros(2, 3).index_put_((torch.tensor([0, 0]), torch.tensor([1, 1])), "
            "torch.tensor([1., 1.]), accumulate=True)</code> holds a 2 at [0, 1]. Read torch.Tensor.index_put_.")
    assert token_problems(chapter, "en", [(grade_id, _ladder(fine), "", source)]) == []
    # docstrings and comments are not the answer's code
    assert answer_tokens('def f(x):\n    ### BEGIN SOLUTION\n    """Doc."""\n    return x  # c\n    ### END SOLUTION\n') \
        == [["return", "x"]]
    assert hint_tokens("the model's <code>x.sum(dim=-1)</code> isn't 'mean'") == \
        ["the", "model", "s", "x", ".", "sum", "(", "dim", "=", "-", "1", ")", "isn", "t", "'mean'"]


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
