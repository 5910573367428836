"""Shared helpers for the tests that look at the course's notebooks and its grading pipeline."""

import shutil
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "autograder"))

import course as course_cli  # noqa: E402  (autograder/course.py)
import notebooks as notebook_builder  # noqa: E402  (autograder/notebooks.py)

CHAPTERS = notebook_builder.chapters()
# The smallest number of autograded exercises each chapter promises.
MIN_EXERCISES = {"01_static_to_contextual": 5, "02_self_attention": 6, "03_multi_head_attention": 6,
                 "04_positional_encoding": 5, "05_add_norm_ffn": 6, "06_decoder_masks": 6, "07_training_inference": 8,
                 "08_tokenization": 7, "09_bert": 7, "10_gpt": 9, "11_long_sequences": 8,
                 "12_vision_transformers": 8}


def solution(chapter: str) -> nbformat.NotebookNode:
    return nbformat.read(ROOT / "solutions" / chapter / f"{chapter}.ipynb", as_version=4)


def released(chapter: str) -> nbformat.NotebookNode:
    return nbformat.read(ROOT / "chapters" / chapter / f"{chapter}.ipynb", as_version=4)


def released_chinese(chapter: str) -> nbformat.NotebookNode:
    return nbformat.read(ROOT / "chapters" / "zh" / chapter / f"{chapter}.ipynb", as_version=4)


def solution_chinese(chapter: str) -> nbformat.NotebookNode:
    """The solution notebook with its markdown in Chinese, as a learner of the Chinese edition hands it in."""
    import translations

    return translations.translate(solution(chapter), ROOT / "solutions" / chapter / f"{chapter}.zh.toml")


def nbgrader_meta(cell) -> dict:
    return cell.metadata.get("nbgrader", {})


def is_solution_cell(cell) -> bool:
    return cell.cell_type == "code" and nbgrader_meta(cell).get("solution", False)


def is_test_cell(cell) -> bool:
    meta = nbgrader_meta(cell)
    return cell.cell_type == "code" and meta.get("grade", False) and not meta.get("solution", False)


def scratch_course(tmp: Path, chapters=None) -> "course_cli.Course":
    """A copy of the course (config, grading scripts, solution notebooks) in a temp dir."""
    (tmp / "autograder").mkdir(parents=True)
    for name in ["nbgrader_config.py", "course.py", "sandbox_runner.py", "feedback.py", "translations.py"]:
        shutil.copy(ROOT / "autograder" / name, tmp / "autograder" / name)
    for chapter in chapters or CHAPTERS:
        (tmp / "solutions" / chapter).mkdir(parents=True)
        shutil.copy(ROOT / "solutions" / chapter / f"{chapter}.ipynb", tmp / "solutions" / chapter)
        for chinese in (ROOT / "solutions" / chapter).glob("*.zh.toml"):  # markdown twins, code comments
            shutil.copy(chinese, tmp / "solutions" / chapter)
    return course_cli.Course(tmp)


def hidden_lines(chapter: str) -> list[str]:
    """The code lines of every hidden test region of a chapter."""
    import re

    lines = []
    for cell in solution(chapter).cells:
        if is_test_cell(cell):
            for region in re.findall(r"### BEGIN HIDDEN TESTS\n(.*?)### END HIDDEN TESTS", cell.source, re.S):
                lines += [line.strip() for line in region.splitlines() if line.strip()]
    return lines
