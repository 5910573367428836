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
   FIFO, bounded; it is loaded with `torch.load(weights_only=True)`, validated
   (core.validate_outputs) and judged here, in the grader's process, as it arrives;
3. re-runs a test on its own (autograder/sandbox_runner.py, with only that test's reference hidden)
   when the run called another test's hidden reference, or ended while collecting an earlier test;
4. applies the grading policy (autograder/policy.py) and writes the final scores into its private
   gradebook, so that `nbgrader generate_feedback` (with autograder/feedback.py) shows them;
5. returns scores, notes, the autograded notebook, the feedback page and the time of each phase.

Any failure inside a job costs only that submission: it comes back with every test at 0 and a
note saying why.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import re
import select
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import textwrap
import time
import traceback
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import hiding  # noqa: E402
import isolation  # noqa: E402
import policy  # noqa: E402
import sanitize  # noqa: E402
from transformer_lib.language import ENGLISH, say  # noqa: E402  (no torch: the nbgrader driver imports this module)

STUDENT = "student"  # the student id inside a job's private course
MAX_OUTPUT_BYTES = 64 * 2**20  # outputs one test may send back
WATCHDOG_GRACE = 5  # seconds past the per-cell limit before the grader kills a run that ignores it
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
class Collected:
    """What one sandboxed run sent back for one test."""

    outputs: list | None  # per checker call: the validated outputs (None: see problem)
    problem: str = ""
    seen: list = dataclasses.field(default_factory=list)  # forbidden APIs called
    called: list = dataclasses.field(default_factory=list)  # hidden references called so far in the run
    called_during: list = dataclasses.field(default_factory=list)  # ... while this test's functions ran
    judged: list = dataclasses.field(default_factory=list)  # (passed, message) per checker call
    english: list = dataclasses.field(default_factory=list)  # each message in English (the report's)


@dataclasses.dataclass
class RunEnd:
    problem: str  # why the run ended early ("" when it ran to the end)
    called: list  # hidden references called before it ended
    during_test: bool = False  # it ended while collecting a test's outputs
    test: str = ""  # ... of this test


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
        # its own, with only its own reference hidden, exactly as in the learner's lab.
        reruns = []
        for test in checked:
            own = {f"{m}.{n}" for m, n in test.hidden}
            got = collected.get(test.grade_id)
            called = got.called if got is not None else end.called
            ended_before = got is None and end.during_test and end.test != test.grade_id
            if (any(name not in own for name in called) or ended_before) and not _settled(got):
                # it met another test's hidden reference, or the run ended while collecting an
                # earlier test (a collection that a run of this test alone does not make)
                reruns.append(test)
            elif got is None:
                collected[test.grade_id] = Collected(None, end.problem or "the notebook's run ended before this test")
        if reruns:
            clock = time.monotonic()
            # What later cells' yours_or_reference needs of the tests before: their visible verdicts
            # from the first run when that run was clean for them; a test whose run hung or died
            # counts as not passing (its later cells fall back on the reference, which a re-run has).
            visible = {}
            for test in checked:
                got = collected.get(test.grade_id)
                own = {f"{m}.{n}" for m, n in test.hidden}
                clean = got is not None and not any(name not in own for name in got.called)
                for call, judged in zip(test.calls, (got.judged or []) if clean and got.outputs is not None else []):
                    if not call["hidden"]:
                        visible[call["checker"].removeprefix("check_")] = bool(judged[0])
                if got is None or got.outputs is None:
                    for call in test.calls:
                        visible.setdefault(call["checker"].removeprefix("check_"), False)
            copies = hiding.build_copies(self.cache, [[hiding.Hidden(*h) for h in t.hidden] for t in reruns])
            for test, copy_parent in zip(reruns, copies):
                earlier = {name: v for name, v in visible.items()
                           if name not in {c["checker"].removeprefix("check_") for c in test.calls}}
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
                verdicts[test.grade_id] = self.verdict(test, collected[test.grade_id])
            else:
                verdicts[test.grade_id] = self.kernel_verdict(test, autograded)

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
                    comments.setdefault(test.answer_id, []).append(f"{gid}: {self.public(said)}")
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
        (self.course / "nbgrader_config.py").write_text(self._nbgrader_config())

    def _nbgrader_config(self) -> str:
        kit = self.kit
        secrets = json.dumps(kit.secrets)
        trusted = json.dumps(kit.release_markdown)
        return textwrap.dedent(f"""\
            c = get_config()  # noqa: F821
            c.CourseDirectory.root = {str(self.course)!r}
            c.CourseDirectory.course_id = {kit.course_id!r}
            c.CourseDirectory.source_directory = "source"
            c.CourseDirectory.release_directory = "release"
            c.CourseDirectory.submitted_directory = "submitted"
            c.CourseDirectory.autograded_directory = "autograded"
            c.CourseDirectory.feedback_directory = "feedback"
            c.CourseDirectory.db_url = {"sqlite:///" + str(self.course / "gradebook.db")!r}
            c.CourseDirectory.ignore = [".ipynb_checkpoints", "*.pyc", "__pycache__", "feedback", "*.py", "cited_figures.toml", "*.zh.toml"]
            c.Execute.timeout = {int(self.spec.cell_timeout)}
            c.Execute.iopub_timeout = 5
            c.Execute.startup_timeout = 120
            c.Autograde.autograde_preprocessors = [
                "sandboxed_kernel.SandboxedExecute", "nbgrader.preprocessors.IgnorePattern",
                "nbconvert.preprocessors.ClearMetadataPreprocessor", "nbgrader.preprocessors.LimitOutput",
                "nbgrader.preprocessors.SaveAutoGrades", "nbgrader.preprocessors.AssignLatePenalties",
                "nbgrader.preprocessors.CheckCellMetadata"]
            c.ClearMetadataPreprocessor.preserve_cell_metadata_mask = [("nbgrader"), ("tags")]
            c.GenerateFeedback.preprocessors = [
                "nbgrader.preprocessors.GetGrades", "nbgrader.preprocessors.ClearHiddenTests",
                "feedback.ShortenTestTracebacks", "feedback.GraderVerdicts", "feedback.SafeOutputs",
                "feedback.ScrubHidden", "feedback.WrapVerdicts",
                "nbconvert.preprocessors.CSSHTMLHeaderPreprocessor"]
            c.ClearHiddenTests.enforce_metadata = False
            c.HTMLExporter.sanitize_html = True
            c.ScrubHidden.secrets = {secrets}
            c.SafeOutputs.trusted_markdown = {trusted}
            """) + self._feedback_language()

    def _feedback_language(self) -> str:
        """The feedback page's own sentences in the submission's language (its verdicts already are)."""
        if self.language == ENGLISH:
            return ""
        from feedback import BANNER, MISSING_VERDICT, SKIPPED_TEXT

        return (f"c.SafeOutputs.banner = {say(BANNER, self.language)!r}\n"
                f"c.SafeOutputs.skipped_text = {say(SKIPPED_TEXT, self.language)!r}\n"
                f"c.GraderVerdicts.missing = {say(MISSING_VERDICT, self.language)!r}\n")

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
        self.driver = _ZYGOTE.start(str(self.course), self.kit.chapter, self._nbgrader_env(), self.driver_log)
        if self.driver is None:  # no fork server here (or it died): a fresh interpreter, as before
            self.driver = subprocess.Popen(
                [isolation.python_executable(), str(HERE / "jobs.py"), "--nbgrader-driver", str(self.course),
                 self.kit.chapter],
                cwd=self.course, env=self._nbgrader_env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=self.driver_log, start_new_session=True, preexec_fn=_grader_limits)

    def _driver_message(self, timeout: float) -> dict | None:
        """The driver's next message, or None if it died or ran past `timeout`."""
        fd = self.driver.stdout.fileno()
        deadline = time.monotonic() + timeout
        data = b""
        while not data.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([fd], [], [], min(left, 5.0))
            if ready:
                chunk = os.read(fd, 1 << 20)
                if not chunk:
                    return None
                data += chunk
                if len(data) > 2**22:
                    return None
        try:
            return json.loads(data)
        except ValueError:
            return None

    def _stop_driver(self) -> None:
        driver = getattr(self, "driver", None)
        if driver is not None:
            isolation.kill_group(driver)
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
        message = self._driver_message(self.notebook_timeout() + 180)
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

    def verdict(self, test: TestPlan, got: "Collected") -> tuple[float, str, str, str]:
        """(score, verdict shown to the student, note for the report, the note in the student's language) for
        one checker-based test."""
        sources = self._learner_sources(test, before_only=True)
        references = [f"{m}.{n}" for m, n in test.hidden]
        uses_ref = set(sanitize.uses_reference(sources, references, test.checker_names, set(self.kit.release_lines)))
        uses_ref |= {name for name in got.called_during if name in references}
        answer_sources = self._learner_sources(test, before_only=False)
        forbidden = sorted(set(sanitize.uses_forbidden(answer_sources, test.forbidden, set(self.kit.release_lines)))
                           | set(got.seen))
        flags = policy.flags_for(sorted(uses_ref), forbidden)
        for flag in flags:
            self.result["flags"].append(f"{test.grade_id}: {flag}")
        if got.outputs is None:
            passed, message, in_english = False, got.problem, got.problem
        else:
            failed = [i for i, (p, _) in enumerate(got.judged) if not p]
            passed, message = not failed, got.judged[failed[0]][1] if failed else ""
            in_english = got.english[failed[0]] if failed and got.english else message  # for the report
        points = policy.score(test.points, passed, flags)
        score = f"{points:g}/{test.points:g}"
        if flags:
            note = "; ".join(flags)
            said = say("; ", self.language).join(policy.flags_for(sorted(uses_ref), forbidden, self.language))
            verdict = say("\u2717 {score}: {flags}.", self.language, score=score, flags=said)
            return points, verdict + (say(" ({message})", self.language, message=message) if message else ""), note, said
        if passed:
            return test.points, say("\u2713 {score}: every case of this test matches the reference.", self.language,
                                    score=score), "", ""
        return (0.0, f"\u2717 {score}: {message}",
                say("failed the independent check: {message}", ENGLISH, message=in_english),
                say("failed the independent check: {message}", self.language, message=message))

    def _judge(self, test: TestPlan, outputs: list) -> tuple[list[tuple[bool, str]], list[str]]:
        """Judge one test's outputs, here, in the grader's process: (passed, message) per checker call, the
        message in the student's language; and each message in English, for the report."""
        from transformer_lib.checks import get_checker

        judged, english = [], []
        for call, call_outputs in zip(test.calls, outputs):
            checker = get_checker(call["checker"])
            if isinstance(call_outputs, dict):  # the function could not even be looked up
                judged.append((False, f"{checker.name}: {call_outputs.get('__error__', 'no outputs')}"))
                english.append(judged[-1][1])
                continue
            try:
                verdict = checker.judge(call_outputs, call["hidden"], self.language)
            except Exception as exc:  # validated outputs should never get here; if they do, 0 with a note
                judged.append((False, say("{exercise}: the outputs could not be compared ({error})", self.language,
                                          exercise=checker.name, error=type(exc).__name__)))
                english.append(say("{exercise}: the outputs could not be compared ({error})", ENGLISH,
                                   exercise=checker.name, error=type(exc).__name__))
                continue
            if verdict.passed:
                judged.append((True, verdict.message))
                english.append(verdict.english)
            else:
                judged.append((False, self._hide_cases(verdict.message, checker.name, self.language)))
                english.append(self._hide_cases(verdict.english, checker.name, ENGLISH))
        return judged, english

    def _hide_cases(self, message: str, checker_name: str, language: str) -> str:
        if language == ENGLISH:
            for described, name in self.kit.hidden_cases.get(checker_name, []):
                message = message.replace(described, "a hidden case").replace(f"'{name}'", "(a hidden case)")
            return message
        for described, name in self.kit.hidden_cases_zh.get(checker_name, []):
            message = message.replace(described, say("a hidden case", language))
            message = message.replace(f"「{name}」", say("(a hidden case)", language))
        return message

    def public(self, text: str) -> str:
        for secret in sorted(self.kit.secrets, key=len, reverse=True):
            if secret:
                text = text.replace(secret, "[hidden]")
        return text

    def _learner_sources(self, test: TestPlan, before_only: bool) -> list[str]:
        """The learner's code cells before `test`'s cell; with before_only=False only those since the
        previous test cell (the answer to this exercise)."""
        cells = self.clean.notebook["cells"]
        learner = set(self.clean.learner_cells)
        test_ids = {t.grade_id for t in self.kit.tests}
        sources, start = [], 0
        for i, cell in enumerate(cells):
            gid = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
            if gid == test.grade_id:
                break
            if gid in test_ids:
                start = len(sources)
            if i in learner and cell["cell_type"] == "code":
                sources.append(cell["source"])
        return sources if before_only else sources[start:]

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
        """Read one run's frames until it says it is done, ends, or overruns a limit. `proc` is the
        runner's process; with `watch` (nbgrader's driver, whose kernel sends the frames) the run
        is over once the driver has answered: a kernel whose collector never sent a frame then
        gives None (the caller collects with a separate run)."""
        per_cell = self.spec.cell_timeout + WATCHDOG_GRACE
        if proc is None:  # nbgrader's kernel gives a test cell twice the limit (collection, then its checks)
            per_cell = 2 * self.spec.cell_timeout + 10 + WATCHDOG_GRACE
        total_deadline = time.monotonic() + self.notebook_timeout() + 60
        deadline = time.monotonic() + per_cell + 60  # the first cell also waits for the imports
        buffer = bytearray()
        last_cell, called = "the start", []
        cell_started = time.monotonic()
        connected = False
        skipping, skip_head = 0, bytearray()
        collected: dict[str, Collected] = {}

        def end(problem: str) -> tuple[dict, RunEnd]:
            during = bool(problem) and str(last_cell).startswith("test ")
            return collected, RunEnd(problem, called, during, str(last_cell)[5:] if during else "")

        def overran() -> str:
            where = last_cell if str(last_cell).startswith("test") else f"cell {last_cell}"
            return (f"{where} ran past the per-cell limit of {self.spec.cell_timeout} s and did not stop "
                    "when interrupted: the run was stopped")

        def kernel_ended() -> str:
            """Why nbgrader's kernel stopped sending before the collection was complete."""
            if time.monotonic() - cell_started >= self.spec.cell_timeout:
                return overran()
            where = f"while running {last_cell}" if str(last_cell).startswith("test") else f"in cell {last_cell}"
            return (f"the notebook's process ended {where} before the test's outputs were sent "
                    "(os._exit, a crash or the memory limit)")

        while True:
            now = time.monotonic()
            limit = min(deadline, total_deadline)
            if now >= limit:
                if limit == total_deadline:
                    return end(f"the notebook ran past the grader's total limit (last at {last_cell})")
                return end(overran())
            ready, _, _ = select.select([fd] + ([watch] if watch is not None else []), [], [], min(1.0, limit - now))
            if not ready:
                continue
            if fd not in ready:  # the driver answered: the kernel's run is over
                if not connected:
                    return collected, None
                if all(grade_id in collected for grade_id in tests):
                    return end("")
                # nbgrader stopped the notebook (a cell that ignored its interrupt, a dead kernel)
                # before the collector's last frame: the same end as when the FIFO closes first,
                # whichever of the two this machine happens to see first
                return end(kernel_ended())
            try:
                chunk = os.read(fd, 1 << 20)
            except BlockingIOError:
                continue
            if not chunk:
                if proc is None:
                    if not connected and watch is not None:
                        return collected, None
                    return end(kernel_ended())
                code = proc.poll()
                if code is None:
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        code = proc.wait(timeout=5)
                where = f"while running {last_cell}" if str(last_cell).startswith("test") else f"in cell {last_cell}"
                return end(f"the notebook's process ended {where} before the test's outputs were sent "
                           f"(exit status {code}: os._exit, a crash or the memory limit)")
            if not connected:
                self.first_frame_at = time.monotonic()
            connected = True
            buffer += chunk
            while True:
                if skipping:  # an oversized frame: keep its first bytes (the test's id), drop the rest
                    if len(skip_head) < 256:
                        take = buffer[:256 - len(skip_head)]
                        skip_head += take
                    drop = min(skipping, len(buffer))
                    del buffer[:drop]
                    skipping -= drop
                    if skipping:
                        break
                    grade_id = bytes(skip_head).partition(b"\0")[0].decode("utf-8", "replace")
                    if grade_id not in tests or grade_id in collected:
                        return end("the run sent outputs the grader did not ask for: stopped")
                    collected[grade_id] = Collected(None, f"the outputs were larger than {MAX_OUTPUT_BYTES // 2**20} MiB: "
                                                          "not read, scored 0", called=list(called))
                    if reply_fd is not None:
                        with contextlib.suppress(OSError):
                            os.write(reply_fd, b'{"visible_passed": {}}\n')
                    deadline = time.monotonic() + per_cell
                    continue
                if len(buffer) < 9:
                    break
                kind, size = bytes(buffer[:1]), struct.unpack(">Q", bytes(buffer[1:9]))[0]
                if size > MAX_OUTPUT_BYTES:
                    if kind != b"R":
                        return end("the run sent a message that is not in the grader's format: stopped")
                    del buffer[:9]
                    skipping, skip_head = size, bytearray()
                    continue
                if len(buffer) < 9 + size:
                    break
                payload = bytes(buffer[9:9 + size])
                del buffer[:9 + size]
                if kind == b"C":
                    try:
                        info = json.loads(payload)
                        last_cell = str(info["cell"])[:80]
                        called = [str(n)[:200] for n in info.get("called", [])][:100]
                    except Exception:
                        return end("the run sent a malformed progress message: stopped")
                    cell_started = time.monotonic()
                    deadline = time.monotonic() + per_cell
                elif kind == b"R":
                    head, _, body = payload.partition(b"\0")
                    grade_id = head.decode("utf-8", "replace")
                    if grade_id not in tests or grade_id in collected:
                        return end("the run sent outputs the grader did not ask for: stopped")
                    got = self._load(body, tests[grade_id])
                    called = got.called or called
                    collected[grade_id] = got
                    if reply_fd is not None:
                        visible = {}
                        for call, (passed, _) in zip(tests[grade_id].calls, got.judged or []):
                            if not call["hidden"]:
                                visible[call["checker"].removeprefix("check_")] = bool(passed and got.outputs is not None)
                        with contextlib.suppress(OSError):
                            os.write(reply_fd, (json.dumps({"visible_passed": visible}) + "\n").encode())
                    deadline = time.monotonic() + per_cell
                elif kind == b"D":
                    return end("")
                else:
                    return end("the run sent a message that is not in the grader's format: stopped")

    def _load(self, payload: bytes, test: TestPlan) -> "Collected":
        """torch.load(weights_only=True) on bytes from the sandbox, inside a guard; then validation,
        then judging, here in the grader's process."""
        import torch
        from transformer_lib.checks import get_checker
        from transformer_lib.checks.core import validate_outputs

        def bad(why: str, *names) -> Collected:
            return Collected(None, f"the outputs file was malformed or oddly typed ({why}): scored 0", *names)

        try:
            with zipfile.ZipFile(io.BytesIO(payload)) as archive:
                infos = archive.infolist()
                if sum(i.file_size for i in infos) > 4 * MAX_OUTPUT_BYTES or len(infos) > 100_000 or \
                        any(i.compress_type != zipfile.ZIP_STORED for i in infos):
                    return bad("unexpected archive contents")
            data = torch.load(io.BytesIO(payload), weights_only=True, map_location="cpu")
        except Exception as exc:
            return bad(f"it could not be read back safely: {type(exc).__name__}")
        if type(data) is not dict or type(data.get("calls")) is not list or data.get("grade_id") != test.grade_id:
            return bad("not the grader's format")
        names = []
        for key in ("forbidden_seen", "hidden_called", "called_during"):
            value = data.get(key, [])
            if type(value) is not list or not all(type(v) is str for v in value):
                return bad(f"{key} is not a list of names")
            names.append([v[:200] for v in value[:100]])
        if len(data["calls"]) != len(test.calls):
            return bad("wrong number of checks", *names)
        outputs = []
        for call, outs in zip(test.calls, data["calls"]):
            checker = get_checker(call["checker"])
            if type(outs) is dict:
                problem = validate_outputs([outs], 1)
                if problem or outs.get("__type__") != "error":
                    return bad(problem or "not the grader's format", *names)
                outputs.append(outs)
                continue
            problem = validate_outputs(outs, len(checker.cases(call["hidden"])))
            if problem:
                return bad(problem, *names)
            outputs.append(outs)
        got = Collected(outputs, "", *names)
        got.judged, got.english = self._judge(test, outputs)
        return got

    # -- tests that are not checker calls ------------------------------------------------------

    def kernel_verdict(self, test: TestPlan, autograded: dict) -> tuple[float, str, str, str]:
        """nbgrader's rule for a plain test cell, except that stderr output (a warning) costs nothing."""
        for cell in autograded.get("cells", []):
            if cell.get("metadata", {}).get("nbgrader", {}).get("grade_id") == test.grade_id:
                errors = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
                if errors:
                    why = f"{errors[0].get('ename', 'Error')}: {str(errors[0].get('evalue', ''))[:300]}"
                    return (0.0, f"\u2717 0/{test.points:g}: {self.public(why)}", f"failed in the notebook: {why}",
                            say("failed in the notebook: {why}", self.language, why=why))
                return test.points, say("\u2713 {score}: the test ran without an error.", self.language,
                                        score=f"{test.points:g}/{test.points:g}"), "", ""
        return 0.0, say("This test cell did not run.", self.language), "did not run", say("did not run", self.language)

    # -- results ---------------------------------------------------------------------------------

    def finish(self, autograded: dict, verdicts: dict, comments: dict) -> None:
        """Final scores into the private gradebook, verdicts into the notebook, then the feedback page."""
        from feedback import GRADING_KEY

        for cell in autograded.get("cells", []):
            gid = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
            if gid in verdicts:
                cell.setdefault("metadata", {})[GRADING_KEY] = {"verdict": self.public(verdicts[gid][1]),
                                                                "score": verdicts[gid][0]}
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
            message = self._driver_message(600)
        except OSError:
            pass
        finally:
            self._stop_driver()
        page = self.course / "feedback" / STUDENT / self.kit.chapter / f"{self.kit.chapter}.html"
        if page.exists():
            self.result["feedback"] = page.read_text()
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
                    comment.auto_comment = self.public("\n".join(comments[comment.name]))
            del sub
            gb.db.commit()


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


def _settled(got: "Collected | None") -> bool:
    """A result a run on its own could not change: it passed with less of the library than that run
    would have, or the answer is still the release's `raise NotImplementedError()`."""
    if got is None or got.outputs is None:
        return False
    if got.judged and all(passed for passed, _ in got.judged):
        return True
    flat = [o for call in got.outputs for o in (call if isinstance(call, list) else [call])]
    return bool(flat) and all(isinstance(o, dict) and o.get("__error__") == "NotImplementedError" for o in flat)


def _grader_limits() -> None:
    """The job's own nbgrader process is trusted code reading untrusted data: bound its memory."""
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (8 * 2**30, 8 * 2**30))


