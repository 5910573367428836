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


def _key(digest: str, hidden: list[Hidden]) -> str:
    stub_format = hashlib.sha256((HIDDEN_SOURCE + inspect.getsource(_stub)).encode()).hexdigest()
    return hashlib.sha256((digest + "|" + stub_format + "|" + ",".join(sorted(h.dotted for h in hidden))).encode()).hexdigest()[:20]


def build_copies(cache: Path, hidden_sets: list[list[Hidden]]) -> list[Path]:
    """For each set of references, a folder holding `transformer_lib/` with them stubbed.

    Cached by content (library source and hidden set); new copies are checked by importing them
    before they are published, all in one interpreter."""
    root = library_root()
    digest = library_digest(root)
    cache.mkdir(parents=True, exist_ok=True)
    os.chmod(cache, 0o755)
    finals = [cache / _key(digest, hidden) for hidden in hidden_sets]
    pending: dict[Path, Path] = {}
    try:
        for final, hidden in zip(finals, hidden_sets):
            if (final / ".ready").exists() or final in pending:
                continue
            pending[final] = _make_copy(root, cache, hidden)
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


def _make_copy(root: Path, cache: Path, hidden: list[Hidden]) -> Path:
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
    (package / f"{HIDDEN_MODULE}.py").write_text(HIDDEN_SOURCE)
    (work / ".modules").write_text("\n".join(sorted(by_module)))
    (work / ".hidden").write_text("\n".join(sorted(h.dotted for h in hidden)))
    compileall.compile_dir(str(package), quiet=2, workers=1)
    for dirpath, dirnames, filenames in os.walk(work):
        os.chmod(dirpath, 0o755)
        for f in filenames:
            os.chmod(os.path.join(dirpath, f), 0o644)
    return work
