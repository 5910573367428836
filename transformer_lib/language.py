"""The language of the check messages: English, or Simplified Chinese for the Chinese edition.

(A module of its own, outside `checks`, so that the grader can import it without torch.)

Every message is written in English in the checkers; the Chinese edition looks each English
string up in a catalogue, `checks/zh/chNN.toml` (one per chapter, keyed by the English text),
`checks/zh/core.toml` (the sentences `checks/core.py` builds messages from, with `{placeholders}`)
and `checks/zh/grader.toml` (the grader's verdict lines and feedback page):

    [[text]]
    en = "softmax over the query dimension (dim=-2)"
    zh = "在查询维度上做了 softmax（dim=-2）"

A string without an entry stays English, and tests/test_translations.py names every string of
every checker that has none, and every entry no checker uses any more (an English edit leaves
its old entry orphaned, as it does a markdown cell's twin).

Which language a message is written in:

* the notebook's own: a Chinese chapter carries `metadata.course.language = "zh"`, and a kernel
  JupyterLab started for it knows the notebook's path (`JPY_SESSION_NAME`);
* else the environment's `COURSE_LANG` (`make lab COURSE_LANG=zh` sets it; the grader sets it
  in the sandboxed kernel of a Chinese submission);
* else English. `set_language` overrides all of them, for the rest of the process.

The grader judges submissions of both languages in one process, so `Checker.judge` takes the
language as an argument instead of reading this module's choice.
"""

from __future__ import annotations

import functools
import json
import os
import re
import tomllib
from pathlib import Path

ENGLISH, CHINESE = "en", "zh"
LANGUAGES = (ENGLISH, CHINESE)
CATALOGUE_DIR = Path(__file__).resolve().parent / "checks" / "zh"
# The notebooks' own text, not check messages: claim lines (transformer_lib/claims.py) and every text of a
# figure or diagram (transformer_lib/figure_text.py). Their keys are templates (see `Templates`).
CLAIMS_CATALOGUE, FIGURES_CATALOGUE = "claims.toml", "figures.toml"
NOTEBOOK_CATALOGUES = (CLAIMS_CATALOGUE, FIGURES_CATALOGUE)

_chosen: str | None = None


def set_language(language: str | None) -> None:
    """Write every later message of this process in `language` ("en" or "zh"); None undoes it."""
    global _chosen
    if language is not None and language not in LANGUAGES:
        raise ValueError(f"language must be one of {LANGUAGES}, got {language!r}")
    _chosen = language


def current_language() -> str:
    """The language the notebook's checks speak: see the module's docstring for the order."""
    if _chosen is not None:
        return _chosen
    from_notebook = _notebook_language(os.environ.get("JPY_SESSION_NAME", ""), os.getcwd())
    if from_notebook is not None:
        return from_notebook
    from_environment = os.environ.get("COURSE_LANG", "").strip().lower()
    return CHINESE if from_environment.startswith(CHINESE) else ENGLISH


@functools.lru_cache(maxsize=16)
def _notebook_language(session_name: str, cwd: str) -> str | None:
    """The `course.language` of the notebook this kernel runs, when its path can be found.
    JupyterLab gives the path absolute or relative to the server's root; the kernel runs in the
    notebook's folder, so the name alone is tried there too."""
    if not session_name.endswith(".ipynb"):
        return None
    path = Path(session_name)
    for candidate in (path, Path(cwd) / path, Path(cwd) / path.name):
        try:
            metadata = json.loads(candidate.read_text(encoding="utf-8")).get("metadata", {})
        except (OSError, ValueError, AttributeError):
            continue
        language = metadata.get("course", {}).get("language", ENGLISH) if isinstance(metadata, dict) else ENGLISH
        return language if language in LANGUAGES else ENGLISH
    return None


@functools.lru_cache(maxsize=1)
def chinese_catalogue() -> dict[str, str]:
    """English text -> its Chinese, from every file in zh/ (entries not yet translated are left out)."""
    catalogue: dict[str, str] = {}
    for path in sorted(CATALOGUE_DIR.glob("*.toml")):
        if path.name in NOTEBOOK_CATALOGUES:
            continue
        for entry in read_catalogue(path):
            if entry["zh"].strip():
                catalogue[entry["en"]] = entry["zh"]
    return catalogue


