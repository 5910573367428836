"""Feedback preprocessors: what a student's feedback page may show.

nbgrader's feedback shows each cell with its outputs. The grader's own pipeline adds, in order:

* ShortenTestTracebacks: a traceback through a test cell quotes the failing source lines,
  hidden tests included, so it shrinks to its last line.
* GraderVerdicts: a test cell shows the grader's verdict (from the independent check), never
  what ran in the notebook's kernel: text the learner's own code printed while a test cell ran
  (a `pre_run_cell` hook that prints the cell's source, say) never reaches the page.
* SafeOutputs: only the learner's answer cells keep their outputs, and only as text (stream and
  error text, which the HTML exporter escapes, and text/plain) or PNG/JPEG images; HTML,
  Markdown, JavaScript, SVG and LaTeX outputs are dropped. Outputs of the other cells are left
  out (they ran without the library's reference answers, so they say little). Markdown the
  learner wrote (any markdown cell that is not the release's own) is shown as escaped text.
* ScrubHidden: any remaining text that quotes a hidden test line or names a hidden case is
  replaced by "[hidden]".
* WrapVerdicts: the verdict lines are wrapped at 100 characters (after scrubbing, so a break
  never splits a secret before it is replaced).

A submission with a server time (autograder/received.json, on a class's hub) also gets a line under
the banner saying when the server received it against its due date (SafeOutputs.notice, written by
deploy/hub/schedule.py), and nbgrader's own "Late submission penalty" line when it was late; the
penalty is LatePenalty's, the chapter's late policy as nbgrader's late-submission plugin.

The course configuration also sets HTMLExporter.sanitize_html, so what is rendered as HTML is
sanitised a second time.
"""

from __future__ import annotations

import hashlib
import html
import math
import re
import textwrap
import unicodedata

from nbformat.notebooknode import NotebookNode
from nbgrader.plugins import LateSubmissionPlugin
from nbgrader.preprocessors import NbGraderPreprocessor
from traitlets import List, Unicode

# What a cell tagged skip-when-grading shows in the autograded notebook and the feedback
# (autograder/sandboxed_kernel.py writes it in place of running the cell).
SKIPPED_TEXT = ("[not run while grading: this cell trains a model or draws a demonstration, and no graded test "
                "depends on it (tag skip-when-grading). It runs as usual in your own lab.]\n")

# The page's banner, and the verdict of a test the grader has none for (a Chinese submission's page
# shows their twins from transformer_lib/checks/zh/grader.toml, set per job in its nbgrader config).
BANNER = ("**Feedback from the course's grader.** Each test cell shows the grader's verdict; answer cells keep "
          "their text output. Outputs of the other cells are not shown: the grader ran your notebook without "
          "the library's reference answers. Cells marked \"not run while grading\" (trainings no test depends on) "
          "were skipped.")
MISSING_VERDICT = "This test was not graded by the course's grader."

GRADING_KEY = "course_grading"  # cell metadata the grader writes into its autograded notebooks
TEXT_MIME = "text/plain"
IMAGE_MIME = ("image/png", "image/jpeg")
MAX_IMAGE_CHARS = 2 * 2**20


def _is_test(cell) -> bool:
    meta = cell.metadata.get("nbgrader", {})
    return cell.cell_type == "code" and bool(meta.get("grade")) and not meta.get("solution")


def _is_answer(cell) -> bool:
    return bool(cell.metadata.get("nbgrader", {}).get("solution"))


def markdown_digest(source: str) -> str:
    return hashlib.sha256(source.strip().encode()).hexdigest()


class LatePenalty(LateSubmissionPlugin):
    """The chapter's late policy (deploy/hub/schedule.csv) as nbgrader's late-submission plugin:
    nbgrader's AssignLatePenalties asks it during autograde, and the job again once the final scores
    are in (jobs.py), so the gradebook, grades.csv and the feedback page hold the same penalty."""

    policy = Unicode("none", help="none, cutoff, per-hour:N or per-day:N").tag(config=True)

    def late_submission_penalty(self, student_id: str, score: float, total_seconds_late: float):
        if total_seconds_late <= 0 or self.policy == "none":
            return None
        if self.policy == "cutoff":
            return score
        unit, _, points = self.policy.removeprefix("per-").partition(":")
        started = math.ceil(total_seconds_late / (3600 if unit == "hour" else 86400))
        return max(0.0, min(float(score), started * float(points)))  # never below 0 points


class ShortenTestTracebacks(NbGraderPreprocessor):
    def preprocess_cell(self, cell, resources, index):
        if _is_test(cell):
            for output in cell.get("outputs", []):
                if output.get("output_type") == "error":
                    output["traceback"] = [f"{output.get('ename', 'Error')}: {output.get('evalue', '')}"]
        return cell, resources


class GraderVerdicts(NbGraderPreprocessor):
    """A test cell's outputs become the grader's verdict for it."""

    missing = Unicode(MISSING_VERDICT).tag(config=True)

    def preprocess_cell(self, cell, resources, index):
        if _is_test(cell):
            verdict = cell.metadata.get(GRADING_KEY, {}).get("verdict") or self.missing
            cell.outputs = [NotebookNode(output_type="stream", name="stdout", text=str(verdict) + "\n")]
            cell.execution_count = None
        return cell, resources


