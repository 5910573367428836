"""What the class got wrong: `make grade`'s class report, for the instructor only.

    autograder/class_report.html   per chapter and exercise: passed, each catalogued mistake by name,
                                   failed in a way no catalogue entry names (with the most common
                                   "what differs" lines), blank, hit a limit; a chart per chapter
    autograder/mistakes.csv        the same counts: chapter, exercise, outcome, mistake, students,
                                   which students, what differs

Built in the grader's process (course.py `grade`, after every job is merged) from the record of
what was graded (autograder/graded.json, regrade.py): each job's result holds `outcomes`, per test
its exercise and what the answer did (judging.outcome), so nothing is run again, and a regrade
replaces a student's entry: a student who fixed a mistake no longer counts for it. Both editions
count together: a mistake is keyed by its English catalogue name; the page is in the instructor's
language (COURSE_LANG=zh: Chinese labels and the catalogue's Chinese names). It shows mistake names,
counts, student logins and generic lines (a shape, a dtype, an exception's type), never a case, an
input or a hidden test line (judging.outcome keeps none; the kit's secrets are scrubbed there).
The page is one file: CSS inline, each chart a PNG drawn with matplotlib and embedded as base64.

The exercise the class found hardest comes first: the highest share of the students who tried it
(not blank) who did not pass it; ties by more failures, then the chapter's own order.
"""

from __future__ import annotations

import base64
import collections
import csv
import html
import io
import time
from pathlib import Path

OUTCOMES = ("passed", "mistake", "unnamed", "blank", "limit")
HTML_NAME, CSV_NAME = "class_report.html", "mistakes.csv"
CSV_LABEL = {"passed": "(passed)", "unnamed": "(no catalogued mistake)", "blank": "(blank)",
             "limit": "(time or memory limit)"}
LABELS = {
    "en": {"title": "What the class got wrong", "hardest": "Exercises, hardest first",
           "chapter": "Chapter", "exercise": "Exercise", "submissions": "Submissions", "passed": "Passed",
           "mistake": "Catalogued mistakes", "unnamed": "Failed, no catalogued mistake", "blank": "Blank",
           "limit": "Time or memory limit", "name": "What they did", "count": "Students", "who": "Who",
           "differs": "what differs", "summary": "{students} students, {submissions} graded submissions, "
           "built {when} from autograder/graded.json (no submission was run again).",
           "unanalysed": "Not counted (graded before the class report existed, or unreadable): {who}. "
           "`make grade FORCE=1` grades them again.",
           "note": "Counts are students: a student whose answer made two catalogued mistakes counts under "
           "both. Chart: M1, M2, ... are the exercise's mistakes in the table below it.",
           "for_instructors": "For instructors only: not part of the release or of any feedback page."},
    "zh": {"title": "全班错在哪里", "hardest": "各练习，最难的在前",
           "chapter": "章节", "exercise": "练习", "submissions": "提交数", "passed": "通过",
           "mistake": "目录中的错误", "unnamed": "未通过，目录中无此错误", "blank": "未作答",
           "limit": "超时或超出内存", "name": "学生的做法", "count": "学生数", "who": "学生",
           "differs": "差异", "summary": "{students} 名学生，{submissions} 份已评分的提交，"
           "{when} 由 autograder/graded.json 生成（没有重新运行任何提交）。",
           "unanalysed": "未计入（在班级报告出现之前评分，或无法读取）：{who}。`make grade FORCE=1` 会重新评分。",
           "note": "计数为学生人数：一个答案若犯了目录中的两个错误，两处都计入。图中 M1、M2……为其下表中该练习的错误。",
           "for_instructors": "仅供教师查看：不在发布内容中，也不在任何反馈页面中。"},
}
COLORS = {"passed": "#4c9a5b", "unnamed": "#8c8c8c", "blank": "#d9d9d9", "limit": "#c0392b"}
MISTAKE_COLORS = ["#e67e22", "#2e86c1", "#8e44ad", "#d4ac0d", "#17a589", "#cb4335", "#5d6d7e", "#a04000"]


class Row:
    """One exercise of one chapter: who did what."""

    def __init__(self, chapter: str, exercise: str, order: int):
        self.chapter, self.exercise, self.order = chapter, exercise, order
        self.students: dict[str, list[str]] = {o: [] for o in OUTCOMES}
        self.mistakes: dict[str, list[str]] = {}
        self.differs: collections.Counter = collections.Counter()
        self.limits: collections.Counter = collections.Counter()

    @property
    def submissions(self) -> int:
        return sum(len(v) for v in self.students.values())

    @property
    def failed(self) -> int:
        return sum(len(self.students[o]) for o in ("mistake", "unnamed", "limit"))

    def difficulty(self) -> tuple:
        tried = self.submissions - len(self.students["blank"])
        return (-(self.failed / tried) if tried else 0.0, -self.failed, self.chapter, self.order)