def read_catalogue(path: Path) -> list[dict]:
    try:
        entries = tomllib.loads(path.read_text(encoding="utf-8")).get("text", [])
    except tomllib.TOMLDecodeError as exc:
        raise RuntimeError(f"{path.name} is not valid TOML: {exc}") from None
    for i, entry in enumerate(entries):
        if not {"en", "zh"} <= set(entry) or not all(isinstance(entry[k], str) for k in ("en", "zh")):
            raise RuntimeError(f"{path.name}: entry {i + 1} must have the strings en and zh")
    return entries


def say(english: str, language: str, **fields) -> str:
    """`english` in `language`, its `{placeholders}` (if any fields are given) filled in."""
    text = chinese_catalogue().get(english, english) if language == CHINESE else english
    return text.format(**fields) if fields else text


# -- the notebooks' own text: claim lines and figures --------------------------------------------------------
#
# A claim's statement or a figure's title is often an f-string with measured numbers inside
# (f"the 4-head model reaches at least {acc:.2f}"), so its catalogue entry is a template: the English with
# each replacement field written {0}, {1}, ... in order, and the Chinese with the same placeholders where
# Chinese puts them. Literal braces are doubled, as in str.format:
#
#     [[text]]
#     en = "the {0}-head model reaches at least {1}"
#     zh = "{0} 头模型至少达到 {1}"
#
# A placeholder matches any text (even none: an English plural's "s"), so what it stood for (a number, a word, a quoted sentence) carries over
# unchanged; a placeholder's text that has an entry of its own (a name from a list, say) is translated too.

_FIELD = re.compile(r"\{\{|\}\}|\{(\d+)\}")


class Templates:
    """English -> Chinese for texts that may hold placeholders; `translate` returns None for a text
    no entry matches."""

    def __init__(self, entries: list[dict]):
        self.exact: dict[str, str] = {}
        self.patterns: list[tuple[re.Pattern, list[int], str]] = []
        literal: dict[str, int] = {}
        for entry in entries:
            english, chinese = entry["en"], entry["zh"]
            if not chinese.strip():
                continue
            pattern, order = template_pattern(english)
            if not order:
                self.exact[english.replace("{{", "{").replace("}}", "}")] = chinese.replace("{{", "{").replace("}}", "}")
            elif _FIELD.sub("", english).strip():  # a bare "{0}" would match anything
                self.patterns.append((pattern, order, chinese))
                literal[pattern.pattern] = len(_FIELD.sub("", english))
        # The most specific template first: the one with the most literal text.
        self.patterns.sort(key=lambda p: -literal[p[0].pattern])

    def translate(self, text: str, depth: int = 0) -> str | None:
        found = self.exact.get(text)
        if found is not None:
            return found
        for pattern, order, chinese in self.patterns:
            match = pattern.fullmatch(text)
            if match:
                values = [""] * (max(order) + 1)
                for group, index in zip(match.groups(), order):
                    inner = self.translate(group, depth + 1) if depth == 0 and _has_words(group) else None
                    values[index] = inner if inner is not None else group
                try:
                    return chinese.format(*values)
                except (IndexError, KeyError, ValueError):
                    return None
        return None


def template_pattern(english: str) -> tuple[re.Pattern, list[int]]:
    """The regular expression a template matches, and its placeholders' numbers in the order they appear."""
    parts, order, position = [], [], 0
    for field in _FIELD.finditer(english):
        parts.append(re.escape(english[position:field.start()]))
        if field.group(1) is None:
            parts.append(re.escape(field.group(0)[0]))
        else:
            order.append(int(field.group(1)))
            parts.append("(.*?)")
        position = field.end()
    parts.append(re.escape(english[position:]))
    return re.compile("".join(parts), re.DOTALL), order


def _has_words(text: str) -> bool:
    return re.search(r"[A-Za-z]{2}", text) is not None


@functools.lru_cache(maxsize=2)
def templates(file: str) -> Templates:
    path = CATALOGUE_DIR / file
    return Templates(read_catalogue(path) if path.exists() else [])


@functools.lru_cache(maxsize=8192)
def _translated(file: str, text: str) -> str:
    if not _has_words(text):
        return text
    found = templates(file).translate(text)
    return text if found is None else found


def translate(text: str, file: str, language: str | None = None) -> str:
    """`text` (a claim's statement, a figure's text) in `language` (default: the notebook's), from the
    templates of `file` (CLAIMS_CATALOGUE or FIGURES_CATALOGUE); unchanged when English or without an entry."""
    if (language or current_language()) != CHINESE or not isinstance(text, str):
        return text
    return _translated(file, text)
