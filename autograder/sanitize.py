"""Read a submission defensively and rebuild it from the release before anything runs it.

The learner owns the *code* of their answer cells and of any cell they add; everything nbgrader
relies on (which cells are graded, their ids, points, locks, schema versions, the test cells'
source, the kernel) comes from the release the grader generated itself. So a bad
`schema_version`, a duplicated or unknown `grade_id`, a test cell that was edited, converted to
markdown or deleted, odd cell types or metadata, or a notebook that is not a notebook at all
cannot make nbgrader fail for the class: they become notes, and only the affected tests can
lose points.

Also here: the static scans of the learner's code for the grading policy (an answer that
imports the reference implementation it is graded against, or names an API its exercise
forbids).
"""

from __future__ import annotations

import ast
import copy
import dataclasses
import json

from transformer_lib import safe_ast  # ast.parse is not thread-safe on 3.11; jobs run in threads

MAX_NOTEBOOK_BYTES = 20 * 2**20


@dataclasses.dataclass
class Template:
    """What the grader knows about one graded or answer cell (from its own release)."""

    grade_id: str
    cell_type: str
    source: str  # what nbgrader's gradebook holds for it (answer cells: the release's stub)
    metadata: dict  # the release's cell metadata (nbgrader block with the gradebook's checksum, tags, ...)
    kind: str  # "test", "answer" or "other" (locked markdown, tasks)
    also_untouched: tuple[str, ...] = ()  # other sources of an unchanged test cell (the release's, the solution's)


@dataclasses.dataclass
class Sanitized:
    notebook: dict | None  # nbformat 4 JSON, or None when the submission cannot be read
    notes: list[str]
    deleted_tests: list[str]
    edited_tests: list[str]
    learner_cells: list[int]  # indices of code cells whose source is the learner's (answers, added or changed cells)
    unreadable: str = ""
    language: str = "en"  # the edition the submission came from (metadata.course.language): its feedback's language


def _source(value) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return "".join(value)
    return None


def _grade_id(cell: dict) -> str | None:
    meta = cell.get("metadata")
    if not isinstance(meta, dict):
        return None
    nb = meta.get("nbgrader")
    if not isinstance(nb, dict):
        return None
    gid = nb.get("grade_id")
    return gid if isinstance(gid, str) and gid else None


