"""What a learner of the Chinese edition reads in a chapter's outputs besides its markdown: claim lines and
the text of figures and diagrams. The code is the English edition's; transformer_lib/claims.py and
transformer_lib/figure_text.py translate at run time from checks/zh/claims.toml and checks/zh/figures.toml.

This module finds the strings that need an entry, and says what counts as English a learner would read:

* `english_sentences(text)`: the runs of two or more English words left in a text (the definition is at
  `ENGLISH_WORD`); a test fails on any in a rendered Chinese chapter;
* `chapter_keys(chapter)`: every string literal or f-string of a chapter's code that reaches a claim
  (`claim`, `claim_between`) or a figure's text (a title, an axis label, a legend, a text or annotation),
  as its catalogue key (an f-string's replacement fields written {0}, {1}, ...);
* `diagram_texts()`: every text each diagram of transformer_lib/diagrams draws.

    python tests/notebook_text.py status     # keys without a Chinese entry, and orphaned entries
    python tests/notebook_text.py scaffold   # add a blank entry for each to the catalogues
    python tests/notebook_text.py prune      # delete the orphans (once their translation is carried over)
"""

from __future__ import annotations

import ast
import inspect
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from transformer_lib import language  # noqa: E402

# -- what counts as English a learner would read --------------------------------------------------------
#
# An English word is a run of two or more ASCII letters that is not code, a name or a unit (a hyphen
# separates two words: fine-tuning is two, top-k is one, GPT-2 none):
#   * not touching a character that makes it code: _ . ( [ { = / \ ^ ` # < > or a digit (d_model, x.view,
#     transpose(1, 2), GPT-2, 124M, <pad>);
#   * not all capitals (an acronym or a name: BERT, GPU, CLS), nor a word with a capital inside (LayerNorm,
#     PyTorch), nor one of KEPT (terms Chinese technical text keeps in English) or UNITS;
#   * not inside $...$ (mathematics), `...` (code) or quotes ('...', "...", “...”, ‘...’, 「...」, 『...』): a
#     quoted word is data, the token or sentence a model reads or writes.
# An English sentence is two or more English words in a row with only spaces or a hyphen between them:
# punctuation, a symbol, a line break or a Chinese character ends the run.
KEPT = {"softmax", "token", "tokens", "Transformer", "Transformers", "logits", "logit", "argmax", "et", "al",
        "nanoGPT", "word2vec", "tanh", "sin", "cos", "exp", "log", "max", "min", "mean", "sum", "std", "ln",
        "vs", "top", "Swin", "Adam", "AdamW", "Colab", "numpy", "torch", "sklearn", "matplotlib",
        "bos", "eos", "pad", "unk"}  # the special tokens' names
UNITS = {"ms", "us", "ns", "µs", "MB", "GB", "KB", "kB", "MiB", "GiB", "nats", "bit", "bits", "dB", "px", "it"}
NOT_TEXT = re.compile(r"\$[^$]*\$|`[^`]*`|“[^”]*”|‘[^’]*’|「[^」]*」|『[^』]*』|(?<![A-Za-z])'[^'\n]*'(?![A-Za-z])"
                      r"|\"[^\"\n]*\"")
ENGLISH_WORD = re.compile(r"(?<![A-Za-z0-9_.(\[{=/\\^`#<>])[A-Za-z]{2,}(?![A-Za-z0-9_.(\[{=/\\^`#<>])")
SEPARATOR = re.compile(r"[ \t]+|[ \t]*-[ \t]*")


def _is_word(word: str) -> bool:
    if word in KEPT or word in UNITS:
        return False
    if word.isupper() or any(c.isupper() for c in word[1:]):
        return False
    return True


def english_words(text: str) -> list[tuple[int, int, str]]:
    """Every English word of `text` (start, end, word), with mathematics, code and quotes taken out."""
    cleaned = NOT_TEXT.sub(lambda m: "\x00" * len(m.group(0)), text)
    return [(m.start(), m.end(), m.group(0)) for m in ENGLISH_WORD.finditer(cleaned) if _is_word(m.group(0))]


