"""The job's nbgrader process (the driver): nbgrader's configuration for a job, the process that
runs nbgrader on it, and the job's end of that process's pipes.

Each job (autograder/jobs.py) grades on a private copy of the course that holds only its one
submission, with a gradebook without solutions. One process per job runs nbgrader on it:
`nbgrader autograde` (whose kernel runs in the sandbox, autograder/sandboxed_kernel.py) and then,
once the job has written the final scores into the private gradebook and sends the line
"feedback", `nbgrader generate_feedback` (with autograder/feedback.py). What it guarantees:

* nbgrader is trusted code reading untrusted data: the driver runs under a memory limit
  (`_grader_limits`), in a session of its own that the job kills with its process group;
* it speaks in JSON lines on stdout, {"success", "log", "error"}, one after each nbgrader step,
  bounded; nbgrader's own output goes to stderr (the job's log). `read_message`, the job's end,
  never waits past its timeout and gives None for a driver that died, overran or wrote more than
  4 MiB or something that is not JSON;
* the configuration (`nbgrader_config`) confines nbgrader to the private course and the job's
  timeouts, runs the kernel through sandboxed_kernel.SandboxedExecute, and builds the feedback
  page through feedback.py's preprocessors, with the kit's secrets scrubbed and only the release's
  own markdown trusted, in the submission's language.

A driver is forked by autograder/forkserver.py (which imports nbgrader once per grader), or,
without one, started as a fresh interpreter: `python driver.py --nbgrader-driver COURSE CHAPTER`.
"""

from __future__ import annotations

import json
import os
import select
import sys
import textwrap
import time
from pathlib import Path

from transformer_lib.language import ENGLISH, say  # no torch: the driver's process imports this module

STUDENT = "student"  # the student id inside a job's private course


def nbgrader_config(course: Path, kit, cell_timeout: int, language: str) -> str:
    """The job's nbgrader_config.py, for its private course at `course`."""
    secrets = json.dumps(kit.secrets)
    trusted = json.dumps(kit.release_markdown)
    return textwrap.dedent(f"""\
        c = get_config()  # noqa: F821
        c.CourseDirectory.root = {str(course)!r}
        c.CourseDirectory.course_id = {kit.course_id!r}
        c.CourseDirectory.source_directory = "source"
        c.CourseDirectory.release_directory = "release"
        c.CourseDirectory.submitted_directory = "submitted"
        c.CourseDirectory.autograded_directory = "autograded"
        c.CourseDirectory.feedback_directory = "feedback"
        c.CourseDirectory.db_url = {"sqlite:///" + str(course / "gradebook.db")!r}
        c.CourseDirectory.ignore = [".ipynb_checkpoints", "*.pyc", "__pycache__", "feedback", "*.py", "cited_figures.toml", "*.zh.toml"]
        c.Execute.timeout = {int(cell_timeout)}
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
        """) + _feedback_language(language)


def _feedback_language(language: str) -> str:
    """The feedback page's own sentences in the submission's language (its verdicts already are)."""
    if language == ENGLISH:
        return ""
    from feedback import BANNER, MISSING_VERDICT, SKIPPED_TEXT

    return (f"c.SafeOutputs.banner = {say(BANNER, language)!r}\n"
            f"c.SafeOutputs.skipped_text = {say(SKIPPED_TEXT, language)!r}\n"
            f"c.GraderVerdicts.missing = {say(MISSING_VERDICT, language)!r}\n")


def read_message(driver, timeout: float) -> dict | None:
    """The driver's next message, or None if it died or ran past `timeout`."""
    fd = driver.stdout.fileno()
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


def _grader_limits() -> None:
    """The job's own nbgrader process is trusted code reading untrusted data: bound its memory."""
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (8 * 2**30, 8 * 2**30))


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


if __name__ == "__main__" and sys.argv[1:2] == ["--nbgrader-driver"]:
    _driver(sys.argv[2], sys.argv[3])
