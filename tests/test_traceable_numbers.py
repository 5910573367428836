"""Every number in a chapter's prose can be traced (DESIGN.md: "Every number in learner-facing prose
is printed by the same notebook or cited with its source").

A *quoted number* is a number in a markdown cell with a decimal point (0.88), a thousands separator
(236,832), a percent sign (85%) or a times sign (4.4×). Bare integers are counts ("12 heads", "3 seeds")
and are exempt, as are section numbers (headings "### 1.3", "§2.1", "sections 3.1 and 3.3") and
version numbers (Python 3.11).

A quoted number is traced when, at the precision the prose gives it,

* a cell of the same notebook prints it (any output nbval compares, or a `✓` claim line of a cell
  whose other output it ignores: a trained number is quoted as its claim, not as one machine's
  digits), or the notebook's code sets it (a learning rate, a sequence length); or
* it is written as what the learner will see, "about 0.83 here" (*about*, *around*, *roughly*, ≈; 约,
  大约), and lies inside the range of a `claim_between(value, low, high, ...)` of the same notebook
  (transformer_lib/claims.py): one machine's digits, vouched for by the guarantee that holds on
  every machine (83% counts as 0.83); or
* the chapter's list of cited figures, `solutions/NN_name/cited_figures.toml`, names it:

      [[figure]]
      value  = "81.3%"                      # as the prose writes it
      source = "Liu et al. 2021 (Swin Transformer), Table 1: Swin-T top-1 on ImageNet-1k"
      cue    = "Liu et al."                 # the prose names the source in the same cell

      [[figure]]
      value    = "0.4223"
      source   = "worked example of exercise 3: softmax([1, 0, 1])[0] = e / (2e + 1)"
      computed = "math.e / (2 * math.e + 1)"   # arithmetic the test redoes

  A cited figure from a publication names its source next to the number (`cue` must occur in the
  markdown cell that quotes it); a worked example's arithmetic is recomputed here (`computed`).
  An entry no cell quotes any more is an error too: the list stays the chapter's real bibliography.
"""

from __future__ import annotations

import ast
import math
import re
import tomllib
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
SOLUTIONS = ROOT / "solutions"
CHAPTERS = sorted(p.name for p in SOLUTIONS.iterdir() if p.is_dir() and (p / f"{p.name}.ipynb").exists())

QUOTED = re.compile(r"(?<![\w.,])(\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+\.\d+|\d+)(\s?%|×)?(?![\w])")
# Numbers that name a place in a text, or a release, rather than quote a measurement.
NOT_A_QUANTITY = re.compile(
    r"(§\s?|\b[Ss]ections?\s|\bTables?\s|\bFig(?:ure|\.)?\s|\bEq(?:uation|\.)\s?|\bchapter\s|"
    r"\bPython\s|\bPyTorch\s|\bJupyterLab\s|\bnbgrader\s|\btransformers\s|\bv)"
    r"(?:\d+(?:\.\d+)*(?:,\s?|\s(?:and|or|to|–)\s|–))*$")
HEADING = re.compile(r"^#+\s+(?:\d+(?:\.\d+)*\.?\s)?", re.M)
# "about 0.83 here": the number one run shows, traced by a claim's range rather than by digits.
APPROXIMATE = re.compile(r"(?:\b(?:about|around|roughly)|≈|约为?|大约)\s*$")
OUTPUT_NUMBER = re.compile(r"(?<![\w.])\d+(?:[,_]\d{3})*(?:\.\d+)?(?:[eE][-+]?\d+)?")  # 60_000 in code


def quoted_numbers(markdown: str) -> list[tuple[str, str, float, int, bool, bool]]:
    """(as written, context, value, decimals, is_percent, is_approximate) for each quoted number of one cell."""
    found = []
    for line in markdown.splitlines():
        heading = HEADING.match(line)
        start = heading.end() if heading else 0  # "### 1.3 From counts ..." : 1.3 is a section number
        for m in QUOTED.finditer(line, start):
            digits, suffix = m.group(1), (m.group(2) or "").strip()
            if not ("." in digits or "," in digits or suffix):
                continue
            if NOT_A_QUANTITY.search(line[max(0, m.start() - 40):m.start()]):
                continue
            decimals = len(digits.split(".")[1]) if "." in digits else 0
            approximate = bool(APPROXIMATE.search(line[max(0, m.start() - 12):m.start()]))
            found.append((digits + suffix, line[max(0, m.start() - 60):m.end() + 30],
                          float(digits.replace(",", "")), decimals, suffix == "%", approximate))
    return found


def _ignores_output(cell) -> bool:
    return "nbval-ignore-output" in cell.metadata.get("tags", [])