def english_sentences(text: str) -> list[str]:
    """The runs of two or more English words in `text`, as they stand in it."""
    runs, first, count, end = [], None, 0, None
    for start, stop, _ in english_words(text):
        if first is not None and SEPARATOR.fullmatch(text[end:start] or ""):
            count += 1
        else:
            if count >= 2:
                runs.append(text[first:end])
            first, count = start, 1
        end = stop
    if count >= 2:
        runs.append(text[first:end])
    return runs


# -- the strings a chapter's code sends to a claim or a figure --------------------------------------------

CHAPTERS = sorted(p.name for p in (ROOT / "solutions").iterdir() if re.match(r"\d\d_", p.name))
CLAIM_ARGUMENT = {"claim": (1, "statement"), "claim_between": (3, "statement")}
# Figure calls: the positional index of their text (None: keywords only) and the keywords that hold text.
FIGURE_ARGUMENT = {
    "set_title": (0, "label"), "title": (0, "label"), "suptitle": (0, "t"), "set_xlabel": (0, "xlabel"),
    "set_ylabel": (0, "ylabel"), "xlabel": (0, "xlabel"), "ylabel": (0, "ylabel"), "supxlabel": (0, "t"),
    "supylabel": (0, "t"), "text": (2, "s"), "figtext": (2, "s"), "annotate": (0, "text"), "set_label": (0, "s"),
    "set_text": (0, "s"),
    "draw_mask": (4, "title"),  # transformer_lib/diagrams/ch06.py: a chapter's own title for the diagram
}
TEXT_KEYWORDS = ("label", "title", "xlabel", "ylabel", "labels")  # plot(label=...), ax.set(xlabel=...), legend(title=...)


def template(node: ast.AST) -> list[str]:
    """The catalogue keys a string expression can produce: a literal as it is (braces doubled), an
    f-string with {0}, {1}, ... for its fields; both branches of `a if c else b`; '+' joined. Others: []."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value.replace("{", "{{").replace("}", "}}")]
    if isinstance(node, ast.JoinedStr):
        parts, index = [], 0
        for value in node.values:
            if isinstance(value, ast.Constant):
                parts.append(str(value.value).replace("{", "{{").replace("}", "}}"))
            else:
                parts.append(f"{{{index}}}")
                index += 1
        return ["".join(parts)]
    if isinstance(node, ast.IfExp):
        return template(node.body) + template(node.orelse)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = template(node.left), template(node.right)
        if len(left) == 1 and len(right) == 1:
            return [_renumber(left[0] + right[0])]
    if isinstance(node, (ast.List, ast.Tuple)):
        return [key for element in node.elts for key in template(element)]
    if isinstance(node, (ast.ListComp, ast.GeneratorExp)):  # [f"target {t}" for t in ...]
        return template(node.elt)
    return []


def _renumber(key: str) -> str:
    counter = iter(range(1000))
    return re.sub(r"(?<!\{)\{\d+\}(?!\})", lambda m: f"{{{next(counter)}}}", key)


def _call_name(node: ast.Call) -> str | None:
    return getattr(node.func, "attr", getattr(node.func, "id", None))


def _argument(node: ast.Call, index: int | None, keyword: str) -> ast.AST | None:
    for kw in node.keywords:
        if kw.arg == keyword:
            return kw.value
    if index is not None and len(node.args) > index and not any(isinstance(a, ast.Starred) for a in node.args[:index + 1]):
        return node.args[index]
    return None


def code_keys(source: str) -> dict[str, list[str]]:
    """{"claims": [...], "figures": [...]}: the keys of `source`'s strings, in source order, without repeats."""
    found = {"claims": [], "figures": []}
    for node in sorted((n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Call)),
                       key=lambda n: (n.lineno, n.col_offset)):
        name = _call_name(node)
        if name in CLAIM_ARGUMENT:
            argument = _argument(node, *CLAIM_ARGUMENT[name])
            found["claims"] += template(argument) if argument is not None else []
            continue
        expressions = []
        if name in FIGURE_ARGUMENT:
            expressions.append(_argument(node, *FIGURE_ARGUMENT[name]))
        if name == "legend" and node.args and isinstance(node.args[-1], (ast.List, ast.Tuple)):
            expressions.append(node.args[-1])
        if name in ("set_xticklabels", "set_yticklabels") and node.args:
            expressions.append(node.args[0])
        if name in ("set_xticks", "set_yticks", "xticks", "yticks") and len(node.args) > 1:
            expressions.append(node.args[1])
        expressions += [kw.value for kw in node.keywords if kw.arg in TEXT_KEYWORDS]
        for expression in expressions:
            if expression is not None:
                found["figures"] += template(expression)
    for kind in found:
        found[kind] = [k for k in dict.fromkeys(found[kind]) if needs_entry(k)]
    return found


