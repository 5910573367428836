"""The instructor's commands: release the chapters, grade every submission.

    python autograder/course.py release [CHAPTER ...]
    python autograder/course.py grade [--root DIR] [--cell-timeout S]

Both drive real nbgrader (generate_assignment, autograde, generate_feedback, export)
with the configuration in autograder/nbgrader_config.py. `grade` adds two things
nbgrader does not do:

* an independent check of every checker-based test: the learner's code runs again in a
  locked-down process (autograder/sandbox_runner.py) that only records outputs; they are
  judged here, in the grader's own process, so code that patches a checker inside the
  notebook's kernel gains nothing;
* a report that says why a cell scored zero when nbgrader would leave it blank (a deleted
  test cell, an unreadable notebook), instead of a silent gap.
"""

from __future__ import annotations

import argparse
import ast
import csv
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_ROOT = HERE.parent


# -- the course on disk ---------------------------------------------------------------


@dataclass
class Course:
    root: Path

    @property
    def solutions(self) -> Path:
        return self.root / "solutions"

    @property
    def chapters_dir(self) -> Path:
        return self.root / "chapters"

    @property
    def submitted(self) -> Path:
        return self.root / "autograder" / "submitted"

    @property
    def autograded(self) -> Path:
        return self.root / "autograder" / "autograded"

    @property
    def feedback(self) -> Path:
        return self.root / "autograder" / "feedback"

    @property
    def db_url(self) -> str:
        return "sqlite:///" + str(self.root / "autograder" / "gradebook.db")

    def chapters(self) -> list[str]:
        return sorted(p.name for p in self.solutions.iterdir() if p.is_dir() and (p / f"{p.name}.ipynb").exists())

    def students(self) -> list[str]:
        if not self.submitted.exists():
            return []
        return sorted(p.name for p in self.submitted.iterdir() if p.is_dir() and not p.name.startswith("."))

    def nbgrader(self, *args: str, cell_timeout: int | None = None, check: bool = True) -> subprocess.CompletedProcess:
        """Run one nbgrader command on this course, with the course's configuration."""
        env = dict(os.environ)
        env["JUPYTER_CONFIG_PATH"] = str(self.root / "autograder")
        # nbgrader calls alembic and jupyter by name: put this interpreter's bin first.
        env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
        env.setdefault("PYTHONHASHSEED", "0")
        if cell_timeout is not None:
            env["COURSE_CELL_TIMEOUT"] = str(cell_timeout)
        proc = subprocess.run(
            [sys.executable, "-m", "nbgrader", *args],
            cwd=self.root, env=env, capture_output=True, text=True,
        )
        if check and proc.returncode != 0:
            raise RuntimeError(f"nbgrader {' '.join(args)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")
        return proc


# -- release ---------------------------------------------------------------------------


class LearnerWorkFound(RuntimeError):
    """A release would overwrite a notebook a learner has worked in."""


def learner_work(notebook_path: Path) -> list[str]:
    """Why `notebook_path` looks like a learner's work in progress (empty when it is a clean release).

    A release has no outputs and every nbgrader cell still matches the checksum nbgrader
    stored when it generated the release; a learner's notebook has run cells or edited ones."""
    import nbformat
    from nbgrader.utils import compute_checksum

    if not notebook_path.exists():
        return []
    try:
        nb = nbformat.read(notebook_path, as_version=4)
    except Exception as exc:  # unreadable: not ours to overwrite either
        return [f"it cannot be read as a notebook ({type(exc).__name__})"]
    reasons = []
    if any(c.cell_type == "code" and (c.get("outputs") or c.get("execution_count")) for c in nb.cells):
        reasons.append("cells have been run")
    edited = [c.metadata["nbgrader"].get("grade_id", "?") for c in nb.cells
              if "checksum" in c.metadata.get("nbgrader", {}) and compute_checksum(c) != c.metadata["nbgrader"]["checksum"]]
    if edited:
        reasons.append(f"cells were edited ({', '.join(edited[:5])})")
    return reasons


def release(course: Course, chapters: list[str] | None = None, release_dir: str | None = None,
            force: bool = False) -> None:
    """Regenerate the learners' notebooks from the solutions with nbgrader generate_assignment.

    Refuses (unless `force`) to overwrite a notebook in the release folder that a learner has
    worked in: `make lab` serves that very folder, and their answers live nowhere else."""
    extra = [f"--CourseDirectory.release_directory={release_dir}"] if release_dir else []
    selected = chapters or course.chapters()
    if not force and release_dir is None:
        for chapter in selected:
            reasons = learner_work(course.chapters_dir / chapter / f"{chapter}.ipynb")
            if reasons:
                raise LearnerWorkFound(
                    f"chapters/{chapter}/{chapter}.ipynb holds a learner's work ({'; '.join(reasons)}). "
                    f"Release would overwrite it: move it somewhere safe first, or run `make release FORCE=1` "
                    f"to overwrite it anyway.")
    for chapter in selected:
        course.nbgrader("generate_assignment", chapter, "--force", *extra)