def sanitize(raw: bytes, templates: list[Template], notebook_metadata: dict, release_code: set[str]) -> Sanitized:
    """Rebuild the submitted notebook `raw` on the release's skeleton (see the module docstring)."""
    if len(raw) > MAX_NOTEBOOK_BYTES:
        return Sanitized(None, [f"the notebook is larger than {MAX_NOTEBOOK_BYTES // 2**20} MiB: not graded, scored 0"],
                         [], [], [], "too large")
    try:
        data = json.loads(raw.decode("utf-8"))
        cells = data["cells"]
        if not isinstance(cells, list) or not all(isinstance(c, dict) for c in cells):
            raise ValueError("cells is not a list of cells")
        if not isinstance(data.get("nbformat"), int) or data["nbformat"] != 4:
            raise ValueError(f"nbformat {data.get('nbformat')!r} is not 4")
    except Exception as exc:
        why = f"{type(exc).__name__}: {str(exc)[:120]}"
        return Sanitized(None, [f"notebook could not be read ({why}); scored 0, file left in place"], [], [], [], why)

    by_id = {t.grade_id: t for t in templates}
    notes: list[str] = []
    seen: set[str] = set()
    edited: list[str] = []
    out_cells: list[dict] = []
    learner_cells: list[int] = []
    for index, cell in enumerate(cells):
        ctype = cell.get("cell_type")
        source = _source(cell.get("source", ""))
        gid = _grade_id(cell)
        if source is None or ctype not in ("code", "markdown", "raw"):
            if gid in by_id and by_id[gid].kind == "test":
                pass  # rebuilt from the release below
            else:
                notes.append(f"cell {index} is not a valid notebook cell: left out")
                continue
        source = source if source is not None else ""
        template = by_id.get(gid) if gid else None
        if gid and template is None:
            notes.append(f"cell {index} claims an nbgrader id '{gid}' the release does not have: run as an ordinary cell")
        if template is not None and gid in seen:
            notes.append(f"cell {index} repeats the nbgrader id '{gid}' (a copied cell): the first one is graded, "
                         "this one runs as an ordinary cell")
            template = None
        if template is None:
            if ctype == "code":
                learner_cells.append(len(out_cells))
                out_cells.append(_code(source))
            elif ctype in ("markdown", "raw"):
                out_cells.append({"cell_type": ctype, "metadata": {}, "source": source})
            continue
        seen.add(gid)
        _note_metadata_changes(cell, template, notes)
        if template.kind == "test":
            if ctype != "code" or (source != template.source and source not in template.also_untouched):
                edited.append(gid)
                how = "converted to " + str(ctype) if ctype != "code" else "edited"
                notes.append(f"test cell '{gid}' was {how}: the original test was graded")
            out_cells.append({**_code(template.source), "metadata": copy.deepcopy(template.metadata)})
        elif template.kind == "answer":
            if ctype != template.cell_type:
                notes.append(f"answer cell '{gid}' was converted to {ctype}: graded as {template.cell_type}")
            cell_out = {"cell_type": template.cell_type, "metadata": copy.deepcopy(template.metadata), "source": source}
            if template.cell_type == "code":
                cell_out.update(outputs=[], execution_count=None)
                learner_cells.append(len(out_cells))
            out_cells.append(cell_out)
        else:  # a locked cell or a task: the release's, whatever the submission holds
            cell_out = {"cell_type": template.cell_type, "metadata": copy.deepcopy(template.metadata),
                        "source": template.source}
            if template.cell_type == "code":
                cell_out.update(outputs=[], execution_count=None)
            out_cells.append(cell_out)

    deleted = [t.grade_id for t in templates if t.kind == "test" and t.grade_id not in seen]
    for gid in deleted:
        notes.append(f"test cell '{gid}' was deleted: scored 0")
    for t in templates:
        if t.kind == "answer" and t.grade_id not in seen:
            notes.append(f"answer cell '{t.grade_id}' was deleted: its test runs on whatever the notebook defines")
    # an ordinary cell whose code is the release's own is not the learner's
    learner_cells = [i for i in learner_cells
                     if _grade_id(out_cells[i]) is not None or out_cells[i]["source"].strip() not in release_code]
    for i, cell in enumerate(out_cells):
        cell["id"] = f"cell-{i}"
    notebook = {"nbformat": 4, "nbformat_minor": 5, "metadata": copy.deepcopy(notebook_metadata), "cells": out_cells}
    language = submission_language(data)
    if language != "en":
        notebook["metadata"]["course"] = {**notebook["metadata"].get("course", {}), "language": language}
    return Sanitized(notebook, notes, deleted, edited, learner_cells, language=language)


def submission_language(data: dict) -> str:
    """The edition a submission came from: "zh" for the Chinese release (its metadata.course.language),
    else "en". Only the feedback's language depends on it, so whatever a notebook claims is harmless."""
    meta = data.get("metadata")
    course = meta.get("course") if isinstance(meta, dict) else None
    language = course.get("language") if isinstance(course, dict) else None
    return "zh" if language == "zh" else "en"


def _code(source: str) -> dict:
    return {"cell_type": "code", "metadata": {}, "source": source, "outputs": [], "execution_count": None}


def _note_metadata_changes(cell: dict, template: Template, notes: list[str]) -> None:
    meta = cell.get("metadata") if isinstance(cell.get("metadata"), dict) else {}
    submitted = meta.get("nbgrader") if isinstance(meta.get("nbgrader"), dict) else {}
    expected = template.metadata.get("nbgrader", {})
    changed = [k for k in ("grade", "solution", "locked", "points", "schema_version", "task")
               if k in expected and submitted.get(k) != expected.get(k)]
    if changed:
        detail = ", ".join(f"{k} {submitted.get(k)!r}" for k in changed)
        notes.append(f"the nbgrader metadata of cell '{template.grade_id}' was changed ({detail}): the release's was used")


# -- static scans for the grading policy ----------------------------------------------------------


