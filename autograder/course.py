"""The instructor's commands: release the chapters, grade every submission.

    python autograder/course.py release [CHAPTER ...]
    python autograder/course.py grade [--root DIR] [--cell-timeout S] [--jobs N] [--scheduler ADDRESS] [--all]

Both drive real nbgrader (generate_assignment, autograde, generate_feedback, export). `grade`
treats every submission as hostile:

* one job per submission and chapter (autograder/jobs.py), run in parallel on this machine's
  cores (`--jobs`) or on a Dask cluster (`--scheduler tcp://host:8786`), the same code either
  way; this process alone writes the gradebook, grades.csv, report.csv and the feedback pages;
* in a job, submitted code runs only in the sandbox of autograder/isolation.py (bubblewrap:
  unprivileged, no network, nothing of the course visible, limits, its own PID namespace), both
  in nbgrader's kernel and in the independent check, and without the reference implementations
  of the functions being graded (autograder/hiding.py);
* scores of checker-based tests come only from the independent check, judged by the grader on
  outputs read back defensively; answers that use the reference or a forbidden API score 0 for
  that test (autograder/policy.py);
* a report that says why a cell scored zero (a deleted test cell, an unreadable notebook, a
  hang, a dead kernel, a malformed outputs file, the policy), instead of a silent gap;
* a later submission replaces the earlier one (nbgrader collect --update replaces its folder), and
  a run grades only the submissions new or changed since the last one: the others keep their
  grades and feedback (autograder/regrade.py: the record, and when it holds); `--all` grades all;
* on a class's hub, a submission counts at the time the exchange received it
  (autograder/received.json), against the chapter's due date, the student's extension and the late
  policy (deploy/hub/schedule.py): the penalty is in the gradebook, grades.csv, report.csv and the
  feedback page, and a timestamp.txt that claims an earlier time is named in the report. Without
  received.json (a learner grading their own work) nothing of this applies.
"""

from __future__ import annotations

import argparse
import ast
import concurrent.futures
import contextlib
import csv
import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from transformer_lib import safe_ast  # noqa: E402  (ast.parse is not thread-safe on 3.11: kits are built in threads)
from transformer_lib.language import CHINESE, say  # noqa: E402


# -- the course on disk ---------------------------------------------------------------


@dataclass
class Course:
    root: Path

    @property
    def solutions(self) -> Path:
        return self.root / "solutions"

    @property
    def chapters_dir(self) -> Path:
        return self.root / "chapters"

    @property
    def submitted(self) -> Path:
        return self.root / "autograder" / "submitted"

    @property
    def autograded(self) -> Path:
        return self.root / "autograder" / "autograded"

    @property
    def feedback(self) -> Path:
        return self.root / "autograder" / "feedback"

    @property
    def db_url(self) -> str:
        return "sqlite:///" + str(self.root / "autograder" / "gradebook.db")

    def chapters(self) -> list[str]:
        return sorted(p.name for p in self.solutions.iterdir() if p.is_dir() and (p / f"{p.name}.ipynb").exists())

    def students(self) -> list[str]:
        if not self.submitted.exists():
            return []
        return sorted(p.name for p in self.submitted.iterdir() if p.is_dir() and not p.name.startswith("."))

    def nbgrader(self, *args: str, cell_timeout: int | None = None, check: bool = True) -> subprocess.CompletedProcess:
        """Run one nbgrader command on this course, with the course's configuration."""
        env = dict(os.environ)
        env["JUPYTER_CONFIG_PATH"] = str(self.root / "autograder")
        # nbgrader calls alembic and jupyter by name: put this interpreter's bin first.
        env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
        env.setdefault("PYTHONHASHSEED", "0")
        if cell_timeout is not None:
            env["COURSE_CELL_TIMEOUT"] = str(cell_timeout)
        proc = subprocess.run(
            [sys.executable, "-m", "nbgrader", *args],
            cwd=self.root, env=env, capture_output=True, text=True,
        )
        if check and proc.returncode != 0:
            raise RuntimeError(f"nbgrader {' '.join(args)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")
        return proc


# nbgrader generate_assignment for several chapters in one process: nbgrader's start-up and the
# course configuration (which reads every chapter, autograder/nbgrader_config.py) cost about 2 s,
# paid once instead of once a chapter. Each chapter is exactly what `nbgrader generate_assignment
# CHAPTER --force` makes: the same application class, with the course's configuration.
_GENERATE_ASSIGNMENTS = """
import sys
from nbgrader.apps import NbGraderAPI
from nbgrader.apps.nbgraderapp import NbGraderApp

app = NbGraderApp.instance()
app.load_config_file()
config = app.config
release_directory, chapters = sys.argv[1], sys.argv[2:]
if release_directory:
    config.CourseDirectory.release_directory = release_directory
api = NbGraderAPI(config=config)
for chapter in chapters:
    result = api.generate_assignment(chapter, force=True)
    if not result["success"]:
        sys.exit(f"nbgrader generate_assignment {chapter} failed:\\n{result.get('log', '')}\\n{result.get('error', '')}")
"""


def generate_assignments(course: Course, chapters: list[str], release_dir: str | None = None) -> None:
    env = dict(os.environ, JUPYTER_CONFIG_PATH=str(course.root / "autograder"),
               PATH=str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""))
    env.setdefault("PYTHONHASHSEED", "0")
    proc = subprocess.run([sys.executable, "-c", _GENERATE_ASSIGNMENTS, release_dir or "", *chapters],
                          cwd=course.root, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"nbgrader generate_assignment failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")


# -- release ---------------------------------------------------------------------------


class LearnerWorkFound(RuntimeError):
    """A release would overwrite a notebook a learner has worked in."""


def learner_work(notebook_path: Path) -> list[str]:
    """Why `notebook_path` looks like a learner's work in progress (empty when it is a clean release).

    A release has no outputs and every nbgrader cell still matches the checksum nbgrader
    stored when it generated the release; a learner's notebook has run cells or edited ones."""
    import nbformat
    from nbgrader.utils import compute_checksum

    if not notebook_path.exists():
        return []
    try:
        nb = nbformat.read(notebook_path, as_version=4)
    except Exception as exc:  # unreadable: not ours to overwrite either
        return [f"it cannot be read as a notebook ({type(exc).__name__})"]
    reasons = []
    if any(c.cell_type == "code" and (c.get("outputs") or c.get("execution_count")) for c in nb.cells):
        reasons.append("cells have been run")
    edited = [c.metadata["nbgrader"].get("grade_id", "?") for c in nb.cells
              if "checksum" in c.metadata.get("nbgrader", {}) and compute_checksum(c) != c.metadata["nbgrader"]["checksum"]]
    if edited:
        reasons.append(f"cells were edited ({', '.join(edited[:5])})")
    return reasons


