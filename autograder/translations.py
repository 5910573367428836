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
"""

from __future__ import annotations

import argparse
import copy
import difflib
import re
import subprocess
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

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
    text replaced by its twin from `twins_file`, and the language recorded in its metadata.
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
    out.metadata.setdefault("course", {})["language"] = "zh"
    return out


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
    for name in ("status", "scaffold", "show", "fill"):
        p = sub.add_parser(name)
        p.add_argument("chapters", nargs="*" if name == "status" else 1)
        if name == "fill":
            p.add_argument("folder", type=Path)
    args = parser.parse_args(argv)
    if args.command == "status":
        import notebooks

        results = [status(ch) for ch in (args.chapters or notebooks.chapters())]
        for found in results:
            print(describe(found) if not found.complete else f"{found.chapter}: complete")
        return 0 if all(f.complete for f in results) else 1
    chapter = args.chapters[0]
    if args.command == "fill":
        print(f"{chapter}: {fill(chapter, args.folder)} twins set from {args.folder}")
        return 0
    if args.command == "scaffold":
        print(f"{chapter}: {scaffold(chapter)} entries added to {twins_path(chapter).relative_to(ROOT)}")
        return 0
    for cell in english_cells(chapter):
        print(f"=== {cell.id}\n{cell.source}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
