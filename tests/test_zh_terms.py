"""The Chinese edition writes each term one way: every Chinese text keeps to transformer_lib/checks/zh/terms.toml.

The texts: every chapter's twins (solutions/*/*.zh.toml), every check message catalogue
(transformer_lib/checks/zh/*.toml: the chapters', core.toml, grader.toml), README.zh.md and the Chinese
edition's start page chapters/zh/README.md. A term's
forbidden variants are looked for in the prose only (code, formulas, web addresses and the English column
of the glossaries are left out, and so is each place the term's `allow` names); each one found is named
with its file, line, key (the twin's cell id, the message's English) and the term to write instead.

Each rule is shown to work: it rejects every `bad` sentence of its entry and accepts every `good` one.
"""

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CATALOGUES = ROOT / "transformer_lib" / "checks" / "zh"
TERMS_FILE = CATALOGUES / "terms.toml"
TERMS = tomllib.loads(TERMS_FILE.read_text(encoding="utf-8"))["term"]


@dataclass
class Text:
    file: str      # relative to the repository root
    key: str       # the twin's cell id, the message's English, or "" (README)
    line: int      # the file's line on which the text starts (1-based)
    text: str
    kind: str      # "twin", "checks" or "readme"


@dataclass
class Found:
    text: Text
    offset: int
    variant: str
    term: dict

    def __str__(self) -> str:
        line = self.text.line + self.text.text.count("\n", 0, self.offset)
        start = self.text.text.rfind("\n", 0, self.offset) + 1
        end = self.text.text.find("\n", self.offset)
        context = self.text.text[max(start, self.offset - 30):end if end >= 0 else None][:80]
        key = f" [{self.text.key[:60]}]" if self.text.key else ""
        return (f"{self.text.file}:{line}{key}: “{self.variant}” is forbidden ({self.term['en']}: write "
                f"{self.term['zh']}) in …{context}…")


# -- the texts

_TWIN = re.compile(r"^id = \"(?P<id>[^\"]+)\"\nzh = '''\n(?P<zh>.*?)'''", re.M | re.S)
_MESSAGE = re.compile(r"^en = (?P<en>\".*\")\nzh = (?P<zh>\".*\")$", re.M)


def _line_of(raw: str, offset: int) -> int:
    return raw.count("\n", 0, offset) + 1


def twins(path: Path) -> list[Text]:
    raw = path.read_text(encoding="utf-8")
    found = [Text(str(path.relative_to(ROOT)), m["id"], _line_of(raw, m.start("zh")), m["zh"], "twin")
             for m in _TWIN.finditer(raw)]
    parsed = tomllib.loads(raw).get("cell", [])
    assert [(t.key, t.text) for t in found] == [(c["id"], c["zh"]) for c in parsed], (
        f"{path.name}: a twin is not written as id = \"…\" then zh = '''…''' (the layout translations.py writes)")
    return found


def messages(path: Path) -> list[Text]:
    raw = path.read_text(encoding="utf-8")
    found = []
    for m in _MESSAGE.finditer(raw):
        entry = tomllib.loads(f"en = {m['en']}\nzh = {m['zh']}")
        found.append(Text(str(path.relative_to(ROOT)), entry["en"], _line_of(raw, m.start("zh")), entry["zh"], "checks"))
    parsed = tomllib.loads(raw).get("text", [])
    assert [(t.key, t.text) for t in found] == [(e["en"], e["zh"]) for e in parsed], (
        f"{path.name}: an entry is not written as one line en = \"…\" then one line zh = \"…\" (as message_catalogue.py does)")
    return found


def chinese_texts() -> list[Text]:
    texts = []
    for path in sorted(ROOT.glob("solutions/*/*.zh.toml")):
        texts += twins(path)
    for path in sorted(CATALOGUES.glob("*.toml")):
        if path != TERMS_FILE:
            texts += messages(path)
    for readme in ("README.zh.md", "chapters/zh/README.md"):
        texts.append(Text(readme, "", 1, (ROOT / readme).read_text(encoding="utf-8"), "readme"))
    return texts


# -- what is read: the prose

_NOT_PROSE = [re.compile(p, re.M | re.S) for p in (
    r"^```.*?^```",                  # fenced code
    r"<code>.*?</code>",
    r"``.+?``",                     # inline code holding a backtick
    r"`[^`\n]+`",                   # inline code
    r"\$\$.+?\$\$",                 # display formulas
    r"\$[^$\n]+\$",                 # inline formulas
    r"https?://[^\s)>）]+",
    r"\]\([^)\s]*\)",               # a link's target
)]
_GLOSSARY_HEADER = re.compile(r"^\|\s*English\s*\|\s*中文\s*\|.*$", re.M)
_FIRST_CELL = re.compile(r"^\|[^|\n]*\|", re.M)