def release(course: Course, chapters: list[str] | None = None, release_dir: str | None = None,
            force: bool = False) -> None:
    """Regenerate the learners' notebooks from the solutions with nbgrader generate_assignment.

    Refuses (unless `force`) to overwrite a notebook in the release folder that a learner has
    worked in: `make lab` serves that very folder, and their answers live nowhere else."""
    selected = chapters or course.chapters()
    out = course.root / release_dir if release_dir else course.chapters_dir
    if not force and release_dir is None:
        for chapter in selected:
            for path in (out / chapter / f"{chapter}.ipynb", out / CHINESE / chapter / f"{chapter}.ipynb"):
                reasons = learner_work(path)
                if reasons:
                    raise LearnerWorkFound(
                        f"{path.relative_to(course.root)} holds a learner's work ({'; '.join(reasons)}). "
                        f"Release would overwrite it: move it somewhere safe first, or run `make release FORCE=1` "
                        f"to overwrite it anyway.")
    generate_assignments(course, selected, release_dir)
    if release_dir is None:  # the learners' release; the grader's own copies need no Chinese
        for chapter in selected:
            release_chinese(course, chapter, out)


# CHINESE ("zh", from transformer_lib.language): chapters/zh/NN_name/NN_name.ipynb is the release's Chinese edition


def release_chinese(course: Course, chapter: str, out: Path) -> Path | None:
    """chapters/zh/<chapter>/<chapter>.ipynb: the English release with every markdown cell replaced by
    its Chinese twin (solutions/<chapter>/<chapter>.zh.toml) and the code cells' comments and docstrings
    by their Chinese (<chapter>.code.zh.toml); the code itself, ids and nbgrader metadata shared (the
    checksum of a graded cell whose comments changed is nbgrader's for the Chinese cell). A chapter
    whose Chinese text is not complete gets none (and says so); a comment still without Chinese stays
    English (and is named)."""
    import nbformat
    import translations

    twins = course.solutions / chapter / f"{chapter}.zh.toml"
    target = out / CHINESE / chapter / f"{chapter}.ipynb"
    if not twins.exists():
        return None
    english = nbformat.read(out / chapter / f"{chapter}.ipynb", as_version=4)
    try:
        chinese = translations.translate(english, twins)
    except ValueError as exc:
        print(f"{chapter}: no Chinese release: {exc}", file=sys.stderr)
        return None
    english_left = [u for c in chinese.cells if c.cell_type == "code" for u in translations.code_units(c.source)
                    if u.needs_translation]
    if english_left:
        print(f"{chapter}: {len(english_left)} comment(s)/docstring(s) of the Chinese release still in English "
              f"(first: {english_left[0].text.strip()[:60]!r}); `python autograder/translations.py status` lists them",
              file=sys.stderr)
    target.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(chinese, target)
    return target


# -- what the tests of a chapter call ---------------------------------------------------


@dataclass
class CheckerCall:
    checker: str  # e.g. "check_softmax"
    function: str  # the expression passed to it, e.g. "softmax"
    hidden: bool


