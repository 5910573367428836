"""nbgrader's exchange classes, for an exchange root that nobody but root may write.

nbgrader 0.9.6 checks that the exchange root is writable by whoever runs a step (every student's
fetch, submit, list and fetch_feedback), and its release makes the root 0777 again each time. In a
root that everyone may write, a student can create a course's folder before the instructor does,
or rename the course's folder away and put their own in its place. These classes only ask to pass
through the root; everything else is nbgrader's own. The students' and the instructor's nbgrader
configurations name them (`c.ExchangeFactory.<step> = "course_exchange.<Class>"`, see CLASSES).
"""

from __future__ import annotations

import os

from nbgrader.exchange import default


class _PassThroughRoot:
    def ensure_root(self):
        # os.access as nbgrader's own checks do: the root must exist and be searchable, nothing more
        if not (os.path.isdir(self.root) and os.access(self.root, os.X_OK)):
            self.fail(f"The exchange {self.root} is missing or cannot be entered: please tell your instructor")


class ExchangeFetchAssignment(_PassThroughRoot, default.ExchangeFetchAssignment):
    pass


class ExchangeFetchFeedback(_PassThroughRoot, default.ExchangeFetchFeedback):
    pass


class ExchangeSubmit(_PassThroughRoot, default.ExchangeSubmit):
    pass


class ExchangeList(_PassThroughRoot, default.ExchangeList):
    pass


class ExchangeReleaseAssignment(_PassThroughRoot, default.ExchangeReleaseAssignment):
    pass


class ExchangeReleaseFeedback(_PassThroughRoot, default.ExchangeReleaseFeedback):
    pass


class ExchangeCollect(_PassThroughRoot, default.ExchangeCollect):
    pass


STEPS = ("fetch_assignment", "fetch_feedback", "submit", "list", "release_assignment", "release_feedback", "collect")
CLASSES = {step: f"course_exchange.Exchange{''.join(w.title() for w in step.split('_'))}" for step in STEPS}


def config_lines() -> str:
    """The lines of an nbgrader_config.py that select these classes (this module must be importable)."""
    return "".join(f"c.ExchangeFactory.{step} = {name!r}\n" for step, name in CLASSES.items())
