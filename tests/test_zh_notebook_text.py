"""The Chinese edition has no English where a learner reads it: claim lines, figures and diagrams (issue 26, item 4).

The zh notebooks run the English code; transformer_lib/claims.py and transformer_lib/figure_text.py translate
each claim statement and every matplotlib text at run time from checks/zh/claims.toml and figures.toml.

* every string a chapter's code sends to a claim or a figure's title, axis label, legend, text or
  annotation has a Chinese entry (a static reading of solutions/NN/NN.py: tests/notebook_text.py);
* every diagram of transformer_lib/diagrams, drawn in Chinese, shows no English sentence, and each of its
  texts with an English word has an entry;
* rendered, at no extra run: the chapters that do not train run their Chinese release in the lab
  (tests/test_browser.py; tests/test_release_runs.py where there is no browser), the training chapters
  run in Chinese in tests/test_other_cpus_default.py; every claim line and figure text they draw is
  recorded (COURSE_TEXT_LOG) and must hold no English sentence (`notebook_text.english_sentences`: two or
  more English words in a row, code, names, units, mathematics and quoted data aside:
  `notebook_text.assert_rendered_in_chinese`);
* the detector and the mechanism are shown to catch an English claim and an English figure title.
"""

from __future__ import annotations

import re

import matplotlib

