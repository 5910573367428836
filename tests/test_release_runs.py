"""A fresh release runs top to bottom, and re-running a test cell tests what the learner wrote.

Each chapter's release is executed in a kernel exactly as handed out (every stub unfilled):
no cell may fail except the graded test cells (tagged `raises-exception`), each of which must
show only its one-line "not implemented yet" message. Then, in the same kernel, every graded
test cell runs again and must still fail: nothing in the chapter may have rebound the
learner's function to the reference.

tests/test_browser.py does all of this through the learner's lab (Run All in chromium, then the
test cells again in the same kernel), so where it runs this file's runs would only repeat it: each
chapter's release then runs once, in the browser. Where chromium or Playwright is missing, the
browser test is skipped and these runs make the same checks without a browser. As there, the
chapters that do not train run in their Chinese edition, and every claim line and figure text must
speak Chinese (tests/test_zh_notebook_text.py).
"""

import importlib.util
import shutil

import nbformat
import pytest
from nbclient import NotebookClient

import notebook_text
from course_files import CHAPTERS, ROOT, is_test_cell
from other_cpus import TRAINING_CHAPTERS

pytestmark = pytest.mark.slow

# What an unfinished test cell and the summary of an untouched chapter say (as in tests/test_browser.py).
WORDS = {"en": {"unfinished": "not implemented yet", "none passing": "Exercises passing: 0 of"},
         "zh": {"unfinished": "还没有实现", "none passing": "已通过的练习：0 /"}}
BROWSER_TEST_RUNS = bool(shutil.which("chromium")) and importlib.util.find_spec("playwright") is not None


def _error_lines(cell) -> list[str]:
    return [line for o in cell.outputs if o.output_type == "error" for line in o.traceback]


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_fresh_release_runs_through_and_tests_stay_honest(chapter, tmp_path, monkeypatch):
    if BROWSER_TEST_RUNS:
        pytest.skip("tests/test_browser.py runs this release in the lab and makes the same checks there")
    chinese = chapter not in TRAINING_CHAPTERS
    words = WORDS["zh" if chinese else "en"]
    folder = tmp_path / chapter
    shutil.copytree(ROOT / "chapters" / ("zh" if chinese else "") / chapter, folder)
    drawn = tmp_path / "drawn.jsonl"
    monkeypatch.delenv("JPY_SESSION_NAME", raising=False)
    monkeypatch.setenv("COURSE_LANG", "zh" if chinese else "en")
    monkeypatch.setenv("COURSE_TEXT_LOG", str(drawn))
    nb = nbformat.read(folder / f"{chapter}.ipynb", as_version=4)
    # allow_errors=False: a failure in any cell not tagged raises-exception stops the run here.
    client = NotebookClient(nb, timeout=600, kernel_name="python3", allow_errors=False,
                            resources={"metadata": {"path": str(folder)}})
    with client.setup_kernel():
        for index, cell in enumerate(nb.cells):
            if cell.cell_type == "code":
                client.execute_cell(cell, index)
        tests = [(i, c) for i, c in enumerate(nb.cells) if is_test_cell(c)]
        assert tests, f"{chapter} has no graded test cell"
        for index, cell in tests:
            assert "raises-exception" in cell.metadata.get("tags", []), f"{chapter}: test cell {index} is not tagged"
            lines = _error_lines(cell)
            assert len(lines) == 1 and "CheckFailed" in lines[0] and words["unfinished"] in lines[0], (
                f"{chapter}: test cell {index} should show one 'not implemented yet' line, shows {lines}")
        for index, cell in enumerate(nb.cells):
            if cell.cell_type == "code" and not is_test_cell(cell):
                assert not [o for o in cell.outputs if o.output_type == "error"], f"{chapter}: cell {index} failed"
                text = "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")
                assert "Traceback" not in text, f"{chapter}: cell {index} printed a traceback"
        # Re-run every test cell in the same kernel, after the whole chapter ran.
        for index, cell in tests:
            cell.outputs = []
            client.execute_cell(cell, index)
            lines = _error_lines(cell)
            assert lines and words["unfinished"] in lines[0], (
                f"{chapter}: re-running test cell {index} after the chapter no longer fails: {lines or cell.outputs}")
        summary = "".join(o.get("text", "") for o in nb.cells[max(i for i, c in enumerate(nb.cells)
                                                                     if c.cell_type == "code")].outputs)
        assert f"{words['none passing']} {len(tests)}" in summary, summary
    if chinese:
        notebook_text.assert_rendered_in_chinese(chapter, drawn)