def needs_entry(key: str) -> bool:
    """Whether a key holds an English word (its placeholders aside)."""
    return bool(english_words(re.sub(r"\{\d+\}", " ", key)))


def chapter_source(chapter: str) -> str:
    """A chapter's code (its jupytext .py; markdown cells are comments there), magics taken out."""
    text = (ROOT / "solutions" / chapter / f"{chapter}.py").read_text(encoding="utf-8")
    return "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in text.splitlines())


def chapter_keys(chapter: str) -> dict[str, list[str]]:
    return code_keys(chapter_source(chapter))


# -- the diagrams ------------------------------------------------------------------------------------------

def diagram_calls():
    """(module name, function name, a call that draws it): every draw_* of transformer_lib/diagrams, with
    the arguments a chapter gives where it needs some."""
    import importlib

    import matplotlib.pyplot as plt
    import torch

    special = {
        "draw_mask": lambda f: f(plt.subplots()[1], torch.ones(3, 3, dtype=torch.bool).tril(), ["a", "b", "c"],
                                 ["a", "b", "c"], "causal mask"),
        "draw_text_to_vectors": lambda f: f(" lowest newer", [" low", "est", " new", "er"], [7, 5, 8, 2]),
        "draw_interaction_patterns": lambda f: f({"local": torch.ones(6, 6, dtype=torch.bool).tril().triu(-1),
                                                  "global": torch.ones(6, 6, dtype=torch.bool)}),
        "draw_relative_index": lambda f: f(_relative_index(2), 2),
    }
    calls = []
    for path in sorted((ROOT / "transformer_lib" / "diagrams").glob("ch*.py")):
        module = importlib.import_module(f"transformer_lib.diagrams.{path.stem}")
        for name, function in inspect.getmembers(module, inspect.isfunction):
            if name.startswith("draw_") and function.__module__ == module.__name__:
                calls.append((path.stem, name, (lambda f=function, n=name: special[n](f) if n in special else f())))
    return calls


def _relative_index(window: int):
    import torch

    coords = torch.stack(torch.meshgrid(torch.arange(window), torch.arange(window), indexing="ij")).flatten(1)
    relative = (coords[:, :, None] - coords[:, None, :]).permute(1, 2, 0) + (window - 1)
    return relative[..., 0] * (2 * window - 1) + relative[..., 1]


def drawn_texts(figure) -> list[str]:
    """Every visible text of a drawn figure, as it was drawn."""
    from matplotlib.text import Text

    figure.canvas.draw()
    return [t.get_text() for t in figure.findobj(Text) if t.get_visible() and t.get_text().strip()]


def diagram_texts() -> dict[str, list[str]]:
    """(module.function) -> its texts, drawn in the current language."""
    import matplotlib

    matplotlib.use("agg")
    import matplotlib.pyplot as plt

    texts = {}
    for module, name, call in diagram_calls():
        result = call()
        figures = {plt.figure(n) for n in plt.get_fignums()} if result is None else {getattr(result, "figure", result)}
        texts[f"{module}.{name}"] = [t for figure in figures for t in drawn_texts(figure)]
        plt.close("all")
    return texts


# -- the catalogues ----------------------------------------------------------------------------------------

FILES = {"claims": language.CLAIMS_CATALOGUE, "figures": language.FIGURES_CATALOGUE}


