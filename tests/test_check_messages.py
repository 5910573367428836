"""The check messages of the Chinese edition (transformer_lib/language.py, transformer_lib/checks/zh/).

* every string a checker, the checks' core or the grader can show a learner has a faithful Chinese
  entry, and no entry is left that nothing says any more (autograder/message_catalogue.py);
* a notebook's checks speak its language: the Chinese chapter's metadata, else COURSE_LANG, else English;
* each chapter diagnoses a catalogued mistake in Chinese with the same verdict as in English; an
  unfinished answer, a right one, yours_or_reference and the chapter summary speak Chinese too.
"""

import json
import sys

import pytest
import torch

from course_files import ROOT

sys.path.insert(0, str(ROOT / "autograder"))
import message_catalogue  # noqa: E402
from transformer_lib import language  # noqa: E402
from transformer_lib.checks import CHAPTER_MODULES, RESULTS, exercise_summary, get_checker, yours_or_reference  # noqa: E402
from transformer_lib.language import CHINESE, ENGLISH, say  # noqa: E402

KEYS = message_catalogue.expected_keys()


@pytest.fixture
def chinese_notebook():
    language.set_language(CHINESE)
    yield
    language.set_language(None)


@pytest.mark.parametrize("file", sorted(KEYS))
def test_every_check_message_has_a_faithful_chinese_entry(file):
    found = message_catalogue.status(file, KEYS[file])
    assert found.complete, message_catalogue.describe(found)


def test_the_catalogue_names_a_missing_entry_an_orphan_and_a_lost_placeholder(tmp_path, monkeypatch):
    monkeypatch.setattr(message_catalogue, "CATALOGUE_DIR", tmp_path)
    (tmp_path / "core.toml").write_text(
        '[[text]]\nen = "{exercise}: all {count} cases match the reference."\nzh = "{exercise}：全部用例都一致。"\n\n'
        '[[text]]\nen = "an English sentence edited since"\nzh = "一句已被改动的英文"\n', encoding="utf-8")
    keys = [message_catalogue.Key("{exercise}: all {count} cases match the reference.", "core.py:1"),
            message_catalogue.Key("a new sentence", "core.py:2")]
    found = message_catalogue.status("core.toml", keys)
    assert [k.english for k in found.missing] == ["a new sentence"]
    assert [e["en"] for e in found.orphans] == ["an English sentence edited since"]
    assert found.placeholders == ["{exercise}: all {count} cases match the reference."]
    assert not found.complete


def test_a_notebook_speaks_its_own_language(tmp_path, monkeypatch):
    folder = tmp_path / "chapters" / "zh" / "02_self_attention"
    folder.mkdir(parents=True)
    notebook = folder / "02_self_attention.ipynb"
    notebook.write_text(json.dumps({"cells": [], "metadata": {"course": {"language": "zh"}}, "nbformat": 4,
                                    "nbformat_minor": 5}))
    english = tmp_path / "01.ipynb"
    english.write_text(json.dumps({"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    monkeypatch.delenv("COURSE_LANG", raising=False)
    monkeypatch.delenv("JPY_SESSION_NAME", raising=False)
    assert language.current_language() == ENGLISH
    monkeypatch.setenv("JPY_SESSION_NAME", str(notebook))  # JupyterLab's kernel: the notebook's path
    assert language.current_language() == CHINESE
    monkeypatch.chdir(folder)  # the path relative to the server's root: found from the kernel's folder
    monkeypatch.setenv("JPY_SESSION_NAME", "chapters/zh/02_self_attention/02_self_attention.ipynb")
    assert language.current_language() == CHINESE
    monkeypatch.setenv("COURSE_LANG", "zh")  # an English notebook stays English in the Chinese lab
    monkeypatch.setenv("JPY_SESSION_NAME", str(english))
    assert language.current_language() == ENGLISH
    monkeypatch.delenv("JPY_SESSION_NAME")  # no notebook known (the grader's kernel): the environment
    assert language.current_language() == CHINESE
    language.set_language(ENGLISH)
    try:
        assert language.current_language() == ENGLISH
    finally:
        language.set_language(None)
    with pytest.raises(ValueError):
        language.set_language("fr")


def _first_catalogued_mistake(module):
    for checker in module.CHECKERS:
        for mistake in checker.mistakes:
            return checker, mistake
    raise AssertionError(f"{module.__name__} has no catalogued mistake")


@pytest.mark.parametrize("module", CHAPTER_MODULES, ids=lambda m: m.__name__.rsplit(".", 1)[-1])
def test_each_chapter_diagnoses_a_mistake_in_chinese(module):
    checker, mistake = _first_catalogued_mistake(module)
    outputs = checker.collect_outputs(mistake.implementation)
    english, chinese = checker.judge(outputs), checker.judge(outputs, language=CHINESE)
    assert (english.passed, english.mistake) == (chinese.passed, chinese.mistake) == (False, mistake.name)
    assert chinese.message == f"{checker.name}：看起来是{say(mistake.name, CHINESE)}。{say(mistake.fix, CHINESE)}"
    assert mistake.name not in chinese.message and mistake.fix not in chinese.message

    right = checker.judge(checker.collect_outputs(checker.reference), language=CHINESE)
    assert right.passed and right.message.startswith(f"{checker.name}：全部 ")

    def unfinished(*args, **kwargs):
        raise NotImplementedError()

    blank = checker.judge(checker.collect_outputs(unfinished), language=CHINESE)
    assert not blank.passed and "还没有实现" in blank.message and "`raise NotImplementedError()`" in blank.message


def test_a_shape_error_and_a_case_are_described_in_chinese():
    checker = get_checker("softmax")
    verdict = checker.judge(checker.collect_outputs(lambda x: x[..., :1]), language=CHINESE)
    case = checker.cases()[0]
    assert verdict.message.startswith(f"softmax：用例“{say(case.name, CHINESE)}”")
    assert "形状不对，应为" in verdict.message


def test_an_error_the_exercise_raises_on_purpose_is_translated():
    from transformer_lib.checks import ch10

    checker = get_checker("gpt_block")

    def calls_the_block(x, block, cache=None):
        return block(x, cache)

    verdict = checker.judge(checker.collect_outputs(calls_the_block), language=CHINESE)
    assert not verdict.passed
    assert say(ch10._CALL_THE_BLOCK, CHINESE) in verdict.message and ch10._CALL_THE_BLOCK not in verdict.message


def test_the_notebook_helpers_speak_chinese(chinese_notebook, capsys):
    checker = get_checker("softmax")
    RESULTS.pop(checker.name, None)
    exercise_summary(checker)
    assert capsys.readouterr().out.splitlines() == ["已通过的练习：0 / 1", "  \u00b7 softmax：还没有检查（运行它的测试单元格）"]

    def softmax(x):
        return torch.softmax(x, dim=0)

    assert yours_or_reference(softmax, checker) is checker.reference
    assert capsys.readouterr().out == "你的 `softmax` 还没有通过检查：改用参考实现\n"
    exercise_summary(checker)
    summary = capsys.readouterr().out.splitlines()
    assert summary[1].startswith("  \u2717 softmax：看起来是") and "。" not in summary[1]

    def right(x):
        return torch.softmax(x, dim=-1)

    checker(right)
    assert capsys.readouterr().out.startswith("\u2713 softmax：全部 ")
    assert yours_or_reference(right, checker) is right
    assert capsys.readouterr().out == "使用你的 `right`\n"
    RESULTS.pop(checker.name, None)