# -- the job's nbgrader process --------------------------------------------------------------------


def _driver(course: str, chapter: str) -> None:
    """`nbgrader autograde`, then (when the job says so, after it wrote the final scores into the
    private gradebook) `nbgrader generate_feedback`, in one process. Messages go to stdout as JSON
    lines; nbgrader's own output goes to stderr (the job's log)."""
    from traitlets.config.loader import PyFileConfigLoader

    protocol = sys.stdout
    sys.stdout = sys.stderr
    from nbgrader.apps import NbGraderAPI
    from nbgrader.coursedir import CourseDirectory

    config = PyFileConfigLoader("nbgrader_config.py", path=course).load_config()
    api = NbGraderAPI(coursedir=CourseDirectory(config=config), config=config)

    def say(result: dict) -> None:
        protocol.write(json.dumps({"success": bool(result.get("success")), "log": str(result.get("log", ""))[-20000:],
                                   "error": str(result.get("error", "") or "")[-5000:]}) + "\n")
        protocol.flush()

    autograded = Path(course) / "autograded" / STUDENT / chapter / f"{chapter}.ipynb"
    if not autograded.exists():
        say(api.autograde(chapter, STUDENT, force=True, create=True))
        if sys.stdin.readline().strip() != "feedback":
            return
    else:  # feedback only (nbgrader's run failed and the job wrote the notebook itself)
        if sys.stdin.readline().strip() != "feedback":
            return
    say(api.generate_feedback(chapter, STUDENT, force=True))


