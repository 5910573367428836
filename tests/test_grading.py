"""The grading pipeline, for real: nbgrader's gradebook, autograde, feedback and export on a
scratch copy of the course, with one student per situation an instructor will meet."""

import csv
import html
import re

import nbformat
import pytest
from nbgrader.api import Gradebook

from course_files import (CHAPTERS, hidden_lines, ROOT, is_solution_cell, is_test_cell, nbgrader_meta, released,
                          released_chinese, scratch_course, solution, solution_chinese)
from course_files import course_cli
from transformer_lib.checks import get_checker
from transformer_lib.language import CHINESE, say

pytestmark = pytest.mark.slow

TAMPERED = "02_self_attention"  # the chapter the adversarial submissions are made from
CELL_TIMEOUT = 15
# The chapters graded in Chinese too, and the chapters whose blank release is graded: one from each part
# of the course, among them those whose exercise models raise errors of their own (10, 12). All twelve
# took 24 jobs, 4 minutes of a 34-minute suite. That every checker fails a blank stub, in every chapter,
# is tests/test_checkers.py's; here it is the pipeline around it that is proven.
CHINESE_CHAPTERS = ["02_self_attention", "07_training_inference", "10_gpt", "12_vision_transformers"]
BLANK_CHAPTERS = CHINESE_CHAPTERS
SOLUTION_REGION = re.compile(r"^([ \t]*)### BEGIN SOLUTION\n.*?^[ \t]*### END SOLUTION[ \t]*$", re.S | re.M)


def _exercises(nb):
    """(answer cell, test cell) pairs in notebook order."""
    answers = [c for c in nb.cells if is_solution_cell(c)]
    tests = [c for c in nb.cells if is_test_cell(c)]
    return list(zip(answers, tests))


def _replace_answer(cell, body: str):
    """Swap the solution region of an answer cell for `body` (indented like the region)."""
    cell.source = SOLUTION_REGION.sub(lambda m: "\n".join(m.group(1) + line for line in body.splitlines()), cell.source)


def _submit(course, student, chapter, nb):
    folder = course.submitted / student / chapter
    folder.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, folder / f"{chapter}.ipynb")


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    course = scratch_course(tmp_path_factory.mktemp("course"))
    for chapter in CHAPTERS:
        _submit(course, "alice_solutions", chapter, solution(chapter))
    for chapter in BLANK_CHAPTERS:
        _submit(course, "bob_blank", chapter, released(chapter))
    for chapter in CHINESE_CHAPTERS:  # the Chinese edition
        _submit(course, "li_solutions_zh", chapter, solution_chinese(chapter))
        _submit(course, "wang_blank_zh", chapter, released_chinese(chapter))

    nb = solution_chinese(TAMPERED)  # hana, Chinese edition: queries and keys swapped in the first exercise
    _replace_answer(_exercises(nb)[0][0], "q = x @ w_k\nk = x @ w_q\nv = x @ w_v\nreturn q, k, v")
    _submit(course, "hana_swapped_zh", TAMPERED, nb)

    nb = solution(TAMPERED)  # carol: a wrong answer, and its test cell edited to pass
    answer, test = _exercises(nb)[0]
    _replace_answer(answer, "return None")
    test.source = "pass"
    _submit(course, "carol_edited_test", TAMPERED, nb)

    nb = solution(TAMPERED)  # dave: the second test cell deleted
    deleted = nbgrader_meta(_exercises(nb)[1][1])["grade_id"]
    nb.cells = [c for c in nb.cells if nbgrader_meta(c).get("grade_id") != deleted]
    _submit(course, "dave_deleted_test", TAMPERED, nb)

    nb = solution(TAMPERED)  # erin: an endless loop in the third answer. It sleeps rather than spins: the
    # same timeout stops it (tests/test_grading_adversarial.py has the loops that spin and swallow interrupts)
    # without burning a core for the three periods of the limit that its collector and test cell wait.
    _replace_answer(_exercises(nb)[2][0], "import time\nwhile True:\n    time.sleep(0.1)")
    _submit(course, "erin_endless_loop", TAMPERED, nb)

    nb = solution(TAMPERED)  # frank: a wrong answer, and a patch that makes every check pass in the kernel
    answer = _exercises(nb)[0][0]
    _replace_answer(answer, "return None")
    answer.source += ("\n\nimport transformer_lib.checks.core as _core\n"
                      "_core.Checker.__call__ = lambda self, fn, hidden=False: print('\\u2713 all cases match')\n")
    _submit(course, "frank_patched_checker", TAMPERED, nb)

    broken = course.submitted / "gina_broken_json" / TAMPERED / f"{TAMPERED}.ipynb"
    broken.parent.mkdir(parents=True)
    broken.write_text('{"cells": [ {"cell_type": "code", ')

    report = course_cli.grade(course, cell_timeout=CELL_TIMEOUT)
    return course, report


