"""The Chinese edition's text: one twin per English markdown cell, beside the chapter's source.

A chapter's English text lives in its jupytext source, `solutions/NN_name/NN_name.py`; its Chinese
text in `solutions/NN_name/NN_name.zh.toml`, one entry per markdown cell:

    [[cell]]
    id = "d1776cc3da"          # the English cell's id (notebooks.py: a digest of its text)
    zh = '''
    ## 自注意力 (self-attention)
    ...
    '''

Code cells, their ids and nbgrader metadata are not repeated: the Chinese notebook is the English
one with each markdown cell's text replaced by its twin. Since an English cell's id is a digest of
its text, editing the English text leaves its twin orphaned, and `status` (and
tests/test_translations.py) names both: the English cell without a twin, and the orphan with the
English it was translated from (from git, where the history has it), so that the edit can be
carried over and the twin's id updated.

    python autograder/translations.py status [CHAPTER ...]   # missing, orphaned and unfinished twins
    python autograder/translations.py scaffold CHAPTER       # add an entry for every cell without a twin
    python autograder/translations.py show CHAPTER           # the English cells, with their ids
    python autograder/translations.py fill CHAPTER FOLDER    # set twins from FOLDER/<id>.md files

The code cells' comments and docstrings have their Chinese in `solutions/NN_name/NN_name.code.zh.toml`,
keyed by the English text (not by cell, so that an edit elsewhere in a cell leaves them in place):

    [[text]]
    en = '''Scaled dot products of every query with every key.'''
    zh = '''每个查询与每个键的缩放点积。'''

One entry is a docstring (as a unit) or a block of comments (a comment and the comment lines right
below it at the same column); the key matches whatever the whitespace. The Chinese cell is the English
one with those replaced through Python's tokenizer (quotes, indentation and code unchanged: the cell
equals the English once comments and docstrings are removed, see `strip_comments`). nbgrader's markers
(`### BEGIN SOLUTION`, `# YOUR CODE HERE`, ...) and magic comments (`# noqa`, `# type:`) are never
replaced, and a comment with no English sentence in it (a shape like `# [batch, seq, d_k]`) needs no entry.

`status` lists them too: the comments and docstrings of the release without Chinese, and the
entries whose English the chapter no longer has (orphans: re-key them to the edited English).

    python autograder/translations.py code-scaffold CHAPTER  # add a TODO entry for each one missing
"""

from __future__ import annotations

import argparse
import ast
import copy
import difflib
import io
import json
import re
import subprocess
import sys
import tokenize
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from transformer_lib import safe_ast  # the grader builds kits in threads: one parse at a time

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SOLUTIONS = ROOT / "solutions"
sys.path.insert(0, str(HERE))

TODO = "待翻译"  # the marker `scaffold` writes where a translation is still missing


def twins_path(chapter: str) -> Path:
    return SOLUTIONS / chapter / f"{chapter}.zh.toml"


def english_cells(chapter: str) -> list[nbformat.NotebookNode]:
    """The chapter's markdown cells, from its source (ids as notebooks.py gives them)."""
    import notebooks  # jupytext: the maintainer's tools, not the learner's or the grader's

    return [c for c in notebooks.read_source(chapter).cells if c.cell_type == "markdown"]


def read_twins(chapter: str) -> list[dict]:
    path = twins_path(chapter)
    if not path.exists():
        return []
    try:
        entries = tomllib.loads(path.read_text(encoding="utf-8")).get("cell", [])
    except tomllib.TOMLDecodeError as exc:
        raise SystemExit(f"{path.relative_to(ROOT)} is not valid TOML: {exc}") from None
    for i, entry in enumerate(entries):
        if set(entry) != {"id", "zh"} or not all(isinstance(v, str) for v in entry.values()):
            raise SystemExit(f"{path.relative_to(ROOT)}: entry {i + 1} must have exactly the strings id and zh")
    return entries


def _clean(text: str) -> str:
    return text.strip("\n")


