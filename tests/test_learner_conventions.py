"""The conventions that keep a chapter usable by a learner, checked on every chapter's source.

README's maintainer section states them; each test here fails naming the chapter and the cell.
"""

import ast
import re

import pytest

from course_files import CHAPTERS, MIN_EXERCISES, is_solution_cell, is_test_cell, nbgrader_meta, released, solution
from course_files import course_cli

# Mentions of the source documents the learner does not have: "document 000 §5", "001 §4",
# "§1.3", "source 003", "the extracted text", seed file names.
SOURCE_REFERENCE = re.compile(
    r"(document|source|seed|doc\.?)\s*0\d\d|\b00[0-4]\s*§|§\s*\d|extracted text|\b00[0-4]_[0-9a-f]{6}|"
    r"the (source )?documents\b", re.I)


def _answer_names(nb) -> set[str]:
    names = set()
    for cell in nb.cells:
        if is_solution_cell(cell):
            for node in ast.parse(cell.source).body:
                if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                    names.add(node.name)
    return names


def _bound_names(source: str) -> set[str]:
    """Names a cell binds at top level or anywhere by import/assignment/def."""
    bound = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            bound |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            bound.add(node.id)
    return bound


def test_enough_exercises_across_the_course():
    counts = {ch: sum(is_test_cell(c) for c in solution(ch).cells) for ch in CHAPTERS}
    for chapter, minimum in MIN_EXERCISES.items():
        assert counts[chapter] >= minimum, f"{chapter} has {counts[chapter]} graded exercises, promises {minimum}"
    early = [ch for ch in CHAPTERS if ch[:2] <= "07"]
    assert sum(counts[ch] for ch in early) >= 38, counts


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_no_learner_facing_text_cites_a_source_document_by_number(chapter):
    for index, cell in enumerate(released(chapter).cells):
        hit = SOURCE_REFERENCE.search(cell.source)
        assert hit is None, f"{chapter} cell {index} mentions {hit.group(0)!r}: cite the published source by name"


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_test_cells_let_run_all_go_on(chapter):
    for cell in solution(chapter).cells:
        if is_test_cell(cell):
            assert "raises-exception" in cell.metadata.get("tags", []), (
                f"{chapter}: test cell {nbgrader_meta(cell)['grade_id']} lacks the raises-exception tag")


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_the_learners_names_are_never_rebound(chapter):
    nb = solution(chapter)
    names = _answer_names(nb)
    assert names, f"{chapter} has no answer cell defining a function or class"
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code" or is_solution_cell(cell):
            continue
        rebound = names & _bound_names(cell.source)
        assert not rebound, (f"{chapter} cell {index} rebinds {sorted(rebound)}: later cells must use "
                             f"`name_impl = yours_or_reference(name, check_name)` instead")


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_each_exercise_hands_on_yours_or_the_reference(chapter):
    nb = solution(chapter)
    source = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    for cell in nb.cells:
        if is_test_cell(cell):
            for call in course_cli.checker_calls(cell.source):
                if call.hidden:
                    continue
                pattern = rf"yours_or_reference\(\s*{re.escape(call.function)}\s*,\s*{call.checker}\s*\)"
                assert re.search(pattern, source), f"{chapter}: no `yours_or_reference({call.function}, {call.checker})`"


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_chapter_ends_with_the_exercise_summary(chapter):
    nb = solution(chapter)
    code = [c for c in nb.cells if c.cell_type == "code"]
    last = code[-1].source
    assert "exercise_summary(" in last, f"{chapter}: the last code cell must print the exercise summary"
    checkers = {call.checker for c in nb.cells if is_test_cell(c) for call in course_cli.checker_calls(c.source)}
    missing = [name for name in checkers if name not in last]
    assert not missing, f"{chapter}: the summary leaves out {missing}"


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_headings_hold_no_latex(chapter):
    for cell in solution(chapter).cells:
        if cell.cell_type == "markdown":
            for line in cell.source.splitlines():
                if line.startswith("#"):
                    assert "$" not in line, f"{chapter}: heading with LaTeX: {line!r}"


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_nbval_markers_are_tags_not_comments(chapter):
    for cell in released(chapter).cells:
        assert not re.search(r"#\s*NBVAL_", cell.source), f"{chapter}: a learner-facing NBVAL comment: use a cell tag"


# The hint ladders (three rungs, no answer lines) are tested in tests/test_hint_ladders.py.


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_every_chapter_draws_a_conceptual_diagram(chapter):
    code = "\n".join(c.source for c in solution(chapter).cells if c.cell_type == "code")
    assert "transformer_lib.diagrams" in code, f"{chapter} draws no diagram from transformer_lib.diagrams"


# The chapters that run or train a model built from the learner's functions (chapter 06's decoder,
# chapter 09's BERT, which embeds with the learner's embedding_sum and pre-trains with their step): each asserts, with
# transformer_lib.checks.model_calls, that the model it trains calls the function the learner's
# check handed over (theirs when it passes), so "your block carries this model" is measured.
MODEL_CHAPTERS = {"06_decoder_masks": ["decoder_layer_forward_impl"], "09_bert": ["embedding_sum_impl"], "10_gpt": ["gpt_block_impl", "gpt_forward_impl"],
                  "12_vision_transformers": ["vit_forward_impl", "swin_window_attention_impl"]}


@pytest.mark.parametrize("chapter", sorted(MODEL_CHAPTERS))
def test_the_trained_model_calls_the_learners_functions(chapter):
    asserted = set()
    for cell in solution(chapter).cells:
        if cell.cell_type != "code":
            continue
        for node in ast.walk(ast.parse(cell.source)):
            if isinstance(node, ast.Assert):
                for call in ast.walk(node.test):
                    if isinstance(call, ast.Call) and getattr(call.func, "id", "") == "model_calls" and len(call.args) > 1:
                        asserted |= {n.id for n in ast.walk(call.args[1]) if isinstance(n, ast.Name)}
    missing = [name for name in MODEL_CHAPTERS[chapter] if name not in asserted]
    assert not missing, f"{chapter}: no `assert model_calls(model, {missing[0]}, ...)` checks the trained model runs it"