def expected_keys() -> dict[str, list[tuple[str, str]]]:
    """kind -> [(key, where)]: every key the chapters' code and the diagrams need, in order."""
    keys = {"claims": [], "figures": []}
    seen = {"claims": set(), "figures": set()}
    for chapter in CHAPTERS:
        for kind, found in chapter_keys(chapter).items():
            for key in found:
                if key not in seen[kind]:
                    seen[kind].add(key)
                    keys[kind].append((key, chapter))
    language.set_language(language.ENGLISH)
    try:
        for where, texts in diagram_texts().items():
            for text in texts:
                key = text.replace("{", "{{").replace("}", "}}")
                # A diagram's single words are often its example's tokens ("she", "ate"): data, left as they
                # are; its other texts need an entry when they hold an English sentence.
                if english_sentences(text) and key not in seen["figures"]:
                    seen["figures"].add(key)
                    keys["figures"].append((key, f"diagrams/{where}"))
    finally:
        language.set_language(None)
    return keys


def entries(kind: str) -> list[dict]:
    path = language.CATALOGUE_DIR / FILES[kind]
    return language.read_catalogue(path) if path.exists() else []


def _string(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def scaffold(kind: str, keys: list[tuple[str, str]]) -> int:
    """Rewrite the catalogue: its entries kept in place, a blank entry added for each key without one,
    grouped under the chapter (or diagram) that needs it."""
    path = language.CATALOGUE_DIR / FILES[kind]
    old = entries(kind)
    have = {e["en"] for e in old}
    new = [(k, w) for k, w in keys if k not in have]
    if not new:
        return 0
    text = path.read_text(encoding="utf-8") if path.exists() else (
        f"# The Chinese of the notebooks' {kind} ({'claim lines' if kind == 'claims' else 'figure and diagram texts'}).\n"
        "# Keyed by the English; an f-string's replacement fields are {0}, {1}, ... in order (literal braces\n"
        "# doubled), and the Chinese uses the same placeholders. See transformer_lib/language.py and\n"
        "# tests/notebook_text.py (python tests/notebook_text.py status | scaffold).\n")
    where = None
    for key, place in new:
        if place != where:
            text += f"\n# -- {place}\n"
            where = place
        text += f"\n[[text]]\nen = {_string(key)}\nzh = \"\"\n"
    path.write_text(text, encoding="utf-8")
    return len(new)


def missing(kind: str, keys: list[tuple[str, str]]) -> list[tuple[str, str]]:
    translated = {e["en"] for e in entries(kind) if e["zh"].strip()}
    return [(k, w) for k, w in keys if k not in translated]


HAND_SECTIONS = ("values ", "diagrams: the texts that depend")  # entries no static reading finds: kept


def orphans(kind: str, keys: list[tuple[str, str]], drawn: set[str] = frozenset()) -> list[str]:
    """Entries outside the hand-written sections that no key needs and no diagram draws (`drawn`, in
    English) any more (an English edit orphans its old entry): carry the translation over, then delete."""
    path = language.CATALOGUE_DIR / FILES[kind]
    wanted = {k for k, _ in keys} | {t.replace("{", "{{").replace("}", "}}") for t in drawn}
    found, section = [], ""
    lines = path.read_text(encoding="utf-8").splitlines() if path.exists() else []
    for line in lines:
        if line.startswith("# -- "):
            section = line[5:]
        elif line.startswith("en = ") and not section.startswith(HAND_SECTIONS):
            english = json.loads(line[5:])
            if english not in wanted:
                found.append(english)
    return found


def prune(kind: str, english: list[str]) -> int:
    """Delete the entries of `english` (orphans) from the catalogue, the rest of the file as it was."""
    path = language.CATALOGUE_DIR / FILES[kind]
    lines, out, i, gone = path.read_text(encoding="utf-8").split("\n"), [], 0, set(english)
    while i < len(lines):
        if lines[i] == "[[text]]" and i + 1 < len(lines) and lines[i + 1].startswith("en = ") \
                and json.loads(lines[i + 1][5:]) in gone:
            i += 3
            while out and i < len(lines) and not out[-1].strip() and not lines[i].strip():
                i += 1  # the blank line the entry stood between
            continue
        out.append(lines[i])
        i += 1
    path.write_text("\n".join(out), encoding="utf-8")
    return len(gone)


def main(argv: list[str]) -> int:
    command = argv[0] if argv else "status"
    keys = expected_keys()
    if command == "scaffold":
        for kind in FILES:
            print(f"{FILES[kind]}: {scaffold(kind, keys[kind])} entries added")
        return 0
    bad = 0
    language.set_language(language.ENGLISH)
    try:
        drawn = {t for texts in diagram_texts().values() for t in texts}
    finally:
        language.set_language(None)
    if command == "prune":
        for kind in FILES:
            print(f"{FILES[kind]}: {prune(kind, orphans(kind, keys[kind], drawn if kind == 'figures' else set()))} "
                  "orphans deleted")
        return 0
    for kind in FILES:
        left = missing(kind, keys[kind])
        bad += len(left)
        print(f"{FILES[kind]}: {len(keys[kind])} keys, {len(left)} without Chinese")
        for key, where in left:
            print(f"  {where}: {key!r}")
        for english in orphans(kind, keys[kind], drawn if kind == "figures" else set()):
            print(f"  orphan (no chapter or diagram says this any more): {english!r}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))


# -- a rendered Chinese chapter ----------------------------------------------------------------------------

def read_log(path: Path) -> list[dict]:
    """The texts transformer_lib/figure_text.py recorded (COURSE_TEXT_LOG): {"kind": "figure"|"claim", "text"}."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def english_left(records: list[dict]) -> list[str]:
    """'kind: text  <- the English found', once per distinct text with English a learner would read."""
    found = {}
    for record in records:
        runs = english_sentences(record["text"])
        if runs:
            found.setdefault((record["kind"], record["text"]), runs)
    return [f"{kind}: {text!r}  <- {', '.join(runs)}" for (kind, text), runs in found.items()]


# The lines transformer_lib/checks/core.py prints in a notebook (a tick, a cross or a dot line aside).
PRINTED = ("using your `{name}`", "your `{name}` does not pass its check yet: using the reference",
           "Exercises passing: {passed} of {total}")


def nbval_sanitizer(path: Path) -> Path:
    """An nbval sanitize file for running an English solution notebook in Chinese: each line the checks
    print (a tick, cross or dot line, 'using your ...', the summary) becomes a placeholder, the same in both
    languages and different for each kind of line (a cross never matches a tick; the function's name and the
    counts stay in it), so nbval still compares every other output digit for digit. The Chinese of each
    line comes from checks/zh/core.toml."""
    sections = []
    # One placeholder per mark, so a tick in the stored output still differs from a cross in this run.
    for i, mark in enumerate(("\u2713", "\u2717", "\u00b7")):
        sections += [f"[mark {i}]", f"regex: (?m)^( *){mark} .*$", rf"replace: \1<a check line marked {mark}>", ""]
    core = {e["en"]: e["zh"] for e in language.read_catalogue(language.CATALOGUE_DIR / "core.toml")}
    for i, english in enumerate(PRINTED):
        for side, text in (("en", english), ("zh", core.get(english, english))):
            parts, fields = re.split(r"\{[a-z_]+\}", text), re.findall(r"\{([a-z_]+)\}", text)
            pattern = "".join(re.escape(part) + (f"(?P<{fields[k]}>.*?)" if k < len(fields) else "")
                              for k, part in enumerate(parts))
            kept = " ".join(rf"\g<{name}>" for name in sorted(fields))  # the name, the counts: still compared
            sections += [f"[printed {i} {side}]", f"regex: (?m)^{pattern}$", f"replace: <printed line {i}: {kept}>", ""]
    path.write_text("\n".join(sections), encoding="utf-8")
    return path


def assert_rendered_in_chinese(chapter: str, log) -> None:
    records = read_log(log)
    assert any(r["kind"] == "figure" for r in records), f"{chapter}: no figure text was recorded in {log}"
    english = english_left(records)
    assert not english, (f"{chapter}, run in Chinese, shows English a learner would read (add entries to "
                         "transformer_lib/checks/zh/claims.toml or figures.toml):\n" + "\n".join(english))
