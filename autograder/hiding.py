"""Copies of transformer_lib without the reference implementations being graded.

A sandbox that runs a learner's code sees, in place of transformer_lib, a copy in which the
reference answer of every exercise being graded is a stub: a function of the same name that
raises ReferenceHiddenError, or a class whose constructor does. The reference's code is not in
the copy at all (no source, no bytecode), so nothing the learner writes can import it, read it
or call it. Each checker names its reference (and, when it has one, the fallback later cells use).

Which references a copy hides:

* the independent check runs each test in its own sandbox whose copy hides only that test's
  reference(s): the rest of the library behaves as in the learner's lab (later cells still fall
  back on the reference of an *earlier* exercise the learner got wrong, as the chapter promises);
* nbgrader's kernel runs the whole chapter, so its copy hides every reference the chapter grades.

Copies are content-addressed (library source + hidden set) and cached, and each is checked by
importing it once in a fresh interpreter before any sandbox uses it.

A class whose answers are hidden (`make hub ANSWERS=hidden`) gives every student's server a copy
too, made by the same machinery: `build_student_library` hides every graded exercise's reference
and ships, in their place, the reference's outputs on the visible cases (so the notebook's checks
still judge) and a table naming each hidden reference's exercise (so a cell that needs one says
which, in one line: transformer_lib/checks/core.py, AnswerHidden).
"""

from __future__ import annotations

import ast
import compileall
import dataclasses
import hashlib
import importlib.util
import inspect
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable

from transformer_lib import safe_ast  # ast.parse is not thread-safe on 3.11; copies are built in threads

PACKAGE = "transformer_lib"
HIDDEN_MODULE = "_grading_hidden"  # transformer_lib/_grading_hidden.py, only in the copies

HIDDEN_SOURCE = '''"""Present only in the grader's copies of transformer_lib: stubs of hidden references raise this."""


class ReferenceHiddenError(RuntimeError):
    """The reference implementation of the exercise being graded is not available while grading."""


CALLED = []  # every hidden reference called in this process, in order (the grader's runner reports it)
COUNTS = {}


def hidden(name):
    COUNTS[name] = COUNTS.get(name, 0) + 1
    if name not in CALLED:
        CALLED.append(name)
    return ReferenceHiddenError(
        f"{name} is the reference answer of the exercise being graded; it is not available while grading "
        "(your own code must compute the result)")
'''


@dataclasses.dataclass(frozen=True, order=True)
class Hidden:
    module: str  # e.g. transformer_lib.attention
    name: str  # a top-level function or class of that module

    @property
    def dotted(self) -> str:
        return f"{self.module}.{self.name}"


def library_root() -> Path:
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(f"{PACKAGE} is not importable")
    return Path(list(spec.submodule_search_locations)[0]).resolve()


def references_of(checker) -> tuple[list[Hidden], list[str]]:
    """(what can be hidden, what cannot) for one checker's reference and fallback."""
    hidden, problems = [], []
    for obj in filter(None, [checker.reference, getattr(checker, "fallback", None)]):
        module, name = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
        if not module or not name or not module.startswith(PACKAGE) or "." in name or "<" in name:
            problems.append(f"{checker.name}: its reference {obj!r} is not a top-level function or class of {PACKAGE}")
            continue
        hidden.append(Hidden(module, name))
    return hidden, problems


def library_digest(root: Path | None = None) -> str:
    root = root or library_root()
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def _stub(node: ast.stmt, dotted: str, lines: list[str]) -> str:
    indent = " " * node.col_offset
    call = f"__import__('{PACKAGE}.{HIDDEN_MODULE}', fromlist=['hidden']).hidden({dotted!r})"
    if isinstance(node, ast.ClassDef):
        bases = [ast.unparse(b) for b in node.bases] + [ast.unparse(k) for k in node.keywords]
        head = f"class {node.name}({', '.join(bases)}):" if bases else f"class {node.name}:"
        return "\n".join([
            indent + head,
            indent + f'    """Hidden while grading: {dotted} is a reference answer."""',
            indent + "    def __init__(self, *args, **kwargs):",
            indent + f"        raise {call}",
        ])
    return "\n".join([
        indent + f"def {node.name}(*args, **kwargs):",
        indent + f'    """Hidden while grading: {dotted} is a reference answer."""',
        indent + f"    raise {call}",
    ])