def checker_calls(test_source: str) -> list[CheckerCall]:
    """The `check_<name>(function, hidden=...)` calls of a test cell.

    Test cells of this course contain only such calls (tests/test_release.py holds
    every solution notebook to that), so these calls are the whole test.
    """
    calls = []
    for node in ast.walk(safe_ast.parse(test_source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id.startswith("check_"):
            hidden = any(k.arg == "hidden" and isinstance(k.value, ast.Constant) and k.value.value is True for k in node.keywords)
            if node.args:
                calls.append(CheckerCall(node.func.id, ast.unparse(node.args[0]), hidden))
    return calls


def original_tests(course: Course, chapter: str) -> dict[str, str]:
    """grade_id -> source of every graded test cell, as the solutions have it (never the submission's)."""
    import nbformat

    nb = nbformat.read(course.solutions / chapter / f"{chapter}.ipynb", as_version=4)
    tests = {}
    for cell in nb.cells:
        meta = cell.metadata.get("nbgrader", {})
        if meta.get("grade") and not meta.get("solution") and cell.cell_type == "code":
            tests[meta["grade_id"]] = cell.source
    return tests


def answer_cells(course: Course, chapter: str) -> dict[str, str]:
    """test grade_id -> grade_id of the answer cell it tests (the last one before it)."""
    import nbformat

    nb = nbformat.read(course.solutions / chapter / f"{chapter}.ipynb", as_version=4)
    answers, last_answer = {}, None
    for cell in nb.cells:
        meta = cell.metadata.get("nbgrader", {})
        if meta.get("solution"):
            last_answer = meta["grade_id"]
        elif meta.get("grade") and last_answer is not None:
            answers[meta["grade_id"]] = last_answer
    return answers


# -- a chapter's kit: what every job of the chapter needs, from the grader's own sources -----------


HIDDEN_REGION = re.compile(r"^[ \t]*### BEGIN HIDDEN TESTS.*?^[ \t]*### END HIDDEN TESTS[ \t]*\n?", re.S | re.M)


def hidden_lines(test_source: str) -> list[str]:
    lines = []
    for region in re.findall(r"### BEGIN HIDDEN TESTS\n(.*?)### END HIDDEN TESTS", test_source, re.S):
        lines += [line.strip() for line in region.splitlines() if line.strip()]
    return lines


def _template_config(root: Path) -> str:
    return "\n".join([
        "c = get_config()  # noqa: F821",
        f"c.CourseDirectory.root = {str(root)!r}",
        "c.CourseDirectory.course_id = 'transformer-course'",
        "c.CourseDirectory.source_directory = 'source'",
        "c.CourseDirectory.release_directory = 'release'",
        f"c.CourseDirectory.db_url = {'sqlite:///' + str(root / 'gradebook.db')!r}",
        "c.CourseDirectory.ignore = ['.ipynb_checkpoints', '*.pyc', '__pycache__', 'feedback', '*.py', 'jupytext.toml', 'cited_figures.toml', '*.zh.toml']",
        "c.ClearHiddenTests.enforce_metadata = False",
        "c.ClearOutput.enabled = True",
    ]) + "\n"


def build_kit(course: Course, chapter: str) -> "jobs.ChapterKit":
    """Everything a job of `chapter` needs, made from solutions/ by the grader: the tests and their
    checker calls, the release's skeleton and a gradebook that holds no solution and, for
    checker-based tests, no hidden test source (the independent check runs those; the kernel never
    sees them)."""
    import sqlite3

    import nbformat
    from nbgrader.utils import compute_checksum
    from transformer_lib.checks import get_checker

    import hiding
    import jobs
    import policy
    import sanitize

    solution = nbformat.read(course.solutions / chapter / f"{chapter}.ipynb", as_version=4)
    answers = answer_cells(course, chapter)
    tests: list[jobs.TestPlan] = []
    full_sources: dict[str, str] = {}
    secrets: set[str] = set()
    hidden_names: set[str] = set()
    hidden_cases: dict[str, list[tuple[str, str]]] = {}
    hidden_cases_zh: dict[str, list[tuple[str, str]]] = {}
    every_case: dict[str, list] = {}  # checker name -> its cases, visible and hidden
    for cell in solution.cells:
        meta = cell.metadata.get("nbgrader", {})
        if not (meta.get("grade") and not meta.get("solution") and cell.cell_type == "code"):
            continue
        calls = checker_calls(cell.source)
        full_sources[meta["grade_id"]] = cell.source
        secrets.update(hidden_lines(cell.source))
        hidden, forbidden, names = [], [], []
        for call in calls:
            checker = get_checker(call.checker)
            refs, problems = hiding.references_of(checker)
            hidden += [(h.module, h.name) for h in refs]
            forbidden += policy.forbidden_for(checker)
            names.append(call.checker)
            if checker.name not in every_case:  # building cases holds the checks' lock: once per checker
                every_case[checker.name] = checker.cases(hidden=True)
            hidden_ones = [c for c in every_case[checker.name] if c.hidden]
            cases = [(c.describe(), c.name) for c in hidden_ones]
            hidden_cases[checker.name] = cases
            secrets.update(d for d, _ in cases)
            cases_zh = [(c.describe(CHINESE), say(c.name, CHINESE)) for c in hidden_ones]
            hidden_cases_zh[checker.name] = cases_zh
            secrets.update(d for d, _ in cases_zh)
            hidden_names.update(n for _, n in cases if len(n) >= 10 or " " in n)
        if calls:  # the grader runs these itself: the kernel gets the visible part only
            cell.source = HIDDEN_REGION.sub("", cell.source).rstrip("\n")
        tests.append(jobs.TestPlan(
            grade_id=meta["grade_id"], points=float(meta.get("points", 0)), answer_id=answers.get(meta["grade_id"]),
            calls=[{"checker": c.checker, "function": c.function, "hidden": c.hidden} for c in calls],
            hidden=sorted(set(hidden)), forbidden=list(dict.fromkeys(forbidden)), checker_names=sorted(set(names))))

    with tempfile.TemporaryDirectory(prefix="course-kit-") as tmp:
        root = Path(tmp)
        (root / "source" / chapter).mkdir(parents=True)
        nbformat.write(solution, root / "source" / chapter / f"{chapter}.ipynb")
        (root / "nbgrader_config.py").write_text(_template_config(root))
        env = dict(os.environ, JUPYTER_CONFIG_PATH=str(root), JUPYTER_CONFIG_DIR=str(root / ".jupyter"),
                   PATH=str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""))
        proc = subprocess.run([sys.executable, "-m", "nbgrader", "generate_assignment", chapter, "--force"],
                              cwd=root, env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"nbgrader generate_assignment {chapter} (grading copy) failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
        release_nb = nbformat.read(root / "release" / chapter / f"{chapter}.ipynb", as_version=4)
        gradebook = (root / "gradebook.db").read_bytes()
        db = sqlite3.connect(root / "gradebook.db")
        try:
            stored = {name: (source, checksum, ctype) for name, source, checksum, ctype in db.execute(
                "SELECT name, source, checksum, cell_type FROM source_cell")}
        finally:
            db.close()

    visible_names = {c.name for cases in every_case.values() for c in cases if not c.hidden}
    secrets.update(hidden_names - visible_names)
    templates = []
    test_ids = {t.grade_id for t in tests}
    for cell in release_nb.cells:
        meta = cell.metadata.get("nbgrader", {})
        gid = meta.get("grade_id")
        if not gid:
            continue
        metadata = json.loads(json.dumps(cell.metadata))
        source, checksum, ctype = stored.get(gid, (cell.source, meta.get("checksum"), cell.cell_type))
        kind = "test" if gid in test_ids else ("answer" if meta.get("solution") else "other")
        if kind != "answer":
            metadata["nbgrader"]["checksum"] = checksum
            probe = nbformat.from_dict({"cell_type": ctype, "source": source, "metadata": metadata})
            if compute_checksum(probe) != checksum:
                raise RuntimeError(f"{chapter}: the grading copy of cell {gid} does not match nbgrader's checksum")
        untouched = (cell.source, full_sources.get(gid, cell.source)) if kind == "test" else ()
        templates.append(sanitize.Template(gid, ctype, source, metadata, kind, untouched))
    # The Chinese release's code cells are the English ones with Chinese comments: a learner's copy of
    # either is the course's own code (not the learner's), and a tagged one of either is skipped.
    chinese_nb = _chinese(course, chapter, release_nb)
    for template in templates:
        if template.kind == "test":
            zh_test = next((c.source for c in chinese_nb.cells
                            if c.metadata.get("nbgrader", {}).get("grade_id") == template.grade_id), None)
            if zh_test is not None and zh_test not in template.also_untouched:
                template.also_untouched = (*template.also_untouched, zh_test)
    code = [c.source for nb in (release_nb, chinese_nb) for c in nb.cells if c.cell_type == "code"]
    from feedback import markdown_digest

    return jobs.ChapterKit(
        chapter=chapter, course_id="transformer-course", templates=templates,
        notebook_metadata=json.loads(json.dumps(release_nb.metadata)),
        release_code=sorted({c.strip() for c in code}),
        release_lines=sorted({line.strip() for c in code for line in c.splitlines() if line.strip()}),
        release_markdown=sorted({markdown_digest(c.source) for nb in (release_nb, chinese_nb)
                                 for c in nb.cells if c.cell_type == "markdown"}),
        tests=tests, gradebook=gradebook, secrets=sorted(s for s in secrets if len(s) >= 6),
        hidden_cases=hidden_cases, hidden_cases_zh=hidden_cases_zh,
        skip_when_grading=sorted({c.source.strip() for nb in (release_nb, chinese_nb) for c in nb.cells
                                  if c.cell_type == "code" and jobs.SKIP_TAG in c.metadata.get("tags", [])}))


def _chinese(course: Course, chapter: str, release_nb):
    """The Chinese edition of the release (its markdown is the course's own, trusted in feedback too);
    the English one again when the chapter has no complete Chinese text."""
    import translations

    try:
        return translations.translate(release_nb, course.solutions / chapter / f"{chapter}.zh.toml")
    except ValueError:
        return release_nb


def grader_cache(course: Course) -> Path:
    """Where the grader keeps what it builds from the course's own files: the library copies with
    references hidden (`libraries/`) and the chapters' kits (`kits/`). Both are addressed by the
    content they are built from, so a later `make grade` (a regrade) reuses them and an edit to a
    solution, the grader or the library builds anew. COURSE_GRADER_CACHE puts it elsewhere: the
    test suite shares one between its grading runs, which grade copies of the same course."""
    return Path(os.environ.get("COURSE_GRADER_CACHE") or course.root / "autograder" / ".sandbox")


def kit_digest(course: Course, chapter: str) -> str:
    """What a chapter's kit is built from: its solution and Chinese text (markdown twins and code
    comments), the grader's code, the library and its message catalogues, and nbgrader's version."""
    import hashlib

    import nbgrader

    import hiding

    library = hiding.library_root()
    digest = hashlib.sha256(nbgrader.__version__.encode())
    files = [course.solutions / chapter / f"{chapter}.ipynb", course.solutions / chapter / f"{chapter}.zh.toml",
             course.solutions / chapter / f"{chapter}.code.zh.toml"]
    files += sorted(HERE.glob("*.py")) + sorted(p for p in library.rglob("*") if p.suffix in (".py", ".toml"))
    for path in files:
        digest.update(path.name.encode() + b"\0" + (path.read_bytes() if path.exists() else b"(none)") + b"\0")
    return digest.hexdigest()[:24]


def cached_kit(course: Course, chapter: str, kits: Path) -> "jobs.ChapterKit":
    """build_kit(course, chapter), or the kit an earlier run built from the same content. The kit
    holds hidden tests: the folder is the grader's alone (0700), and no sandbox binds it. One
    builder at a time per kit (a lock file), so parallel graders build it once."""
    import fcntl
    import pickle

    kits.mkdir(parents=True, exist_ok=True)
    os.chmod(kits, 0o700)
    path = kits / f"{chapter}-{kit_digest(course, chapter)}.pickle"
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            with open(path, "rb") as f:
                return pickle.load(f)
        except (OSError, EOFError, pickle.UnpicklingError, AttributeError, ImportError):
            pass  # not built yet, or unreadable: build it
        kit = build_kit(course, chapter)
        work = path.with_suffix(".tmp")
        with open(os.open(work, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as f:
            pickle.dump(kit, f)
        os.replace(work, path)
        return kit


def prepare_chapter(course: Course, chapter: str, cache: Path) -> "jobs.ChapterKit":
    """A chapter's kit and the library copies its jobs will need, built once before any job runs
    (or found in the grader's cache, grader_cache()). Safe to call for several chapters in threads
    at once (tests/test_grading_race.py)."""
    import hiding

    kit = cached_kit(course, chapter, cache.parent / "kits")
    sets = [[hiding.Hidden(*h) for h in sorted({h for t in kit.tests for h in t.hidden})]]
    sets += [[hiding.Hidden(*h) for h in t.hidden] for t in kit.tests if t.calls]
    hiding.build_copies(cache, sets)
    return kit


# -- grading --------------------------------------------------------------------------------


@dataclass
class Report:
    scores: dict = field(default_factory=dict)  # (student, chapter) -> (score, max)
    notes: dict = field(default_factory=dict)  # (student, chapter) -> [str]
    isolation: str = ""
    guarantees: dict = field(default_factory=dict)  # what a probe inside a sandbox found: name -> (held, detail)
    seconds: dict = field(default_factory=dict)  # (student, chapter) -> seconds the job took
    timings: dict = field(default_factory=dict)  # (student, chapter) -> {phase: seconds} of that job
    faults: list = field(default_factory=list)  # the grader's own failures, one line each (make grade exits 1)
    graded: set = field(default_factory=set)  # (student, chapter) graded by a job in this run
    kept: set = field(default_factory=set)  # (student, chapter) unchanged since the last run: grade and feedback kept
    # (student, chapter) -> (schedule.SubmissionTime, late penalty): submissions with a server time
    late: dict = field(default_factory=dict)

    def note(self, student: str, chapter: str, text: str) -> None:
        self.notes.setdefault((student, chapter), []).append(text)

    def final(self, key: tuple[str, str]) -> tuple[float, float]:
        """(score after the late penalty, max score); `scores` keeps the score before it, as the
        gradebook's grades hold it (autograder/regrade.py compares the two)."""
        score, max_score = self.scores[key]
        penalty = self.late.get(key, (None, None))[1] or 0.0
        return max(0.0, score - penalty), max_score


def default_jobs() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return max(1, os.cpu_count() or 1)


@contextlib.contextmanager
def executor(jobs: int | None = None, scheduler=None):
    """Where grading jobs run: threads here (each job's work is in its own processes), or a Dask
    cluster when `scheduler` is an address or a distributed.Client. Either way a
    concurrent.futures.Executor: one code path submits the jobs and collects the results."""
    if scheduler is None:
        with concurrent.futures.ThreadPoolExecutor(max_workers=jobs or default_jobs(),
                                                   thread_name_prefix="grading-job") as pool:
            yield pool
        return
    from distributed import Client

    client = scheduler if isinstance(scheduler, Client) else Client(scheduler)
    try:
        _ship_code(client)
        yield client.get_executor(pure=False)
    finally:
        if client is not scheduler:
            client.close()


GRADER_MODULES = ["isolation", "hiding", "policy", "sanitize", "feedback", "sandboxed_kernel", "sandbox_runner",
                  "frames", "judging", "rerun", "driver", "forkserver", "jobs"]


def _importable() -> bool:
    import importlib

    try:
        for name in GRADER_MODULES:
            importlib.import_module(name)
        return True
    except ImportError:
        return False


def _ship_code(client) -> None:
    """Workers that cannot import the grader's modules get them (in dependency order)."""
    if all(client.run(_importable).values()):
        return
    for name in GRADER_MODULES:
        client.upload_file(str(HERE / f"{name}.py"))


def grade(course: Course, *args, **kwargs) -> Report:
    """`_grade`, with the instructor's COURSE_LANG taken out of the environment while it runs. That
    variable chooses the class report's language and nothing else: each submission is judged, and its
    sandboxed kernel speaks, in the submission's own language. (Left in, it reached the kernels: an
    English submission's checks spoke Chinese, which the grader did not recognise, and scored 0.)"""
    saved = {name: os.environ.pop(name) for name in ("COURSE_LANG", "JPY_SESSION_NAME") if name in os.environ}
    try:
        return _grade(course, *args, report_language=saved.get("COURSE_LANG") or "en", **kwargs)
    finally:
        os.environ.update(saved)


def _grade(course: Course, cell_timeout: int = 120, jobs: int | None = None, scheduler=None,
           isolation_mode: str | None = None, limits: dict | None = None, log=None,
           regrade_all: bool = False, report_language: str = "en") -> Report:
    """Grade every submission that is new or changed since the last run: one isolated job per
    submission and chapter, in parallel (or on a Dask cluster); this process alone writes the
    gradebook, grades.csv, report.csv, the feedback and the record of what it graded
    (autograder/regrade.py says when a submission keeps its grade without a job). `regrade_all`
    (`course.py grade --all`) grades every submission, whatever the record says."""
    import time

    import isolation
    import jobs as grading_jobs
    import regrade

    log = log or (lambda text: None)
    report = Report()
    chapters = course.chapters()
    times = submission_times(course, chapters)  # {} without received.json; a bad schedule stops here
    iso = isolation.detect(isolation_mode)
    report.isolation = iso.describe()
    report.guarantees = _check_isolation(course, iso)
    students = course.students()
    record_file = regrade.record_path(course.root)
    record = regrade.empty() if regrade_all else regrade.load(record_file, log)
    present, digest_of, saved = None, {}, [time.monotonic()]

    def save_record(final: bool = False) -> None:  # what is merged so far, so an interrupted run keeps it
        if present is None or (not final and time.monotonic() - saved[0] < 30):
            return
        try:
            if final:
                regrade.keep_only(record, present)  # a submission gone from submitted/ drops out
            regrade.save(record_file, record)
            saved[0] = time.monotonic()
        except Exception as exc:  # the grades stand; the next run grades everything again
            log(f"the record of what was graded could not be written ({_one_line(exc)})")

    try:
        submissions = {(s, c): course.submitted / s / c / f"{c}.ipynb" for s in students for c in chapters}
        for (student, chapter), path in submissions.items():
            if not path.exists() and (course.submitted / student / chapter).exists():
                report.note(student, chapter, f"no {chapter}.ipynb in the submission folder")
        cache = grader_cache(course) / "libraries"
        raws, kit_digests = {}, {}
        for chapter in chapters:
            try:
                kit_digests[chapter] = kit_digest(course, chapter)
            except Exception:  # prepare_chapter will say what is wrong: grade this chapter
                kit_digests[chapter] = None
        for key, path in submissions.items():
            if path.is_file():
                raws[key], sha = _read_submission(path)
                if sha and kit_digests[key[1]]:
                    digest_of[key] = regrade.Digest(sha, regrade.grading_digest(
                        kit_digests[key[1]], cell_timeout, limits, iso.mode,
                        times[key].digest_part() if key in times else None))
        kept, in_gradebook = ({}, set()) if regrade_all else _unchanged(course, record, digest_of, log)
        for key, entry in kept.items():  # their grade, notes and feedback stay as the last run left them
            for text in entry.get("notes", []):
                report.note(*key, text)
            report.scores[key] = (entry["score"], entry["max_score"])
            raws.pop(key)
        report.kept = set(kept)
        present = {key: submissions[key] for key in raws.keys() | kept.keys()}

        def prepare(chapter):
            return prepare_chapter(course, chapter, cache)

        # Record the assignments (cells, checksums) in the gradebook without touching chapters/,
        # while each chapter's kit is built alongside: the chapters with submissions to grade, and
        # any whose content changed since the last run recorded it (or that the gradebook lacks).
        wanted = [c for c in chapters if any(c == key[1] for key in raws)]
        to_release = [c for c in chapters if c in wanted or c not in in_gradebook or kit_digests[c] is None
                      or record["released"].get(c) != kit_digests[c]]
        kits, failed = {}, {}
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, jobs or default_jobs())) as setup:
            kit_futures = {c: setup.submit(prepare, c) for c in wanted}
            try:
                if to_release:
                    for chapter in to_release:
                        record["released"].pop(chapter, None)
                    release(course, to_release, release_dir=os.path.join("autograder", ".release"))
                    record["released"].update({c: kit_digests[c] for c in to_release if kit_digests[c]})
            except Exception as exc:  # no chapter can be recorded in the gradebook: none is graded
                failed = {c: f"recording the assignments in the gradebook failed ({_one_line(exc)})" for c in wanted}
            for chapter, future in kit_futures.items():
                try:
                    kits[chapter] = future.result()
                except Exception as exc:  # this chapter's kit: its submissions alone go ungraded
                    failed.setdefault(chapter, f"preparing {chapter} failed ({_one_line(exc)})")
        for chapter, why in failed.items():
            kits.pop(chapter, None)
            report.faults.append(why)
            for (student, other) in raws:
                if other == chapter:
                    report.note(student, chapter, f"not graded: the grader itself failed: {why}; every test "
                                                  "scored 0 until the instructor fixes it and grades again")
                    report.scores[(student, chapter)] = (0.0, _max_points(course, chapter))
                    regrade.drop(record, (student, chapter))  # graded by the next run
        specs = []
        for (student, chapter), raw in sorted(raws.items()):
            if chapter in failed:
                continue
            when = times.get((student, chapter))
            specs.append(grading_jobs.JobSpec(student=student, chapter=chapter, submission=raw, kit=kits[chapter],
                                              cell_timeout=cell_timeout, limits=limits or {}, cache_dir=str(cache),
                                              isolation=iso.mode, late=when.for_job() if when else None))
        # Honest work first: order does not change a score, it makes progress easy to follow.
        held = [name for name, (ok, _) in report.guarantees.items() if ok]
        missing = [f"{name} ({detail})" for name, (ok, detail) in report.guarantees.items() if not ok]
        raws.clear()  # the specs hold the bytes now
        log(f"{report.isolation}\nchecked inside a sandbox: {', '.join(held) or 'nothing'}"
            + (f"\nWARNING, not given here: {'; '.join(missing)}" if missing else "")
            + f"\ngrading {len(present)} submissions ("
            + ("--all: every one graded again, whatever the last run recorded" if regrade_all else
               f"{len(present) - len(kept)} new or changed; {len(kept)} unchanged since the last run keep their "
               "grades and feedback") + ")"
            + f"\ngrading {len(specs)} submissions with "
            f"{'the Dask cluster at ' + str(getattr(scheduler, 'scheduler', scheduler)) if scheduler is not None else str(jobs or default_jobs()) + ' parallel jobs'}")
        from nbgrader.api import Gradebook

        with Gradebook(course.db_url, "transformer-course") as gb, executor(jobs, scheduler) as pool:
            import warnings

            with warnings.catch_warnings():  # the rows in a fixed order, whatever order the jobs finish in
                warnings.simplefilter("ignore")
                _record_due_dates(gb, sorted({spec.chapter for spec in specs}), times)
                for spec in specs:
                    gb.update_or_create_student(spec.student)
                    gb.update_or_create_submission(spec.chapter, spec.student)
            futures = {pool.submit(grading_jobs.grade_job, spec): spec for spec in specs}
            for done, future in enumerate(concurrent.futures.as_completed(futures), start=1):
                spec = futures[future]
                try:
                    result = future.result()
                except Exception as exc:  # a lost worker, a pickling error: this submission alone pays
                    result = {"student": spec.student, "chapter": spec.chapter, "status": "error",
                              "notes": [f"the grading job failed ({type(exc).__name__}: {str(exc)[:200]}); every test scored 0"],
                              "scores": {t.grade_id: [0.0, t.points] for t in spec.kit.tests}, "comments": {},
                              "flags": [], "autograded": None, "feedback": None, "seconds": 0.0}
                _merge(course, gb, result, report, times.get((spec.student, spec.chapter)))
                key = (spec.student, spec.chapter)
                report.graded.add(key)
                report.timings[key] = dict(result.get("timings", {}))
                score, max_score = report.scores[key]
                if result.get("status") == "error" or key not in digest_of:  # the grader's failure: graded again next run
                    regrade.drop(record, key)
                else:  # after its gradebook rows and files are written
                    regrade.put(record, key, digest_of[key], result, score, max_score, report.notes.get(key, []),
                                course.feedback / spec.student / spec.chapter / f"{spec.chapter}.html",
                                course.autograded / spec.student / spec.chapter / f"{spec.chapter}.ipynb")
                    save_record()
                parts = ", ".join(f"{k} {v:.0f}" for k, v in result.get("timings", {}).items())
                log(f"[{done}/{len(specs)}] {spec.student} / {spec.chapter}: {score:g}/{max_score:g} "
                    f"({result.get('seconds', 0):.0f} s{': ' + parts if parts else ''})")
            for (student, chapter) in list(report.notes):
                if (student, chapter) not in report.scores and chapter in chapters:
                    report.scores[(student, chapter)] = (0.0, gb.find_assignment(chapter).max_score)
    finally:
        save_record(final=True)
        _lateness(course, report, times, log)
        _export(course, report, chapters, students)
        _class_report(course, record, log, report_language)
    return report


# -- deadlines: the server's time against the schedule (deploy/hub/schedule.py) ---------------------


def schedule_module():
    """deploy/hub/schedule.py, loaded by its path: it lives with the hub's files, whose other modules
    are not the grader's to import (and nothing named `schedule` may shadow it)."""
    module = sys.modules.get("course_schedule")
    if module is None:
        import importlib.util

        spec = importlib.util.spec_from_file_location("course_schedule", HERE.parent / "deploy" / "hub" / "schedule.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules["course_schedule"] = module
        spec.loader.exec_module(module)
    return module


def submission_times(course: Course, chapters: list[str]) -> dict:
    """(student, chapter) -> schedule.SubmissionTime for each submission autograder/received.json
    knows; {} without it. Raises schedule.ScheduleError (one line) for a bad schedule or record."""
    if not (course.root / "autograder" / "received.json").exists():  # a learner's own grading: as it always was
        return {}
    return schedule_module().submission_times(course.root, chapters)


def _record_due_dates(gb, chapters: list[str], times: dict) -> None:
    """Each chapter's due date for the class as nbgrader's assignment duedate (Formgrader and
    `nbgrader export` show it; a student's extension is their submission's, set when it is merged)."""
    if not times:
        return
    due = {c: t.deadline.class_due for (_, c), t in times.items() if t.deadline is not None}
    for chapter in chapters:
        gb.update_or_create_assignment(chapter, duedate=due.get(chapter))


def _lateness(course: Course, report: Report, times: dict, log) -> None:
    """Every present submission with a server time: its penalty as the gradebook holds it (made by
    its job, now or in the run that graded it) and the report's notes on it (recomputed each run, so
    never kept in the record: a kept submission's notes there are its job's)."""
    if not times:
        return
    for key in sorted(set(report.scores) - set(times)):  # put in submitted/ by hand, say
        report.note(*key, "no server time in autograder/received.json: graded without a due date")
    present = [key for key in times if key in report.scores]
    try:
        penalties = _penalties(course, present) if present else {}
    except Exception as exc:  # the grades stand; the penalties are missing from this run's reports
        log(f"the late penalties could not be read from the gradebook ({_one_line(exc)})")
        report.faults.append(f"late penalties unreadable ({_one_line(exc)})")
        penalties = {}
    for key, penalty in penalties.items():
        report.late[key] = (times[key], penalty)
        for text in times[key].report_notes(penalty):
            report.note(*key, text)


def _penalties(course: Course, keys: list) -> dict:
    """(student, chapter) -> the late penalty nbgrader's gradebook holds for that submission."""
    import warnings

    from nbgrader.api import Gradebook, MissingEntry

    found = {}
    with warnings.catch_warnings(), Gradebook(course.db_url, "transformer-course") as gb:
        warnings.simplefilter("ignore")
        for student, chapter in keys:
            try:
                found[(student, chapter)] = gb.find_submission(chapter, student).late_submission_penalty or 0.0
            except MissingEntry:
                found[(student, chapter)] = 0.0
    return found


def _add_time_columns(path: Path, report: Report) -> None:
    """grades.csv's own columns, then received, due (with the student's extension), late_by, late_policy
    and penalty (nbgrader's late_submission_penalty again, beside the times that explain it). Only on a
    class's hub (a server time known): a learner's grades.csv stays nbgrader's."""
    if not report.late:
        return
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    extra = ["received", "due", "late_by", "late_policy", "penalty"]
    columns = [c for c in (list(rows[0]) if rows else ["assignment", "student_id"]) if c not in extra] + extra
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, columns, lineterminator="\n")
        writer.writeheader()
        for row in rows:
            when, penalty = report.late.get((row.get("student_id"), row.get("assignment")), (None, None))
            writer.writerow({**row, **(when.csv_fields(penalty) if when else dict.fromkeys(extra, ""))})


def _class_report(course: Course, record: dict, log, language: str) -> None:
    """autograder/class_report.html and mistakes.csv (autograder/class_report.py), from the record just
    saved: what each student's answers did, as judged; in the instructor's language (COURSE_LANG)."""
    import class_report

    try:
        class_report.write(course.root / "autograder", record, language)
    except Exception as exc:  # the grades stand without it
        log(f"the class report could not be written ({_one_line(exc)})")


def _read_submission(path: Path) -> tuple[bytes, str | None]:
    """A submission's bytes as its job gets them, and the sha256 of the file (None: unreadable, never
    counted unchanged). Past 64 MiB the job gets a stand-in that it rejects; the digest is still the file's."""
    import hashlib

    limit = 64 * 2**20
    try:
        if path.stat().st_size <= limit:
            raw = path.read_bytes()
            return raw, hashlib.sha256(raw).hexdigest()
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(2**20), b""):
                digest.update(block)
        return b"\0" * (limit + 1), digest.hexdigest()
    except OSError as exc:
        return f"unreadable: {exc}".encode(), None


def _unchanged(course: Course, record: dict, digest_of: dict, log) -> tuple[dict, set]:
    """The submissions that keep their grade without a job, with their record entries (regrade.py:
    the same bytes and grading digest, their feedback page and autograded notebook still there, the
    gradebook still holding them at the recorded score); and the assignments the gradebook holds."""
    import warnings

    import regrade

    candidates = {}
    for key, digest in digest_of.items():
        entry = regrade.lookup(record, key)
        student, chapter = key
        if regrade.unchanged(record, key, digest) and regrade.files_intact(
                entry, course.feedback / student / chapter / f"{chapter}.html",
                course.autograded / student / chapter / f"{chapter}.ipynb"):
            candidates[key] = entry
    if not (course.root / "autograder" / "gradebook.db").exists():
        return {}, set()
    from nbgrader.api import Gradebook

    scores = {}
    try:
        with warnings.catch_warnings(), Gradebook(course.db_url, "transformer-course") as gb:
            warnings.simplefilter("ignore")
            assignments = {a.name for a in gb.assignments}
            for chapter in sorted({c for _, c in candidates} & assignments):
                scores[chapter] = {row["student"]: row["score"] for row in gb.submission_dicts(chapter)}
    except Exception as exc:  # an unreadable gradebook: grade everything into it again
        log(f"the gradebook could not be read ({_one_line(exc)}): grading every submission")
        return {}, set()
    kept = {key: entry for key, entry in candidates.items()
            if key[0] in scores.get(key[1], {}) and abs(float(scores[key[1]][key[0]]) - entry["score"]) <= 1e-6}
    return kept, assignments


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:300]}"