matplotlib.use("agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

import notebook_text  # noqa: E402
from course_files import ROOT  # noqa: E402
from transformer_lib import claims, figure_text, language  # noqa: E402
from transformer_lib.language import CHINESE  # noqa: E402

figure_text.install()


@pytest.fixture
def chinese():
    language.set_language(CHINESE)
    yield
    language.set_language(None)
    plt.close("all")


def test_what_counts_as_an_english_sentence():
    found = notebook_text.english_sentences
    assert found("Multi-head attention: the shapes along the way") == ["Multi-head attention", "the shapes along the way"]
    assert found("多头注意力：沿途 the shapes") == ["the shapes"]
    assert found("黄色 = may attend，灰色 = 被遮住") == ["may attend"]
    assert found("fine-tuning 之后") == ["fine-tuning"]  # a hyphenated word is two
    assert found("top-k 和 top-p 截掉了长尾") == []  # top is kept, k a symbol
    # Not English a learner reads: code, names, units, mathematics, quoted data, single words.
    for text in ("view + transpose(1, 2)", "[B, L, d_model]", "mask.unsqueeze(1) → [2, 1, 1, 5]", "GPT-2 small",
                 "LayerNorm 与 BatchNorm", "softmax token", "$\\mathrm{softmax}(QK^T)$", "模型生成 'the cat sat on'",
                 "“she is eating a green apple”", "12.5 ms / 3 MB", "损失 loss", "BERT MLM NSP"):
        assert found(text) == [], text


def test_every_claim_and_figure_string_of_a_chapter_has_chinese():
    keys = notebook_text.expected_keys()
    problems = []
    for kind in notebook_text.FILES:
        problems += [f"{where}: {key!r}" for key, where in notebook_text.missing(kind, keys[kind])]
    assert not problems, ("strings a learner reads in the Chinese edition without a Chinese entry (add them with "
                          "`python tests/notebook_text.py scaffold`, then translate):\n" + "\n".join(problems))


def test_the_catalogues_keep_numbers_code_and_placeholders():
    import sys

    sys.path.insert(0, str(ROOT / "autograder"))
    from translations import differences

    problems = []
    for kind in notebook_text.FILES:
        for entry in notebook_text.entries(kind):
            if not entry["zh"].strip():
                continue
            english, chinese = entry["en"], entry["zh"]
            placeholders = language.template_pattern(english)[1]
            used = language.template_pattern(chinese)[1]
            # Each used once at most; one may go (an English plural's "s"), none may be new.
            if len(used) != len(set(used)) or not set(used) <= set(placeholders) or len(used) < len(placeholders) - 1:
                problems.append(f"{english!r}: placeholders {placeholders}, the Chinese uses {used}")
            lost = differences(*(re.sub(r"(?<!\{)\{\d+\}(?!\})", "", text) for text in (english, chinese)))
            if lost:
                problems.append(f"{english!r}: " + "; ".join(lost))
    assert not problems, "\n".join(problems)


def test_every_diagram_draws_in_chinese(chinese):
    assert figure_text.cjk_font(), ("no Chinese font: the Chinese edition's figures cannot be drawn (`make browser` "
                                    "installs one as root; else install fonts-wqy-microhei or Noto Sans CJK SC)")
    problems = []
    for where, texts in notebook_text.diagram_texts().items():
        for text in texts:
            if notebook_text.english_sentences(text):
                problems.append(f"{where}: {text!r} <- {notebook_text.english_sentences(text)}")
    assert not problems, "diagrams with English left in the Chinese edition:\n" + "\n".join(problems)


def test_a_claim_speaks_chinese_and_an_unknown_one_is_caught(chinese, capsys, monkeypatch):
    monkeypatch.setattr(language, "templates", lambda file: language.Templates([
        {"en": "the {0}-head model reaches at least {1} on every task", "zh": "{0} 头模型在每个任务上至少达到 {1}"},
        {"en": claims.FAILED, "zh": "本章说“{statement}”，但这次运行的结果不支持这一点。{detail}"},
        {"en": claims.MEASURED, "zh": "（测得：{measured}）"}]))
    language._translated.cache_clear()
    try:
        claims.claim(True, f"the {4}-head model reaches at least {0.99} on every task")
        claims.claim_between(0.83, 0.7, None, "the model reaches at least 0.7 on every task")
        with pytest.raises(claims.ClaimFailed, match="本章说“4 头模型在每个任务上至少达到 0.99”，但这次运行的结果不支持这一点。（测得：0.5）"):
            claims.claim(False, "the 4-head model reaches at least 0.99 on every task", measured="0.5")
    finally:
        language._translated.cache_clear()
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == "✓ 4 头模型在每个任务上至少达到 0.99"
    # The statement without an entry stays English, and the rendered test finds it.
    assert printed[1] == "✓ the model reaches at least 0.7 on every task"
    assert notebook_text.english_left([{"kind": "claim", "text": line} for line in printed]) == [
        "claim: '✓ the model reaches at least 0.7 on every task'  <- the model reaches at least, on every task"]


def test_a_figure_speaks_chinese_and_an_english_title_is_caught(chinese, monkeypatch, tmp_path):
    monkeypatch.setattr(language, "templates", lambda file: language.Templates([
        {"en": "Loss by step ({0} steps)", "zh": "各步的损失（共 {0} 步）"}, {"en": "training step", "zh": "训练步"},
        {"en": "the trained model", "zh": "训练后的模型"}]))
    language._translated.cache_clear()
    log = tmp_path / "drawn.jsonl"
    monkeypatch.setenv(figure_text.LOG_VARIABLE, str(log))
    try:
        fig, ax = plt.subplots()
        ax.plot([0, 1], [1, 0], label="the trained model")
        ax.set_title(f"Loss by step ({200} steps)")
        ax.set_xlabel("training step")
        ax.set_ylabel("loss on held-out text")  # no entry
        ax.legend()
        texts = notebook_text.drawn_texts(fig)
    finally:
        language._translated.cache_clear()
    assert {"各步的损失（共 200 步）", "训练步", "训练后的模型"} <= set(texts)
    assert "loss on held-out text" in texts
    assert notebook_text.english_left(notebook_text.read_log(log)) == [
        "figure: 'loss on held-out text'  <- loss on held-out text"]


def test_without_a_chinese_font_figures_stay_english_and_one_line_says_what_to_install(chinese, monkeypatch, capsys):
    monkeypatch.setattr(figure_text, "_font", None)
    monkeypatch.setattr(figure_text, "_looked", True)
    monkeypatch.setattr(figure_text, "_warned", False)
    fig, ax = plt.subplots()
    ax.set_title("Multi-head attention: the shapes along the way")
    ax.set_xlabel("positions")
    fig.canvas.draw()
    assert ax.get_title() == "Multi-head attention: the shapes along the way"
    out = capsys.readouterr().out
    assert out.count("fonts-wqy-microhei") == 1 and out.count("\n") == 1
    # A student on the class's hub has no root: the line asks them to tell the instructor, never sudo.
    monkeypatch.setenv("JUPYTERHUB_USER", "wang")
    monkeypatch.setattr(figure_text, "_warned", False)
    fig.canvas.draw()
    out = capsys.readouterr().out
    assert "老师" in out and "sudo" not in out and out.count("\n") == 1


def test_an_english_notebook_is_left_alone(monkeypatch):
    language.set_language(language.ENGLISH)
    try:
        fig, ax = plt.subplots()
        ax.set_title("Multi-head attention: the shapes along the way")
        assert "Multi-head attention: the shapes along the way" in notebook_text.drawn_texts(fig)
    finally:
        language.set_language(None)
        plt.close("all")


def test_the_chinese_nbval_pass_still_tells_a_cross_from_a_tick(tmp_path):
    """The default-kernel pass runs the Chinese edition against the English outputs through
    notebook_text.nbval_sanitizer: a check line becomes a placeholder in both languages, but a failing
    check (✗) must not match a stored passing one (✓), and the counts of the summary still count."""
    import configparser

    config = configparser.ConfigParser()
    config.read(notebook_text.nbval_sanitizer(tmp_path / "sanitize.cfg"), encoding="utf-8")

    def sanitized(text: str) -> str:
        for section in config.sections():
            text = re.sub(config[section]["regex"], config[section]["replace"], text)
        return text

    zh = {e["en"]: e["zh"] for e in language.read_catalogue(language.CATALOGUE_DIR / "core.toml")}
    summary = "Exercises passing: {passed} of {total}"
    assert sanitized("✓ softmax passes its check") == sanitized("✓ softmax 通过了检查")
    assert sanitized("✓ softmax passes its check") != sanitized("✗ softmax 没有通过检查")
    assert sanitized(summary.format(passed=3, total=5)) == sanitized(zh[summary].format(passed=3, total=5))
    assert sanitized(summary.format(passed=3, total=5)) != sanitized(zh[summary].format(passed=2, total=5))