# -- what the tests of a chapter call ---------------------------------------------------


@dataclass
class CheckerCall:
    checker: str  # e.g. "check_softmax"
    function: str  # the expression passed to it, e.g. "softmax"
    hidden: bool


def checker_calls(test_source: str) -> list[CheckerCall]:
    """The `check_<name>(function, hidden=...)` calls of a test cell.

    Test cells of this course contain only such calls (tests/test_release.py holds
    every solution notebook to that), so these calls are the whole test.
    """
    calls = []
    for node in ast.walk(ast.parse(test_source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id.startswith("check_"):
            hidden = any(k.arg == "hidden" and isinstance(k.value, ast.Constant) and k.value.value is True for k in node.keywords)
            if node.args:
                calls.append(CheckerCall(node.func.id, ast.unparse(node.args[0]), hidden))
    return calls


def original_tests(course: Course, chapter: str) -> dict[str, str]:
    """grade_id -> source of every graded test cell, as the solutions have it (never the submission's)."""
    import nbformat

    nb = nbformat.read(course.solutions / chapter / f"{chapter}.ipynb", as_version=4)
    tests = {}
    for cell in nb.cells:
        meta = cell.metadata.get("nbgrader", {})
        if meta.get("grade") and not meta.get("solution") and cell.cell_type == "code":
            tests[meta["grade_id"]] = cell.source
    return tests


def answer_cells(course: Course, chapter: str) -> dict[str, str]:
    """test grade_id -> grade_id of the answer cell it tests (the last one before it)."""
    import nbformat

    nb = nbformat.read(course.solutions / chapter / f"{chapter}.ipynb", as_version=4)
    answers, last_answer = {}, None
    for cell in nb.cells:
        meta = cell.metadata.get("nbgrader", {})
        if meta.get("solution"):
            last_answer = meta["grade_id"]
        elif meta.get("grade") and last_answer is not None:
            answers[meta["grade_id"]] = last_answer
    return answers


# -- the independent check ---------------------------------------------------------------


def _limit_resources(cpu_seconds: int, memory_bytes: int):
    def apply():
        import resource

        resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds))
        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
        os.setsid()

    return apply


# Run as root (CI, containers): new network and mount namespaces; inside, the scratch
# folder is bound onto itself and everything else is remounted read-only, so the learner's
# code can write nowhere but its scratch folder (never the gradebook) and reach no network.
_READ_ONLY_ROOT = 'mount --bind "$0" "$0" && mount -o remount,bind,ro / && exec "$@"'


def _isolation(scratch: Path) -> list[str]:
    """The command prefix that isolates the sandbox, as far as this machine allows."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return []
    full = [unshare, "-n", "-m", "--propagation", "private", "sh", "-c", _READ_ONLY_ROOT, str(scratch)]
    if subprocess.run([*full, "true"], capture_output=True).returncode == 0:
        return full
    if subprocess.run([unshare, "-rn", "true"], capture_output=True).returncode == 0:
        return [unshare, "-rn"]  # an unprivileged user: no network, at least
    return []


def run_sandbox(notebook: Path, tests: dict[str, list[CheckerCall]], cell_timeout: int) -> tuple[dict, str]:
    """Run the notebook's code in a locked-down process; return (outputs per grade_id, problem)."""
    import torch

    with tempfile.TemporaryDirectory(prefix="course-sandbox-") as scratch:
        scratch = Path(scratch)
        plan = {
            "cell_timeout": cell_timeout,
            "tests": [
                {"grade_id": gid, "calls": [{"checker": c.checker, "function": c.function, "hidden": c.hidden} for c in calls]}
                for gid, calls in tests.items()
            ],
        }
        (scratch / "plan.json").write_text(json.dumps(plan))
        shutil.copy(notebook, scratch / "submission.ipynb")
        if os.getuid() == 0:  # the runner drops to `nobody`, whose only writable folder is this one
            for path in [scratch, *scratch.iterdir()]:
                os.chown(path, 65534, 65534)
        outputs_path = scratch / "outputs.pt"
        env = {
            "PATH": os.defpath,
            "HOME": str(scratch),
            "MPLBACKEND": "Agg",
            "MPLCONFIGDIR": str(scratch / ".mpl"),
            "PYTHONHASHSEED": "0",
            "OMP_NUM_THREADS": "1",
        }
        wall = cell_timeout * (len(tests) + 4) + 60
        try:
            proc = subprocess.run(
                [*_isolation(scratch), sys.executable, "-I", str(HERE / "sandbox_runner.py"),
                 "submission.ipynb", "plan.json", str(outputs_path)],
                cwd=scratch, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                timeout=wall, preexec_fn=_limit_resources(wall, 16 * 2**30),
            )
        except subprocess.TimeoutExpired:
            return {}, f"the independent check ran past its {wall} s limit"
        if not outputs_path.exists():
            tail = (proc.stderr or proc.stdout)[-400:].strip()
            return {}, f"the independent check produced no outputs (exit {proc.returncode}): {tail}"
        return torch.load(outputs_path, weights_only=True), ""