class _Names(ast.NodeVisitor):
    """Dotted names a piece of code refers to, with import aliases resolved."""

    def __init__(self):
        self.aliases: dict[str, str] = {}
        self.found: list[tuple[str, int]] = []  # (dotted name, line)
        self.attributes: list[tuple[str, int]] = []  # attribute names used on anything (method calls)

    def visit_Import(self, node):
        for a in node.names:
            if a.asname:
                self.aliases[a.asname] = a.name
            else:
                self.aliases[a.name.split(".")[0]] = a.name.split(".")[0]
            self.found.append((a.name, node.lineno))

    def visit_ImportFrom(self, node):
        if node.module and not node.level:
            for a in node.names:
                dotted = f"{node.module}.{a.name}"
                self.aliases[a.asname or a.name] = dotted
                self.found.append((dotted, node.lineno))

    def _dotted(self, node) -> str | None:
        parts = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        if isinstance(node, ast.Name):
            base = self.aliases.get(node.id, node.id)
            return ".".join([base, *reversed(parts)])
        return None

    def visit_Attribute(self, node):
        dotted = self._dotted(node)
        if dotted:
            self.found.append((dotted, node.lineno))
        self.attributes.append((node.attr, node.lineno))
        self.generic_visit(node)

    def visit_Name(self, node):
        if node.id in self.aliases:
            self.found.append((self.aliases[node.id], node.lineno))

    def visit_Call(self, node):
        # getattr(module, "name") with a constant name
        if isinstance(node.func, ast.Name) and node.func.id == "getattr" and len(node.args) >= 2 \
                and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str):
            base = self._dotted(node.args[0])
            if base:
                self.found.append((f"{base}.{node.args[1].value}", node.lineno))
        self.generic_visit(node)


def _scan(sources: list[str], release_lines: set[str] = frozenset()) -> _Names:
    """Names used by `sources`, keeping only those on lines the release does not have (so a learner
    who edits an instructor cell is judged on the lines they wrote, not on the instructor's)."""
    result = _Names()
    for src in sources:
        names = _Names()
        lines = src.splitlines()
        try:
            names.visit(safe_ast.parse(src))
            offsets = None
        except SyntaxError:
            # IPython magics and the like: scan what parses, line by line
            offsets = []
            for number, line in enumerate(lines, start=1):
                try:
                    tree = safe_ast.parse(line.strip())
                except SyntaxError:
                    continue
                before = len(names.found), len(names.attributes)
                names.visit(tree)
                offsets.append((before, number))
        def new_line(lineno: int) -> bool:
            text = lines[lineno - 1].strip() if 0 < lineno <= len(lines) else ""
            return text not in release_lines
        if offsets is not None:  # line numbers are 1 in every one-line parse: map them back
            found, attrs = [], []
            bounds = offsets + [((len(names.found), len(names.attributes)), None)]
            for (start, number), (end, _) in zip(bounds, bounds[1:]):
                found += [(d, number) for d, _ in names.found[start[0]:end[0]]]
                attrs += [(a, number) for a, _ in names.attributes[start[1]:end[1]]]
            names.found, names.attributes = found, attrs
        result.found += [(d, n) for d, n in names.found if new_line(n)]
        result.attributes += [(a, n) for a, n in names.attributes if new_line(n)]
    return result


def uses_reference(sources: list[str], references: list[str], checker_names: list[str],
                   release_lines: set[str] = frozenset()) -> list[str]:
    """Which of `references` (dotted names) the code imports or names, and any `check_x.reference`."""
    names = _scan(sources, release_lines)
    hits = sorted({d for d, _ in names.found for ref in references if d == ref or d.startswith(ref + ".")})
    for dotted, _ in names.found:
        head, _, attr = dotted.rpartition(".")
        if attr in ("reference", "fallback") and head.split(".")[-1] in checker_names:
            hits.append(f"{head}.{attr}")
    return sorted(set(hits))


def uses_forbidden(sources: list[str], forbidden: list[str], release_lines: set[str] = frozenset()) -> list[str]:
    """Which forbidden APIs (dotted names; "torch.Tensor.x" also matches any `.x(...)` method call)."""
    if not forbidden:
        return []
    names = _scan(sources, release_lines)
    hits = set()
    for api in forbidden:
        if api.startswith("aten."):
            continue
        if any(d == api for d, _ in names.found):
            hits.add(api)
        if api.startswith("torch.Tensor."):
            method = api.rsplit(".", 1)[1]
            if any(a == method for a, _ in names.attributes):
                hits.add(api)
    return sorted(hits)
