"""How fast `make grade` grades a class, on a scratch copy of the course (nothing in autograder/ is
touched). Two modes:

* chapter 02 only (the default): N copies of a correct submission, graded with one job and with
  two; the runs must give exactly the same grades and notes. Goal: a speed-up of at least 1.8x
  with 2 jobs on a 2-core machine.

      .venv/bin/python benchmarks/bench_grading.py                   # 10 students, 1 job then 2 jobs
      .venv/bin/python benchmarks/bench_grading.py --students 20 --jobs 1 2 4

* the whole course (`--course`): N students x all twelve chapters, two of every three handing in
  the solutions and one the untouched release, graded once with `--jobs` parallel jobs (or on a
  Dask LocalCluster with that many one-thread workers, `--scheduler local`). It prints:
  - the CPU time the whole machine spent (from /proc/stat: every process, sandboxes included) and
    the part `getrusage` sees (the grader and the children it reaped), and the wall time;
  - core-seconds per student: the machine's CPU time after the one-off set-up (the release and the
    chapters' kits), divided by N; and wall x cores per student, which counts idle cores too;
  - per chapter, the mean seconds of each phase of a job (nbgrader's run of the notebook with the
    outputs collected in the same kernel, its start-up, re-runs, feedback), for solutions and blanks;
  - the start-up costs alone: a sandboxed interpreter, the same importing torch and the checkers,
    and nbgrader's own process;
  - the projection for 300 students on 16 cores: set-up + 300 x core-seconds per student / 16.
  `--save FILE` writes every (student, chapter)'s score and notes; `--compare FILE` checks that a
  run gives exactly the saved ones (the grader before and after a change, on the same submissions).

      .venv/bin/python benchmarks/bench_grading.py --course --students 3 --jobs 2 --save /tmp/grades.json

  - a regrade (`--regrade FRACTION`, default 0.1): after grading the class from scratch, that
    fraction of the class's submissions (at least one; student-chapter pairs spread over the class)
    is resubmitted, a solution swapped for the release or the release for the solution, and the
    class graded again as `make grade` does after resubmissions: only those are graded. It prints
    the regrade's machine CPU and wall time as a fraction of the grading from scratch (goal: at most
    15%), and checks that exactly the resubmissions were graded and that every score is right.
    (A fraction of the submissions rather than of the students: with 3 students, one student is a
    third of the class.) `--regrade 0` skips it.

Both modes first time one plain run of the twelve solution notebooks (nbclient, one thread: what
benchmarks/notebook_times.py runs), in the same process, and print every cost also as a ratio to
it, so that figures compare across machines: the minutes depend on the machine, the ratios should
not. CPU costs are divided by the plain run's CPU seconds (getrusage: this process and the kernels
it reaped), wall times by its wall time. `--no-plain` skips it (the ratios are then null).

Goal for the whole course: at most 95 core-seconds per student (300 students x 12 chapters in 30
minutes on 16 cores). The machine must be otherwise idle: /proc/stat counts every process.

The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "autograder"))
sys.path.insert(0, str(ROOT / "tests"))

import course as course_cli  # noqa: E402
from adversarial import build as adversarial  # noqa: E402

sys.path.insert(0, str(ROOT / "benchmarks"))
import notebook_times  # noqa: E402

CHAPTER = adversarial.CHAPTER
TARGET_CORE_SECONDS = 95  # per student, whole course: 300 students in 30 minutes on 16 cores
TARGET_REGRADE = 0.15  # a regrade after 10% of the class resubmitted, as a fraction of grading from scratch


# -- the unit: one plain run of the twelve solution notebooks --------------------------------------


def plain_run(skip: bool = False) -> dict | None:
    """Wall and CPU seconds of one plain run of the twelve solution notebooks (notebook_times.main:
    nbclient, one kernel thread), measured here; every other cost is also printed as a ratio to it."""
    if skip:
        return None
    print("one plain run of the twelve solution notebooks (benchmarks/notebook_times.py):", flush=True)
    wall0, busy0, reaped0 = time.perf_counter(), busy_seconds(), reaped_seconds()
    notebook_times.main([])  # its own budgets: not this benchmark's business (it prints them)
    plain = {"wall_s": round(time.perf_counter() - wall0, 1), "cpu_s": round(reaped_seconds() - reaped0, 1),
             "machine_cpu_s": round(busy_seconds() - busy0, 1)}
    print(f"plain run: wall {plain['wall_s']} s, CPU {plain['cpu_s']} s (getrusage), "
          f"machine CPU {plain['machine_cpu_s']} s (/proc/stat)", flush=True)
    return plain


def ratio(value: float, unit: float | None) -> float | None:
    return float(f"{value / unit:.4g}") if unit else None  # four significant digits: start-up costs are tiny


def as_plain(value: float, unit: float | None) -> str:
    """' (0.42 plain runs)', or nothing without the unit."""
    return f" ({value / unit:.4g} plain runs)" if unit else ""


# -- chapter 02, 1 job against 2 ----------------------------------------------------------------


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


def grade(course: course_cli.Course, jobs: int, cell_timeout: int, scheduler=None, log=None):
    """Grade the class from scratch: no gradebook, feedback or record of an earlier run."""
    for name in ["autograded", "feedback", ".release"]:
        shutil.rmtree(course.root / "autograder" / name, ignore_errors=True)
    for name in ["gradebook.db", "graded.json"]:
        (course.root / "autograder" / name).unlink(missing_ok=True)
    return regrade(course, jobs, cell_timeout, scheduler=scheduler, log=log, regrade_all=True)


def regrade(course: course_cli.Course, jobs: int, cell_timeout: int, scheduler=None, log=None, regrade_all=False):
    """Grade the class as `make grade` does: only what is new or changed since the last run."""
    started = time.perf_counter()
    report = course_cli.grade(course, cell_timeout=cell_timeout, jobs=jobs, scheduler=scheduler, log=log,
                              regrade_all=regrade_all)
    seconds = time.perf_counter() - started
    results = {f"{s}/{c}": [list(report.scores[(s, c)]), report.notes.get((s, c), [])] for s, c in sorted(report.scores)}
    return seconds, results, report


def chapter_02(args) -> int:
    seconds, results = {}, {}
    plain = plain_run(args.no_plain)
    unit = plain and plain["wall_s"]
    max_points = course_cli._max_points(course_cli.Course(ROOT), CHAPTER)
    with tempfile.TemporaryDirectory(prefix="bench-grading-") as tmp:
        course = make_course(Path(tmp), args.students)
        # An untimed first grade builds the library copies (cached in the course) and warms the disk cache.
        grade(course, max(args.jobs), args.cell_timeout)
        for jobs in args.jobs:
            seconds[jobs], results[jobs], _ = grade(course, jobs, args.cell_timeout)
            print(f"{jobs} job(s): {args.students} students in {seconds[jobs]:.1f} s{as_plain(seconds[jobs], unit)}, "
                  f"{60 * args.students / seconds[jobs]:.1f} students per minute", flush=True)
    base, most = min(args.jobs), max(args.jobs)
    identical = all(results[j] == results[base] for j in args.jobs)
    right = all(tuple(score) == (max_points, max_points) for score, _ in results[base].values())
    for jobs in sorted(args.jobs):
        if jobs != base:
            print(f"speed-up with {jobs} jobs: {seconds[base] / seconds[jobs]:.2f}x")
    print(f"results identical to the {base}-job run: {identical}; every student {max_points:g}/{max_points:g}: {right}")
    summary = {"students": args.students, "seconds": {str(j): round(s, 1) for j, s in seconds.items()},
               "speedup": round(seconds[base] / seconds[most], 2),
               "students_per_minute": {str(j): round(60 * args.students / s, 1) for j, s in seconds.items()},
               "identical": identical, "all_full_marks": right, "plain_run": plain,
               "seconds_in_plain_runs": {str(j): ratio(s, unit) for j, s in seconds.items()}}
    print(json.dumps(summary))
    return 0 if identical and right else 1


# -- the whole course ------------------------------------------------------------------------------


def busy_seconds() -> float:
    """CPU seconds every process of the machine has used since boot (/proc/stat)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    user, nice, system, idle, iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def reaped_seconds() -> float:
    import resource

    me, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + children.ru_utime + children.ru_stime


