"""What `make grade` graded, so that the next run grades only what is new or changed.

The record is one file, autograder/graded.json, written by the grader process only (course.py
`grade`, never a job or a sandbox), atomically (a temporary file in the same folder, then
os.replace): a reader sees the old record or the new one, never half of one. It is keyed by
(student, chapter) and holds, for each submission graded:

* `submission`: the sha256 of the submitted notebook's bytes, as the job received them;
* `grading`: the digest of everything else its grade depends on: the chapter's kit digest
  (course.kit_digest: the solution and its Chinese text, the grader's code, the library, nbgrader's
  version), the cell timeout, the sandbox limits, the isolation mode and the versions of Python,
  torch and numpy that the sandboxes run; and, for a submission with a server time
  (autograder/received.json), that time, its due date with any extension and the late policy
  (deploy/hub/schedule.py SubmissionTime.digest_part): an extension granted after grading grades that
  submission again, so its gradebook row and feedback page lose the penalty;
* `score`, `max_score` and `notes`: exactly what the grade put in report.csv for it;
* `result`: the job's judged result (jobs.grade_job's dict) without the autograded notebook, the
  feedback page and the log, which live in their own files: status, scores per test, the report's
  notes, flags, the comments on the feedback page (the verdict messages, per answer cell),
  nbgrader's own scores, re-runs and timings, and any key a job adds later. A class report (named
  mistakes per exercise, say) can be rebuilt from it without running anything; a regrade replaces
  the entry, so a student who fixed a mistake no longer counts for it;
* `files`: the sizes of the feedback page and the autograded notebook that were written.

What it guarantees: a submission keeps its grade and feedback without a job only when
`unchanged()` holds for it (the same submission bytes and the same grading digest) AND its
feedback page and autograded notebook are still there at the size written AND the gradebook still
holds the submission at the recorded score (course.py checks the last two). Anything else is graded
again. A submission no longer in submitted/ drops out of the record; one the grader failed on (its
chapter could not be prepared, the job itself failed) is left out, so the next run grades it. A
record that is missing, unreadable, of another version or malformed counts as empty: everything is
graded (the log says so in one line), never a crash. `course.py grade --all` (`make grade
FORCE=1`) ignores the record and grades everything.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

VERSION = 1
RECORD = Path("autograder") / "graded.json"
# Not kept in the record: each is in its own file (autograded/, feedback/) or is only a log.
BULKY = ("autograded", "feedback", "log")


class Digest(NamedTuple):
    submission: str  # sha256 of the notebook's bytes
    grading: str  # grading_digest(): what else the grade depends on


def record_path(root: Path) -> Path:
    return Path(root) / RECORD


def empty() -> dict:
    return {"version": VERSION, "submissions": {}, "released": {}}


def submission_digest(raw: bytes) -> str:
    return hashlib.sha256(raw).hexdigest()


def grading_digest(kit_digest: str, cell_timeout, limits: dict | None, isolation: str,
                   deadline: dict | None = None) -> str:
    """The digest of what a grade depends on besides the submission. `deadline` only for a submission
    with a server time: without one the digest is what it always was."""
    from importlib import metadata

    def version(name: str) -> str:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return "(none)"

    parts = {"kit": kit_digest, "cell_timeout": cell_timeout, "limits": limits or {}, "isolation": isolation,
             "python": sys.version, "torch": version("torch"), "numpy": version("numpy")}
    if deadline is not None:
        parts["deadline"] = deadline
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:24]


def load(path: Path, log=None) -> dict:
    """The record at `path`; an empty one (everything is graded) when it is missing or unusable."""
    log = log or (lambda text: None)
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        log(f"no record of an earlier grading ({path}): grading every submission")
        return empty()
    except (OSError, ValueError) as exc:  # unreadable, not JSON, not UTF-8
        log(f"the record of the last grading ({path}) is unreadable ({type(exc).__name__}): grading every submission")
        return empty()
    if not _well_formed(data):
        log(f"the record of the last grading ({path}) is not one this grader wrote: grading every submission")
        return empty()
    return data


def _well_formed(data) -> bool:
    if not (isinstance(data, dict) and data.get("version") == VERSION and isinstance(data.get("submissions"), dict)
            and isinstance(data.get("released", {}), dict)):
        return False
    for chapters in data["submissions"].values():
        if not isinstance(chapters, dict) or not all(isinstance(e, dict) for e in chapters.values()):
            return False
    data.setdefault("released", {})
    return True


def save(path: Path, record: dict) -> None:
    """Write the record atomically: a temporary file beside it, then os.replace."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(record, f, indent=1, sort_keys=True, default=str)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def lookup(record: dict, key: tuple[str, str]) -> dict | None:
    student, chapter = key
    entry = record.get("submissions", {}).get(student, {}).get(chapter)
    return entry if isinstance(entry, dict) else None


def unchanged(record: dict, key: tuple[str, str], digest: Digest) -> bool:
    """The record holds a grade of exactly this submission, made the way it would be made now."""
    entry = lookup(record, key)
    return (entry is not None and entry.get("submission") == digest.submission and entry.get("grading") == digest.grading
            and isinstance(entry.get("score"), (int, float)) and isinstance(entry.get("max_score"), (int, float))
            and isinstance(entry.get("notes", []), list))


def files_intact(entry: dict, feedback: Path, autograded: Path) -> bool:
    """The feedback page and autograded notebook the grade wrote are still there, at the size written."""
    files = entry.get("files")
    if not isinstance(files, dict):
        return False
    for path, size in ((feedback, files.get("feedback")), (autograded, files.get("autograded"))):
        if size is None:
            if path == feedback:
                return False
            continue  # no autograded notebook was written (an unreadable submission)
        try:
            if path.stat().st_size != size:
                return False
        except OSError:
            return False
    return True


def put(record: dict, key: tuple[str, str], digest: Digest, result: dict, score: float, max_score: float,
        notes: list[str], feedback: Path, autograded: Path) -> None:
    """Record one graded submission (after its gradebook rows and files are written)."""
    def size(path: Path, written) -> int | None:
        try:
            return path.stat().st_size if written else None
        except OSError:
            return None

    student, chapter = key
    record.setdefault("submissions", {}).setdefault(student, {})[chapter] = {
        "submission": digest.submission, "grading": digest.grading, "graded_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "score": float(score), "max_score": float(max_score), "notes": list(notes),
        "result": json.loads(json.dumps({k: v for k, v in result.items() if k not in BULKY}, default=str)),
        "files": {"feedback": size(feedback, True), "autograded": size(autograded, result.get("autograded"))}}


def drop(record: dict, key: tuple[str, str]) -> None:
    student, chapter = key
    chapters = record.get("submissions", {}).get(student)
    if chapters is not None:
        chapters.pop(chapter, None)
        if not chapters:
            record["submissions"].pop(student, None)


def keep_only(record: dict, keys) -> None:
    """Drop every submission not in `keys` (a student or chapter gone from submitted/)."""
    keys = set(keys)
    for student, chapters in list(record.get("submissions", {}).items()):
        for chapter in list(chapters):
            if (student, chapter) not in keys:
                drop(record, (student, chapter))