def _max_points(course: Course, chapter: str) -> float:
    """The chapter's points, from the solution notebook (the gradebook may not hold it)."""
    import nbformat

    try:
        nb = nbformat.read(course.solutions / chapter / f"{chapter}.ipynb", as_version=4)
    except Exception:
        return 0.0
    return float(sum(c.metadata.get("nbgrader", {}).get("points", 0) for c in nb.cells
                     if c.metadata.get("nbgrader", {}).get("grade")))


def _check_isolation(course: Course, iso) -> dict:
    """Probe a sandbox as the jobs make them: not root, no mount, read-only root, no network, no
    view of solutions/, the gradebook or the submissions, own PID namespace, children die."""
    import isolation

    secrets = [str(course.solutions), str(course.root / "autograder" / "gradebook.db"), str(course.submitted),
               str(grader_cache(course) / "kits")]
    try:
        with isolation.job_uid() as uid:
            return isolation.verify(isolation.SandboxSpec(uid=uid), secrets, iso)
    except Exception as exc:
        return {"the probe ran": (False, f"{type(exc).__name__}: {exc}")}


def _merge(course: Course, gb, result: dict, report: Report, when=None) -> None:
    """One job's result into the course: gradebook rows, autograded notebook, feedback, report.
    `when`: the submission's schedule.SubmissionTime (None without a server time)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # SQLAlchemy's autoflush notices from nbgrader's api
        _merge_rows(gb, result, when)
    _merge_files(course, result, report)


def _merge_rows(gb, result: dict, when=None) -> None:
    student, chapter = result["student"], result["chapter"]
    gb.update_or_create_student(student)
    gb.update_or_create_submission(chapter, student)
    nb = gb.find_submission_notebook(chapter, chapter, student)
    scores = result["scores"]
    for grade in nb.grades:
        score = scores.get(grade.name, [0.0, None])[0]
        grade.auto_score = float(score)
        grade.manual_score = None
        grade.needs_manual_grade = False
    for comment in nb.comments:
        comment.auto_comment = result["comments"].get(comment.name) or None
    if when is not None:  # the server's time, this student's extension, the job's penalty
        deadline = when.deadline
        extension = deadline.due - deadline.class_due if deadline and deadline.extended else None
        gb.update_or_create_submission(chapter, student, timestamp=when.received.received, extension=extension)
        nb.late_submission_penalty = result.get("late_penalty")
    gb.db.commit()


def _merge_files(course: Course, result: dict, report: Report) -> None:
    student, chapter = result["student"], result["chapter"]
    scores = result["scores"]
    for note in result["notes"]:
        report.note(student, chapter, note)
    for flag in result.get("flags", []):
        if flag.startswith("nbgrader:"):
            report.note(student, chapter, flag)
    report.scores[(student, chapter)] = (sum(s for s, _ in scores.values()), sum(p for _, p in scores.values()))
    report.seconds[(student, chapter)] = result.get("seconds", 0.0)
    if result.get("autograded"):
        path = course.autograded / student / chapter / f"{chapter}.ipynb"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(result["autograded"])
    page = course.feedback / student / chapter / f"{chapter}.html"
    page.parent.mkdir(parents=True, exist_ok=True)
    page.write_text(result.get("feedback") or _fallback_feedback(result))


def _fallback_feedback(result: dict) -> str:
    """A plain page when no feedback could be made (an unreadable notebook, a failed job)."""
    import html

    rows = "".join(f"<tr><td>{html.escape(g)}</td><td>{s:g} / {p:g}</td></tr>" for g, (s, p) in result["scores"].items())
    notes = "".join(f"<li>{html.escape(n)}</li>" for n in result["notes"])
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(result['chapter'])}</title></head>"
            f"<body><h1>{html.escape(result['chapter'])}</h1><table>{rows}</table><ul>{notes}</ul></body></html>")


def _export(course: Course, report: Report, chapters: list[str], students: list[str]) -> None:
    """grades.csv (nbgrader export) and report.csv, whatever happened before."""
    try:
        course.nbgrader("export", f"--to={course.root / 'autograder' / 'grades.csv'}")
    except Exception as exc:
        report.note("*", "*", f"nbgrader export failed: {str(exc)[:300]}")
        with open(course.root / "autograder" / "grades.csv", "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["assignment", "student_id", "score", "max_score"])
            for key in sorted(report.scores):
                writer.writerow([key[1], key[0], *report.final(key)])
    _add_time_columns(course.root / "autograder" / "grades.csv", report)
    _write_report(course, report, chapters, students)


def _write_report(course: Course, report: Report, chapters: list[str], students: list[str]) -> None:
    path = course.root / "autograder" / "report.csv"
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["student", "chapter", "score", "max_score", "notes"])
        for student in students:
            for chapter in chapters:
                if (student, chapter) in report.scores:
                    score, max_score = report.final((student, chapter))  # after any late penalty, as grades.csv
                    writer.writerow([student, chapter, score, max_score, " | ".join(report.notes.get((student, chapter), []))])


def format_table(report: Report, chapters: list[str], students: list[str]) -> str:
    width = max([len("student")] + [len(s) for s in students]) + 2
    cols = [max(len(c), 9) + 2 for c in chapters]
    lines = ["student".ljust(width) + "".join(c.ljust(w) for c, w in zip(chapters, cols))]
    for s in students:
        cells = []
        for c, w in zip(chapters, cols):
            score = report.final((s, c)) if (s, c) in report.scores else None
            text = "-" if score is None else f"{score[0]:g}/{score[1]:g}" + ("*" if (s, c) in report.notes else "")
            cells.append(text.ljust(w))
        lines.append(s.ljust(width) + "".join(cells))
    if report.notes:
        lines.append("")
        lines.append("* notes:")
        for (s, c), notes in sorted(report.notes.items()):
            for n in notes:
                lines.append(f"  {s} / {c}: {n}")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, default=DEFAULT_ROOT, help="course root (default: this repository)")
    sub = parser.add_subparsers(dest="command", required=True)
    rel = sub.add_parser("release", help="regenerate chapters/ from solutions/")
    rel.add_argument("chapters", nargs="*")
    rel.add_argument("--force", action="store_true", help="overwrite chapters a learner has worked in")
    gr = sub.add_parser("grade", help="autograde autograder/submitted/, write feedback, export grades")
    gr.add_argument("--cell-timeout", type=int, default=int(os.environ.get("COURSE_CELL_TIMEOUT", "120")))
    gr.add_argument("--jobs", type=int, default=int(os.environ.get("JOBS") or 0) or None,
                    help="parallel grading jobs on this machine (default: all cores)")
    gr.add_argument("--scheduler", default=os.environ.get("SCHEDULER") or None,
                    help="a Dask scheduler address (tcp://host:8786): run the jobs on that cluster")
    gr.add_argument("--isolation", choices=["auto", "bwrap", "unshare", "rlimits"], default=None,
                    help="force an isolation mode (default: the strongest this machine allows)")
    gr.add_argument("--all", action="store_true",
                    help="grade every submission again (default: only those new or changed since the last run; "
                         "the others keep their grades and feedback)")
    args = parser.parse_args(argv)
    course = Course(args.root.resolve())
    if args.command == "release":
        try:
            release(course, args.chapters or None, force=args.force)
        except LearnerWorkFound as exc:
            print(f"release refused: {exc}", file=sys.stderr)
            return 1
        print(f"released {', '.join(args.chapters or course.chapters())} into {course.chapters_dir}")
        return 0
    students = course.students()
    if not students:
        print(f"no submissions under {course.submitted}: put them in {course.submitted}/STUDENT/CHAPTER/CHAPTER.ipynb")
        return 0
    try:
        report = grade(course, args.cell_timeout, jobs=args.jobs, scheduler=args.scheduler,
                       isolation_mode=args.isolation, log=lambda text: print(text, flush=True), regrade_all=args.all)
    except schedule_module().ScheduleError as exc:  # nothing was graded
        print(f"make grade: {exc}", file=sys.stderr)
        return 1
    graded = [c for c in course.chapters() if any((s, c) in report.scores for s in students)]
    print(format_table(report, graded, students))  # the chapters someone submitted, not all twelve
    print(f"\n{report.isolation}")
    print(f"\nfeedback: {course.feedback}/STUDENT/CHAPTER/*.html")
    print(f"grades:   {course.root / 'autograder' / 'grades.csv'} (nbgrader export), {course.root / 'autograder' / 'report.csv'} (with notes)")
    if report.faults:
        print(f"make grade: the grader failed: {'; '.join(report.faults)} (those submissions are 0 in report.csv)",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