def startup_costs(repeat: int = 3) -> dict:
    """Median seconds of: a sandboxed interpreter doing nothing; one importing torch and the
    checkers (what every sandboxed run pays first); nbgrader's own process importing nbgrader."""
    import isolation

    iso = isolation.detect()
    python = isolation.python_executable()

    def timed(argv) -> float:
        runs = []
        for _ in range(repeat):
            started = time.perf_counter()
            subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           cwd=tempfile.gettempdir())
            runs.append(time.perf_counter() - started)
        return round(statistics.median(runs), 2)

    import hiding

    library = str(hiding.library_root())  # bound read-only where it lives, as a job binds its copy
    with isolation.job_uid() as uid:
        spec = isolation.SandboxSpec(uid=uid, read_only=[(library, library)])
        bare = timed(isolation.wrap(spec, [python, "-I", "-c", "pass"], iso))
        imports = timed(isolation.wrap(spec, [python, "-I", "-c", "import torch, transformer_lib.checks"], iso))
    nbgrader = timed([python, "-c", "from nbgrader.apps import NbGraderAPI"])
    return {"sandboxed interpreter": bare, "sandboxed interpreter + torch + checkers": imports,
            "nbgrader's process": nbgrader}


def make_class(folder: Path, students: int) -> tuple[course_cli.Course, dict]:
    """Two of every three students hand in the solutions, one the untouched release."""
    from course_files import CHAPTERS, released, scratch_course, solution

    import nbformat

    course = scratch_course(folder)
    kinds = {}
    for i in range(students):
        name, notebook_of = (f"s{i:03d}_blank", released) if i % 3 == 2 else (f"s{i:03d}_solutions", solution)
        kinds[name] = "blank" if i % 3 == 2 else "solutions"
        for chapter in CHAPTERS:
            target = course.submitted / name / chapter
            target.mkdir(parents=True, exist_ok=True)
            nbformat.write(notebook_of(chapter), target / f"{chapter}.ipynb")
    return course, kinds