def _cell_scores(course, student, chapter):
    with Gradebook(course.db_url, "transformer-course") as gb:
        nb = gb.find_submission_notebook(chapter, chapter, student)
        return {g.name: (g.score, g.max_score) for g in nb.grades}


def _test_ids(chapter):
    return [nbgrader_meta(t)["grade_id"] for _, t in _exercises(solution(chapter))]


def test_solutions_get_every_point(graded):
    course, report = graded
    for chapter in CHAPTERS:
        score, max_score = report.scores[("alice_solutions", chapter)]
        assert max_score > 0 and score == max_score, _cell_scores(course, "alice_solutions", chapter)
    assert not any(s == "alice_solutions" for s, _ in report.notes)


def test_a_right_notebook_runs_once(graded):
    """nbgrader's run hides every reference of the chapter, so a checker whose cases, or the objects it
    hands the learner's function, needed another exercise's reference failed a right answer there and
    cost a second sandboxed run. No chapter may need one."""
    course, report = graded
    rerun = {chapter: report.timings[("alice_solutions", chapter)] for chapter in CHAPTERS
             if "re-runs" in report.timings[("alice_solutions", chapter)]}
    assert not rerun


def test_the_chinese_edition_is_graded_exactly_as_the_english_one(graded):
    """The same answers score the same in either language, test cell by test cell."""
    course, report = graded
    for english, chinese in (("alice_solutions", "li_solutions_zh"), ("bob_blank", "wang_blank_zh")):
        for chapter in CHINESE_CHAPTERS:
            assert report.scores[(chinese, chapter)] == report.scores[(english, chapter)], (chinese, chapter)
            assert _cell_scores(course, chinese, chapter) == _cell_scores(course, english, chapter), (chinese, chapter)
        assert report.notes.get((chinese, TAMPERED)) == report.notes.get((english, TAMPERED))


def _page_text(course, student, chapter):
    page = course.feedback / student / chapter / f"{chapter}.html"
    return html.unescape(re.sub(r"<[^>]+>", "", page.read_text())), page.read_text()


def test_a_chinese_submission_gets_its_feedback_in_chinese(graded):
    course, report = graded
    text, page = _page_text(course, "li_solutions_zh", TAMPERED)
    assert "课程评分程序的反馈" in text and "Feedback from the course's grader" not in text
    assert "这个测试的每个用例都与参考实现一致" in text and "every case of this test matches" not in text
    heading = released_chinese(TAMPERED).cells[0].source.splitlines()[0].lstrip("# ").strip()
    assert re.search(r"<h1[^>]*>\s*" + re.escape(html.escape(heading, quote=False)), page), \
        "the chapter's Chinese text is the course's own: rendered, not escaped as a learner's markdown"
    text, _ = _page_text(course, "wang_blank_zh", TAMPERED)
    assert "还没有实现" in text and "not implemented yet" not in text
    assert "没有通过独立检查" in text and "failed the independent check" not in text  # the gradebook's comments

    # A wrong answer: the diagnosis names the mistake in Chinese, and the score is the English one's
    first = _test_ids(TAMPERED)[0]
    assert _cell_scores(course, "hana_swapped_zh", TAMPERED)[first][0] == 0
    mistake = next(m for m in get_checker("project_qkv").mistakes if m.name.startswith("queries and keys swapped"))
    text, _ = _page_text(course, "hana_swapped_zh", TAMPERED)
    expected = say("{exercise}: looks like {mistake}. {fix}", CHINESE, exercise="project_qkv",
                   mistake=say(mistake.name, CHINESE), fix=say(mistake.fix, CHINESE))
    assert expected != mistake.message("project_qkv")
    assert any(first in n and mistake.message("project_qkv") in n for n in report.notes[("hana_swapped_zh", TAMPERED)]), \
        "the instructor's report stays English"
    assert re.sub(r"\s+", "", expected) in re.sub(r"\s+", "", text)  # the page wraps verdict lines


def test_blank_stubs_get_zero(graded):
    course, report = graded
    for chapter in BLANK_CHAPTERS:
        assert report.scores[("bob_blank", chapter)][0] == 0