class SafeOutputs(NbGraderPreprocessor):
    """Keep only text (and PNG/JPEG) outputs of answer cells; escape the learner's markdown."""

    trusted_markdown = List(Unicode(), help="sha256 of the release's own markdown cells (rendered as they are)").tag(config=True)
    banner = Unicode(BANNER).tag(config=True)
    notice = Unicode("", help="a line under the banner: when the server received the submission").tag(config=True)
    skipped_text = Unicode(SKIPPED_TEXT, help="what a skipped cell shows (the page's language)").tag(config=True)

    def preprocess(self, nb, resources):
        nb, resources = super().preprocess(nb, resources)
        if self.notice:
            nb.cells.insert(0, NotebookNode(cell_type="markdown", metadata={}, source=self.notice, id="grader-notice"))
        if self.banner:
            nb.cells.insert(0, NotebookNode(cell_type="markdown", metadata={}, source=self.banner, id="grader-banner"))
        return nb, resources

    def preprocess_cell(self, cell, resources, index):
        if cell.cell_type == "markdown":
            if markdown_digest(cell.source) not in set(self.trusted_markdown) and not cell.metadata.get("nbgrader", {}).get("locked"):
                cell.source = "<pre>" + html.escape(cell.source) + "</pre>"
                cell.attachments = {}
            return cell, resources
        if cell.cell_type == "raw":
            cell.source = ""
            return cell, resources
        if cell.cell_type != "code" or _is_test(cell):
            return cell, resources
        if not _is_answer(cell):  # only the grader's own word that a cell was skipped in grading mode
            cell.outputs = [{**o, "text": self.skipped_text} for o in cell.get("outputs", [])
                            if o.get("output_type") == "stream" and o.get("text") == SKIPPED_TEXT]
            return cell, resources
        kept = []
        for output in cell.get("outputs", []):
            kind = output.get("output_type")
            if kind in ("stream", "error"):
                kept.append(output)
            elif kind in ("display_data", "execute_result"):
                data = {k: v for k, v in output.get("data", {}).items()
                        if k == TEXT_MIME or (k in IMAGE_MIME and isinstance(v, str) and len(v) <= MAX_IMAGE_CHARS)}
                if data:
                    output["data"] = data
                    output["metadata"] = {}
                    kept.append(output)
        cell.outputs = kept
        return cell, resources


class ScrubHidden(NbGraderPreprocessor):
    """Replace quotes of hidden tests (lines, case names) anywhere on the page."""

    secrets = List(Unicode(), help="text that must not appear in feedback").tag(config=True)

    def _scrub(self, text):
        if not isinstance(text, str):
            return text
        for secret in sorted(set(self.secrets), key=len, reverse=True):
            if secret and secret in text:
                text = text.replace(secret, "[hidden]")
        return text

    def preprocess_cell(self, cell, resources, index):
        cell.source = self._scrub(cell.source)
        for output in cell.get("outputs", []):
            if "text" in output:
                output["text"] = self._scrub(output["text"])
            if "evalue" in output:
                output["evalue"] = self._scrub(output["evalue"])
            if "traceback" in output:
                output["traceback"] = [self._scrub(line) for line in output["traceback"]]
            for key, value in list(output.get("data", {}).items()):
                if isinstance(value, str) and not key.startswith("image/"):
                    output["data"][key] = self._scrub(value)
        return cell, resources


class WrapVerdicts(NbGraderPreprocessor):
    """A test cell's verdict is preformatted text: wrapped, a long diagnosis reads without
    scrolling sideways. Runs last, after ScrubHidden, so a line break never splits a secret
    before it is scrubbed."""

    width = 100

    def preprocess_cell(self, cell, resources, index):
        if _is_test(cell):
            for output in cell.get("outputs", []):
                if output.get("output_type") == "stream":
                    lines = str(output.get("text", "")).splitlines()
                    output["text"] = "\n".join(textwrap.fill(line, width=self._width(line), subsequent_indent="  ")
                                               for line in lines) + "\n"
        return cell, resources

    def _width(self, line: str) -> int:
        """A Chinese character takes two columns: a line that holds them wraps at half as many characters."""
        wide = sum(unicodedata.east_asian_width(ch) in "WF" for ch in line)
        return self.width // 2 if wide > len(line) // 4 else self.width


def page_in_language(page: str, language: str) -> str:
    """nbgrader's feedback template writes its own labels in English (the score lines, the table of
    contents, "Student's answer"); a Chinese submission's page gets them in Chinese, like the rest of it."""
    from transformer_lib.language import ENGLISH, say  # torch-free

    if language == ENGLISH:
        return page
    score = say("Score", language)
    page = re.sub(r"\(Score: ([-\d.]+) / ([-\d.]+)\)", lambda m: f"（{score}：{m[1]} / {m[2]}）", page)
    page = re.sub(r"(?m)^(\s*)Score: ([-\d.]+) / ([-\d.]+)", lambda m: f"{m[1]}{score}：{m[2]} / {m[3]}", page)
    for english, chinese in (("Test cell", say("Test cell", language)), ("Comment", say("Comment", language))):
        page = re.sub(rf"(<a href=\"#[^\"]*\">){english}(</a>)", lambda m, text=chinese: m[1] + text + m[2], page)
    page = page.replace("(Top)</a>", f"（{say('Top', language)}）</a>")
    # nbgrader's late line; its twin is here, not in grader.toml: no say() template asks for it
    page = re.sub(r"Late submission penalty \(Score: (-[\d.]+)\)", lambda m: f"迟交扣分（{score}：{m[1]}）", page)
    page = page.replace("<span class=\"nbgrader-label\">Student's answer</span>",
                        f"<span class=\"nbgrader-label\">{say('Your answer', language)}</span>")
    return page.replace("<b>Comments:</b>", f"<b>{say('Comments', language)}：</b>")
