"""The Chinese edition: one twin per English markdown cell, kept faithful, released beside the English.

* every chapter's twins are complete: no English cell without one, no orphan, no unfinished one, and
  each keeps the English cell's formulas, inline code and numbers (autograder/translations.py);
* an English edit is caught and shown: the cell without a twin, and the orphan with its old English;
* the Chinese release is the English release with the markdown and the code cells' comments and
  docstrings replaced: ids, outputs and nbgrader metadata identical (but for nbgrader's checksum of a
  graded cell whose comments changed, which is the Chinese cell's own), and every code cell equal to the
  English one once comments and docstrings are removed (so nbval on the English solutions covers the
  Chinese code); it is what `make release` makes now (tests/test_release.py);
* every comment and docstring a learner reads in the Chinese release is Chinese: none holds an English
  sentence (`translations.english_runs`), and every chapter's catalogue of them is complete;
* the Chinese lab's configuration is the English one with Chinese menus.
"""

import copy
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


def code_differences(english: nbformat.NotebookNode, chinese: nbformat.NotebookNode) -> list[str]:
    """How the Chinese notebook differs from the English one beyond its text: cells, ids, metadata,
    outputs, and code once comments and docstrings are removed."""
    from nbgrader.utils import compute_checksum

    if len(chinese.cells) != len(english.cells):
        return [f"{len(chinese.cells)} cells, the English has {len(english.cells)}"]
    problems = []
    for i, (en, zh) in enumerate(zip(english.cells, chinese.cells)):
        en_meta, zh_meta = json.loads(json.dumps(en.metadata)), json.loads(json.dumps(zh.metadata))
        checksum = zh_meta.get("nbgrader", {}).pop("checksum", None)
        en_meta.get("nbgrader", {}).pop("checksum", None)
        if (zh.cell_type, zh.id, zh_meta) != (en.cell_type, en.id, en_meta):
            problems.append(f"cell {i} ({en.id}): its type, id or metadata differ")
        if checksum is not None and checksum != compute_checksum(zh):
            problems.append(f"cell {i} ({en.id}): nbgrader's checksum is not the Chinese cell's")
        if en.cell_type == "code":
            if translations.strip_comments(zh.source) != translations.strip_comments(en.source):
                problems.append(f"cell {i} ({en.id}): its code differs from the English once comments are removed")
            if zh.outputs != en.outputs:
                problems.append(f"cell {i} ({en.id}): its outputs differ")
    if chinese.metadata.get("course") != {"language": "zh"}:
        problems.append("the notebook's metadata does not say it is Chinese")
    if {k: v for k, v in chinese.metadata.items() if k != "course"} != english.metadata:
        problems.append("the notebook's metadata differ")
    return problems


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_the_chinese_release_shares_every_code_cell(chapter):
    english = nbformat.read(ROOT / "chapters" / chapter / f"{chapter}.ipynb", as_version=4)
    chinese = nbformat.read(ZH / chapter / f"{chapter}.ipynb", as_version=4)
    assert code_differences(english, chinese) == []


def test_the_code_check_catches_a_chinese_cell_whose_code_changed():
    chapter = CHAPTERS[1]
    english = nbformat.read(ROOT / "chapters" / chapter / f"{chapter}.ipynb", as_version=4)
    chinese = nbformat.read(ZH / chapter / f"{chapter}.ipynb", as_version=4)
    index, cell = next((i, c) for i, c in enumerate(chinese.cells)
                       if c.cell_type == "code" and "#" in c.source and "nbgrader" not in c.metadata)
    twin = copy.deepcopy(chinese)
    twin.cells[index].source = cell.source + "\n# 又一条注释"  # a comment more: still the same code
    assert code_differences(english, twin) == []
    twin.cells[index].source = cell.source.replace("=", "= 1 +", 1)
    assert code_differences(english, twin) == [
        f"cell {index} ({cell.id}): its code differs from the English once comments are removed"]
    answer = next(i for i, c in enumerate(chinese.cells) if "checksum" in c.metadata.get("nbgrader", {}))
    twin = copy.deepcopy(chinese)
    twin.cells[answer].source += "\n# 又一条注释"  # nbgrader would take it for a learner's edit
    assert code_differences(english, twin) == [
        f"cell {answer} ({chinese.cells[answer].id}): nbgrader's checksum is not the Chinese cell's"]


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_every_code_comment_and_docstring_has_chinese(chapter):
    """The chapter's catalogue (NN_name.code.zh.toml) has Chinese for every comment and docstring of the
    release a learner reads, none it no longer needs, and each keeps its inline code and numbers."""
    found = translations.code_status(chapter)
    assert found.complete, translations.describe_code(found)


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_no_english_sentence_in_the_chinese_code_cells(chapter):
    """No comment or docstring of the Chinese release holds an English sentence (`translations.english_runs`)."""
    chinese = nbformat.read(ZH / chapter / f"{chapter}.ipynb", as_version=4)
    assert any(translations.code_units(c.source) for c in chinese.cells if c.cell_type == "code")
    english = english_comments(chinese)
    assert not english, f"comments or docstrings of chapters/zh/{chapter} still in English: {english[:5]}"


