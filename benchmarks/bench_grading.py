"""How fast `make grade` grades a class: N copies of a correct chapter-02 submission, graded with
one job and with two, on a scratch copy of the course (nothing in autograder/ is touched).

Each job is one submission of one chapter, fully isolated (autograder/jobs.py): nbgrader's run
of the notebook with the kernel in the sandbox, the independent check in the sandbox, judging
and feedback. The grader's process merges the results and is the one writer of the gradebook.
Goal: a speed-up of at least 1.8x with 2 jobs on the course's 2-core machine. The two runs must
give exactly the grades and notes of the serial run.

    .venv/bin/python benchmarks/bench_grading.py              # 10 students, 1 job then 2 jobs
    .venv/bin/python benchmarks/bench_grading.py --students 20 --jobs 1 2 4

The last line printed is one JSON object: {"students": N, "seconds": {"1": ..., "2": ...},
"speedup": ..., "students_per_minute": {...}, "identical": true}.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "autograder"))

import course as course_cli  # noqa: E402
from adversarial import build as adversarial  # noqa: E402

CHAPTER = adversarial.CHAPTER


def make_course(folder: Path, students: int) -> course_cli.Course:
    (folder / "autograder").mkdir(parents=True)
    for name in ["nbgrader_config.py", "course.py", "sandbox_runner.py", "feedback.py"]:
        shutil.copy(ROOT / "autograder" / name, folder / "autograder" / name)
    (folder / "solutions" / CHAPTER).mkdir(parents=True)
    shutil.copy(ROOT / "solutions" / CHAPTER / f"{CHAPTER}.ipynb", folder / "solutions" / CHAPTER)
    course = course_cli.Course(folder)
    template = folder / "template"
    adversarial.build(template, 9, folder, ["a_honest_correct"])
    notebook = template / "a_honest_correct" / CHAPTER / f"{CHAPTER}.ipynb"
    for i in range(students):
        target = course.submitted / f"student_{i:03d}" / CHAPTER
        target.mkdir(parents=True)
        shutil.copy(notebook, target / f"{CHAPTER}.ipynb")
    shutil.rmtree(template)
    return course


def grade(course: course_cli.Course, jobs: int, cell_timeout: int) -> tuple[float, dict]:
    for name in ["autograded", "feedback", ".release"]:
        shutil.rmtree(course.root / "autograder" / name, ignore_errors=True)
    (course.root / "autograder" / "gradebook.db").unlink(missing_ok=True)
    started = time.perf_counter()
    report = course_cli.grade(course, cell_timeout=cell_timeout, jobs=jobs)
    seconds = time.perf_counter() - started
    return seconds, {f"{s}/{c}": [report.scores[(s, c)], report.notes.get((s, c), [])] for s, c in report.scores}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--students", type=int, default=10)
    parser.add_argument("--jobs", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--cell-timeout", type=int, default=120)
    args = parser.parse_args(argv)
    seconds, results = {}, {}
    with tempfile.TemporaryDirectory(prefix="bench-grading-") as tmp:
        course = make_course(Path(tmp), args.students)
        # An untimed first grade builds the library copies (cached in the course) and warms the disk cache.
        grade(course, max(args.jobs), args.cell_timeout)
        for jobs in args.jobs:
            seconds[jobs], results[jobs] = grade(course, jobs, args.cell_timeout)
            print(f"{jobs} job(s): {args.students} students in {seconds[jobs]:.1f} s, "
                  f"{60 * args.students / seconds[jobs]:.1f} students per minute", flush=True)
    base, most = min(args.jobs), max(args.jobs)
    identical = all(results[j] == results[base] for j in args.jobs)
    right = all(tuple(score) == (8.0, 8.0) for score, _ in results[base].values())
    for jobs in sorted(args.jobs):
        if jobs != base:
            print(f"speed-up with {jobs} jobs: {seconds[base] / seconds[jobs]:.2f}x")
    print(f"results identical to the {base}-job run: {identical}; every student 8/8: {right}")
    summary = {"students": args.students, "seconds": {str(j): round(s, 1) for j, s in seconds.items()},
               "speedup": round(seconds[base] / seconds[most], 2),
               "students_per_minute": {str(j): round(60 * args.students / s, 1) for j, s in seconds.items()},
               "identical": identical, "all_full_marks": right}
    print(json.dumps(summary))
    return 0 if identical and right else 1


if __name__ == "__main__":
    sys.exit(main())