def _blank(text: str, start: int, end: int) -> str:
    return text[:start] + re.sub(r"[^\n]", " ", text[start:end]) + text[end:]


def prose(text: str) -> str:
    """`text` with everything that is not Chinese prose blanked out (same length, same lines)."""
    for pattern in _NOT_PROSE:
        for m in reversed(list(pattern.finditer(text))):
            text = _blank(text, m.start(), m.end())
    for header in _GLOSSARY_HEADER.finditer(text):
        end = text.find("\n\n", header.start())
        table_end = len(text) if end < 0 else end
        for cell in reversed(list(_FIRST_CELL.finditer(text, header.end(), table_end))):
            text = _blank(text, cell.start() + 1, cell.end() - 1)
    return text


def _patterns(term: dict) -> list[re.Pattern]:
    return ([re.compile(re.escape(v)) for v in term.get("forbid", [])]
            + [re.compile(p) for p in term.get("forbid_pattern", [])])


def violations(text: Text, terms: list[dict] = TERMS) -> list[Found]:
    readable = prose(text.text)
    found = []
    for term in terms:
        if term.get("where", "all") == "checks" and text.kind != "checks":
            continue
        seen = readable
        for allowed in term.get("allow", []):
            for m in reversed(list(re.finditer(allowed, seen))):
                seen = _blank(seen, m.start(), m.end())
        for pattern in _patterns(term):
            found += [Found(text, m.start(), text.text[m.start():m.end()], term) for m in pattern.finditer(seen)]
    return sorted(found, key=lambda f: (f.text.file, f.text.line, f.offset))


# -- the tests

def test_every_chinese_text_keeps_to_the_term_list():
    texts = chinese_texts()
    assert len({t.file for t in texts}) >= 12 + 14 + 2, "the twins, the catalogues and the READMEs were not all found"
    found = [str(f) for t in texts for f in violations(t)]
    assert not found, f"{len(found)} forbidden variants (transformer_lib/checks/zh/terms.toml):\n" + "\n".join(found)


def test_every_term_is_complete_and_its_patterns_compile():
    allowed_keys = {"en", "zh", "forbid", "forbid_pattern", "allow", "where", "bad", "good", "note"}
    for term in TERMS:
        assert {"en", "zh", "bad", "good"} <= set(term) <= allowed_keys, term.get("en", term)
        assert term.get("forbid") or term.get("forbid_pattern"), term["en"]
        assert term.get("where", "all") in ("all", "checks"), term["en"]
        assert term["bad"] and term["good"], term["en"]
        _patterns(term), [re.compile(p) for p in term.get("allow", [])]
    concepts = [t["en"] for t in TERMS]
    assert len(concepts) == len(set(concepts)), "a concept is listed twice"


@pytest.mark.parametrize("term", TERMS, ids=[t["en"][:40] for t in TERMS])
def test_each_rule_rejects_its_bad_sentences_and_accepts_its_good_ones(term):
    kind = "checks" if term.get("where") == "checks" else "twin"
    for sentence in term["bad"]:
        text = Text("solutions/00_example/00_example.zh.toml", "0123456789", 7, sentence, kind)
        found = violations(text, [term])
        assert found, f"{term['en']}: not caught: {sentence}"
        message = str(found[0])
        assert message.startswith("solutions/00_example/00_example.zh.toml:7 [0123456789]: “"), message
        assert f"“{found[0].variant}” is forbidden" in message and found[0].variant in sentence
    for sentence in term["good"]:
        found = violations(Text("x", "", 1, sentence, kind), [term])
        assert not found, f"{term['en']}: a right sentence was rejected: " + "; ".join(map(str, found))


def test_a_variant_is_named_on_its_own_line_in_code_and_formulas_it_is_not():
    twin = Text("solutions/05_add_norm_ffn/05_add_norm_ffn.zh.toml", "abcdef0123", 40,
                "## 2. 层归一化\n\n公式 $\\mathrm{LayerNorm}(x)$ 与 `nn.LayerNorm` 都是代码。\n每个子层后面接一个 LayerNorm。\n"
                "| English | 中文 | 含义 |\n|---|---|---|\n| layer normalisation (LayerNorm) | 层归一化 | 对每个词元归一化 |\n",
                "twin")
    found = violations(twin)
    assert [str(f).split(": ")[0] for f in found] == ["solutions/05_add_norm_ffn/05_add_norm_ffn.zh.toml:43 [abcdef0123]"]
    message = Text("transformer_lib/checks/zh/ch10.toml", "the targets are not shifted", 303, "目标没有错位", "checks")
    assert str(violations(message)[0]).startswith(
        "transformer_lib/checks/zh/ch10.toml:303 [the targets are not shifted]: “错位” is forbidden (shifted by one")
