"""The Chinese check messages: which English strings need a Chinese entry, and which have one.

The checkers write their messages in English; transformer_lib/language.py looks each string up
in transformer_lib/checks/zh/*.toml when a message is for a Chinese notebook. Three kinds of string
need an entry:

* a chapter's catalogue (`zh/chNN.toml`): the name and fix of every mistake and property of the
  chapter's checkers, the name of every case, and the errors its exercise models raise in the
  learner's process (`ERROR_MESSAGES` in chNN.py);
* `zh/core.toml`: every `say("...")` template of transformer_lib/checks/core.py;
* `zh/grader.toml`: every `say("...")` template of the grader (autograder/*.py).

A string shared by two chapters belongs to the first. `status` names every string without an entry,
every entry nothing uses any more (an English edit orphans its old entry, which still shows the
English it was translated from) and every entry that lost a number or a piece of inline code.

    python autograder/message_catalogue.py status            # what is missing, orphaned or unfaithful
    python autograder/message_catalogue.py scaffold [FILE]   # rewrite the files: entries kept, a blank
                                                             # entry added for each new string
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

from transformer_lib import language, safe_ast  # noqa: E402  (safe_ast: the grader's rule, one parse at a time)
from transformer_lib.checks import CHAPTER_MODULES  # noqa: E402

CATALOGUE_DIR = language.CATALOGUE_DIR


@dataclass
class Key:
    english: str
    where: str  # a comment for the translator: the exercise and the kind of string


SAYING = ("say", "said")  # language.say, and the local helpers that call it with the language filled in


def _say_templates(paths: list[Path]) -> list[Key]:
    """The literal first argument of every say(...) or said(...) call in `paths`, in source order."""
    keys = []
    for path in paths:
        calls = [node for node in ast.walk(safe_ast.parse(path.read_text(encoding="utf-8")))
                 if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) in SAYING
                 and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)]
        keys += [Key(node.args[0].value, f"{path.name}:{node.lineno}") for node in sorted(calls, key=lambda n: n.lineno)]
    return keys


def expected_keys() -> dict[str, list[Key]]:
    """File name -> the strings it must translate, in the order a translator meets them."""
    files: dict[str, list[Key]] = {}
    seen: set[str] = set()

    def add(file: str, key: Key) -> None:
        if key.english not in seen and key.english.strip():
            seen.add(key.english)
            files.setdefault(file, []).append(key)

    for key in _say_templates([ROOT / "transformer_lib" / "checks" / "core.py"]):
        add("core.toml", key)
    for key in _say_templates(sorted(HERE.glob("*.py"))):
        add("grader.toml", key)
    from feedback import BANNER, MISSING_VERDICT, SKIPPED_TEXT  # say()'s arguments there are names, not literals

    for text in (BANNER, SKIPPED_TEXT, MISSING_VERDICT):
        add("grader.toml", Key(text, "feedback.py"))
    for module in CHAPTER_MODULES:
        file = module.__name__.rsplit(".", 1)[-1] + ".toml"
        files.setdefault(file, [])
        for checker in module.CHECKERS:
            for case in checker.cases(hidden=True):
                add(file, Key(case.name, f"{checker.name}: case"))
            for mistake in checker.mistakes:
                add(file, Key(mistake.name, f"{checker.name}: mistake"))
                add(file, Key(mistake.fix, f"{checker.name}: its fix"))
            for prop in checker.properties:
                add(file, Key(prop.name, f"{checker.name}: property"))
                add(file, Key(prop.fix, f"{checker.name}: its fix"))
        for message in getattr(module, "ERROR_MESSAGES", ()):
            add(file, Key(message, "an error raised in the learner's code"))
    return files


@dataclass
class Status:
    file: str
    missing: list[Key] = field(default_factory=list)
    untranslated: list[str] = field(default_factory=list)
    orphans: list[dict] = field(default_factory=list)
    unfaithful: list[tuple[str, list[str]]] = field(default_factory=list)
    placeholders: list[str] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        return not (self.missing or self.untranslated or self.orphans or self.unfaithful or self.placeholders)


def _placeholders(text: str) -> set[str]:
    import string

    try:
        return {name for _, name, _, _ in string.Formatter().parse(text) if name is not None}
    except ValueError:
        return {"<unbalanced braces>"}


def status(file: str, keys: list[Key]) -> Status:
    from translations import differences

    found = Status(file)
    path = CATALOGUE_DIR / file
    entries = language.read_catalogue(path) if path.exists() else []
    by_english = {e["en"]: e for e in entries}
    wanted = {k.english for k in keys}
    for key in keys:
        entry = by_english.get(key.english)
        if entry is None:
            found.missing.append(key)
        elif not entry["zh"].strip():
            found.untranslated.append(key.english)
        else:
            problems = differences(key.english, entry["zh"])
            if problems:
                found.unfaithful.append((key.english, problems))
            if file in ("core.toml", "grader.toml") and _placeholders(entry["zh"]) != _placeholders(key.english):
                found.placeholders.append(key.english)
    found.orphans = [e for e in entries if e["en"] not in wanted]
    return found


def describe(found: Status) -> str:
    lines = [f"{found.file}:"]
    lines += [f"  missing ({k.where}): {k.english}" for k in found.missing]
    lines += [f"  not translated yet: {e}" for e in found.untranslated]
    lines += [f"  orphan (no checker says this any more): {e['en']}" for e in found.orphans]
    lines += [f"  {e[:80]}: " + "; ".join(p) for e, p in found.unfaithful]
    lines += [f"  placeholders differ: {e}" for e in found.placeholders]
    return "\n".join(lines)


def _string(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)  # a JSON string is a TOML basic string


def scaffold(file: str, keys: list[Key]) -> int:
    """Rewrite `file` in the order of its strings: entries kept, a blank one added for each string
    without one, orphans kept at the end (with their English) until someone carries them over."""
    path = CATALOGUE_DIR / file
    entries = language.read_catalogue(path) if path.exists() else []
    by_english = {e["en"]: e for e in entries}
    wanted = {k.english for k in keys}
    body = [f"# Chinese check messages ({file}), keyed by the English text. See autograder/message_catalogue.py.", ""]
    added, where = 0, None
    for key in keys:
        if key.where.split(":")[0] != where:
            where = key.where.split(":")[0]
            body += [f"# -- {where}", ""]
        entry = by_english.get(key.english)
        added += entry is None
        body += ["[[text]]", f"en = {_string(key.english)}", f"zh = {_string(entry['zh'] if entry else '')}", ""]
    orphans = [e for e in entries if e["en"] not in wanted]
    if orphans:
        body += ["# -- orphans: their English changed or went away; carry the translation over, then delete", ""]
    for entry in orphans:
        body += ["[[text]]", f"en = {_string(entry['en'])}", f"zh = {_string(entry['zh'])}", ""]
    CATALOGUE_DIR.mkdir(exist_ok=True)
    path.write_text("\n".join(body), encoding="utf-8")
    return added


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["status", "scaffold"])
    parser.add_argument("files", nargs="*", help="catalogue files (ch02.toml, core.toml, ...); default all")
    args = parser.parse_args(argv)
    keys = expected_keys()
    files = args.files or list(keys)
    if args.command == "scaffold":
        for file in files:
            print(f"{file}: {scaffold(file, keys[file])} entries added")
        return 0
    results = [status(file, keys[file]) for file in files]
    for found in results:
        print(f"{found.file}: complete ({len(keys[found.file])} strings)" if found.complete else describe(found))
    return 0 if all(f.complete for f in results) else 1


if __name__ == "__main__":
    sys.exit(main())