_MATH = re.compile(r"\$\$.+?\$\$|\$[^$]+?\$", re.S)  # inline formulas may wrap onto the next line
_FENCE = re.compile(r"^[ \t]*```.*?^[ \t]*```", re.S | re.M)
_CODE = re.compile(r"`[^`\n]+(?:\n[^`\n]+)?`")  # a span may wrap onto the next line, not across a paragraph
_TEXT_IN_MATH = re.compile(r"\\text\{[^{}]*\}")  # words inside a formula may be translated
# A number: not inside a Latin word or another number (CJK characters count as \w in Python, so
# they are left out of the lookbehind: "约 20 分钟" and "约20分钟" both show 20).
_NUMBER = re.compile(r"(?<![A-Za-z0-9_.])\d[\d,]*(?:\.\d+)?(?:e-?\d+)?")
_SCALED_EN = re.compile(r"(?<![A-Za-z0-9_.])(\d[\d,]*(?:\.\d+)?)\s*(thousand|million|billion|trillion|k|M|B)\b")
_SCALED_ZH = re.compile(r"(?<![A-Za-z0-9_.])(\d[\d,]*(?:\.\d+)?)\s*(千|万|亿)")
_SCALES = {"thousand": 1e3, "k": 1e3, "million": 1e6, "M": 1e6, "billion": 1e9, "B": 1e9, "trillion": 1e12,
           "千": 1e3, "万": 1e4, "亿": 1e8}
_UNITS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve",
          "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen"]
_TENS = {"twenty": 20, "thirty": 30, "forty": 40, "fifty": 50, "sixty": 60, "seventy": 70, "eighty": 80, "ninety": 90}
_WORD = re.compile(r"\b(" + "|".join(list(_TENS) + _UNITS + ["hundred", "thousand"]) + r")(?:-(" + "|".join(_UNITS[1:10])
                   + r"))?\b", re.I)


def _normal(fragment: str) -> str:
    return " ".join(_TEXT_IN_MATH.sub(r"\\text{}", fragment).split())


def _prose(text: str) -> str:
    return _CODE.sub(" ", _MATH.sub(" ", _FENCE.sub(" ", text)))


def _numbers(text: str) -> set[str]:
    return {n.replace(",", "") for n in _NUMBER.findall(_prose(text))}


def _value(number: str) -> float:
    return float(number.replace(",", ""))


def _scaled(text: str, pattern: re.Pattern) -> set[float]:
    return {round(_value(n) * _SCALES[unit], 6) for n, unit in pattern.findall(_prose(text))}


def _spelled(text: str) -> set[float]:
    """Numbers the English writes in words ("sixteen", "ninety-six"), which the Chinese may write in digits."""
    values = set()
    for tens_or_unit, unit in _WORD.findall(_prose(text)):
        word = tens_or_unit.lower()
        value = _TENS.get(word) or {"hundred": 100, "thousand": 1000}.get(word) or _UNITS.index(word)
        values.add(float(value + (_UNITS.index(unit.lower()) if unit else 0)))
    return values


def differences(english: str, chinese: str) -> list[str]:
    """What a translation must keep: its formulas (the words in a \\text{} aside), its inline code and
    its numbers. A number may change its unit (256 million as 2.56 亿), a number written in words may
    become digits, and single digits may be added (第 1 步 for "first")."""
    problems = []
    for what, pattern in (("code block", _FENCE), ("formula", _MATH), ("inline code", _CODE)):
        if pattern is not _FENCE:
            english, chinese = _FENCE.sub(" ", english), _FENCE.sub(" ", chinese)
        kept = {_normal(m) for m in pattern.findall(chinese)}
        lost = sorted({m for m in pattern.findall(english) if _normal(m) not in kept})
        if lost:
            problems.append(f"{what} not kept: {', '.join(lost)[:200]}")
    en, zh = _numbers(english), _numbers(chinese)
    en_scaled, zh_scaled = _scaled(english, _SCALED_EN), _scaled(chinese, _SCALED_ZH)
    lost = sorted(n for n in en - zh if not any(abs(_value(n) * _SCALES[u] - v) < 1e-6 * v
                                                  for v in zh_scaled for u in ("thousand", "million", "billion")
                                                  if round(_value(n) * _SCALES[u], 6) in en_scaled))
    words = _spelled(english)
    added = sorted(n for n in zh - en if len(n) > 1 and _value(n) not in words
                   and not any(abs(_value(n) * _SCALES[u] - v) < 1e-6 * v for v in en_scaled for u in ("千", "万", "亿")
                               if round(_value(n) * _SCALES[u], 6) in zh_scaled))
    if lost:
        problems.append(f"numbers not kept: {', '.join(lost)[:200]}")
    if added:
        problems.append(f"numbers not in the English: {', '.join(added)[:200]}")
    return problems