def hide_in_source(source: str, names: list[str], module: str) -> str:
    """`source` with the top-level definitions `names` replaced by raising stubs."""
    tree = safe_ast.parse(source)
    lines = source.splitlines()
    found = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name in names:
            found[node.name] = node  # the last definition is the one the module exports
    missing = set(names) - set(found)
    if missing:
        raise RuntimeError(f"{module}: no top-level definition of {sorted(missing)} to hide")
    for node in sorted(found.values(), key=lambda n: n.lineno, reverse=True):
        first = min([node.lineno] + [d.lineno for d in node.decorator_list]) - 1
        lines[first:node.end_lineno] = _stub(node, f"{module}.{node.name}", lines).splitlines()
    return "\n".join(lines) + "\n"


_VALIDATE = """
import importlib, sys
for parent in sys.argv[1:]:
    for name in [m for m in sys.modules if m == "transformer_lib" or m.startswith("transformer_lib.")]:
        del sys.modules[name]
    sys.path.insert(0, parent)
    try:
        import transformer_lib, transformer_lib.checks
        assert transformer_lib.__file__.startswith(parent), transformer_lib.__file__
        for module in open(parent + "/.modules").read().split():
            importlib.import_module(module)
    except BaseException as exc:
        print(parent, type(exc).__name__, exc, file=sys.stderr)
        sys.exit(1)
    finally:
        sys.path.remove(parent)
"""


def _check_importable(parents: list[Path]) -> None:
    """Import every new copy once (one interpreter for all of them) before any sandbox uses it."""
    if not parents:
        return
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(OMP_NUM_THREADS="1", MPLBACKEND="Agg")
    proc = subprocess.run([sys.executable, "-c", _VALIDATE, *map(str, parents)],
                          capture_output=True, text=True, env=env, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"a copy of {PACKAGE} with references hidden cannot be imported:\n{proc.stderr[-2000:]}")


def _key(digest: str, hidden: list[Hidden], hidden_source: str = HIDDEN_SOURCE) -> str:
    stub_format = hashlib.sha256((hidden_source + inspect.getsource(_stub)).encode()).hexdigest()
    return hashlib.sha256((digest + "|" + stub_format + "|" + ",".join(sorted(h.dotted for h in hidden))).encode()).hexdigest()[:20]


def build_copies(cache: Path, hidden_sets: list[list[Hidden]], hidden_source: str = HIDDEN_SOURCE,
                 add_files: Callable[[Path], None] | None = None) -> list[Path]:
    """For each set of references, a folder holding `transformer_lib/` with them stubbed.

    Cached by content (library source, hidden set and `hidden_source`, the module the stubs call);
    new copies are checked by importing them before they are published, all in one interpreter.
    `add_files(package)` writes more files into a new copy before it is compiled: what they hold
    must follow from the key's content (build_student_library's outputs do)."""
    root = library_root()
    digest = library_digest(root)
    cache.mkdir(parents=True, exist_ok=True)
    os.chmod(cache, 0o755)
    finals = [cache / _key(digest, hidden, hidden_source) for hidden in hidden_sets]
    pending: dict[Path, Path] = {}
    try:
        for final, hidden in zip(finals, hidden_sets):
            if (final / ".ready").exists() or final in pending:
                continue
            pending[final] = _make_copy(root, cache, hidden, hidden_source, add_files)
        _check_importable(list(pending.values()))
        for final, work in pending.items():
            (work / ".ready").write_text("ok")
            try:
                os.rename(work, final)
            except OSError:  # another job published the same copy first
                shutil.rmtree(work, ignore_errors=True)
    finally:
        for work in pending.values():
            if work.exists():
                shutil.rmtree(work, ignore_errors=True)
    return finals