def printed_numbers(nb) -> list[float]:
    """The numbers a reader can see the notebook produce: compared outputs, claim lines, code."""
    texts = []
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        texts.append(cell.source)
        for output in cell.get("outputs", []):
            pieces = [output.get("text", "")] + [output.get("data", {}).get(kind, "")
                                                 for kind in ("text/plain", "text/markdown", "text/html")]
            for piece in pieces:
                piece = "".join(piece) if isinstance(piece, list) else piece
                if _ignores_output(cell):  # this machine's digits: only the claims it checked count
                    piece = "\n".join(line for line in piece.splitlines() if line.lstrip().startswith("✓"))
                texts.append(piece)
    return [float(x.replace(",", "").replace("_", "")) for x in OUTPUT_NUMBER.findall("\n".join(texts))]


def claim_ranges(nb) -> tuple[list[tuple[float, float]], list[str]]:
    """The (low, high) of every `claim_between(value, low, high, ...)` in the notebook's code, and a problem
    for each whose bounds are not number literals (or None) a reader could check by eye."""
    ranges, problems = [], []
    for cell in nb.cells:
        if cell.cell_type != "code" or "claim_between" not in cell.source:
            continue
        try:
            tree = ast.parse(cell.source)
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None))
                    == "claim_between"):
                continue
            try:
                low, high = (ast.literal_eval(arg) for arg in node.args[1:3])
            except (ValueError, TypeError, SyntaxError):
                problems.append(f"claim_between needs number literals (or None) as its bounds: "
                                f"{ast.unparse(node)[:100]}")
                continue
            ranges.append((-math.inf if low is None else float(low), math.inf if high is None else float(high)))
    return ranges, problems


def inside_a_claim(value: float, percent: bool, ranges) -> bool:
    value = value / 100 if percent else value
    return any(low <= value <= high for low, high in ranges)


def matches(value: float, decimals: int, percent: bool, candidates) -> bool:
    tolerance = 0.5 * 10 ** -decimals + 1e-9
    for x in candidates:
        if abs(x - value) <= tolerance or (percent and abs(100 * x - value) <= tolerance):
            return True
    return False


def cited_figures(chapter: str) -> list[dict]:
    path = SOLUTIONS / chapter / "cited_figures.toml"
    if not path.exists():
        return []
    return tomllib.loads(path.read_text(encoding="utf-8")).get("figure", [])


def untraced(nb, cited: list[dict]) -> list[str]:
    """Messages for every quoted number that is neither printed nor cited, and every bad citation."""
    problems = []
    printed = printed_numbers(nb)
    ranges, problems = claim_ranges(nb)
    used = set()
    for cell in nb.cells:
        if cell.cell_type != "markdown":
            continue
        for written, context, value, decimals, percent, approximate in quoted_numbers(cell.source):
            entries = [i for i, f in enumerate(cited) if f["value"] == written]
            if entries:
                used.update(entries)
                for i in entries:
                    cue = cited[i].get("cue")
                    if cue and cue not in cell.source:
                        problems.append(f"{written}: cited from {cited[i]['source']!r}, but the cell quoting it "
                                        f"does not name {cue!r}: …{context}…")
                continue
            if approximate and inside_a_claim(value, percent, ranges):
                continue
            if not matches(value, decimals, percent, printed):
                why = (" (an 'about' number must lie inside the range of a claim_between of the notebook)"
                       if approximate else "")
                problems.append(f"{written} is neither printed by the notebook nor in cited_figures.toml{why}: "
                                f"…{context}…")
    for i, figure in enumerate(cited):
        where = f"cited_figures.toml entry {figure.get('value')!r}"
        if not figure.get("source"):
            problems.append(f"{where} has no source")
        if not (figure.get("cue") or figure.get("computed")):
            problems.append(f"{where} needs a cue (the source named in the prose) or a computed check")
        if "computed" in figure:
            digits = figure["value"].rstrip("%×").replace(",", "")
            decimals = len(digits.split(".")[1]) if "." in digits else 0
            result = eval(figure["computed"], {"math": math, "__builtins__": {}})  # noqa: S307 (our own file)
            if not matches(float(digits), decimals, figure["value"].endswith("%"), [float(result)]):
                problems.append(f"{where}: {figure['computed']} = {result}, not {figure['value']}")
        if i not in used:
            problems.append(f"{where} is quoted nowhere in the chapter: remove it")
    return problems


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_every_quoted_number_is_printed_or_cited(chapter):
    nb = nbformat.read(SOLUTIONS / chapter / f"{chapter}.ipynb", as_version=4)
    problems = untraced(nb, cited_figures(chapter))
    assert not problems, f"{chapter}: {len(problems)} untraceable number(s):\n" + "\n".join(problems)