@dataclass
class Status:
    chapter: str
    missing: list[nbformat.NotebookNode] = field(default_factory=list)  # English cells without a twin
    orphans: list[dict] = field(default_factory=list)  # twins of no English cell
    unfinished: list[dict] = field(default_factory=list)  # twins still holding the TODO marker
    duplicates: list[str] = field(default_factory=list)  # ids with more than one twin
    unfaithful: list[tuple[str, list[str]]] = field(default_factory=list)  # (id, what differs)

    @property
    def complete(self) -> bool:
        return not (self.missing or self.orphans or self.unfinished or self.duplicates or self.unfaithful)


def status(chapter: str) -> Status:
    cells = english_cells(chapter)
    twins = read_twins(chapter)
    ids = {c.id for c in cells}
    seen: dict[str, int] = {}
    for twin in twins:
        seen[twin["id"]] = seen.get(twin["id"], 0) + 1
    found = Status(chapter)
    found.duplicates = sorted(i for i, n in seen.items() if n > 1)
    found.missing = [c for c in cells if c.id not in seen]
    found.orphans = [t for t in twins if t["id"] not in ids]
    found.unfinished = [t for t in twins if t["id"] in ids and TODO in t["zh"]]
    english = {c.id: c.source for c in cells}
    for twin in twins:
        if twin["id"] in english and TODO not in twin["zh"]:
            problems = differences(english[twin["id"]], twin["zh"])
            if problems:
                found.unfaithful.append((twin["id"], problems))
    return found


def translate(nb: nbformat.NotebookNode, twins_file: Path) -> nbformat.NotebookNode:
    """The Chinese notebook: `nb` (a solution notebook or its release) with every markdown cell's
    text replaced by its twin from `twins_file`, the comments and docstrings of its code cells by
    their Chinese from the catalogue beside it (NN_name.code.zh.toml; `translate_code_cells`), and
    the language recorded in its metadata.
    Raises ValueError when a markdown cell has no finished twin."""
    try:
        entries = tomllib.loads(twins_file.read_text(encoding="utf-8")).get("cell", [])
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ValueError(f"{twins_file.name}: {exc}") from None
    twins = {t["id"]: _clean(t["zh"]) for t in entries if TODO not in t["zh"]}
    out = nbformat.from_dict(copy.deepcopy(dict(nb)))
    missing = [c.id for c in out.cells if c.cell_type == "markdown" and c.id not in twins]
    if missing:
        raise ValueError(f"{len(missing)} markdown cell(s) without a finished Chinese twin in {twins_file.name} "
                         f"(first: {missing[0]}); `python autograder/translations.py status` lists them")
    for cell in out.cells:
        if cell.cell_type == "markdown":
            cell.source = twins[cell.id]
    translate_code_cells(out, catalogue_beside(twins_file))  # what is not yet translated stays English
    out.metadata.setdefault("course", {})["language"] = "zh"
    return out


# -- code cells: comments and docstrings -----------------------------------------------------------

# nbgrader's markers and magic comments: never translated (nbgrader and linters read them)
_KEPT_COMMENT = re.compile(r"^#+\s*(?:(?:BEGIN|END) (?:SOLUTION|HIDDEN TESTS)|YOUR CODE HERE|noqa|type:|pragma|fmt:"
                           r"|pylint:|-\*-|%%)|^#!|#\s*noqa\b")
_SOLUTION_REGION = re.compile(r"^([ \t]*)### BEGIN SOLUTION\n.*?^[ \t]*### END SOLUTION[ \t]*$", re.S | re.M)
_HIDDEN_REGION = re.compile(r"^[ \t]*### BEGIN HIDDEN TESTS.*?^[ \t]*### END HIDDEN TESTS[ \t]*\n?", re.S | re.M)
# An English word: two letters or more (one is a variable), or "a"; not part of an identifier, a
# dotted name, a call, a number or a formula (W^Q)
_EN_WORD = r"(?<![\w.'^])(?:[A-Za-z][a-z]+(?:'[a-z]+)?|a)(?![\w(.'^])"
_EN_RUN = re.compile(rf"(?:{_EN_WORD})(?:[ \t]+(?:{_EN_WORD}))+")
# The English name of a term in parentheses right after its Chinese (前向预钩子（forward pre-hook）): a gloss
_GLOSS = re.compile(r"(?<=[\u4e00-\u9fff])（[A-Za-z][A-Za-z \-]{0,40}）")
_QUOTES = re.compile(r"(?i)^([rbuf]*)('''|\"\"\"|'|\")")