# -- a fork server for the job's nbgrader process --------------------------------------------------
#
# Importing nbgrader (nbconvert, traitlets, SQLAlchemy, jupyter_client) costs about 2.3 s of CPU,
# as much as a small chapter's whole run. One process per grader (per Dask worker) imports it once
# and forks a fresh copy for each job: the copy has never seen another job's data (the server
# reads no notebook), gets the job's environment, folder, pipes and memory limit, and is killed
# with its process group like the interpreter it replaces. If the server is not there (it died,
# or cannot start), the job starts an interpreter as before.


class _ForkedDriver:
    """What the job uses of a subprocess.Popen, for a driver forked by the server (not our child:
    the server reaps it)."""

    def __init__(self, pid: int, stdin, stdout):
        self.pid, self.stdin, self.stdout = pid, stdin, stdout

    def poll(self):
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return 0
        return None

    def kill(self) -> None:
        with contextlib.suppress(OSError):
            os.kill(self.pid, signal.SIGKILL)

    def wait(self, timeout: float | None = None):
        deadline = time.monotonic() + (timeout if timeout is not None else 10**9)
        while self.poll() is None:
            if time.monotonic() > deadline:
                raise subprocess.TimeoutExpired("nbgrader driver", timeout)
            time.sleep(0.02)
        for stream in (self.stdin, self.stdout):
            with contextlib.suppress(OSError):
                stream.close()
        return 0


