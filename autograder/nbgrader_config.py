"""nbgrader configuration for the course.

Run every nbgrader command from the repository root with
`--config autograder/nbgrader_config.py` (the Makefile does). nbgrader's directory names
are pointed at the course layout instead of renaming it:

    solutions/                    source: full solutions, visible and hidden tests
    chapters/                     release: what learners open (committed, generated)
    autograder/submitted/         submissions, one folder per student
    autograder/autograded/        nbgrader's executed, scored copies
    autograder/feedback/          HTML feedback per student
    autograder/gradebook.db       the gradebook (SQLite)
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from feedback import GraderVerdicts, SafeOutputs, ScrubHidden, ShortenTestTracebacks, WrapVerdicts, markdown_digest  # noqa: E402

c = get_config()  # noqa: F821 (provided by traitlets when the file is loaded)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

c.CourseDirectory.root = ROOT
c.CourseDirectory.course_id = "transformer-course"
c.CourseDirectory.source_directory = "solutions"
c.CourseDirectory.release_directory = "chapters"
c.CourseDirectory.submitted_directory = os.path.join("autograder", "submitted")
c.CourseDirectory.autograded_directory = os.path.join("autograder", "autograded")
c.CourseDirectory.feedback_directory = os.path.join("autograder", "feedback")
c.CourseDirectory.db_url = "sqlite:///" + os.path.join(ROOT, "autograder", "gradebook.db")
# The jupytext sources (*.py) are the maintainers' editing format; they hold the
# solutions, so they must never be copied into a release or a submission.
c.CourseDirectory.ignore = [".ipynb_checkpoints", "*.pyc", "__pycache__", "feedback", "*.py", "jupytext.toml", "cited_figures.toml", "*.zh.toml"]

# Students' notebooks run with a per-cell limit: an endless loop costs that cell, not
# the whole run. nbgrader 0.9 reads Execute.timeout (ExecutePreprocessor.timeout loses to it).
c.Execute.timeout = int(os.environ.get("COURSE_CELL_TIMEOUT", "120"))

# Autograding runs submitted code: only `make grade` may do it (autograder/course.py), which runs
# each submission in its own job with the kernel sandboxed, under a configuration of its own.
# Started any other way (Formgrader's autograde button, `nbgrader autograde` by hand), it refuses.
from nbgrader.preprocessors import NbGraderPreprocessor  # noqa: E402


class RefuseUnsandboxedAutograde(NbGraderPreprocessor):
    def preprocess(self, nb, resources):
        raise RuntimeError("autograding runs submitted code, which only `make grade` runs sandboxed "
                           "(autograder/course.py); run `make grade` instead of nbgrader autograde")


c.Autograde.autograde_preprocessors = [RefuseUnsandboxedAutograde]

# Feedback must not reveal hidden tests (nbgrader shows them by default), nor render what the
# student's code printed as HTML (autograder/feedback.py). `make grade` writes feedback itself,
# with the same preprocessors; these apply when an instructor regenerates it from Formgrader.
c.GenerateFeedback.preprocessors = [
    "nbgrader.preprocessors.GetGrades",
    "nbgrader.preprocessors.ClearHiddenTests",
    ShortenTestTracebacks,
    GraderVerdicts,
    SafeOutputs,
    ScrubHidden,
    WrapVerdicts,
    "nbconvert.preprocessors.CSSHTMLHeaderPreprocessor",
]
c.ClearHiddenTests.enforce_metadata = False
c.HTMLExporter.sanitize_html = True


def _course_text():
    """Digests of the release's markdown, English and Chinese (shown as it is), and the hidden test lines (scrubbed)."""
    import json
    import re

    trusted, secrets = [], []
    for folder, collect in (("chapters", "markdown"), (os.path.join("chapters", "zh"), "markdown"), ("solutions", "hidden")):
        base = os.path.join(ROOT, folder)
        for chapter in sorted(os.listdir(base)) if os.path.isdir(base) else []:
            path = os.path.join(base, chapter, chapter + ".ipynb")
            try:
                cells = json.load(open(path))["cells"]
            except (OSError, ValueError, KeyError):
                continue
            for cell in cells:
                source = "".join(cell.get("source", ""))
                if collect == "markdown" and cell.get("cell_type") == "markdown":
                    trusted.append(markdown_digest(source))
                elif collect == "hidden":
                    for region in re.findall(r"### BEGIN HIDDEN TESTS\n(.*?)### END HIDDEN TESTS", source, re.S):
                        secrets += [line.strip() for line in region.splitlines() if len(line.strip()) >= 6]
    return trusted, secrets


c.SafeOutputs.trusted_markdown, c.ScrubHidden.secrets = _course_text()

# The release keeps nothing from the solutions' outputs.
c.ClearOutput.enabled = True