def judge_tests(tests: dict[str, list[CheckerCall]], outputs: dict, problem: str) -> dict[str, str]:
    """grade_id -> why it fails, for every test cell the independent check rejects."""
    from transformer_lib.checks import get_checker

    failures = {}
    for grade_id, calls in tests.items():
        recorded = outputs.get(grade_id)
        if recorded is None or len(recorded) != len(calls):
            failures[grade_id] = problem or "the independent check never reached this test"
            continue
        for call, outs in zip(calls, recorded):
            checker = get_checker(call.checker)
            if isinstance(outs, dict):  # an error before any case ran (missing name, timeout)
                failures[grade_id] = f"{checker.name}: {outs.get('__error__', 'no outputs')}"
                break
            verdict = checker.judge(outs, call.hidden)
            if not verdict.passed:
                failures[grade_id] = verdict.message
                break
    return failures


# -- grading --------------------------------------------------------------------------------


@dataclass
class Report:
    scores: dict = field(default_factory=dict)  # (student, chapter) -> (score, max)
    notes: dict = field(default_factory=dict)  # (student, chapter) -> [str]

    def note(self, student: str, chapter: str, text: str) -> None:
        self.notes.setdefault((student, chapter), []).append(text)


def _graded_cell_ids(notebook: Path) -> set[str]:
    import nbformat

    nb = nbformat.read(notebook, as_version=4)
    return {c.metadata.get("nbgrader", {}).get("grade_id") for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade")}


def _set_zero(gb, grade_id: str, chapter: str, student: str, why: str, answer_id: str | None) -> None:
    """Score a test cell 0, and say why in a comment on its answer cell, which the feedback shows."""
    grade = gb.find_grade(grade_id, chapter, chapter, student)
    grade.manual_score = 0.0
    grade.needs_manual_grade = False
    if answer_id is not None:
        comment = gb.find_comment(answer_id, chapter, chapter, student)
        comment.manual_comment = "\n".join(filter(None, [comment.manual_comment, f"{grade_id}: {why}"]))
    gb.db.commit()


def grade(course: Course, cell_timeout: int = 120, independent_check: bool = True) -> Report:
    from nbgrader.api import Gradebook, MissingEntry

    report = Report()
    chapters = course.chapters()
    # Record the assignments (cells, checksums) in the gradebook without touching chapters/.
    release(course, chapters, release_dir=os.path.join("autograder", ".release"))
    students = course.students()

    unreadable: dict[str, set[str]] = {}
    missing_cells: dict[tuple[str, str], set[str]] = {}
    with Gradebook(course.db_url, "transformer-course") as gb:
        for chapter in chapters:
            expected = {c.name for c in gb.find_notebook(chapter, chapter).grade_cells}
            for student in students:
                path = course.submitted / student / chapter / f"{chapter}.ipynb"
                if not path.exists():
                    if (course.submitted / student / chapter).exists():
                        report.note(student, chapter, f"no {chapter}.ipynb in the submission folder")
                    continue
                try:
                    present = _graded_cell_ids(path)
                except Exception as exc:
                    unreadable.setdefault(chapter, set()).add(student)
                    report.note(student, chapter, f"notebook could not be read ({type(exc).__name__}: {str(exc)[:120]}); scored 0, file left in place")
                    continue
                gone = expected - present
                if gone:
                    missing_cells[(student, chapter)] = gone
                    for gid in sorted(gone):
                        report.note(student, chapter, f"test cell '{gid}' was deleted: scored 0")

    for chapter in chapters:
        takers = [s for s in students if (course.submitted / s / chapter / f"{chapter}.ipynb").exists()]
        if not any(s not in unreadable.get(chapter, set()) for s in takers):
            continue
        exclude = sorted(unreadable.get(chapter, set()))
        extra = [f"--CourseDirectory.student_id_exclude={','.join(exclude)}"] if exclude else []
        course.nbgrader("autograde", chapter, "--create", "--force", *extra, cell_timeout=cell_timeout)

    with Gradebook(course.db_url, "transformer-course") as gb:
        answers = {chapter: answer_cells(course, chapter) for chapter in chapters}
        for (student, chapter), gone in missing_cells.items():
            for gid in gone:
                _set_zero(gb, gid, chapter, student, "this test cell was deleted from the submission: scored 0",
                          answers[chapter].get(gid))

        if independent_check:
            for chapter in chapters:
                tests = {gid: checker_calls(src) for gid, src in original_tests(course, chapter).items()}
                tests = {gid: calls for gid, calls in tests.items() if calls}
                for student in students:
                    autograded = course.autograded / student / chapter / f"{chapter}.ipynb"
                    if not autograded.exists() or not tests:
                        continue
                    outputs, problem = run_sandbox(autograded, tests, cell_timeout)
                    for gid, why in judge_tests(tests, outputs, problem).items():
                        grade = gb.find_grade(gid, chapter, chapter, student)
                        if (grade.score or 0) > 0:
                            note = f"passed inside the notebook but failed the independent check: {why}; scored 0"
                            _set_zero(gb, gid, chapter, student, note, answers[chapter].get(gid))
                            report.note(student, chapter, f"'{gid}' {note}")

        for chapter in chapters:
            max_score = gb.find_assignment(chapter).max_score
            for student in students:
                try:
                    sub = gb.find_submission(chapter, student)
                    report.scores[(student, chapter)] = (sub.score, max_score)
                except MissingEntry:
                    if (student, chapter) in report.notes:
                        report.scores[(student, chapter)] = (0.0, max_score)

    for chapter in chapters:
        if any(course.autograded.joinpath(s, chapter).exists() for s in students):
            course.nbgrader("generate_feedback", chapter, "--force")
    course.nbgrader("export", f"--to={course.root / 'autograder' / 'grades.csv'}")
    _write_report(course, report, chapters, students)
    return report


def _write_report(course: Course, report: Report, chapters: list[str], students: list[str]) -> None:
    path = course.root / "autograder" / "report.csv"
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["student", "chapter", "score", "max_score", "notes"])
        for student in students:
            for chapter in chapters:
                if (student, chapter) in report.scores:
                    score, max_score = report.scores[(student, chapter)]
                    writer.writerow([student, chapter, score, max_score, " | ".join(report.notes.get((student, chapter), []))])