def rows_from(record: dict) -> tuple[list[Row], list[str]]:
    """The rows, hardest first, and the submissions that hold no outcomes ('student / chapter')."""
    rows: dict[tuple[str, str], Row] = {}
    unanalysed = []
    for student, chapters in sorted(record.get("submissions", {}).items()):
        for chapter, entry in sorted(chapters.items()):
            outcomes = (entry.get("result") or {}).get("outcomes")
            if not isinstance(outcomes, dict) or not outcomes:
                unanalysed.append(f"{student} / {chapter}")
                continue
            for grade_id, found in outcomes.items():
                if not isinstance(found, dict) or found.get("outcome") not in OUTCOMES:
                    continue
                exercise = str(found.get("exercise") or grade_id)
                row = rows.setdefault((chapter, exercise), Row(chapter, exercise, int(found.get("order", 0))))
                row.students[found["outcome"]].append(student)
                if found["outcome"] == "mistake":
                    for name in found.get("mistakes", []):
                        row.mistakes.setdefault(str(name), []).append(student)
                elif found["outcome"] == "unnamed":
                    row.differs.update(dict.fromkeys(map(str, found.get("differs", [])), 1))
                elif found["outcome"] == "limit":
                    row.limits.update(dict.fromkeys(map(str, found.get("differs", [])), 1))
    return sorted(rows.values(), key=Row.difficulty), unanalysed


def csv_rows(rows: list[Row]) -> list[list]:
    """mistakes.csv's rows: per exercise (hardest first) its named mistakes (most students first), then
    the unnamed failures, the limits, the blanks and the passes; only what at least one student did."""
    out = []
    for row in rows:
        for name, who in sorted(row.mistakes.items(), key=lambda kv: (-len(kv[1]), kv[0])):
            out.append([row.chapter, row.exercise, "mistake", name, len(who), " ".join(who), ""])
        for outcome, details in (("unnamed", row.differs), ("limit", row.limits), ("blank", None), ("passed", None)):
            who = row.students[outcome]
            if who:
                said = "; ".join(f"{line} ({n})" for line, n in details.most_common(5)) if details else ""
                out.append([row.chapter, row.exercise, outcome, CSV_LABEL[outcome], len(who), " ".join(who), said])
    return out