# The checker itself, shown to fail where it should.

def _notebook(markdown: str, output: str = "", tags=()):
    nb = nbformat.v4.new_notebook()
    code = nbformat.v4.new_code_cell("x = compute()", metadata={"tags": list(tags)})
    code.outputs = [nbformat.v4.new_output("stream", name="stdout", text=output)]
    nb.cells = [nbformat.v4.new_markdown_cell(markdown), code]
    return nb


def test_a_number_printed_at_the_prose_precision_is_traced():
    assert untraced(_notebook("The loss falls to 0.64 and accuracy to 93%.", "loss 0.6412\naccuracy 0.9304"), []) == []


def test_a_number_the_notebook_never_prints_is_reported():
    problems = untraced(_notebook("The loss falls to 0.64.", "loss 0.6512"), [])
    assert len(problems) == 1 and problems[0].startswith("0.64 is neither printed")


def test_an_ignored_output_does_not_trace_a_number_but_its_claim_does():
    nb = _notebook("Accuracy is 0.93; at least 90% on any machine.", "accuracy 0.9304\n✓ at least 90% right",
                   tags=["nbval-ignore-output"])
    problems = untraced(nb, [])
    assert len(problems) == 1 and problems[0].startswith("0.93 is neither printed")


def _claimed(markdown: str, low="0.7", high="None"):
    nb = _notebook(markdown, "accuracy 0.8312\n✓ at least 70% right", tags=["nbval-ignore-output"])
    nb.cells[1].source = f"claim_between(accuracy, {low}, {high}, 'at least 70% right')"
    return nb


def test_an_about_number_inside_its_claims_range_is_traced():
    assert untraced(_claimed("Accuracy is about 0.83 here; at least 0.7 on every CPU we tried."), []) == []
    assert untraced(_claimed("准确率约 83%（每种 CPU 上都至少 70%）。"), []) == []


def test_an_about_number_outside_every_claims_range_is_reported():
    problems = untraced(_claimed("Accuracy is about 0.65 here; at least 0.7 on every CPU."), [])
    assert len(problems) == 1 and problems[0].startswith("0.65 is neither printed") and "claim_between" in problems[0]
    problems = untraced(_claimed("Accuracy is about 0.97 here.", low="0.7", high="0.95"), [])
    assert len(problems) == 1 and problems[0].startswith("0.97 is neither printed")


def test_a_number_without_about_is_not_traced_by_a_range():
    problems = untraced(_claimed("Accuracy is 0.83; at least 0.7 on every CPU."), [])
    assert len(problems) == 1 and problems[0].startswith("0.83 is neither printed")


def test_a_claim_range_must_be_literal():
    problems = untraced(_claimed("Accuracy is about 0.83 here.", low="floor"), [])
    assert any(p.startswith("claim_between needs number literals") for p in problems)


def test_counts_section_numbers_and_versions_are_exempt():
    nb = _notebook("### 1.3 Counts\n12 heads, 3 seeds, §2.1, sections 3.1 and 3.3, Python 3.11.", "")
    assert untraced(nb, []) == []


def test_cited_figures_need_their_source_named_and_a_use():
    nb = _notebook("Swin-T reaches 81.3% top-1 (Liu et al. 2021).", "")
    good = [{"value": "81.3%", "source": "Liu et al. 2021, Table 1", "cue": "Liu et al."}]
    assert untraced(nb, good) == []
    unnamed = [{"value": "81.3%", "source": "Liu et al. 2021, Table 1", "cue": "Dosovitskiy"}]
    assert "does not name 'Dosovitskiy'" in untraced(nb, unnamed)[0]
    stale = good + [{"value": "11.45%", "source": "Prince 2023", "cue": "Prince"}]
    assert untraced(nb, stale) == ["cited_figures.toml entry '11.45%' is quoted nowhere in the chapter: remove it"]


def test_worked_examples_are_recomputed():
    nb = _notebook("softmax([1, 0, 1]) is [0.4223, 0.1554, 0.4223].", "")
    right = [{"value": "0.4223", "source": "worked example", "computed": "math.e / (2 * math.e + 1)"},
             {"value": "0.1554", "source": "worked example", "computed": "1 / (2 * math.e + 1)"}]
    assert untraced(nb, right) == []
    wrong = [right[0], {"value": "0.1554", "source": "worked example", "computed": "1 / (2 * math.e)"}]
    assert untraced(nb, wrong)[0].startswith("cited_figures.toml entry '0.1554': 1 / (2 * math.e) = ")
