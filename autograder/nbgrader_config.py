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
from feedback import ShortenTestTracebacks  # noqa: E402

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
c.CourseDirectory.ignore = [".ipynb_checkpoints", "*.pyc", "__pycache__", "feedback", "*.py", "jupytext.toml"]

# Students' notebooks run with a per-cell limit: an endless loop costs that cell, not
# the whole run. nbgrader 0.9 reads Execute.timeout (ExecutePreprocessor.timeout loses to it).
c.Execute.timeout = int(os.environ.get("COURSE_CELL_TIMEOUT", "120"))

# Feedback must not reveal hidden tests (nbgrader shows them by default).
c.GenerateFeedback.preprocessors = [
    "nbgrader.preprocessors.GetGrades",
    "nbgrader.preprocessors.ClearHiddenTests",
    ShortenTestTracebacks,
    "nbconvert.preprocessors.CSSHTMLHeaderPreprocessor",
]
c.ClearHiddenTests.enforce_metadata = False

# The release keeps nothing from the solutions' outputs.
c.ClearOutput.enabled = True