def english_runs(text: str) -> list[str]:
    """The English a reader would read in `text`: runs of 2 or more English words separated by spaces,
    outside `code spans` and formulas. Identifiers (`d_model`, `torch.softmax`, `f(x)`) and shapes
    (`[batch, heads, seq, d_k]`: commas between the names) are not English words, "et al." is not,
    a run of capitalised words (a name: "Penn Treebank", "YOUR CODE HERE") is not a sentence, and
    neither is a term's English name glossed in full-width parentheses right after its Chinese."""
    text = _CODE.sub(" ", _MATH.sub(" ", text))
    text = re.sub(r"\bet al\.", " ", text)
    text = _GLOSS.sub(" ", text)
    runs = []
    for match in _EN_RUN.finditer(text):
        words = re.findall(r"[A-Za-z']+", match.group(0))
        if all(w[0].isupper() for w in words):
            continue
        runs.append(match.group(0))
    return runs


def _key(text: str) -> str:
    return " ".join(text.split())


def code_catalogue_path(chapter: str) -> Path:
    return SOLUTIONS / chapter / f"{chapter}.code.zh.toml"


def catalogue_beside(twins_file: Path) -> Path:
    """NN_name.code.zh.toml beside NN_name.zh.toml (the name keeps nbgrader's `*.zh.toml` ignore rule)."""
    return twins_file.with_name(twins_file.name.removesuffix(".zh.toml") + ".code.zh.toml")


def read_code_catalogue(path: Path) -> list[dict]:
    if not path.exists():
        return []
    try:
        entries = tomllib.loads(path.read_text(encoding="utf-8")).get("text", [])
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{path.name} is not valid TOML: {exc}") from None
    for i, entry in enumerate(entries):
        if set(entry) != {"en", "zh"} or not all(isinstance(v, str) for v in entry.values()):
            raise ValueError(f"{path.name}: entry {i + 1} must have exactly the strings en and zh")
    return entries


@dataclass
class Unit:
    """One translatable piece of a code cell: a docstring's text or a block of comments."""

    kind: str  # "comment" or "docstring"
    text: str  # comments: their text after '#', one line each; a docstring: its source between the quotes
    start: int  # the offsets in the cell's source of what a translation replaces
    end: int
    indent: str  # what a new line of the translation starts with (comments: up to their '#')
    prefix: str  # comments: the '#' and the space after it; a docstring: its quotes

    @property
    def needs_translation(self) -> bool:
        return bool(english_runs(self.text))