def whole_course(args) -> int:
    jobs = max(args.jobs)
    cores = len(os.sched_getaffinity(0))
    startup = startup_costs()
    print("start-up costs (median of 3, s):", json.dumps(startup), flush=True)
    plain = plain_run(args.no_plain)
    cpu_unit, wall_unit = (plain["cpu_s"], plain["wall_s"]) if plain else (None, None)
    if plain:
        print("start-up costs in plain runs:", json.dumps({k: ratio(v, wall_unit) for k, v in startup.items()}), flush=True)
    cluster = client = None
    if args.scheduler == "local":
        import distributed

        cluster = distributed.LocalCluster(n_workers=jobs, threads_per_worker=1, processes=True, dashboard_address=None)
        client = distributed.Client(cluster)
    marks = {}

    def log(text: str) -> None:
        if text.startswith("isolation:") and "setup" not in marks:
            marks["setup"] = (time.perf_counter(), busy_seconds())
        if args.verbose:
            print(text, flush=True)

    try:
        with tempfile.TemporaryDirectory(prefix="bench-course-") as tmp:
            course, kinds = make_class(Path(tmp), args.students)
            chapters = course.chapters()
            wall0, busy0, reaped0 = time.perf_counter(), busy_seconds(), reaped_seconds()
            seconds, results, report = grade(course, jobs, args.cell_timeout, scheduler=client, log=log)
            wall, busy, reaped = seconds, busy_seconds() - busy0, reaped_seconds() - reaped0
            if args.save:
                Path(args.save).write_text(json.dumps(results, indent=1, sort_keys=True))
            again = resubmit_and_regrade(course, kinds, args, jobs, client, log) if args.regrade > 0 else None
    finally:
        if client is not None:
            client.close()
            cluster.close()
    setup_wall, setup_busy = marks["setup"][0] - wall0, marks["setup"][1] - busy0
    per_student = (busy - setup_busy) / args.students
    wall_per_student = (wall - setup_wall) * cores / args.students
    projected = setup_wall + 300 * per_student / 16

    timings = getattr(report, "timings", {})  # (the grader before this benchmark's mode had no per-job timings)
    phases = sorted({p for t in timings.values() for p in t})
    print(f"\n{args.students} students x {len(chapters)} chapters, "
          f"{'a Dask LocalCluster of ' + str(jobs) + ' workers' if client else str(jobs) + ' jobs'} on {cores} cores")
    if plain:
        print(f"unit: one plain run of the twelve solution notebooks, {cpu_unit} CPU s, {wall_unit} s wall "
              f"(CPU costs are divided by the first, wall times by the second)")
    print(f"wall {wall:.1f} s{as_plain(wall, wall_unit)} (set-up {setup_wall:.1f} s{as_plain(setup_wall, wall_unit)}); "
          f"CPU of the whole machine {busy:.1f} core-s{as_plain(busy, cpu_unit)} "
          f"(set-up {setup_busy:.1f}{as_plain(setup_busy, cpu_unit)}); seen by getrusage {reaped:.1f} core-s{as_plain(reaped, cpu_unit)}")
    print(f"core-seconds per student: {per_student:.1f} (CPU){as_plain(per_student, cpu_unit)}; "
          f"{wall_per_student:.1f} (wall x cores, idle included){as_plain(wall_per_student, cpu_unit)}")
    print(f"projected for 300 students on 16 cores: {projected / 60:.1f} min{as_plain(projected, wall_unit)} "
          f"(goal {TARGET_CORE_SECONDS} core-s per student, 30 min)")
    if again:
        cpu_part, wall_part = again["machine_cpu_s"] / busy, again["wall_s"] / wall
        again.update(cpu_fraction=round(cpu_part, 3), wall_fraction=round(wall_part, 3),
                     goal_met=max(cpu_part, wall_part) <= TARGET_REGRADE,
                     machine_cpu_in_plain_runs=ratio(again["machine_cpu_s"], cpu_unit),
                     wall_in_plain_runs=ratio(again["wall_s"], wall_unit))
        print(f"regrade after {again['resubmitted']} of {again['submissions']} submissions were resubmitted "
              f"({again['resubmitted'] / again['submissions']:.0%}): wall {again['wall_s']:.1f} s"
              f"{as_plain(again['wall_s'], wall_unit)}, CPU of the whole machine {again['machine_cpu_s']:.1f} core-s"
              f"{as_plain(again['machine_cpu_s'], cpu_unit)}; {cpu_part:.1%} of the CPU and {wall_part:.1%} of the wall "
              f"time of grading from scratch (goal {TARGET_REGRADE:.0%}); graded exactly the resubmissions: "
              f"{again['graded_exactly_the_resubmissions']}; every score right: {again['right']}")
    print(f"\nmean seconds per job ({', '.join(phases)}; job = the whole job):")
    header = f"{'chapter':28s} {'kind':9s} " + " ".join(f"{p[:16]:>16s}" for p in phases) + f" {'job':>6s}"
    print(header)
    table = {}
    for chapter in chapters:
        for kind in ("solutions", "blank"):
            keys = [(s, chapter) for s in kinds if kinds[s] == kind and (s, chapter) in report.seconds]
            if not keys:
                continue
            row = {p: round(statistics.mean(timings[k].get(p, 0.0) for k in keys), 1) for p in phases}
            row["job"] = round(statistics.mean(report.seconds[k] for k in keys), 1)
            table[f"{chapter}/{kind}"] = row
            print(f"{chapter:28s} {kind:9s} " + " ".join(f"{row[p]:16.1f}" for p in phases) + f" {row['job']:6.1f}")
    totals = {kind: round(sum(r["job"] for k, r in table.items() if k.endswith(kind)), 1) for kind in ("solutions", "blank")}
    print(f"sum over chapters of the mean job: solutions {totals['solutions']} s, blank {totals['blank']} s")

    identical = None
    if args.compare:
        saved = json.loads(Path(args.compare).read_text())
        differ = sorted(k for k in set(saved) | set(results) if saved.get(k) != results.get(k))
        identical = not differ
        for key in differ[:10]:
            print(f"differs from {args.compare}: {key}: {saved.get(key)} -> {results.get(key)}")
    right = all(tuple(score) == (score[1], score[1]) if kinds[key.split("/")[0]] == "solutions" else score[0] == 0
                for key, (score, _) in results.items())
    print(f"solutions full marks and blanks 0: {right}; identical to {args.compare}: {identical}")
    summary = {"students": args.students, "chapters": len(chapters), "jobs": jobs,
               "scheduler": args.scheduler or "threads", "cores": cores, "wall_s": round(wall, 1),
               "setup_wall_s": round(setup_wall, 1), "machine_cpu_s": round(busy, 1), "getrusage_cpu_s": round(reaped, 1),
               "core_s_per_student": round(per_student, 1), "wall_core_s_per_student": round(wall_per_student, 1),
               "projected_300_on_16_min": round(projected / 60, 1), "goal_met": per_student <= TARGET_CORE_SECONDS,
               "startup_s": startup, "per_chapter": table, "right": right, "identical": identical,
               "plain_run": plain, "in_plain_runs": None if not plain else {
                   "wall": ratio(wall, wall_unit), "setup_wall": ratio(setup_wall, wall_unit),
                   "machine_cpu": ratio(busy, cpu_unit), "setup_machine_cpu": ratio(setup_busy, cpu_unit),
                   "getrusage_cpu": ratio(reaped, cpu_unit), "core_s_per_student": ratio(per_student, cpu_unit),
                   "wall_core_s_per_student": ratio(wall_per_student, cpu_unit),
                   "projected_300_on_16": ratio(projected, wall_unit),
                   "startup": {k: ratio(v, wall_unit) for k, v in startup.items()}},
               "regrade": again}
    regraded_right = again is None or (again["right"] and again["graded_exactly_the_resubmissions"])
    print(json.dumps(summary))
    return 0 if right and identical is not False and regraded_right else 1


