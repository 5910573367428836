"""The Chinese edition: one twin per English markdown cell, kept faithful, released beside the English.

* every chapter's twins are complete: no English cell without one, no orphan, no unfinished one, and
  each keeps the English cell's formulas, inline code and numbers (autograder/translations.py);
* an English edit is caught and shown: the cell without a twin, and the orphan with its old English;
* the Chinese release is the English release with only the markdown replaced: code cells, ids and
  nbgrader metadata byte-identical (so nbval on the English solutions covers the Chinese code), and
  it is what `make release` makes now;
* the Chinese lab's configuration is the English one with Chinese menus.
"""

import json
import sys

import nbformat
import pytest

from course_files import CHAPTERS, ROOT, course_cli

sys.path.insert(0, str(ROOT / "autograder"))
import translations  # noqa: E402

ZH = ROOT / "chapters" / course_cli.CHINESE


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_every_markdown_cell_has_a_faithful_chinese_twin(chapter):
    found = translations.status(chapter)
    assert found.complete, translations.describe(found)


def test_the_fidelity_check_catches_a_lost_formula_code_or_number():
    english = "The weights $a_{ij}$ of `softmax(scores)` sum to 1; 1,285 minutes in all (Vaswani et al., 2017)."
    assert translations.differences(english, "权重 $a_{ij}$（`softmax(scores)`）之和为 1；共 1285 分钟（Vaswani et al., 2017）。") == []
    assert translations.differences(english, "权重 $a_{j}$（`softmax(scores)`）之和为 1；共 1285 分钟（2017）。") == [
        "formula not kept: $a_{ij}$"]
    assert translations.differences(english, "权重 $a_{ij}$（softmax）之和为 1；共 1285 分钟（2017）。") == [
        "inline code not kept: `softmax(scores)`"]
    assert translations.differences(english, "权重 $a_{ij}$（`softmax(scores)`）之和为 1；共 1258 分钟（2017）。") == [
        "numbers not kept: 1285", "numbers not in the English: 1258"]


def test_an_english_edit_leaves_a_missing_twin_and_an_orphan(tmp_path, monkeypatch):
    chapter = CHAPTERS[0]
    cells = translations.english_cells(chapter)
    entries = [{"id": c.id, "zh": "译文 " + " ".join(sorted(translations._numbers(c.source)))
                + "".join(f" {m}" for m in translations._MATH.findall(c.source))
                + "".join(f" {m}" for m in translations._CODE.findall(c.source))} for c in cells]
    monkeypatch.setattr(translations, "twins_path", lambda ch: tmp_path / f"{ch}.zh.toml")
    translations.write_twins(chapter, entries)
    assert translations.status(chapter).complete, translations.describe(translations.status(chapter))

    edited = cells[3].copy()
    edited.source = cells[3].source + "\n\nOne more sentence."
    edited.id = "0123456789"
    monkeypatch.setattr(translations, "english_cells", lambda ch: cells[:3] + [edited] + cells[4:])
    found = translations.status(chapter)
    assert [c.id for c in found.missing] == ["0123456789"]
    assert [t["id"] for t in found.orphans] == [cells[3].id]
    report = translations.describe(found)
    assert "no twin for 0123456789" in report and f"orphan {cells[3].id}" in report


def test_an_unfinished_twin_is_not_released(tmp_path):
    chapter = CHAPTERS[0]
    nb = nbformat.read(ROOT / "chapters" / chapter / f"{chapter}.ipynb", as_version=4)
    markdown = [c for c in nb.cells if c.cell_type == "markdown"]
    twins = tmp_path / "twins.toml"
    entries = [{"id": c.id, "zh": "译文"} for c in markdown]
    entries[-1]["zh"] = translations.TODO
    body = "".join(f"[[cell]]\nid = \"{e['id']}\"\nzh = '''\n{e['zh']}\n'''\n\n" for e in entries)
    twins.write_text(body, encoding="utf-8")
    with pytest.raises(ValueError, match="without a finished Chinese twin"):
        translations.translate(nb, twins)
    twins.write_text(body.replace(translations.TODO, "译文"), encoding="utf-8")
    chinese = translations.translate(nb, twins)
    assert [c.source for c in chinese.cells if c.cell_type == "markdown"] == ["译文"] * len(markdown)
    assert chinese.metadata["course"]["language"] == "zh"


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_the_chinese_release_shares_every_code_cell(chapter):
    english = nbformat.read(ROOT / "chapters" / chapter / f"{chapter}.ipynb", as_version=4)
    chinese = nbformat.read(ZH / chapter / f"{chapter}.ipynb", as_version=4)
    assert len(chinese.cells) == len(english.cells)
    for en, zh in zip(english.cells, chinese.cells):
        assert (zh.cell_type, zh.id, zh.metadata) == (en.cell_type, en.id, en.metadata)
        if en.cell_type == "code":
            assert zh.source == en.source and zh.outputs == en.outputs
    assert chinese.metadata["course"] == {"language": "zh"}
    assert {k: v for k, v in chinese.metadata.items() if k != "course"} == english.metadata


def test_the_chinese_lab_is_the_english_one_in_chinese():
    english, chinese = ROOT / ".lab", ROOT / ".lab-zh"
    files = sorted(p.relative_to(english) for p in english.rglob("*.json"))
    assert files == sorted(p.relative_to(chinese) for p in chinese.rglob("*.json"))
    for name in files:
        en, zh = json.loads((english / name).read_text()), json.loads((chinese / name).read_text())
        if name.name == "default_setting_overrides.json":
            assert zh.pop("@jupyterlab/translation-extension:plugin") == {"locale": "zh_CN"}
        assert zh == en, name
    assert (ZH / "README.md").exists(), "the Chinese start page, chapters/zh/README.md"


def test_the_chinese_readme_gives_only_the_english_readmes_numbers():
    """README.zh.md is README.md for Chinese readers: every number it gives is one README.md gives."""
    english, chinese = (ROOT / "README.md").read_text(encoding="utf-8"), (ROOT / "README.zh.md").read_text(encoding="utf-8")
    assert "README.zh.md" in english and "README.md" in chinese
    invented = sorted(translations._numbers(chinese) - translations._numbers(english))
    assert not invented, f"numbers in README.zh.md that README.md does not give: {invented}"