def _docstring_spans(source: str) -> dict[int, tuple[int, int]]:
    """Every docstring (the first statement of the module or of a function or class body): its first
    row -> (start, end) character offsets in `source` of the string literal, quotes included.

    The offsets come from `ast` (UTF-8 byte columns, converted here), not from `tokenize`: on Python 3.12
    tokenize's end column of a string holding non-ASCII text is not a character offset."""
    tree = safe_ast.parse(source)
    lines = source.splitlines(keepends=True)
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line))

    def char_offset(row: int, byte_col: int) -> int:
        return offsets[row - 1] + len(lines[row - 1].encode("utf-8")[:byte_col].decode("utf-8"))

    found = {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.body:
            first = node.body[0]
            if (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
                    and isinstance(first.value.value, str)):
                value = first.value
                found[value.lineno] = (char_offset(value.lineno, value.col_offset),
                                       char_offset(value.end_lineno, value.end_col_offset))
    return found


def code_units(source: str) -> list[Unit]:
    """The comments (in blocks) and docstrings of a code cell, in order; none when it is not Python."""
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
        docstrings = _docstring_spans(source)
    except (tokenize.TokenError, SyntaxError, ValueError):
        return []
    lines = source.splitlines(keepends=True)
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line))

    def offset(row: int, col: int) -> int:
        return offsets[row - 1] + col

    def comment_start(tok) -> int:
        # a comment runs to the end of its line: its column, counted in characters on every Python
        return len(lines[tok.start[0] - 1].rstrip("\r\n")) - len(tok.string)

    def before(tok) -> str:
        return lines[tok.start[0] - 1][:comment_start(tok) if tok.type == tokenize.COMMENT else tok.start[1]]

    units: list[Unit] = []
    block: list = []  # the comment tokens of the block being gathered

    def close_block():
        if block:
            first, last = block[0], block[-1]
            prefix = re.match(r"#+ ?", first.string).group(0)
            texts = [t.string[len(re.match(r"#+ ?", t.string).group(0)):].rstrip() for t in block]
            indent = before(first) if not before(first).strip() else " " * comment_start(first)
            start = offset(first.start[0], comment_start(first))
            end = offset(last.start[0], comment_start(last) + len(last.string))
            units.append(Unit("comment", "\n".join(texts), start, end, indent, prefix))
            block.clear()

    for tok in tokens:
        if tok.type == tokenize.COMMENT:
            if _KEPT_COMMENT.search(tok.string):
                close_block()
                continue
            if block:
                prev = block[-1]
                if not (tok.start[0] == prev.start[0] + 1 and comment_start(tok) == comment_start(prev)
                        and not before(tok).strip()):
                    close_block()
            block.append(tok)
        elif tok.type in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT):
            continue
        else:
            close_block()
            if tok.type == tokenize.STRING and tok.start[0] in docstrings \
                    and docstrings[tok.start[0]][0] == offset(*tok.start):
                literal_start, literal_end = docstrings.pop(tok.start[0])
                head, quote = _QUOTES.match(source[literal_start:literal_end]).groups()
                start, end = literal_start + len(head) + len(quote), literal_end - len(quote)
                indent = before(tok) if not before(tok).strip() else " " * tok.start[1]
                units.append(Unit("docstring", source[start:end], start, end, indent, quote))
    close_block()
    return units


def _render(unit: Unit, chinese: str) -> str:
    """The source text that replaces `unit` in the Chinese cell: the Chinese lines, each indented as
    the English; a docstring keeps its quotes and, where the English has it, a closing line of its own."""
    lines = chinese.strip("\n").split("\n")
    if unit.kind == "comment":
        return ("\n" + unit.indent).join(unit.prefix + line if line.strip() else unit.prefix.rstrip() for line in lines)
    english = unit.text.split("\n")
    body = lines[0] + "".join("\n" + (unit.indent + line if line.strip() else "") for line in lines[1:])
    if len(english) > 1 and not english[0].strip():  # the text starts on the line below the quotes
        body = english[0] + "\n" + unit.indent + body
    if len(english) > 1 and not english[-1].strip():  # the closing quotes on a line of their own
        body += "\n" + english[-1]
    if unit.prefix[0] in body or "\\" in body:
        raise ValueError(f"a docstring's Chinese may not hold its quote character or a backslash: {chinese[:60]!r}")
    return body


def strip_comments(source: str) -> list[str]:
    """The cell's code without its comments and docstrings (a docstring leaves its empty quotes): the
    lines left, stripped at the right, blank ones dropped. A Chinese cell must give its English cell's."""
    for unit in reversed(code_units(source)):
        source = source[:unit.start] + source[unit.end:]
    return [line.rstrip() for line in source.split("\n") if line.strip()]


def translate_code(source: str, catalogue: dict[str, str]) -> tuple[str, list[Unit]]:
    """The Chinese cell: each comment block and docstring of `source` that `catalogue` (English key ->
    Chinese) holds replaced; and the units a learner reads that had no Chinese."""
    units = code_units(source)
    missing, out = [], source
    for unit in reversed(units):
        chinese = catalogue.get(_key(unit.text))
        if chinese is None:
            if unit.needs_translation:
                missing.append(unit)
            continue
        out = out[:unit.start] + _render(unit, chinese) + out[unit.end:]
    if out != source:
        try:
            safe_ast.parse(out)
        except SyntaxError as exc:
            raise ValueError(f"the Chinese comments broke a code cell ({exc}): {source[:80]!r}") from None
        if strip_comments(out) != strip_comments(source):
            raise ValueError(f"the Chinese comments changed a code cell's code: {source[:80]!r}")
    return out, missing[::-1]


