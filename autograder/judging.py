"""Judging: from what a run collected for a test to its score and the words that explain it.

Each function here is a plain function of what it is given (the test's plan, what the runs
collected, the chapter's kit, the rebuilt submission, the student's language); autograder/jobs.py
calls them for each test once the runs are over, and `judge` for each test's outputs as they
arrive (autograder/frames.py). What they guarantee:

* a checker-based test is judged here, in the grader's process, by the checker itself on outputs
  already validated (frames.load); an exception while comparing scores 0 with a note, never
  fails the job;
* the grading policy (autograder/policy.py) applies to every checker-based test: an answer that
  used the reference it is graded against, or an API its exercise forbids, is flagged (the flag
  goes to the report) and scored by the policy, whatever its outputs;
* a plain test cell follows nbgrader's rule (an error output fails it), except that stderr output
  (a warning) costs nothing;
* what the student reads (verdicts, the gradebook's comments) is in the submission's language and
  never shows a hidden case's description or name, nor any of the kit's secrets (`public`); the
  report's notes stay English.
"""

from __future__ import annotations

import policy
import sanitize
from transformer_lib.language import ENGLISH, say


def verdict(test, got, kit, clean: sanitize.Sanitized, language: str,
            report_flags: list) -> tuple[float, str, str, str]:
    """(score, verdict shown to the student, note for the report, the note in the student's language) for
    one checker-based test. Its policy flags are appended to `report_flags` ("grade_id: flag")."""
    sources = learner_sources(test, kit, clean, before_only=True)
    references = [f"{m}.{n}" for m, n in test.hidden]
    uses_ref = set(sanitize.uses_reference(sources, references, test.checker_names, set(kit.release_lines)))
    uses_ref |= {name for name in got.called_during if name in references}
    answer_sources = learner_sources(test, kit, clean, before_only=False)
    forbidden = sorted(set(sanitize.uses_forbidden(answer_sources, test.forbidden, set(kit.release_lines)))
                       | set(got.seen))
    flags = policy.flags_for(sorted(uses_ref), forbidden)
    for flag in flags:
        report_flags.append(f"{test.grade_id}: {flag}")
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
        said = say("; ", language).join(policy.flags_for(sorted(uses_ref), forbidden, language))
        verdict = say("\u2717 {score}: {flags}.", language, score=score, flags=said)
        return points, verdict + (say(" ({message})", language, message=message) if message else ""), note, said
    if passed:
        return test.points, say("\u2713 {score}: every case of this test matches the reference.", language,
                                score=score), "", ""
    return (0.0, f"\u2717 {score}: {message}",
            say("failed the independent check: {message}", ENGLISH, message=in_english),
            say("failed the independent check: {message}", language, message=message))


def judge(test, outputs: list, kit, language: str) -> tuple[list[tuple[bool, str]], list[str]]:
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
            verdict = checker.judge(call_outputs, call["hidden"], language)
        except Exception as exc:  # validated outputs should never get here; if they do, 0 with a note
            judged.append((False, say("{exercise}: the outputs could not be compared ({error})", language,
                                      exercise=checker.name, error=type(exc).__name__)))
            english.append(say("{exercise}: the outputs could not be compared ({error})", ENGLISH,
                               exercise=checker.name, error=type(exc).__name__))
            continue
        if verdict.passed:
            judged.append((True, verdict.message))
            english.append(verdict.english)
        else:
            judged.append((False, hide_cases(verdict.message, checker.name, language, kit)))
            english.append(hide_cases(verdict.english, checker.name, ENGLISH, kit))
    return judged, english


def hide_cases(message: str, checker_name: str, language: str, kit) -> str:
    if language == ENGLISH:
        for described, name in kit.hidden_cases.get(checker_name, []):
            message = message.replace(described, "a hidden case").replace(f"'{name}'", "(a hidden case)")
        return message
    for described, name in kit.hidden_cases_zh.get(checker_name, []):
        message = message.replace(described, say("a hidden case", language))
        message = message.replace(f"「{name}」", say("(a hidden case)", language))
    return message


def public(text: str, secrets: list[str]) -> str:
    for secret in sorted(secrets, key=len, reverse=True):
        if secret:
            text = text.replace(secret, "[hidden]")
    return text


def learner_sources(test, kit, clean: sanitize.Sanitized, before_only: bool) -> list[str]:
    """The learner's code cells before `test`'s cell; with before_only=False only those since the
    previous test cell (the answer to this exercise)."""
    cells = clean.notebook["cells"]
    learner = set(clean.learner_cells)
    test_ids = {t.grade_id for t in kit.tests}
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


def kernel_verdict(test, autograded: dict, kit, language: str) -> tuple[float, str, str, str]:
    """nbgrader's rule for a plain test cell, except that stderr output (a warning) costs nothing."""
    for cell in autograded.get("cells", []):
        if cell.get("metadata", {}).get("nbgrader", {}).get("grade_id") == test.grade_id:
            errors = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
            if errors:
                why = f"{errors[0].get('ename', 'Error')}: {str(errors[0].get('evalue', ''))[:300]}"
                return (0.0, f"\u2717 0/{test.points:g}: {public(why, kit.secrets)}", f"failed in the notebook: {why}",
                        say("failed in the notebook: {why}", language, why=why))
            return test.points, say("\u2713 {score}: the test ran without an error.", language,
                                    score=f"{test.points:g}/{test.points:g}"), "", ""
    return 0.0, say("This test cell did not run.", language), "did not run", say("did not run", language)