def build_copy(cache: Path, hidden: list[Hidden]) -> Path:
    return build_copies(cache, [hidden])[0]


def _make_copy(root: Path, cache: Path, hidden: list[Hidden], hidden_source: str = HIDDEN_SOURCE,
               add_files: Callable[[Path], None] | None = None) -> Path:
    work = Path(tempfile.mkdtemp(prefix=".build-", dir=cache))
    package = work / PACKAGE
    shutil.copytree(root, package, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.pyo"))
    by_module: dict[str, list[str]] = {}
    for h in hidden:
        by_module.setdefault(h.module, []).append(h.name)
    for module, names in by_module.items():
        rel = Path(*module.split(".")[1:])
        path = package / rel.with_suffix(".py")
        if not path.exists():
            path = package / rel / "__init__.py"
        path.write_text(hide_in_source(path.read_text(), names, module))
    (package / f"{HIDDEN_MODULE}.py").write_text(hidden_source)
    if add_files is not None:
        add_files(package)
    (work / ".modules").write_text("\n".join(sorted(by_module)))
    (work / ".hidden").write_text("\n".join(sorted(h.dotted for h in hidden)))
    compileall.compile_dir(str(package), quiet=2, workers=1)
    for dirpath, dirnames, filenames in os.walk(work):
        os.chmod(dirpath, 0o755)
        for f in filenames:
            os.chmod(os.path.join(dirpath, f), 0o644)
    return work


# -- a class's library with the answers hidden (make hub ANSWERS=hidden) ----------------------------

# The module the stubs of a student's copy call: the same names as HIDDEN_SOURCE's (the stubs are the
# grader's), but what a stub raises is AnswerHidden, one line in the learner's language that names
# the exercise (transformer_lib/checks/core.py). Its fields are filled in by build_student_library, so
# they are part of the copy's key: the shipped outputs depend on torch, the messages on the catalogues
# (library_digest reads only the .py files).
STUDENT_HIDDEN_SOURCE = '''"""Present only in a class's library with the answers hidden (autograder/hiding.py, build_student_library):
every graded exercise's reference is a stub that raises AnswerHidden (transformer_lib/checks/core.py)."""

# hidden reference -> [its checker, the learner's name for it, chapter, exercise number]
EXERCISES = {exercises}
TORCH = {torch!r}  # the torch that computed the shipped outputs (transformer_lib/{outputs})
OTHER_FILES = {other!r}  # a digest of the library's catalogues and data
CALLED = []
COUNTS = {{}}


def hidden(name):
    COUNTS[name] = COUNTS.get(name, 0) + 1
    if name not in CALLED:
        CALLED.append(name)
    from transformer_lib.checks.core import answer_hidden

    return answer_hidden(name)
'''


@dataclasses.dataclass(frozen=True)
class Exercise:
    checker: str  # the checker's name, e.g. "self_attention_layer"
    function: str  # what the learner writes, as the test cell passes it: "SelfAttention"
    chapter: str  # "02_self_attention"
    number: int  # its place among the chapter's exercises, as the notebook numbers them


def graded_exercises(course_root: Path | None = None, chapters: list[str] | None = None) -> dict[Hidden, Exercise]:
    """Every reference an autograded test cell of `chapters` (default: all) checks, with its exercise.

    Read from the solutions' test cells the way the grader's kits are (course.py: build_kit), so a
    class hides exactly what is graded; a chapter numbers its exercises in the order its tests first
    check them (as its "Exercise N" headings do)."""
    import course  # autograder/course.py, beside this module; only the hub's build needs it
    from transformer_lib.checks import get_checker

    source = course.Course(course_root or library_root().parent)
    found: dict[Hidden, Exercise] = {}
    for chapter in chapters if chapters is not None else source.chapters():
        numbered: dict[str, int] = {}
        for test_source in course.original_tests(source, chapter).values():
            for call in course.checker_calls(test_source):
                checker = get_checker(call.checker)
                number = numbered.setdefault(checker.name, len(numbered) + 1)
                refs, problems = references_of(checker)
                if problems:
                    raise RuntimeError("; ".join(problems))
                for ref in refs:
                    found.setdefault(ref, Exercise(checker.name, call.function, chapter, number))
    return found


def _write_outputs(checkers: list) -> Callable[[Path], None]:
    """What a student's check needs of a reference it can no longer run: its outputs on the visible
    cases, and those of each catalogued mistake (many are the reference with a twist). Visible cases
    only: a hidden case's expected output would be a hidden test."""
    def write(package: Path) -> None:
        import torch

        from transformer_lib.checks.core import SHIPPED_OUTPUTS

        outputs = {c.name: {"expected": c.expected_outputs(hidden=False),
                            "mistakes": {m.name: c.collect_outputs(m.implementation) for m in c.mistakes}}
                   for c in checkers}
        torch.save(outputs, package / SHIPPED_OUTPUTS)
    return write


def _link_or_copy(source: str, target: str) -> None:
    try:
        os.link(source, target)  # the cache's files are read-only for everyone: sharing them is safe
    except OSError:  # another file system
        shutil.copy2(source, target)


def build_student_library(target: Path, chapters: list[str] | None = None, cache: Path | None = None) -> Path:
    """Write `target/transformer_lib`: the library with every graded exercise's reference of `chapters`
    (default: every chapter) hidden, for the servers of a class whose answers are hidden. Returns it.

    The copy holds no source and no bytecode of a hidden reference (the grader's stubs, see
    `_make_copy`). It is built once per library, torch and hidden set in `cache` (default: the
    grader's cache, autograder/.sandbox, or COURSE_GRADER_CACHE) and linked into `target`; a
    `target` that already holds the same build is left as it is."""
    import torch

    from transformer_lib.checks import get_checker
    from transformer_lib.checks.core import SHIPPED_OUTPUTS

    exercises = graded_exercises(chapters=chapters)
    table = {h.dotted: [e.checker, e.function, e.chapter, e.number] for h, e in sorted(exercises.items())}
    other = hashlib.sha256()
    for path in sorted(p for p in library_root().rglob("*") if p.is_file() and p.suffix not in (".py", ".pyc")):
        other.update(str(path.relative_to(library_root())).encode() + b"\0" + path.read_bytes() + b"\0")
    hidden_source = STUDENT_HIDDEN_SOURCE.format(exercises=repr(table), torch=torch.__version__,
                                                 outputs=SHIPPED_OUTPUTS, other=other.hexdigest()[:20])
    checkers = [get_checker(name) for name in sorted({e.checker for e in exercises.values()})]
    cache = cache or Path(os.environ.get("COURSE_GRADER_CACHE") or Path(__file__).resolve().parent / ".sandbox") \
        / "student-libraries"
    built = build_copies(cache, [sorted(exercises)], hidden_source, _write_outputs(checkers))[0]

    target.mkdir(parents=True, exist_ok=True)
    package, stamp = target / PACKAGE, f"{built.name}\n"
    if (package / ".build").is_file() and (package / ".build").read_text() == stamp:
        return package
    work = Path(tempfile.mkdtemp(prefix=".transformer_lib-", dir=target))
    try:
        shutil.copytree(built / PACKAGE, work / PACKAGE, copy_function=_link_or_copy)
        (work / PACKAGE / ".build").write_text(stamp)
        os.chmod(work / PACKAGE / ".build", 0o644)
        if package.exists() or package.is_symlink():
            old = target / f".old-{built.name}-{os.getpid()}"
            os.rename(package, old)
            shutil.rmtree(old, ignore_errors=True)
        os.rename(work / PACKAGE, package)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return package