def code_catalogue(path: Path) -> dict[str, str]:
    """English key -> Chinese, finished entries only."""
    return {_key(e["en"]): e["zh"] for e in read_code_catalogue(path) if TODO not in e["zh"]}


def translate_code_cells(nb: nbformat.NotebookNode, catalogue_file: Path) -> list[Unit]:
    """Replace, in place, the comments and docstrings of `nb`'s code cells that the catalogue holds,
    and recompute nbgrader's checksum of a graded cell so changed (a fresh Chinese release is then not
    taken for a notebook a learner edited; the grader rebuilds every submission on the English
    release's cells and checksums, so the grading is the English one's). Returns the units still in
    English."""
    catalogue = code_catalogue(catalogue_file)
    missing = []
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        source, left = translate_code(cell.source, catalogue)
        missing += left
        if source != cell.source:
            cell.source = source
            grader = cell.metadata.get("nbgrader", {})
            if "checksum" in grader:
                from nbgrader.utils import compute_checksum

                grader["checksum"] = compute_checksum(cell)
    return missing


def release_code(chapter: str) -> list[str]:
    """The chapter's code cells as the release has them (nbgrader's stub for each solution, no hidden
    test), made from its source: the code a learner of either edition reads."""
    import notebooks

    cells = []
    for cell in notebooks.read_source(chapter).cells:
        if cell.cell_type == "code":
            source = _SOLUTION_REGION.sub(lambda m: f"{m.group(1)}# YOUR CODE HERE\n{m.group(1)}raise NotImplementedError()",
                                          cell.source)
            cells.append(_HIDDEN_REGION.sub("", source))
    return cells


@dataclass
class CodeStatus:
    chapter: str
    missing: list[Unit] = field(default_factory=list)  # comments and docstrings a learner reads, without Chinese
    orphans: list[dict] = field(default_factory=list)  # entries whose English the code no longer has
    unfinished: list[dict] = field(default_factory=list)  # entries still holding the TODO marker
    duplicates: list[str] = field(default_factory=list)  # English keys with two entries
    unfaithful: list[tuple[str, list[str]]] = field(default_factory=list)  # (English, what differs)
    english_left: list[tuple[str, list[str]]] = field(default_factory=list)  # (English, English runs in the Chinese)

    @property
    def complete(self) -> bool:
        return not (self.missing or self.orphans or self.unfinished or self.duplicates or self.unfaithful
                    or self.english_left)


def code_status(chapter: str) -> CodeStatus:
    found = CodeStatus(chapter)
    try:
        entries = read_code_catalogue(code_catalogue_path(chapter))
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    seen: dict[str, int] = {}
    for entry in entries:
        seen[_key(entry["en"])] = seen.get(_key(entry["en"]), 0) + 1
    found.duplicates = sorted(k for k, n in seen.items() if n > 1)
    units = [u for cell in release_code(chapter) for u in code_units(cell)]
    present = {_key(u.text) for u in units}
    for unit in units:
        if unit.needs_translation and _key(unit.text) not in seen:
            seen[_key(unit.text)] = 0
            found.missing.append(unit)
    for entry in entries:
        if _key(entry["en"]) not in present:
            found.orphans.append(entry)
        elif TODO in entry["zh"]:
            found.unfinished.append(entry)
        else:
            problems = differences(entry["en"], entry["zh"])
            if problems:
                found.unfaithful.append((entry["en"], problems))
            runs = english_runs(entry["zh"])
            if runs:
                found.english_left.append((entry["en"], runs))
    return found