class _Zygote:
    def __init__(self):
        import threading

        self.lock = threading.Lock()
        self.proc = None
        self.sock = None
        self.failed = False

    def _spawn(self) -> None:
        import socket

        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self.proc = subprocess.Popen([isolation.python_executable(), str(HERE / "jobs.py"), "--nbgrader-zygote",
                                      str(child.fileno())], pass_fds=(child.fileno(),), stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                                     cwd=tempfile.gettempdir())
        child.close()
        self.sock = parent
        parent.settimeout(120)
        if parent.recv(6) != b"ready\n":
            raise RuntimeError("the nbgrader fork server did not start")

    def start(self, course: str, chapter: str, env: dict, log) -> "_ForkedDriver | None":
        import socket

        if os.environ.get("COURSE_NO_FORK_SERVER") or self.failed:
            return None
        with self.lock:
            try:
                if self.proc is None or self.proc.poll() is not None:
                    self._spawn()
                in_read, in_write = os.pipe()
                out_read, out_write = os.pipe()
                request = json.dumps({"course": course, "chapter": chapter, "env": env}).encode()
                try:
                    socket.send_fds(self.sock, [struct.pack(">I", len(request)) + request],
                                    [in_read, out_write, log.fileno()])
                    pid = int(self.sock.recv(32).decode().strip() or "0")
                finally:
                    os.close(in_read)
                    os.close(out_write)
                if pid <= 0:
                    raise RuntimeError("the fork server gave no process")
                return _ForkedDriver(pid, os.fdopen(in_write, "wb"), os.fdopen(out_read, "rb"))
            except Exception:
                with contextlib.suppress(Exception):
                    os.close(in_write)
                    os.close(out_read)
                if self.proc is not None:
                    with contextlib.suppress(Exception):
                        self.proc.kill()
                self.proc = None
                self.failed = True  # this process starts drivers the plain way from now on
                return None