def _chart(chapter_rows: list[Row]) -> str:
    """One stacked horizontal bar per exercise: passed, each mistake (M1, M2, ...), unnamed, blank,
    limit. ASCII labels only (matplotlib's default font has no Chinese glyphs). A data: URI."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 0.5 + 0.45 * len(chapter_rows)), dpi=90)
    seen_labels = set()
    for y, row in enumerate(reversed(chapter_rows)):
        left = 0
        segments = [("passed", len(row.students["passed"]), COLORS["passed"])]
        names = sorted(row.mistakes, key=lambda n: (-len(row.mistakes[n]), n))
        segments += [(f"M{i + 1}", len(row.mistakes[n]), MISTAKE_COLORS[i % len(MISTAKE_COLORS)])
                     for i, n in enumerate(names)]
        segments += [(o, len(row.students[o]), COLORS[o]) for o in ("unnamed", "blank", "limit")]
        for label, width, color in segments:
            if not width:
                continue
            legend = label if label not in seen_labels else None
            seen_labels.add(label)
            ax.barh(y, width, left=left, color=color, edgecolor="white", label=legend)
            ax.text(left + width / 2, y, f"{label}: {width}" if label.startswith("M") else str(width),
                    ha="center", va="center", fontsize=8, color="black")
            left += width
    ax.set_yticks(range(len(chapter_rows)), [r.exercise for r in reversed(chapter_rows)])
    ax.set_xlabel("students")
    ax.spines[["top", "right"]].set_visible(False)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.25 if len(chapter_rows) < 4 else -0.12),
              ncol=6, fontsize=8, frameon=False)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", bbox_inches="tight")
    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def _page(rows: list[Row], unanalysed: list[str], students: int, submissions: int, language: str) -> str:
    from transformer_lib.language import say

    text = LABELS.get(language, LABELS["en"])
    language = language if language in LABELS else "en"
    e = html.escape

    def name(english: str) -> str:  # the catalogue's Chinese name on a Chinese page
        return say(english, language)

    def count(row: Row, outcome: str, mistake: str = "") -> str:
        n = len(row.mistakes[mistake]) if mistake else (
            sum(1 for _ in row.students["mistake"]) if outcome == "mistake" else len(row.students[outcome]))
        return (f'<td class="count" data-chapter="{e(row.chapter)}" data-exercise="{e(row.exercise)}" '
                f'data-outcome="{outcome}" data-mistake="{e(mistake)}">{n}</td>')

    parts = [f'<!DOCTYPE html><html lang="{language}"><head><meta charset="utf-8"><title>{e(text["title"])}</title>',
             "<style>body{font-family:system-ui,sans-serif;margin:2em;max-width:70em}table{border-collapse:collapse;"
             "margin:1em 0}td,th{border:1px solid #ccc;padding:.3em .6em;text-align:left;vertical-align:top}"
             "td.count{text-align:right}.who{color:#555;font-size:.9em}.differs{color:#555;font-size:.9em}"
             "img{max-width:100%}h2{margin-top:2em}</style></head><body>",
             f"<h1>{e(text['title'])}</h1><p><em>{e(text['for_instructors'])}</em></p>",
             f"<p>{e(text['summary'].format(students=students, submissions=submissions, when=time.strftime('%Y-%m-%d %H:%M')))}</p>"]
    if unanalysed:
        parts.append(f"<p>{e(text['unanalysed'].format(who=', '.join(unanalysed)))}</p>")
    parts.append(f"<p>{e(text['note'])}</p>")
    heads = ["chapter", "exercise", "submissions", "passed", "mistake", "unnamed", "blank", "limit"]
    parts.append(f'<h2>{e(text["hardest"])}</h2><table id="hardest"><tr>'
                 + "".join(f"<th>{e(text[h])}</th>" for h in heads) + "</tr>")
    for row in rows:
        parts.append(f"<tr><td>{e(row.chapter)}</td><td>{e(row.exercise)}</td><td class=\"total\">{row.submissions}</td>"
                     + "".join(count(row, o) for o in ("passed", "mistake", "unnamed", "blank", "limit")) + "</tr>")
    parts.append("</table>")
    chapters = list(dict.fromkeys(r.chapter for r in rows))  # the chapter with the hardest exercise first
    for chapter in chapters:
        mine = [r for r in rows if r.chapter == chapter]
        parts.append(f'<section class="chapter" data-chapter="{e(chapter)}"><h2>{e(text["chapter"])} {e(chapter)}</h2>'
                     f'<img alt="{e(chapter)}" src="{_chart(mine)}">')
        for row in mine:
            parts.append(f"<h3>{e(row.exercise)}</h3><table><tr><th></th><th>{e(text['name'])}</th>"
                         f"<th>{e(text['count'])}</th><th>{e(text['who'])}</th></tr>")
            names = sorted(row.mistakes, key=lambda n: (-len(row.mistakes[n]), n))
            for i, mistake in enumerate(names):
                parts.append(f"<tr><td>M{i + 1}</td><td>{e(name(mistake))}</td>{count(row, 'mistake', mistake)}"
                             f"<td class=\"who\">{e(' '.join(row.mistakes[mistake]))}</td></tr>")
            for outcome, details in (("unnamed", row.differs), ("limit", row.limits), ("blank", None), ("passed", None)):
                if not row.students[outcome]:
                    continue
                said = ""
                if details:
                    said = "<div class=\"differs\">" + e(text["differs"]) + ": " + e("; ".join(
                        f"{line} ({n})" for line, n in details.most_common(5))) + "</div>"
                parts.append(f"<tr><td></td><td>{e(text[outcome])}{said}</td>{count(row, outcome)}"
                             f"<td class=\"who\">{e(' '.join(row.students[outcome]))}</td></tr>")
            parts.append("</table>")
        parts.append("</section>")
    parts.append("</body></html>")
    return "\n".join(parts)


def write(folder: Path, record: dict, language: str = "en") -> list[list]:
    """class_report.html and mistakes.csv in `folder` (autograder/), from the record; mistakes.csv's rows."""
    folder = Path(folder)
    rows, unanalysed = rows_from(record)
    table = csv_rows(rows)
    with open(folder / CSV_NAME, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["chapter", "exercise", "outcome", "mistake", "students", "which_students", "differs"])
        writer.writerows(table)
    subs = record.get("submissions", {})
    page = _page(rows, unanalysed, len(subs), sum(len(c) for c in subs.values()), language)
    (folder / HTML_NAME).write_text(page, encoding="utf-8")
    return table


def main(argv=None) -> int:
    """Rebuild the report from autograder/graded.json without grading: `python autograder/class_report.py
    [--lang zh] [--root DIR]` (the language defaults to COURSE_LANG, then English)."""
    import argparse
    import json
    import os
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent)
    parser.add_argument("--lang", choices=sorted(LABELS), default=os.environ.get("COURSE_LANG", "en"))
    args = parser.parse_args(argv)
    folder = args.root / "autograder"
    record = json.loads((folder / "graded.json").read_text())
    table = write(folder, record, args.lang if args.lang in LABELS else "en")
    print(f"{folder / HTML_NAME}, {folder / CSV_NAME}: {len(table)} rows")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