def describe_code(found: CodeStatus) -> str:
    parts = []
    for what, items in (("comment(s)/docstring(s) a learner reads without Chinese", found.missing),
                        ("entry(ies) whose English the code no longer has", found.orphans),
                        (f"entry(ies) still marked {TODO}", found.unfinished),
                        ("English keys with two entries", found.duplicates),
                        ("entry(ies) that change inline code or a number", found.unfaithful),
                        ("entry(ies) whose Chinese still holds English", found.english_left)):
        if items:
            parts.append(f"{len(items)} {what}")
    if not parts:
        return f"{found.chapter} code: complete"
    lines = [f"{found.chapter} code ({code_catalogue_path(found.chapter).name}): " + "; ".join(parts)]
    for unit in found.missing:
        lines.append(f"  no Chinese for {unit.kind}: {unit.text.strip()[:100]!r}")
    for entry in found.orphans:
        lines.append(f"  orphan: {entry['en'].strip()[:80]!r}")
        close = difflib.get_close_matches(entry["en"], [u.text for u in found.missing], n=1, cutoff=0.5)
        if close:
            lines.append(f"    the English now? {close[0].strip()[:100]!r}")
    for entry in found.unfinished:
        lines.append(f"  unfinished: {entry['en'].strip()[:80]!r}")
    for key in found.duplicates:
        lines.append(f"  two entries: {key[:80]!r}")
    for english, problems in found.unfaithful:
        lines.append(f"  {english.strip()[:60]!r}: " + "; ".join(problems))
    for english, runs in found.english_left:
        lines.append(f"  {english.strip()[:60]!r}: English left: {runs[:3]}")
    return "\n".join(lines)


def _toml_string(text: str) -> str:
    if "'''" in text or "\r" in text or text.endswith("'"):
        return json.dumps(text, ensure_ascii=False)
    if "\n" in text:
        return "'''\n" + text + "'''"
    return "'" + text + "'" if "'" not in text else "'''" + text + "'''"


def write_code_catalogue(path: Path, entries: list[dict]) -> None:
    chapter = path.name.removesuffix(".code.zh.toml")
    body = [f"# The Chinese of {chapter}'s code comments and docstrings, keyed by their English (whitespace",
            "# aside). See autograder/translations.py.", ""]
    for entry in entries:
        body += ["[[text]]", f"en = {_toml_string(entry['en'])}", f"zh = {_toml_string(entry['zh'])}", ""]
    path.write_text("\n".join(body), encoding="utf-8")


def _readable(unit: Unit) -> str:
    """A unit's English as a catalogue shows it: a docstring's lines without their common indentation."""
    if unit.kind == "comment":
        return unit.text
    import textwrap

    first, _, rest = unit.text.partition("\n")
    return (first.strip() + "\n" + textwrap.dedent(rest)).strip()


def code_scaffold(chapter: str) -> int:
    """Add an entry marked TODO for each comment and docstring without Chinese."""
    path = code_catalogue_path(chapter)
    entries = read_code_catalogue(path)
    missing = code_status(chapter).missing
    entries += [{"en": _readable(u), "zh": TODO} for u in missing]
    write_code_catalogue(path, entries)
    return len(missing)


def _english_at_last_edit(chapter: str, cell_id: str) -> str | None:
    """The English text of cell `cell_id` as it was when the twins file was last committed."""
    import notebooks

    root = ROOT
    try:
        commit = subprocess.run(["git", "log", "-1", "--format=%H", "--", str(twins_path(chapter).relative_to(root))],
                                cwd=root, capture_output=True, text=True, check=True).stdout.strip()
        if not commit:
            return None
        old = subprocess.run(["git", "show", f"{commit}:{notebooks.source_path(chapter).relative_to(root)}"],
                             cwd=root, capture_output=True, text=True, check=True).stdout
    except (OSError, ValueError, subprocess.CalledProcessError):  # no git, no history, a file outside the course
        return None
    import hashlib

    import jupytext

    for cell in jupytext.reads(old, fmt="py:percent").cells:
        digest = hashlib.sha1(f"{cell.cell_type}:{cell.source}".encode()).hexdigest()[:10]
        if digest == cell_id:
            return cell.source
    return None


