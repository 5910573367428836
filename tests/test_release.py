"""chapters/ is what `make release` makes from solutions/, and gives nothing away."""

import ast
import re
from pathlib import Path

import nbformat
import pytest

from course_files import (CHAPTERS, MIN_EXERCISES, ROOT, is_solution_cell, is_test_cell, nbgrader_meta,
                          notebook_builder, released, scratch_course, solution)
from course_files import course_cli
from transformer_lib.checks import REGISTRY

SOLUTION_REGION = re.compile(r"^([ \t]*)### BEGIN SOLUTION\n.*?^[ \t]*### END SOLUTION[ \t]*$", re.S | re.M)
HIDDEN_REGION = re.compile(r"^[ \t]*### BEGIN HIDDEN TESTS\n.*?^[ \t]*### END HIDDEN TESTS[ \t]*\n?", re.S | re.M)


def test_every_chapter_of_the_map_so_far_is_here():
    assert set(MIN_EXERCISES) <= set(CHAPTERS)
    assert sorted(p.name for p in (ROOT / "chapters").iterdir()
                  if p.is_dir() and not p.name.startswith(".") and p.name != course_cli.CHINESE) == CHAPTERS


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_jupytext_source_and_notebook_agree(chapter):
    assert notebook_builder.differences(chapter) == []


@pytest.fixture(scope="module")
def fresh_release(tmp_path_factory):
    """`make release` of every chapter, once, on a scratch copy of the course (one nbgrader process)."""
    tmp_path = tmp_path_factory.mktemp("release")
    course_cli.release(scratch_course(tmp_path), CHAPTERS)
    return tmp_path


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_release_in_both_languages_matches_what_the_release_command_makes_now(chapter, fresh_release):
    tmp_path = fresh_release
    fresh = nbformat.read(tmp_path / "chapters" / chapter / f"{chapter}.ipynb", as_version=4)
    committed = released(chapter)
    assert [(c.cell_type, c.source) for c in fresh.cells] == [(c.cell_type, c.source) for c in committed.cells], (
        f"chapters/{chapter} is out of date: run `make release` and commit chapters/")
    assert fresh == committed, f"chapters/{chapter} differs from a fresh release in metadata or outputs: run `make release`"
    assert sorted(p.name for p in (tmp_path / "chapters" / chapter).iterdir()) == sorted(
        p.name for p in (ROOT / "chapters" / chapter).iterdir())
    # The same command wrote the Chinese edition (tests/test_translations.py holds its text to the English)
    chinese = Path(course_cli.CHINESE) / chapter / f"{chapter}.ipynb"
    assert (tmp_path / "chapters" / chinese).exists(), f"`make release` wrote no Chinese {chapter}"
    assert nbformat.read(tmp_path / "chapters" / chinese, as_version=4) == \
        nbformat.read(ROOT / "chapters" / chinese, as_version=4), \
        f"chapters/{chinese.parent} is out of date: run `make release` and commit chapters/"


def _expected_stub(source: str) -> str:
    # nbgrader's stub: its "YOUR CODE HERE" marker, then the line the learner replaces.
    return SOLUTION_REGION.sub(lambda m: f"{m.group(1)}# YOUR CODE HERE\n{m.group(1)}raise NotImplementedError()", source)


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_release_holds_no_solution_and_no_hidden_test(chapter):
    sol, rel = solution(chapter), released(chapter)
    text = nbformat.writes(rel)
    for marker in ["BEGIN SOLUTION", "END SOLUTION", "BEGIN HIDDEN TESTS", "END HIDDEN TESTS"]:
        assert marker not in text, f"{marker} reached chapters/{chapter}"
    assert len(sol.cells) == len(rel.cells)
    for s, r in zip(sol.cells, rel.cells):
        if is_solution_cell(s):
            assert r.source == _expected_stub(s.source), f"solution cell {nbgrader_meta(s)['grade_id']} leaked"
            ast.parse(r.source)
        elif is_test_cell(s):
            assert r.source == HIDDEN_REGION.sub("", s.source).rstrip("\n") or r.source == HIDDEN_REGION.sub("", s.source)
        if r.cell_type == "code":
            assert r.outputs == [], "the release must not carry the solutions' outputs"


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_exercises_follow_the_convention(chapter):
    cells = solution(chapter).cells
    solutions = [c for c in cells if is_solution_cell(c)]
    tests = [c for c in cells if is_test_cell(c)]
    assert len(tests) >= MIN_EXERCISES[chapter]
    assert all(SOLUTION_REGION.search(c.source) for c in solutions), "every answer cell has a solution region"
    for cell in tests:
        meta = nbgrader_meta(cell)
        assert meta.get("points", 0) > 0 and meta.get("locked")
        assert HIDDEN_REGION.search(cell.source), f"{meta['grade_id']} has no hidden tests"
        body = ast.parse(cell.source).body
        # Test cells only call checkers: the grader re-runs exactly those calls out of process.
        assert body and all(isinstance(s, ast.Expr) and isinstance(s.value, ast.Call)
                            and s.value.func.id.startswith("check_") for s in body), meta["grade_id"]
        for call in course_cli.checker_calls(cell.source):
            assert call.checker.removeprefix("check_") in REGISTRY


def test_every_checker_is_used_by_a_chapter():
    used = {call.checker.removeprefix("check_") for ch in CHAPTERS for c in solution(ch).cells if is_test_cell(c)
            for call in course_cli.checker_calls(c.source)}
    assert used == set(REGISTRY)


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_chapter_ends_with_a_bilingual_glossary(chapter):
    markdown = "\n".join(c.source for c in solution(chapter).cells if c.cell_type == "markdown")
    assert "Glossary" in markdown and "术语表" in markdown
    glossary = markdown[markdown.index("Glossary"):]
    rows = [line for line in glossary.splitlines() if line.startswith("|") and re.search(r"[\u4e00-\u9fff]", line)]
    assert len(rows) >= 8


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_solutions_are_executed_with_outputs(chapter):
    code = [c for c in solution(chapter).cells if c.cell_type == "code"]
    assert all(c.execution_count is not None for c in code), "run `make notebooks` to execute the solutions"
    errors = [o for c in code for o in c.outputs if o.output_type == "error"]
    assert not errors, errors[0]
    images = [o for c in code for o in c.outputs if "image/png" in o.get("data", {})]
    assert images, "every chapter shows at least one picture"
