"""A fresh release runs top to bottom, and re-running a test cell tests what the learner wrote.

Each chapter's release is executed in a kernel exactly as handed out (every stub unfilled):
no cell may fail except the graded test cells (tagged `raises-exception`), each of which must
show only its one-line "not implemented yet" message. Then, in the same kernel, every graded
test cell runs again and must still fail: nothing in the chapter may have rebound the
learner's function to the reference.

tests/test_browser.py does all of this through the learner's lab (Run All in chromium, then the
test cells again in the same kernel), so where it runs this file's runs would only repeat it: each
chapter's release then runs once, in the browser. Where chromium or Playwright is missing, the
browser test is skipped and these runs make the same checks without a browser.
"""

import importlib.util
import shutil

import nbformat
import pytest
from nbclient import NotebookClient

from course_files import CHAPTERS, ROOT, is_test_cell

pytestmark = pytest.mark.slow

BROWSER_TEST_RUNS = bool(shutil.which("chromium")) and importlib.util.find_spec("playwright") is not None


def _error_lines(cell) -> list[str]:
    return [line for o in cell.outputs if o.output_type == "error" for line in o.traceback]


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_fresh_release_runs_through_and_tests_stay_honest(chapter, tmp_path):
    if BROWSER_TEST_RUNS:
        pytest.skip("tests/test_browser.py runs this release in the lab and makes the same checks there")
    folder = tmp_path / chapter
    shutil.copytree(ROOT / "chapters" / chapter, folder)
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
            assert len(lines) == 1 and "CheckFailed" in lines[0] and "not implemented yet" in lines[0], (
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
            assert lines and "not implemented yet" in lines[0], (
                f"{chapter}: re-running test cell {index} after the chapter no longer fails: {lines or cell.outputs}")
        summary = "".join(o.get("text", "") for o in nb.cells[max(i for i, c in enumerate(nb.cells)
                                                                     if c.cell_type == "code")].outputs)
        assert f"Exercises passing: 0 of {len(tests)}" in summary, summary