def resubmit_and_regrade(course: course_cli.Course, kinds: dict, args, jobs: int, client, log) -> dict:
    """`args.regrade` of the class's submissions handed in again (a solution swapped for the release,
    or the release for the solution), then the class graded as `make grade` does: only those."""
    import math

    from course_files import released, solution

    import nbformat

    chapters = course.chapters()
    pairs = [(s, c) for s in sorted(kinds) for c in chapters]
    count = max(1, min(len(pairs), round(args.regrade * len(pairs))))
    step = len(pairs) / count
    chosen = sorted({pairs[math.floor(i * step)] for i in range(count)})
    for student, chapter in chosen:  # as nbgrader collect --update does: the folder replaced
        folder = course.submitted / student / chapter
        shutil.rmtree(folder)
        folder.mkdir(parents=True)
        nbformat.write((released if kinds[student] == "solutions" else solution)(chapter), folder / f"{chapter}.ipynb")
    wall0, busy0, reaped0 = time.perf_counter(), busy_seconds(), reaped_seconds()
    seconds, results, report = regrade(course, jobs, args.cell_timeout, scheduler=client, log=log)
    busy, reaped = busy_seconds() - busy0, reaped_seconds() - reaped0

    def expected_full(student: str, chapter: str) -> bool:
        return (kinds[student] == "solutions") != ((student, chapter) in chosen)

    right = all((score[0] == score[1] > 0) if expected_full(*key.split("/")) else score[0] == 0
                for key, (score, _) in results.items())
    return {"fraction": args.regrade, "submissions": len(pairs), "resubmitted": len(chosen),
            "wall_s": round(seconds, 1), "machine_cpu_s": round(busy, 1), "getrusage_cpu_s": round(reaped, 1),
            "graded": len(report.graded), "kept": len(report.kept),
            "graded_exactly_the_resubmissions": report.graded == set(chosen) and len(report.kept) == len(pairs) - len(chosen),
            "right": right}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--course", action="store_true", help="every chapter, solutions and blanks mixed")
    parser.add_argument("--students", type=int, default=None, help="default: 10 (chapter 02), 3 (--course)")
    parser.add_argument("--jobs", type=int, nargs="+", default=None, help="default: 1 2 (chapter 02), 2 (--course)")
    parser.add_argument("--scheduler", choices=["local"], default=None, help="--course on a Dask LocalCluster")
    parser.add_argument("--cell-timeout", type=int, default=120)
    parser.add_argument("--save", help="--course: write the grades and notes here")
    parser.add_argument("--compare", help="--course: fail unless the grades and notes equal this file's")
    parser.add_argument("--verbose", action="store_true", help="print the grader's progress lines")
    parser.add_argument("--regrade", type=float, default=0.1, metavar="FRACTION",
                        help="--course: then resubmit this fraction of the submissions and regrade (0: skip)")
    parser.add_argument("--no-plain", action="store_true",
                        help="skip the plain run of the twelve solution notebooks (no ratios)")
    args = parser.parse_args(argv)
    if args.course:
        args.students, args.jobs = args.students or 3, args.jobs or [2]
        return whole_course(args)
    args.students, args.jobs = args.students or 10, args.jobs or [1, 2]
    return chapter_02(args)


if __name__ == "__main__":
    sys.exit(main())