def describe(found: Status, brief: bool = False) -> str:
    parts = []
    if found.missing:
        parts.append(f"{len(found.missing)} English cell(s) without a Chinese twin")
    if found.orphans:
        parts.append(f"{len(found.orphans)} twin(s) of no English cell")
    if found.unfinished:
        parts.append(f"{len(found.unfinished)} twin(s) still marked {TODO}")
    if found.duplicates:
        parts.append(f"ids with two twins: {', '.join(found.duplicates)}")
    if found.unfaithful:
        parts.append(f"{len(found.unfaithful)} twin(s) that change a formula, inline code or a number")
    if brief or not parts:
        return "; ".join(parts) or "complete"
    lines = [f"{found.chapter}: " + "; ".join(parts)]
    for cell in found.missing:
        lines.append(f"  no twin for {cell.id}: {cell.source.strip().splitlines()[0][:90]!r}")
    for twin in found.orphans:
        lines.append(f"  orphan {twin['id']}: {_clean(twin['zh']).splitlines()[0][:60]!r}")
        old = _english_at_last_edit(found.chapter, twin["id"])
        if old is not None:
            closest = difflib.get_close_matches(old, [c.source for c in found.missing], n=1, cutoff=0.3)
            if closest:
                diff = difflib.unified_diff(old.splitlines(), closest[0].splitlines(), "translated from", "English now",
                                            lineterm="")
                lines.extend("    " + line for line in diff)
    for twin in found.unfinished:
        lines.append(f"  unfinished {twin['id']}")
    for cell_id, problems in found.unfaithful:
        lines.append(f"  {cell_id}: " + "; ".join(problems))
    return "\n".join(lines)


def _literal(text: str) -> str:
    if "'''" in text:
        raise ValueError("a cell's text contains ''' and cannot be written as a TOML literal string")
    return "'''\n" + text + "\n'''"


def write_twins(chapter: str, entries: list[dict]) -> None:
    body = [f"# The Chinese text of {chapter}: one twin per English markdown cell, keyed by the cell's id.",
            "# See autograder/translations.py.", ""]
    for entry in entries:
        body += ["[[cell]]", f'id = "{entry["id"]}"', f"zh = {_literal(_clean(entry['zh']))}", ""]
    twins_path(chapter).write_text("\n".join(body), encoding="utf-8")


def scaffold(chapter: str) -> int:
    """Rewrite the twins file in the English cells' order: existing twins kept, one TODO entry per
    cell without one (its English text as a reminder), orphans kept at the end."""
    cells = english_cells(chapter)
    twins = read_twins(chapter)
    by_id = {t["id"]: t for t in twins}
    ids = {c.id for c in cells}
    entries, added = [], 0
    for cell in cells:
        if cell.id in by_id:
            entries.append(by_id[cell.id])
        else:
            entries.append({"id": cell.id, "zh": f"{TODO}\n\n{cell.source}"})
            added += 1
    entries += [t for t in twins if t["id"] not in ids]
    write_twins(chapter, entries)
    return added


def fill(chapter: str, folder: Path) -> int:
    """Set the twin of each cell that has a FOLDER/<id>.md file to that file's text."""
    entries = read_twins(chapter)
    filled = 0
    for entry in entries:
        path = folder / f"{entry['id']}.md"
        if path.exists():
            entry["zh"] = path.read_text(encoding="utf-8")
            filled += 1
    write_twins(chapter, entries)
    return filled


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("status", "scaffold", "show", "fill", "code-scaffold"):
        p = sub.add_parser(name)
        p.add_argument("chapters", nargs="*" if name == "status" else 1)
        if name == "fill":
            p.add_argument("folder", type=Path)
    args = parser.parse_args(argv)
    if args.command == "status":
        import notebooks

        results = [status(ch) for ch in (args.chapters or notebooks.chapters())]
        code = [code_status(ch) for ch in (args.chapters or notebooks.chapters())]
        for found, found_code in zip(results, code):
            print(describe(found) if not found.complete else f"{found.chapter}: complete")
            print(describe_code(found_code))
        return 0 if all(f.complete for f in results + code) else 1
    chapter = args.chapters[0]
    if args.command == "fill":
        print(f"{chapter}: {fill(chapter, args.folder)} twins set from {args.folder}")
        return 0
    if args.command == "code-scaffold":
        print(f"{chapter}: {code_scaffold(chapter)} entries added to {code_catalogue_path(chapter).relative_to(ROOT)}")
        return 0
    if args.command == "scaffold":
        print(f"{chapter}: {scaffold(chapter)} entries added to {twins_path(chapter).relative_to(ROOT)}")
        return 0
    for cell in english_cells(chapter):
        print(f"=== {cell.id}\n{cell.source}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