def format_table(report: Report, chapters: list[str], students: list[str]) -> str:
    width = max([len("student")] + [len(s) for s in students]) + 2
    cols = [max(len(c), 9) + 2 for c in chapters]
    lines = ["student".ljust(width) + "".join(c.ljust(w) for c, w in zip(chapters, cols))]
    for s in students:
        cells = []
        for c, w in zip(chapters, cols):
            score = report.scores.get((s, c))
            text = "-" if score is None else f"{score[0]:g}/{score[1]:g}" + ("*" if (s, c) in report.notes else "")
            cells.append(text.ljust(w))
        lines.append(s.ljust(width) + "".join(cells))
    if report.notes:
        lines.append("")
        lines.append("* notes:")
        for (s, c), notes in sorted(report.notes.items()):
            for n in notes:
                lines.append(f"  {s} / {c}: {n}")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, default=DEFAULT_ROOT, help="course root (default: this repository)")
    sub = parser.add_subparsers(dest="command", required=True)
    rel = sub.add_parser("release", help="regenerate chapters/ from solutions/")
    rel.add_argument("chapters", nargs="*")
    rel.add_argument("--force", action="store_true", help="overwrite chapters a learner has worked in")
    gr = sub.add_parser("grade", help="autograde autograder/submitted/, write feedback, export grades")
    gr.add_argument("--cell-timeout", type=int, default=int(os.environ.get("COURSE_CELL_TIMEOUT", "120")))
    gr.add_argument("--no-independent-check", action="store_true", help="trust the in-notebook checks only")
    args = parser.parse_args(argv)
    course = Course(args.root.resolve())
    if args.command == "release":
        try:
            release(course, args.chapters or None, force=args.force)
        except LearnerWorkFound as exc:
            print(f"release refused: {exc}", file=sys.stderr)
            return 1
        print(f"released {', '.join(args.chapters or course.chapters())} into {course.chapters_dir}")
        return 0
    students = course.students()
    if not students:
        print(f"no submissions under {course.submitted}: put them in {course.submitted}/STUDENT/CHAPTER/CHAPTER.ipynb")
        return 0
    report = grade(course, args.cell_timeout, not args.no_independent_check)
    print(format_table(report, course.chapters(), students))
    print(f"\nfeedback: {course.feedback}/STUDENT/CHAPTER/*.html")
    print(f"grades:   {course.root / 'autograder' / 'grades.csv'} (nbgrader export), {course.root / 'autograder' / 'report.csv'} (with notes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