def test_edited_test_cell_is_graded_with_the_original(graded):
    course, report = graded
    scores = _cell_scores(course, "carol_edited_test", TAMPERED)
    first, *rest = _test_ids(TAMPERED)
    assert scores[first][0] == 0
    assert all(scores[g][0] == scores[g][1] for g in rest)


def test_deleted_test_cell_scores_zero_and_the_report_says_so(graded):
    course, report = graded
    deleted = _test_ids(TAMPERED)[1]
    scores = _cell_scores(course, "dave_deleted_test", TAMPERED)
    assert scores[deleted][0] == 0  # a zero, not nbgrader's blank awaiting manual grading
    assert any(deleted in n and "deleted" in n for n in report.notes[("dave_deleted_test", TAMPERED)])
    others = [g for g in _test_ids(TAMPERED) if g != deleted]
    assert all(scores[g][0] == scores[g][1] for g in others)


def test_endless_loop_costs_only_its_exercise(graded):
    course, report = graded
    scores = _cell_scores(course, "erin_endless_loop", TAMPERED)
    looping = _test_ids(TAMPERED)[2]
    assert scores[looping][0] == 0
    assert all(scores[g][0] == scores[g][1] for g in _test_ids(TAMPERED) if g != looping)


def test_patching_the_checker_in_the_kernel_gains_nothing(graded):
    course, report = graded
    first = _test_ids(TAMPERED)[0]
    assert _cell_scores(course, "frank_patched_checker", TAMPERED)[first][0] == 0
    notes = report.notes[("frank_patched_checker", TAMPERED)]
    assert any("independent check" in n and first in n for n in notes), notes
    page = course.feedback / "frank_patched_checker" / TAMPERED / f"{TAMPERED}.html"
    assert "failed the independent check" in html.unescape(page.read_text()), "the feedback tells the student why"


def test_broken_notebook_scores_zero_is_reported_and_kept(graded):
    course, report = graded
    assert report.scores[("gina_broken_json", TAMPERED)][0] == 0
    assert any("could not be read" in n for n in report.notes[("gina_broken_json", TAMPERED)])
    path = course.submitted / "gina_broken_json" / TAMPERED / f"{TAMPERED}.ipynb"
    assert path.read_text() == '{"cells": [ {"cell_type": "code", '


def test_feedback_is_written_and_hides_hidden_tests(graded):
    course, _ = graded
    pages = [("alice_solutions", c) for c in CHAPTERS] + [("bob_blank", c) for c in BLANK_CHAPTERS]
    for student, chapter in pages + [(s, c) for s in ("li_solutions_zh", "wang_blank_zh") for c in CHINESE_CHAPTERS]:
        page = course.feedback / student / chapter / f"{chapter}.html"
        assert page.exists()
        text = html.unescape(re.sub(r"<[^>]+>", "", page.read_text()))
        assert "BEGIN HIDDEN TESTS" not in text
        for line in hidden_lines(chapter):
            assert line not in text, f"hidden test line {line!r} shown in {page.name}"


def test_grades_are_exported_and_tabulated(graded):
    course, report = graded
    rows = list(csv.DictReader(open(course.root / "autograder" / "grades.csv")))
    assert {r["student_id"] for r in rows} >= {"alice_solutions", "bob_blank"}
    table = course_cli.format_table(report, CHAPTERS, course.students())
    assert "alice_solutions" in table and "notes:" in table
    notes = list(csv.DictReader(open(course.root / "autograder" / "report.csv")))
    assert any(r["student"] == "dave_deleted_test" and "deleted" in r["notes"] for r in notes)


def test_training_cells_are_skipped_while_grading_and_the_feedback_says_so(graded):
    """Grading mode (autograder/sandboxed_kernel.py): the release's skip-when-grading cells are not
    run in nbgrader's kernel; their output in the autograded notebook and the feedback says why."""
    course, _ = graded
    for chapter in ("09_bert", "10_gpt"):
        tagged = [i for i, c in enumerate(solution(chapter).cells) if "skip-when-grading" in c.metadata.get("tags", [])]
        assert tagged, f"{chapter} has no cell tagged skip-when-grading"
        autograded = nbformat.read(course.autograded / "alice_solutions" / chapter / f"{chapter}.ipynb", as_version=4)
        for i in tagged:
            text = "".join(o.get("text", "") for o in autograded.cells[i].outputs)
            assert text.startswith("[not run while grading"), (chapter, i, autograded.cells[i].outputs[:1])
        page = html.unescape((course.feedback / "alice_solutions" / chapter / f"{chapter}.html").read_text())
        assert "not run while grading" in page
