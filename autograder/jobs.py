"""One grading job: one submission of one chapter, graded in isolation. Nothing here writes the
course's gradebook; the grader's main process (course.py) merges each job's result into it.

`grade_job(spec)` is a plain function of its inputs (the submission's bytes and the chapter's
kit, built by course.py from the grader's own release), so it runs the same way in a thread of
`make grade` and on a Dask worker (`make grade SCHEDULER=tcp://...`). A job:

1. rebuilds the submission on the release's skeleton (autograder/sanitize.py), with the release's
   own `skip-when-grading` cells marked (grading mode: training runs no test depends on);
2. runs the notebook once: `nbgrader autograde` on a private copy of the course holding only that
   notebook and a gradebook without solutions, with the kernel in the sandbox
   (autograder/sandboxed_kernel.py) and every reference the chapter grades hidden. Inside that
   kernel a collector (sandbox_runner.load_ipython_extension) records, just before each checked
   test cell runs, what the learner's functions return on the checker's cases, and sends it over a
   FIFO, bounded, as frames (autograder/frames.py); it is loaded with
   `torch.load(weights_only=True)`, validated (core.validate_outputs) and judged here, in the
   grader's process, as it arrives (autograder/judging.py);
3. re-runs a test on its own (autograder/sandbox_runner.py, with only that test's reference hidden)
   when the run called another test's hidden reference, or ended while collecting an earlier test
   (autograder/rerun.py);
4. applies the grading policy (autograder/policy.py, through judging.py) and writes the final
   scores into its private gradebook, with the late penalty when the submission has a server time
   and a due date (`JobSpec.late`: nbgrader's timestamp is the server's, never the student's own
   timestamp.txt, and feedback.LatePenalty is the chapter's late policy), so that `nbgrader
   generate_feedback` (with autograder/feedback.py) shows them;
5. returns scores, notes, the autograded notebook, the feedback page and the time of each phase.

nbgrader runs in one process per job (autograder/driver.py: its configuration, the process, the
job's end of its pipes), forked by a server that imported nbgrader once (autograder/forkserver.py).
This module holds what the rest of the grader uses (the kit's `TestPlan` and `ChapterKit`,
`JobSpec`, `grade_job`; `Collected` and `RunEnd` come from frames.py) and the job itself, which
puts those pieces in order.

Any failure inside a job costs only that submission: it comes back with every test at 0 and a
note saying why.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import driver  # noqa: E402
import feedback  # noqa: E402
import forkserver  # noqa: E402
import frames  # noqa: E402
import hiding  # noqa: E402
import isolation  # noqa: E402
import judging  # noqa: E402
import rerun  # noqa: E402
import sanitize  # noqa: E402
from driver import STUDENT  # noqa: E402
# Collected and RunEnd are what a run's frames give; they, and the frames' limits, are read as jobs.* too
from frames import MAX_OUTPUT_BYTES, WATCHDOG_GRACE, Collected, RunEnd  # noqa: E402, F401
from transformer_lib.language import ENGLISH, say  # noqa: E402

INPUT_DIR = "/grading/input"
RUNNER_PATH = "/grading/sandbox_runner.py"
LIBRARY_DIR = "/grading/lib"
EXTENSION_DIR = "/grading/extension"  # the kernel's collector (sandbox_runner.py) on its sys.path
KERNEL_SPEC_VARIABLE = "COURSE_KERNEL_SANDBOX"  # read by sandboxed_kernel.py
SKIP_TAG = "skip-when-grading"  # sandboxed_kernel.SKIP_TAG (that module imports nbgrader; this one must not)


@dataclasses.dataclass
class TestPlan:
    grade_id: str
    points: float
    answer_id: str | None
    calls: list[dict]  # [{"checker": "check_softmax", "function": "softmax", "hidden": False}, ...]; [] for other tests
    hidden: list[tuple[str, str]]  # (module, name) of the references hidden while this test runs
    forbidden: list[str]
    checker_names: list[str]  # the test-cell names of its checkers (check_softmax)


@dataclasses.dataclass
class ChapterKit:
    chapter: str
    course_id: str
    templates: list[sanitize.Template]
    notebook_metadata: dict
    release_code: list[str]
    release_lines: list[str]
    release_markdown: list[str]  # sha256 of the release's markdown cells
    tests: list[TestPlan]
    gradebook: bytes  # the job's gradebook: the assignment as nbgrader records it, no solutions
    secrets: list[str]  # hidden test lines and hidden case descriptions, scrubbed from feedback
    hidden_cases: dict[str, list[tuple[str, str]]]  # checker name -> [(case description, case name)]
    # the same in Chinese, for a submission of the Chinese edition: [(描述, 用例名)]
    hidden_cases_zh: dict[str, list[tuple[str, str]]] = dataclasses.field(default_factory=dict)
    # sources (stripped) of the release's code cells tagged skip-when-grading (sandboxed_kernel.SKIP_TAG)
    skip_when_grading: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class JobSpec:
    student: str
    chapter: str
    submission: bytes
    kit: ChapterKit
    cell_timeout: int = 120
    limits: dict = dataclasses.field(default_factory=dict)
    cache_dir: str | None = None
    isolation: str = "auto"
    notebook_timeout: int | None = None
    # deploy/hub/schedule.py SubmissionTime.for_job(): received, due (nbgrader's UTC format; due None
    # when the chapter has none), policy, notice {language: line}; None: no server time (no penalty)
    late: dict | None = None


# -- the job ----------------------------------------------------------------------------------------


def grade_job(spec: JobSpec) -> dict:
    """Grade one submission of one chapter; never raises (a failure is a result with notes)."""
    started = time.monotonic()
    kit = spec.kit
    result = {"student": spec.student, "chapter": spec.chapter, "status": "graded", "notes": [], "flags": [],
              "scores": {t.grade_id: [0.0, t.points] for t in kit.tests}, "comments": {}, "nbgrader_scores": {},
              "autograded": None, "feedback": None, "isolation": "", "seconds": 0.0, "log": ""}
    try:
        iso = isolation.detect(None if spec.isolation == "auto" else spec.isolation)
        result["isolation"] = iso.mode
        clean = sanitize.sanitize(spec.submission, kit.templates, kit.notebook_metadata, set(kit.release_code))
        result["notes"] += clean.notes
        if clean.notebook is None:
            result["status"] = "unreadable"
            return result
        _grading_mode(clean.notebook, kit.skip_when_grading)
        with tempfile.TemporaryDirectory(prefix="course-job-") as work, isolation.job_uid() as uid:
            _Job(spec, clean, Path(work), uid, iso, result).run()
    except Exception as exc:  # the grader's own failure on this submission: it alone pays
        result["status"] = "error"
        result["notes"].append(f"the grader failed on this submission ({type(exc).__name__}: {str(exc)[:300]}); "
                               "every test scored 0")
        result["log"] += traceback.format_exc()[-4000:]
        for gid in result["scores"]:
            result["scores"][gid][0] = 0.0
    finally:
        result["seconds"] = round(time.monotonic() - started, 2)
    return result


class _Job:
    language = ENGLISH  # of what the student reads (the submission's edition); the report's notes stay English

    def __init__(self, spec: JobSpec, clean: sanitize.Sanitized, work: Path, uid: int, iso, result: dict):
        self.spec, self.kit, self.clean, self.work, self.uid, self.iso, self.result = \
            spec, spec.kit, clean, work, uid, iso, result
        self.language = clean.language
        self.limits = isolation.Limits(**spec.limits) if spec.limits else isolation.Limits()
        self.course = work / "course"
        self.library = hiding.library_root()
        cache = Path(spec.cache_dir) if spec.cache_dir and Path(spec.cache_dir).parent.is_dir() else \
            Path(tempfile.gettempdir()) / f"course-grading-libraries-{os.geteuid()}"
        if not _private(cache):  # a cache another user could have planted: build a fresh one here
            cache = work / "libraries"
        self.cache = cache
        os.chmod(work, 0o755)

    # -- orchestration --------------------------------------------------------------------------

    def run(self) -> None:
        kit, result = self.kit, self.result
        tests = {t.grade_id: t for t in kit.tests}
        checked = [t for t in kit.tests if t.calls and t.grade_id not in self.clean.deleted_tests]
        kernel_hidden = [hiding.Hidden(*h) for h in sorted({h for t in kit.tests for h in t.hidden})]
        kernel_copy = hiding.build_copies(self.cache, [kernel_hidden])[0]

        # One sandboxed run of the notebook: nbgrader's kernel executes it for the autograded notebook,
        # and a collector inside that kernel (sandbox_runner.load_ipython_extension) sends the
        # outputs of the learner's functions at each checked test cell, judged here as they arrive.
        clock = time.monotonic()
        autograded, nbgrader_scores, collected, end = self.autograde(kernel_copy, checked)
        result.setdefault("timings", {})["notebook run"] = round(time.monotonic() - clock, 1)
        if getattr(self, "first_frame_at", None):  # nbgrader, the sandbox, the kernel and its imports
            result["timings"]["of which start-up"] = round(self.first_frame_at - self.started_at, 1)
        result["nbgrader_scores"] = nbgrader_scores

        stopped = [o for c in autograded.get("cells", []) for o in c.get("outputs", [])
                   if o.get("output_type") == "error" and o.get("ename") == "GradingStopped"]
        if stopped:
            result["notes"].append(f"in nbgrader's run of the notebook, {stopped[0].get('evalue', '')}; the cells "
                                   "after it did not run there")
        if checked and end is None:  # the kernel's collector never reported: the plain runner does it
            clock = time.monotonic()
            collected, end = self.run_sandbox(checked, kernel_copy, interactive=True)
            result["timings"]["independent check"] = round(time.monotonic() - clock, 1)
            result["log"] += "\nthe kernel's collector did not start: the outputs were collected by a separate run\n"
        elif end is None:
            collected, end = {}, RunEnd("", [])

        # A test whose run called the hidden reference of *another* test (a wrong earlier answer
        # whose later cells fall back on the reference, a checker that needs it) runs again on
        # its own, with only its own reference hidden, exactly as in the learner's lab
        # (autograder/rerun.py says when).
        reruns = rerun.needing_rerun(checked, collected, end)
        if reruns:
            clock = time.monotonic()
            visible = rerun.visible_verdicts(checked, collected)
            copies = hiding.build_copies(self.cache, [[hiding.Hidden(*h) for h in t.hidden] for t in reruns])
            for test, copy_parent in zip(reruns, copies):
                earlier = rerun.earlier_verdicts(visible, test)
                alone, end_alone = self.run_sandbox([test], copy_parent, interactive=False, visible=earlier)
                collected[test.grade_id] = alone.get(test.grade_id) or Collected(
                    None, end_alone.problem or "the notebook's run ended before this test")
            result["timings"]["re-runs"] = round(time.monotonic() - clock, 1)
            result["reruns"] = [t.grade_id for t in reruns]

        # gid -> (score, verdict for the student, note for the report or "", the note in the student's language)
        verdicts: dict[str, tuple[float, str, str, str]] = {}
        for test in kit.tests:
            if test.grade_id in self.clean.deleted_tests:
                verdicts[test.grade_id] = (0.0, say("This test cell was deleted from your notebook: scored 0.",
                                                    self.language), "", "")
            elif test.calls:
                verdicts[test.grade_id] = judging.verdict(test, collected[test.grade_id], kit, self.clean,
                                                          self.language, result["flags"])
            else:
                verdicts[test.grade_id] = judging.kernel_verdict(test, autograded, kit, self.language)
        # What each answer did, named (the class report, autograder/class_report.py; kept in graded.json)
        result["outcomes"] = {
            test.grade_id: judging.outcome(test, collected.get(test.grade_id), result["flags"], kit,
                                           verdicts[test.grade_id][0], order)
            if test.calls and test.grade_id not in self.clean.deleted_tests else
            judging.plain_outcome(test, verdicts[test.grade_id][0], order, test.grade_id in self.clean.deleted_tests)
            for order, test in enumerate(kit.tests)}

        comments: dict[str, list[str]] = {}
        for gid, (score, verdict, note, said) in verdicts.items():
            test = tests[gid]
            result["scores"][gid] = [score, test.points]
            in_kernel = nbgrader_scores.get(gid)
            if test.calls and score == 0 and in_kernel and in_kernel > 0 and gid not in self.clean.deleted_tests:
                note, said = [say("passed inside the notebook but failed the independent check: {note}; scored 0",
                                  language, note=n or verdict) for language, n in ((ENGLISH, note), (self.language, said))]
            if note:
                result["notes"].append(f"'{gid}' {note}")
                if test.answer_id:  # the gradebook's comment, on the student's feedback page
                    comments.setdefault(test.answer_id, []).append(f"{gid}: {judging.public(said, kit.secrets)}")
        result["comments"] = {k: "\n".join(v) for k, v in comments.items()}
        clock = time.monotonic()
        self.finish(autograded, verdicts, comments)
        result["timings"]["feedback"] = round(time.monotonic() - clock, 1)

    # -- nbgrader, with the kernel in the sandbox ----------------------------------------------

    def _write_course(self) -> None:
        kit = self.kit
        for folder in ["source", "release", "autograded", "feedback", f"submitted/{STUDENT}"]:
            (self.course / folder / (kit.chapter if folder in ("source", "release") else "")).mkdir(parents=True, exist_ok=True)
        (self.course / "gradebook.db").write_bytes(kit.gradebook)
        notebook = self.course / "submitted" / STUDENT / kit.chapter / f"{kit.chapter}.ipynb"
        notebook.parent.mkdir(parents=True, exist_ok=True)
        notebook.write_text(json.dumps(self.clean.notebook))
        (self.course / "nbgrader_config.py").write_text(
            driver.nbgrader_config(self.course, self.kit, self.spec.cell_timeout, self.language) + self._late_config())
        if self.spec.late:
            self._stamp(notebook.parent)

    def _late_config(self) -> str:
        """The chapter's late policy as nbgrader's late-submission plugin, and the feedback page's line
        saying when the server received the submission (in the submission's language)."""
        late = self.spec.late
        if not late:
            return ""
        notice = late.get("notice", {})
        return (f'c.AssignLatePenalties.plugin_class = "feedback.LatePenalty"\n'
                f"c.LatePenalty.policy = {late.get('policy') or 'none'!r}\n"
                f"c.SafeOutputs.notice = {notice.get(self.language) or notice.get(ENGLISH, '')!r}\n")

    def _stamp(self, folder: Path) -> None:
        """The server's time as the submission's timestamp.txt and this student's due date (with any
        extension) as the assignment's, in the job's private course: nbgrader's autograde computes
        how late it is from them. The student's own timestamp.txt never reaches the job."""
        from nbgrader.api import Gradebook

        (folder / "timestamp.txt").write_text(self.spec.late["received"])
        if self.spec.late.get("due"):
            with Gradebook("sqlite:///" + str(self.course / "gradebook.db"), self.kit.course_id) as gb:
                gb.update_or_create_assignment(self.kit.chapter, duedate=self.spec.late["due"])

    def _nbgrader_env(self) -> dict:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("JUPYTER", "PYTHONPATH", "COURSE_"))}
        env.update(JUPYTER_CONFIG_PATH=str(self.course), JUPYTER_CONFIG_DIR=str(self.course / ".jupyter"),
                   JUPYTER_DATA_DIR=str(self.work / "jupyter-data"), JUPYTER_RUNTIME_DIR=str(self.work / "runtime"),
                   PYTHONPATH=str(HERE), HOME=str(self.work), PYTHONHASHSEED="0", OMP_NUM_THREADS="1",
                   PATH=os.path.dirname(isolation.python_executable()) + os.pathsep + env.get("PATH", os.defpath))
        env[KERNEL_SPEC_VARIABLE] = str(self.work / "kernel-sandbox.json")
        return env

    def _start_driver(self) -> None:
        """One nbgrader process for the job: it autogrades, waits for the final scores, writes feedback."""
        self.driver_log = open(self.work / "nbgrader.log", "ab")
        self.driver = forkserver.ZYGOTE.start(str(self.course), self.kit.chapter, self._nbgrader_env(), self.driver_log)
        if self.driver is None:  # no fork server here (or it died): a fresh interpreter, as before
            self.driver = subprocess.Popen(
                [isolation.python_executable(), str(HERE / "driver.py"), "--nbgrader-driver", str(self.course),
                 self.kit.chapter],
                cwd=self.course, env=self._nbgrader_env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=self.driver_log, start_new_session=True, preexec_fn=driver._grader_limits)

    def _stop_driver(self) -> None:
        proc = getattr(self, "driver", None)
        if proc is not None:
            isolation.kill_group(proc)
            self.driver = None
            self.driver_log.close()
        isolation.kill_uid(self.uid)

    def autograde(self, kernel_copy: Path, checked: list[TestPlan]) -> tuple[dict, dict, dict, "RunEnd | None"]:
        """nbgrader autograde with a sandboxed kernel that also collects the checked tests' outputs:
        (autograded notebook, nbgrader's score per test, collected outputs, how the collection ended;
        None when the kernel's collector never reported)."""
        self._write_course()
        channel = self.work / "channel"
        channel.mkdir(mode=0o700)
        outputs_fifo, answers_fifo = channel / "outputs", channel / "answers"
        plan_path = channel / "collect-plan.json"  # sandbox_runner.PLAN_NAME, found beside the connection file
        os.mkfifo(outputs_fifo, 0o600)
        os.mkfifo(answers_fifo, 0o600)
        plan_path.write_text(json.dumps(self._collect_plan(checked, outputs_fifo, answers_fifo)))
        os.chmod(plan_path, 0o644)
        if os.geteuid() == 0:
            for path in (channel, outputs_fifo, answers_fifo):
                os.chown(path, self.uid, self.uid)
        extension = self.work / "extension"
        extension.mkdir()
        shutil.copyfile(HERE / "sandbox_runner.py", extension / "sandbox_runner.py")
        os.chmod(extension, 0o755)
        os.chmod(extension / "sandbox_runner.py", 0o644)
        read_only, env = self._library_binds(kernel_copy)
        if self.iso.mode == "bubblewrap":
            read_only = read_only + [[str(extension), EXTENSION_DIR]]
            env = {**env, "PYTHONPATH": EXTENSION_DIR}
        else:
            env = {**env, "PYTHONPATH": os.pathsep.join(filter(None, [env.get("PYTHONPATH"), str(extension)]))}
        spec = {"uid": self.uid, "channel": str(channel), "isolation": self.iso.mode,
                "read_only": read_only, "read_write": [[str(channel), str(channel)]],
                "limits": dataclasses.asdict(self.limits), "env": env, "collect": bool(checked),
                "notebook_timeout": self.notebook_timeout(), "output_bytes": 2 * 2**20,
                "stop_after": self._last_test_cell()}
        (self.work / "kernel-sandbox.json").write_text(json.dumps(spec))
        # The grader's ends of the FIFOs, open before the kernel starts: outputs are read without
        # blocking, and the answers FIFO is held open for writing (O_RDWR never waits for a reader).
        out_read = os.open(outputs_fifo, os.O_RDONLY | os.O_NONBLOCK)
        in_write = os.open(answers_fifo, os.O_RDWR)
        try:
            self.started_at, self.first_frame_at = time.monotonic(), None
            self._start_driver()
            collected, end = ({}, None)
            if checked:
                collected, end = self._read_frames(out_read, in_write, None, {t.grade_id: t for t in checked},
                                                   watch=self.driver.stdout.fileno())
        finally:
            # Closed before nbgrader finishes: a kernel still sending gets EPIPE, not a full FIFO to block on.
            os.close(out_read)
            os.close(in_write)
        message = driver.read_message(self.driver, self.notebook_timeout() + 180)
        isolation.kill_uid(self.uid)  # nothing of the kernel's sandbox outlives its run
        log = (message or {}).get("log", "")
        self.result["log"] += log[-6000:]
        checksum_warnings = re.findall(r"Attribute 'checksum' for cell (\S+) has changed", log)
        if checksum_warnings:
            self.result["flags"].append(f"nbgrader: checksum changed for {sorted(set(checksum_warnings))}")
        path = self.course / "autograded" / STUDENT / self.kit.chapter / f"{self.kit.chapter}.ipynb"
        if not message or not message.get("success") or not path.exists():
            why = "ran past the grader's limit or died" if not message else \
                f"failed ({str(message.get('error') or 'no message').strip().splitlines()[-1:]})"
            self.result["notes"].append(f"nbgrader's run of the notebook {why}: the tests were scored by the "
                                        "independent check alone, and the feedback shows no outputs")
            self._stop_driver()
            return json.loads(json.dumps(self.clean.notebook)), {}, collected, end
        autograded = json.loads(path.read_text())
        return autograded, self._gradebook_scores(), collected, end

    def _collect_plan(self, checked: list[TestPlan], outputs_fifo: Path, answers_fifo: Path) -> dict:
        """What the kernel's collector needs: the tests, the FIFOs, and every code cell nbgrader will
        run as (sha256 of its source, index, grade id); test cells as the gradebook restores them."""
        import hashlib

        restored = {t.grade_id: t.source for t in self.kit.templates if t.kind == "test"}
        cells = []
        for index, cell in enumerate(self.clean.notebook["cells"]):
            if cell.get("cell_type") != "code" or index > self._last_test_cell():
                continue
            grade_id = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
            source = cell.get("source", "")
            source = "".join(source) if isinstance(source, list) else source
            source = restored.get(grade_id, source)
            cells.append([hashlib.sha256(source.encode()).hexdigest(), index, grade_id])
        return {"cell_timeout": int(self.spec.cell_timeout), "visible": {}, "fifo_out": str(outputs_fifo),
                "fifo_in": str(answers_fifo), "cells": cells,
                "tests": [{"grade_id": t.grade_id, "calls": t.calls, "forbidden": t.forbidden} for t in checked]}

    def _last_test_cell(self) -> int:
        """The index of the last graded test cell: nothing after it changes a score, so the kernel
        stops there (a chapter that trains a model after its exercises does not train it here)."""
        test_ids = {t.grade_id for t in self.kit.tests}
        indices = [i for i, c in enumerate(self.clean.notebook["cells"])
                   if c.get("metadata", {}).get("nbgrader", {}).get("grade_id") in test_ids]
        return max(indices, default=len(self.clean.notebook["cells"]))

    def notebook_timeout(self) -> int:
        if self.spec.notebook_timeout:
            return int(self.spec.notebook_timeout)
        return int(max(300, min(3600, self.spec.cell_timeout * 15)))

    def _gradebook_scores(self) -> dict:
        from nbgrader.api import Gradebook, MissingEntry

        with Gradebook("sqlite:///" + str(self.course / "gradebook.db"), self.kit.course_id) as gb:
            try:
                nb = gb.find_submission_notebook(self.kit.chapter, self.kit.chapter, STUDENT)
            except MissingEntry:
                return {}
            return {g.name: g.auto_score for g in nb.grades}

    def _library_binds(self, copy_parent: Path) -> tuple[list, dict]:
        """Read-only binds that put the copy where transformer_lib lives, and env for the fallbacks."""
        package = copy_parent / hiding.PACKAGE
        if self.iso.mode == "bubblewrap":
            return [[str(package), str(self.library)], [str(copy_parent), LIBRARY_DIR]], {}
        return [], {"PYTHONPATH": str(copy_parent)}

    # -- the independent check ----------------------------------------------------------------

    def run_sandbox(self, tests: list[TestPlan], copy_parent: Path, interactive: bool,
                    visible: dict | None = None) -> tuple[dict, "RunEnd"]:
        """Run the notebook in a sandbox, collecting the outputs of `tests`; judge each test as its
        outputs arrive (and, if `interactive`, tell the run whether its visible checks passed)."""
        self.runs = getattr(self, "runs", 0) + 1
        folder = self.work / "runs" / str(self.runs)
        folder.mkdir(parents=True)
        out_read, out_write = os.pipe()
        in_read, in_write = os.pipe() if interactive else (None, None)
        notebook = json.loads(json.dumps(self.clean.notebook))
        test_ids = {t.grade_id for t in self.kit.tests}
        for cell in notebook["cells"]:  # test cells never run here: no test source in the sandbox
            if cell.get("metadata", {}).get("nbgrader", {}).get("grade_id") in test_ids:
                cell["source"] = ""
        bubblewrap = self.iso.mode == "bubblewrap"
        wanted = {t.grade_id for t in tests}
        plan = {"fd_out": out_write, "fd_in": in_read, "cell_timeout": int(self.spec.cell_timeout), "visible": visible or {},
                "skip": sorted(test_ids - wanted),
                "tests": [{"grade_id": t.grade_id, "calls": t.calls, "forbidden": t.forbidden} for t in tests]}
        (folder / "plan.json").write_text(json.dumps(plan))
        (folder / "notebook.json").write_text(json.dumps(notebook))
        os.chmod(folder, 0o755)
        for f in folder.iterdir():
            os.chmod(f, 0o644)
        read_only, env = self._library_binds(copy_parent)
        if bubblewrap:
            read_only = read_only + [[str(folder), INPUT_DIR], [str(HERE / "sandbox_runner.py"), RUNNER_PATH]]
            runner, inputs = RUNNER_PATH, INPUT_DIR
        else:
            runner, inputs = str(HERE / "sandbox_runner.py"), str(folder)
        spec = isolation.SandboxSpec(uid=self.uid, read_only=[tuple(p) for p in read_only], env=env, limits=self.limits)
        python = [isolation.python_executable()] + (["-I"] if bubblewrap else ["-E", "-s"])
        if not bubblewrap:  # the fallbacks cannot bind the copy over the library: put it first on sys.path
            python += ["-c", f"import sys, runpy; sys.path.insert(0, {str(copy_parent)!r}); sys.argv = sys.argv[1:]; "
                             "runpy.run_path(sys.argv[0], run_name='__main__')"]
        argv = isolation.wrap(spec, python + [runner, f"{inputs}/plan.json", f"{inputs}/notebook.json"], self.iso)
        scratch = self.work / "scratch" / str(self.runs)
        scratch.mkdir(parents=True)
        if os.geteuid() == 0:
            os.chown(scratch, self.uid, self.uid)
        passed_fds = tuple(fd for fd in (out_write, in_read) if fd is not None)
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                    pass_fds=passed_fds, start_new_session=True,
                                    cwd=isolation.host_cwd(spec, self.iso) or str(scratch))
        finally:
            for fd in passed_fds:
                os.close(fd)
        try:
            return self._read_frames(out_read, in_write, proc, {t.grade_id: t for t in tests})
        finally:
            os.close(out_read)
            if in_write is not None:
                with contextlib.suppress(OSError):
                    os.close(in_write)
            isolation.kill_group(proc)
            isolation.kill_uid(self.uid)

    def _read_frames(self, fd: int, reply_fd: int | None, proc: subprocess.Popen | None,
                     tests: dict[str, TestPlan], watch: int | None = None) -> tuple[dict, "RunEnd | None"]:
        """One run's frames (frames.read_frames), each test's outputs judged as they arrive."""
        def first_frame() -> None:  # nbgrader, the sandbox, the kernel and its imports are up
            self.first_frame_at = time.monotonic()

        return frames.read_frames(fd, reply_fd, proc, tests, self._load, self.spec.cell_timeout,
                                  self.notebook_timeout(), watch=watch, on_first_frame=first_frame)

    def _load(self, payload: bytes, test: TestPlan) -> "Collected":
        """One test's outputs, read back defensively (frames.load) and judged in the student's language."""
        return frames.load(payload, test, lambda t, outputs: judging.judge(t, outputs, self.kit, self.language))

    # -- results ---------------------------------------------------------------------------------

    def finish(self, autograded: dict, verdicts: dict, comments: dict) -> None:
        """Final scores into the private gradebook, verdicts into the notebook, then the feedback page."""
        from feedback import GRADING_KEY

        for cell in autograded.get("cells", []):
            gid = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
            if gid in verdicts:
                cell.setdefault("metadata", {})[GRADING_KEY] = {
                    "verdict": judging.public(verdicts[gid][1], self.kit.secrets), "score": verdicts[gid][0]}
        path = self.course / "autograded" / STUDENT / self.kit.chapter / f"{self.kit.chapter}.ipynb"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(autograded))
        self.result["autograded"] = json.dumps(autograded)
        self._write_scores(verdicts, comments)
        message = None
        if getattr(self, "driver", None) is None:  # nbgrader's run failed: a fresh driver writes the feedback
            self._start_driver_feedback_only()
        try:
            self.driver.stdin.write(b"feedback\n")
            self.driver.stdin.flush()
            message = driver.read_message(self.driver, 600)
        except OSError:
            pass
        finally:
            self._stop_driver()
        page = self.course / "feedback" / STUDENT / self.kit.chapter / f"{self.kit.chapter}.html"
        if page.exists():
            self.result["feedback"] = feedback.page_in_language(page.read_text(), self.language)
        else:
            self.result["notes"].append("no feedback page could be made: " + str((message or {}).get("error", "nbgrader failed"))[-300:])
            self.result["log"] += str((message or {}).get("log", ""))[-4000:]

    def _start_driver_feedback_only(self) -> None:
        self._start_driver()
        self.feedback_only = True

    def _write_scores(self, verdicts: dict, comments: dict) -> None:
        import warnings

        from nbgrader.api import Gradebook

        warnings.filterwarnings("ignore", message=".*not in session.*")
        with Gradebook("sqlite:///" + str(self.course / "gradebook.db"), self.kit.course_id) as gb:
            gb.update_or_create_student(STUDENT)
            sub = gb.update_or_create_submission(self.kit.chapter, STUDENT)
            nb = gb.find_submission_notebook(self.kit.chapter, self.kit.chapter, STUDENT)
            for grade in nb.grades:
                if grade.name in verdicts:
                    grade.auto_score = verdicts[grade.name][0]
                    grade.manual_score = None
                    grade.needs_manual_grade = False
            for comment in nb.comments:
                if comment.name in comments:
                    comment.auto_comment = judging.public("\n".join(comments[comment.name]), self.kit.secrets)
            if self.spec.late:
                self.result["late_penalty"] = self._late_penalty(gb, nb)
            del sub
            gb.db.commit()

    def _late_penalty(self, gb, nb) -> float | None:
        """The penalty on the final scores: nbgrader's AssignLatePenalties computed one on the kernel's
        scores, which the grader's verdicts replaced (a cutoff takes what is left). The timestamp is set
        again here: nbgrader's run may have failed before it recorded one."""
        sub = gb.update_or_create_submission(self.kit.chapter, STUDENT, timestamp=self.spec.late["received"])
        score = sum(float(g.auto_score or 0) for g in nb.grades)
        plugin = feedback.LatePenalty(policy=self.spec.late.get("policy") or "none")
        late = sub.total_seconds_late
        nb.late_submission_penalty = plugin.late_submission_penalty(STUDENT, score, late) if late > 0 else None
        return nb.late_submission_penalty


def _grading_mode(notebook: dict, skipped_sources: list[str]) -> None:
    """The skip-when-grading tag on exactly the course's own tagged cells, as the release has them:
    a learner who changed such a cell has it run; a tag the learner added is dropped."""
    skipped = set(skipped_sources)
    for cell in notebook.get("cells", []):
        if cell.get("cell_type") != "code":
            continue
        source = cell.get("source", "")
        source = "".join(source) if isinstance(source, list) else source
        metadata = cell.setdefault("metadata", {})
        tags = [t for t in metadata.get("tags", []) if t != SKIP_TAG] if isinstance(metadata.get("tags"), list) else []
        if source.strip() in skipped:
            tags.append(SKIP_TAG)
        if tags or "tags" in metadata:
            metadata["tags"] = tags


def _private(folder: Path) -> bool:
    """True when `folder` (if it exists) and its parent belong to us and no one else may write them."""
    for path in (folder, folder.parent):
        try:
            st = path.lstat()
        except FileNotFoundError:
            continue
        except OSError:
            return False
        if path.is_symlink() or st.st_uid != os.geteuid() or (st.st_mode & 0o022 and not (st.st_mode & 0o1000)):
            return False
        if path == folder and st.st_mode & 0o022:
            return False
    return True
