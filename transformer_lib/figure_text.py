"""Figures in the notebook's language: the Chinese edition's figures and diagrams speak Chinese.

The chapters' code is the same in both editions, so a figure's title, axis labels, legend, annotations
and texts are written in English in the code and translated here, when the notebook is the Chinese
edition (transformer_lib/language.py decides which it is): every matplotlib `Text` looks its string up in
`checks/zh/figures.toml` as it is set (so that tight_layout measures the Chinese) and again as it is drawn
(for a text changed behind `set_text`'s back). A string without an entry stays as it is: numbers, code,
single tokens of an example sentence. tests/test_zh_notebook_text.py names every string of a chapter or
diagram that reaches a figure without an entry, and fails on English a learner would read in a rendered
Chinese chapter.

Chinese needs a font with its characters. `install` adds the first CJK font matplotlib finds to the
fallback list of `font.family` (matplotlib >= 3.6 takes each glyph from the first font of the list that
has it), and puts it first for a text with mathematics in it, whose non-math part mathtext sets in one
font. Without any CJK font the figures stay English and one line says which font to install.

`COURSE_TEXT_LOG`, when set, names a file to which every drawn text and claim line is appended (one JSON
string a line, with its kind): the test's window on what a learner sees, from any kernel.
"""

from __future__ import annotations

import json
import logging
import os
import re

from .language import CHINESE, FIGURES_CATALOGUE, current_language, translate

# Fonts with Simplified Chinese, most likely first on Debian/Ubuntu, then macOS and Windows.
CJK_FONTS = ("WenQuanYi Micro Hei", "WenQuanYi Zen Hei", "Noto Sans CJK SC", "Noto Sans SC", "Source Han Sans SC",
             "PingFang SC", "Hiragino Sans GB", "Microsoft YaHei", "SimHei", "Heiti SC", "Arial Unicode MS")
NO_FONT = ("未找到中文字体，图中文字保持英文。请安装文泉驿微米黑（Debian/Ubuntu：sudo apt-get install "
           "fonts-wqy-microhei）或 Noto Sans CJK SC，然后重启内核。")
# On a class's hub the student has no root, and `make hub` installs the font: the server lacks it only
# when the instructor's install failed, so the one line is for them to pass on.
NO_FONT_ON_A_HUB = ("未找到中文字体，图中文字保持英文。请告诉老师：服务器缺少中文字体（`make hub` 会安装 "
                    "fonts-wqy-microhei），装好后重启内核即可。")
CJK = re.compile(r"[\u3000-\u303f\u3400-\u9fff\uff00-\uffef]")
LOG_VARIABLE = "COURSE_TEXT_LOG"

_installed = False
_font: str | None = None  # the CJK font, found when a Chinese notebook first draws
_looked = False
_warned = False


def cjk_font() -> str | None:
    """The first font of CJK_FONTS that matplotlib knows, or None. matplotlib lists the system's fonts
    once and caches the list; a font installed since is found by listing them again."""
    from matplotlib import font_manager

    def known():
        names = {font.name for font in font_manager.fontManager.ttflist}
        return next((name for name in CJK_FONTS if name in names), None)

    found = known()
    if found is None:
        font_manager.fontManager = font_manager._load_fontmanager(try_read_cache=False)
        found = known()
    return found


def install() -> None:
    """Translate every matplotlib text of a Chinese notebook from now on (idempotent; English notebooks
    are left exactly as they were: each text asks the language when it is set and drawn)."""
    global _installed
    if _installed:
        return
    from matplotlib.text import Text

    _installed = True

    set_text, draw, layout = Text.set_text, Text.draw, Text._get_layout

    def set_text_translated(self, s):
        set_text(self, s)
        if _chinese():
            english = self._text
            chinese = translate(english, FIGURES_CATALOGUE, CHINESE)
            if chinese != english:
                self._text = chinese

    def draw_translated(self, renderer):
        if _chinese():
            english = self._text
            chinese = translate(english, FIGURES_CATALOGUE, CHINESE)
            if chinese != english:
                self._text = chinese
            _give_cjk_font(self)
        draw(self, renderer)
        if os.environ.get(LOG_VARIABLE) and self.get_visible() and self._text.strip():
            record("figure", self._text)

    def layout_with_cjk_font(self, renderer):
        if _chinese():
            _give_cjk_font(self)  # measured in the font it will be drawn in
        return layout(self, renderer)

    set_text_translated.__doc__, draw_translated.__doc__ = set_text.__doc__, draw.__doc__
    Text.set_text, Text.draw, Text._get_layout = set_text_translated, draw_translated, layout_with_cjk_font
    if current_language() == CHINESE:
        _chinese()  # the missing-font line as the chapter starts, not at its first figure


def _chinese() -> bool:
    """Whether texts are to be translated now: a Chinese notebook with a CJK font (else one line, once)."""
    global _warned, _font, _looked
    if current_language() != CHINESE:
        return False
    if not _looked:
        _looked, _font = True, cjk_font()
    if _font is None:
        if not _warned:
            _warned = True
            print(NO_FONT_ON_A_HUB if os.environ.get("JUPYTERHUB_USER") else NO_FONT)
        return False
    import matplotlib

    families = matplotlib.rcParams["font.family"]
    if _font not in families:  # a fallback for every text made from now on, the learner's own included
        matplotlib.rcParams["font.family"] = [*families, _font]
        # Most CJK fonts have one weight: a bold title is drawn in the regular one, and matplotlib says so
        # on stderr for every such text. The learner need not read that.
        logging.getLogger("matplotlib.font_manager").addFilter(_no_single_weight_note)
    return True


def _no_single_weight_note(record) -> bool:
    return not (record.getMessage().startswith("findfont: Failed to find font weight") and _font in record.getMessage())


def _give_cjk_font(text) -> None:
    """A text with Chinese in it gets the CJK font in its family list: last (a fallback) for plain text,
    first for mathtext, whose plain parts come from the family's first font."""
    string = text._text
    if not CJK.search(string):
        return
    families = list(text.get_fontfamily())
    mathematics = text._parse_math and string.count("$") - string.count(r"\$") >= 2
    if mathematics and families[:1] != [_font]:
        text.set_fontfamily([_font] + [f for f in families if f != _font])
    elif not mathematics and _font not in families:
        text.set_fontfamily(families + [_font])


def record(kind: str, text: str) -> None:
    """Append one text a learner sees to the file COURSE_TEXT_LOG names (the test's record)."""
    path = os.environ.get(LOG_VARIABLE)
    if path:
        with open(path, "a", encoding="utf-8") as log:
            log.write(json.dumps({"kind": kind, "text": text}, ensure_ascii=False) + "\n")