_ZYGOTE = _Zygote()


def _zygote(fd: int) -> None:
    """The fork server: import what the driver needs, then fork one driver per request."""
    import socket

    from traitlets.config.loader import PyFileConfigLoader  # noqa: F401
    from nbgrader.apps import NbGraderAPI  # noqa: F401
    from nbgrader.coursedir import CourseDirectory  # noqa: F401
    import sandboxed_kernel  # noqa: F401  (nbgrader's preprocessors for the job's config)
    import feedback  # noqa: F401

    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps the drivers
    sock = socket.socket(fileno=fd)
    sock.sendall(b"ready\n")
    while True:
        try:
            head, fds, _, _ = socket.recv_fds(sock, 4, 3)
        except OSError:
            return
        if len(head) < 4:
            return  # the grader is gone
        size = struct.unpack(">I", head)[0]
        body = b""
        while len(body) < size:
            chunk = sock.recv(size - len(body))
            if not chunk:
                return
            body += chunk
        request = json.loads(body)
        pid = os.fork()
        if pid == 0:
            try:
                os.setsid()
                sock.close()
                for target, source in zip((0, 1, 2), fds):
                    os.dup2(source, target)
                for source in fds:
                    os.close(source)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                os.environ.clear()
                os.environ.update(request["env"])
                os.chdir(request["course"])
                _grader_limits()
                sys.stdin = os.fdopen(0, "r")
                sys.stdout = os.fdopen(1, "w")
                sys.stderr = os.fdopen(2, "w")
                _driver(request["course"], request["chapter"])
            finally:
                with contextlib.suppress(Exception):
                    sys.stdout.flush()
                os._exit(0)
        for source in fds:
            os.close(source)
        sock.sendall(f"{pid}\n".encode())


if __name__ == "__main__" and sys.argv[1:2] == ["--nbgrader-driver"]:
    _driver(sys.argv[2], sys.argv[3])
elif __name__ == "__main__" and sys.argv[1:2] == ["--nbgrader-zygote"]:
    _zygote(int(sys.argv[2]))