def english_comments(nb: nbformat.NotebookNode) -> list[tuple[str, str]]:
    """(cell id, text) of each comment block or docstring of `nb` that holds an English sentence."""
    return [(cell.id, unit.text.strip()[:80]) for cell in nb.cells if cell.cell_type == "code"
            for unit in translations.code_units(cell.source) if translations.english_runs(unit.text)]


def test_the_english_check_catches_an_untranslated_comment():
    chapter = CHAPTERS[1]
    english = nbformat.read(ROOT / "chapters" / chapter / f"{chapter}.ipynb", as_version=4)
    chinese = copy.deepcopy(english)
    translations.translate_code_cells(chinese, translations.code_catalogue_path(chapter))
    index = next(i for i, c in enumerate(english.cells) if c.cell_type == "code" and english_comments(
        nbformat.from_dict({"cells": [c]})))
    assert english.cells[index].id not in {cell_id for cell_id, _ in english_comments(chinese)}
    chinese.cells[index].source = english.cells[index].source  # that cell as the English release has it
    assert english.cells[index].id in {cell_id for cell_id, _ in english_comments(chinese)}


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_the_code_comments_keep_to_the_term_list(chapter):
    from test_zh_terms import Text, violations

    path = translations.code_catalogue_path(chapter)
    found = [str(f) for entry in translations.read_code_catalogue(path)
             for f in violations(Text(str(path.relative_to(ROOT)), entry["en"][:60], 1, entry["zh"], "twin"))]
    assert not found, "\n".join(found)


def test_the_english_rule_tells_a_sentence_from_code():
    sentence = ["the query of every token", "Returns the output and the weights: [..., L_q, d_v]",
                "把它放进 the last dimension", "Scaled dot-product attention.",
                "钩子（forward pre-hook, then the backward one）"]
    code = ["[batch, heads, seq, d_k]", "x: [..., n] -> [..., n]", "w_q(x) 就是 x W^Q", "`torch.softmax(x, dim=-1)` 的结果",
            "YOUR CODE HERE", "Vaswani et al. (2017) 的表 3", "用 Penn Treebank 训练", "padding_mask's layout", "[2, 10, 7]",
            "一个前向预钩子（forward pre-hook）"]
    assert [s for s in sentence if not translations.english_runs(s)] == []
    assert {c: translations.english_runs(c) for c in code if translations.english_runs(c)} == {}


def test_comments_and_docstrings_are_replaced_keeping_the_code():
    english = (
        'def f(x, mask=None):  # noqa: D401\n'
        '    """Scaled dot products of every query.\n'
        '\n'
        '    x: [..., n] -> [..., n].\n'
        '    """\n'
        '    # The scores, one row per query,\n'
        '    # before the softmax.\n'
        '    s = x @ x.T  # [n, n]\n'
        '    ### BEGIN SOLUTION\n'
        '    return s  # the scores as they are\n'
        '    ### END SOLUTION\n')
    catalogue = {"Scaled dot products of every query. x: [..., n] -> [..., n].": "每个查询的缩放点积。\n\nx: [..., n] -> [..., n]。",
                 "The scores, one row per query, before the softmax.": "分数：每个查询一行，\n在 softmax 之前。"}
    chinese, missing = translations.translate_code(english, catalogue)
    assert chinese == (
        'def f(x, mask=None):  # noqa: D401\n'
        '    """每个查询的缩放点积。\n'
        '\n'
        '    x: [..., n] -> [..., n]。\n'
        '    """\n'
        '    # 分数：每个查询一行，\n'
        '    # 在 softmax 之前。\n'
        '    s = x @ x.T  # [n, n]\n'
        '    ### BEGIN SOLUTION\n'
        '    return s  # the scores as they are\n'
        '    ### END SOLUTION\n')
    assert [u.text for u in missing] == ["the scores as they are"]
    assert translations.strip_comments(chinese) == translations.strip_comments(english)
    # keyed by the English, not by the cell: an edit elsewhere in the cell keeps the translations
    edited, _ = translations.translate_code(english.replace("s = x @ x.T", "s = x @ x.T / 2"), catalogue)
    assert edited == chinese.replace("s = x @ x.T", "s = x @ x.T / 2")


def test_status_names_missing_and_orphaned_code_entries(tmp_path, monkeypatch):
    chapter = CHAPTERS[1]
    entries = translations.read_code_catalogue(translations.code_catalogue_path(chapter))
    assert entries, f"{chapter} has no code catalogue"
    kept, dropped = entries[1:], entries[0]
    kept.append({"en": "a comment the code no longer has", "zh": "代码里已经没有的注释"})
    monkeypatch.setattr(translations, "code_catalogue_path", lambda ch: tmp_path / f"{ch}.code.zh.toml")
    translations.write_code_catalogue(tmp_path / f"{chapter}.code.zh.toml", kept)
    found = translations.code_status(chapter)
    assert [translations._key(u.text) for u in found.missing] == [translations._key(dropped["en"])]
    assert [e["en"] for e in found.orphans] == ["a comment the code no longer has"]
    report = translations.describe_code(found)
    assert "1 comment(s)/docstring(s) a learner reads without Chinese" in report and "orphan: 'a comment the code" in report


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
