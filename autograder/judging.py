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
        message = message.replace(f"“{name}”", say("(a hidden case)", language))
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


# -- what the class report counts (autograder/class_report.py) ---------------------------------------

BLANK = "NotImplementedError"
POLICY_NAMES = ("used the reference implementation (grading policy)", "called a forbidden API (grading policy)")
_DIFFERS = [  # (pattern in a checker's English message, the generic line the class report shows)
    (r"your function raised ([A-Za-z_][\w.]*)", "raised {0}"),
    (r"wrong shape", "wrong shape"),
    (r"wrong dtype, expected (torch\.\w+), got (torch\.\w+)", "wrong dtype (expected {0}, got {1})"),
    (r"expected a torch\.Tensor, got (a numpy array|an? [\w.]+)", "not a torch.Tensor ({0})"),
    (r"expected floating point values \((torch\.\w+)\), got (torch\.\w+)", "wrong dtype (expected {0}, got {1})"),
    (r"entries differ", "some entries differ"),
    (r"NaN at index", "NaN where a number was expected"),
    (r"values differ", "values differ"),
    (r"expected \d+ items, got \d+", "wrong number of items"),
    (r"expected a (tuple|list) of \d+ items", "expected a {0}, got something else"),
    (r"expected a dict with keys", "not the expected dict"),
    (r"expected a number", "not a number"),
    (r"could not be compared", "the outputs could not be compared"),
    (r"expected outputs for \d+ cases", "wrong number of outputs"),
    (r"expected your function", "not a function"),
    (r"expected .+, got ", "wrong value"),
]


def differs_line(english: str) -> str:
    """The generic 'what differs' of a failed check (a kind of difference, never a case or its inputs)."""
    import re

    where = re.search(r"(output(?:\[[^\]]{1,20}\])+): ", english)
    for pattern, line in _DIFFERS:
        found = re.search(pattern, english)
        if found:
            said = line.format(*found.groups())
            return f"{where.group(1)}: {said}" if where else said
    return re.sub(r"\d+", "N", english.split(": ", 1)[-1])[:100]


def _limit(text: str) -> str | None:
    if "CellTimeout" in text or "per-cell limit" in text or "total limit" in text:
        return "ran past the time limit"
    if "MemoryError" in text or "memory limit" in text:
        return "the memory limit (or a crash)"
    return None


def outcome(test, got, flags: list[str], kit, score: float, order: int) -> dict:
    """What one checker-based test's answer did, for the class report: "passed", "mistake" (the
    checker's catalogue, or a property, named it; names in English, the same for both editions),
    "unnamed" (failed, with generic lines saying what differs), "blank" (the stub still raises
    NotImplementedError) or "limit" (time or memory). Holds no case, input or hidden test line."""
    from transformer_lib.checks import get_checker

    exercise = "+".join(dict.fromkeys(get_checker(c["checker"]).name for c in test.calls)) or test.grade_id
    found = {"exercise": exercise, "order": order, "outcome": "passed", "mistakes": [], "differs": []}
    own = [f.split(": ", 1)[1] for f in flags if f.startswith(f"{test.grade_id}: ")]
    policy_names = [POLICY_NAMES[0 if f.startswith("uses the reference") else 1] for f in own]
    if got is None or got.outputs is None:
        problem = "" if got is None else got.problem
        why = _limit(problem)
        found.update(outcome="limit" if why else "unnamed",
                     differs=[judging_public(why or differs_line(problem or "no outputs"), kit)])
        return found
    for call, outputs, (passed, _), english in zip(test.calls, got.outputs, got.judged, got.english or []):
        cases = outputs if isinstance(outputs, list) else [outputs]
        errors = [o.get("__error__", "") for o in cases if isinstance(o, dict) and o.get("__type__") == "error"]
        if passed:
            continue
        if BLANK in errors:
            found["outcome"] = "blank"
            break
        why = next(filter(None, map(_limit, errors)), None)
        if why:
            found["outcome"] = "limit"
            found["differs"].append(why)
            continue
        checker = get_checker(call["checker"])
        named = [m.name for m in checker.mistakes if english == m.message(checker.name, ENGLISH)]
        if not named and english.startswith(f"{checker.name}: your output shows "):
            named = [p.name for p in checker.properties if p.name in english]
        if named:
            found["mistakes"] += [n for n in named if n not in found["mistakes"]]
        else:
            found["differs"].append(judging_public(differs_line(english), kit))
    if found["outcome"] == "passed" and (found["mistakes"] or found["differs"] or score < test.points):
        found["outcome"] = "mistake" if found["mistakes"] else "unnamed"
    if policy_names and found["outcome"] in ("passed", "unnamed", "mistake"):
        found["mistakes"] += [n for n in policy_names if n not in found["mistakes"]]
        found["outcome"] = "mistake"
    if found["outcome"] == "unnamed" and not found["differs"]:
        found["differs"].append("scored 0")
    return found


def judging_public(text: str, kit) -> str:
    """`public` with the kit's secrets, and no hidden case's name."""
    text = public(text, kit.secrets)
    for cases in kit.hidden_cases.values():
        for described, name in cases:
            text = text.replace(described, "a hidden case").replace(name, "a hidden case") if len(name) >= 6 else text
    return text


def plain_outcome(test, score: float, order: int, deleted: bool) -> dict:
    """The same for a test cell without a checker (nbgrader's rule) or one the student deleted."""
    passed = score >= test.points and not deleted
    return {"exercise": test.grade_id, "order": order, "outcome": "passed" if passed else "unnamed", "mistakes": [],
            "differs": [] if passed else ["the test cell was deleted" if deleted else "an error in the test cell"]}
