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
import tomllib
from pathlib import Path

ENGLISH, CHINESE = "en", "zh"
LANGUAGES = (ENGLISH, CHINESE)
CATALOGUE_DIR = Path(__file__).resolve().parent / "checks" / "zh"

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
