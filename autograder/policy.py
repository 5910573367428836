"""The grading policy for answers that use what their exercise does not allow.

Two things cost a test its points however right its outputs are (README, "Grading policy"):

* **the reference implementation**: an answer that imports, names or calls the library's own
  answer to the exercise it is graded on (`from transformer_lib.attention import softmax` in
  the softmax exercise, or `check_softmax.reference`) scores 0 for that test, with a note. The
  grader hides these references while the learner's code runs (autograder/hiding.py), so a call
  fails anyway; the note says why.
* **a forbidden API**: an exercise may forbid calls that would make it trivial. Each checker
  declares them (`Checker.forbidden`: chapter 02's softmax forbids every PyTorch softmax, chapter
  11's sliding window forbids `dilated_mask`, ...). An answer that names one in its own code, or
  calls one while the grader runs it, scores 0 for that test, with a note.

Both show in the report (`autograder/report.csv`) and in the student's feedback.
"""

from __future__ import annotations

from transformer_lib.language import ENGLISH, say


def forbidden_for(checker) -> tuple[str, ...]:
    """The APIs an answer to `checker`'s exercise may not call (the checker's own declaration)."""
    return tuple(dict.fromkeys(getattr(checker, "forbidden", ()) or ()))


def flags_for(uses_reference: list[str], forbidden: list[str], language: str = ENGLISH) -> list[str]:
    """The notes a test's answer earns under the rules above (empty when it broke none), in `language`
    (the report's are English; the student's feedback is in the submission's language)."""
    flags = []
    if uses_reference:
        flags.append(say("uses the reference implementation ({names}), which answers may not use: scored 0 for "
                         "this test (grading policy)", language, names=", ".join(sorted(uses_reference))))
    if forbidden:
        flags.append(say("calls {names}, which this exercise forbids: scored 0 for this test (grading policy)",
                         language, names=", ".join(sorted(forbidden))))
    return flags


def score(points: float, passed: bool, flags: list[str]) -> float:
    """A checker-based test's score: the independent check's verdict, and 0 under any flag."""
    return points if passed and not flags else 0.0
