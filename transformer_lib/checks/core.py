"""Checkers: data plus a comparison.

A checker for an exercise is three things:

* the **cases**: inputs built deterministically from a seed (random tensors, edge cases);
* the **reference**: the library's answer, run on the same cases;
* the **catalogue of mistakes**: wrong implementations learners often write, each with a
  name and a fix, so a wrong output can be *diagnosed*, not just rejected.

Running the learner's function and judging its outputs are separate steps on purpose.
In a notebook both happen in the learner's kernel (`checker(fn)`) for instant feedback.
The grader runs the learner's code in a separate, locked-down process that only calls
`collect_outputs` and writes the outputs to a file; it then calls `judge` in its own
process, where nothing the learner wrote can patch the comparison.

A catalogue entry recognises one mistake by reproducing it exactly. Learners often make
two at once (softmax over the wrong dim *and* without the max subtracted), and then no
single entry matches. **Properties** catch those: a property names an error from a trait of
the output alone (rows that do not sum to one, NaN only on large inputs, a transposed
result, the input's shape permuted), so a failure is still diagnosed in the learner's terms.

The notebook side has three more pieces, so that a chapter runs straight through:

* every check records its verdict (`RESULTS`), keyed by the function it judged;
* `yours_or_reference(fn, checker)` hands later cells the learner's function when it
  passes and the reference otherwise, and says which in one line. The learner's own
  name is never rebound, so re-running a test cell always tests what the learner wrote;
* `exercise_summary(*checkers)` prints which exercises of the chapter pass.

A class may hide the answers (`make hub ANSWERS=hidden`): its servers import a copy of this library
in which every graded exercise's reference is a stub (autograder/hiding.py, build_student_library).
There a cell that needs a hidden answer, directly or through a later cell's missing variable, ends in
one line (AnswerHidden) instead of a traceback, and Run All goes on; the checks judge against the
reference's outputs shipped with the copy.

Every message is written here and in the chapters' checkers in English, and said in the
notebook's language: each sentence goes through `say` (transformer_lib/language.py), which
looks it up in the Chinese catalogue for a Chinese notebook. `judge` takes the language, so
the grader can judge submissions of both editions side by side.
"""

from __future__ import annotations

import ast
import copy
import dataclasses
import functools
import re
import threading
from pathlib import Path
from typing import Any, Callable

import torch

from .. import safe_ast
from ..language import ENGLISH, current_language, say


class CheckFailed(AssertionError):
    """A failed check. In IPython it prints only its message: the learner needs the
    diagnosis, not a traceback through the checker's internals."""

    def _render_traceback_(self):
        return [f"\x1b[0;31mCheckFailed\x1b[0m: {self}"]


class AnswerHidden(RuntimeError):
    """In a class whose answers are hidden: this cell needs an exercise's answer that is not there (the
    learner's does not pass yet, and the library holds no reference). Shown as its one line; the cell's
    execute reply says "ok" (`_keep_run_all_running`), so Run All goes on to the next cell."""

    def __init__(self, line: str, needs: str = ""):
        super().__init__(line)
        self.needs = needs  # the exercise's name, for the cells after it that miss what this one made

    def _render_traceback_(self):
        return [f"\x1b[0;33m{self}\x1b[0m"]


# Names a cell skipped for a hidden answer would have bound -> the answer it needed. They are removed
# from the kernel (a half-run cell leaves half-made values that fail later in ways no one can explain);
# a later cell that needs one fails with a NameError, which is then a skip too, in one line, and so on.
_SKIPPED_NAMES: dict[str, str] = {}


def _needs_a_skipped_name(error) -> bool:
    return isinstance(error, NameError) and getattr(error, "name", None) in _SKIPPED_NAMES


def _keep_run_all_running(result) -> None:
    """IPython's post_run_cell hook: a cell that ended in CheckFailed still shows its red error
    output (nbgrader scores the test 0 from it, nbval and nbclient see it), but its execute reply
    says "ok". JupyterLab's Run All marks every cell it has not run yet as idle (`[ ]` instead of
    `[*]`) as soon as one reply is an error, assuming the kernel dropped them; with the
    `raises-exception` tag the kernel goes on running them, so a learner would watch a training
    cell run under a blank prompt. Only a failed check is treated so, and, in a class whose answers
    are hidden, a cell skipped for one (AnswerHidden, or a NameError for what a skipped cell did not
    make); any other error is untouched."""
    error = getattr(result, "error_in_exec", None)
    source = getattr(getattr(result, "info", None), "raw_cell", "") or ""
    if isinstance(error, CheckFailed):
        result.error_in_exec = None
    elif isinstance(error, AnswerHidden) or _needs_a_skipped_name(error):
        needs = error.needs if isinstance(error, AnswerHidden) else _SKIPPED_NAMES[error.name]
        _forget_what_it_made(source, needs)
        result.error_in_exec = None
    elif _SKIPPED_NAMES and error is None and getattr(result, "error_before_exec", None) is None:
        for name in _bound_names(source):  # made again (the answer passes now): a NameError for it is the learner's
            _SKIPPED_NAMES.pop(name, None)


def _bound_names(source: str) -> set[str]:
    """The names a cell binds at its top level (assignments, loops, imports, definitions)."""
    from IPython import get_ipython

    try:
        tree = safe_ast.parse(get_ipython().transform_cell(source))
    except Exception:  # not Python after all: nothing to forget
        return set()
    names: set[str] = set()
    todo = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
            continue  # its body binds the function's names, not the notebook's
        if isinstance(node, (ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
            continue
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.alias):
            names.add((node.asname or node.name).split(".")[0])
        todo.extend(ast.iter_child_nodes(node))
    return names


def _forget_what_it_made(source: str, needs: str) -> None:
    from IPython import get_ipython

    shell = get_ipython()
    for name in _bound_names(source):
        shell.user_ns.pop(name, None)
        _SKIPPED_NAMES[name] = needs
    if not shell.custom_exceptions:  # the first skip of this kernel: from now on such a NameError is one line
        shell.set_custom_exc((NameError,), _one_line_for_a_skipped_name)


def _one_line_for_a_skipped_name(shell, etype, value, tb, tb_offset=None):
    """IPython's handler of a NameError once a cell was skipped: one line when the name is one a skipped
    cell did not make, the usual traceback otherwise."""
    if _needs_a_skipped_name(value):
        line = say("skipped: this cell needs `{name}`, which a cell above did not make: it was skipped for `{needs}`",
                   current_language(), name=value.name, needs=_SKIPPED_NAMES[value.name])
        value._render_traceback_ = lambda: AnswerHidden(line)._render_traceback_()
    shell.showtraceback((etype, value, tb), tb_offset=tb_offset, running_compiled_code=True)


def _install_kernel_hook() -> None:
    try:
        from IPython import get_ipython
    except ImportError:
        return
    shell = get_ipython()
    if shell is None or type(shell).__name__ != "ZMQInteractiveShell":  # only a notebook kernel replies
        return
    callbacks = shell.events.callbacks.get("post_run_cell", [])
    if not any(getattr(cb, "__name__", "") == _keep_run_all_running.__name__ for cb in callbacks):
        shell.events.register("post_run_cell", _keep_run_all_running)


# -- a class's library with the answers hidden ---------------------------------------------------

# In that copy (and only there): the reference outputs its checks judge against, written by
# autograder/hiding.py; and its `_grading_hidden` module, whose EXERCISES names each hidden reference's
# exercise. The full library has neither, and a grader's copy has no EXERCISES: both behave as before.
SHIPPED_OUTPUTS = "_class_outputs.pt"


@functools.lru_cache(maxsize=1)
def _shipped_outputs() -> dict:
    path = Path(__file__).resolve().parent.parent / SHIPPED_OUTPUTS
    return torch.load(path, weights_only=True) if path.exists() else {}


@functools.lru_cache(maxsize=1)
def _hidden_exercises() -> dict:
    try:
        from .. import _grading_hidden
    except ImportError:
        return {}
    return getattr(_grading_hidden, "EXERCISES", {})


def _hidden_exercise(obj) -> list | None:
    """[checker, learner's name, chapter, number] when `obj` is a reference this class hides."""
    return _hidden_exercises().get(f"{getattr(obj, '__module__', '')}.{getattr(obj, '__qualname__', '')}")


def answer_hidden(reference: str) -> AnswerHidden:
    """What a stub of a student's copy raises when something calls the hidden `reference` (the library's
    own code, a checker's cases, a cell): which exercise's answer it is, in the learner's language."""
    checker, name, chapter, number = _hidden_exercises().get(reference, ["", reference, "?", "?"])
    return AnswerHidden(say("skipped: this cell needs `{name}` (chapter {chapter}, exercise {number}), whose answer "
                            "this class keeps hidden", current_language(), name=name,
                            chapter=str(chapter).split("_")[0].lstrip("0"), number=number), needs=name)


def _until_it_passes(fallback, name: str, number: int):
    """What later cells get for an answer that does not pass when the reference is hidden: the same kind
    of thing (a function, or a class they may subclass), which says in one line that it is needed."""
    def needed() -> AnswerHidden:
        return AnswerHidden(say("skipped: this cell needs your `{name}` (exercise {number}), which does not pass "
                                "its check yet: once it passes, run the cells from its test cell on again",
                                current_language(), name=name, number=number), needs=name)

    if isinstance(fallback, type):
        def __init__(self, *args, **kwargs):
            raise needed()

        return type(fallback.__name__, (fallback,), {"__init__": __init__, "__module__": fallback.__module__})

    def needs_your_answer(*args, **kwargs):
        raise needed()

    needs_your_answer.__name__ = needs_your_answer.__qualname__ = name
    return needs_your_answer


_install_kernel_hook()


@dataclasses.dataclass
class Case:
    """One input to an exercise: positional and keyword arguments, and a name for messages."""

    name: str
    args: tuple = ()
    kwargs: dict = dataclasses.field(default_factory=dict)
    hidden: bool = False  # hidden cases run only in the graded, hidden part of a test cell

    def describe(self, language: str = ENGLISH) -> str:
        parts = [_describe_value(a) for a in self.args]
        parts += [f"{k}={_describe_value(v)}" for k, v in self.kwargs.items()]
        return say("case '{name}' ({inputs})", language, name=say(self.name, language), inputs=", ".join(parts))


@dataclasses.dataclass
class Mistake:
    """A wrong answer we expect to see, implemented so we can recognise its outputs."""

    name: str  # what the learner did, in their terms: "softmax over the query dimension"
    fix: str  # what to change: "take the softmax over the keys, dim=-1"
    implementation: Callable

    def message(self, checker_name: str, language: str = ENGLISH) -> str:
        return say("{exercise}: looks like {mistake}. {fix}", language, exercise=checker_name,
                   mistake=say(self.name, language), fix=say(self.fix, language))


@dataclasses.dataclass
class Property:
    """An error recognised from a trait of the output, not from one exact wrong answer.

    `seen(case, expected, actual)` is True when the learner's output `actual` for `case`
    shows the trait (the reference's output is `expected`). It runs only on outputs that
    already failed, so it never has to prove an answer right; an exception inside it
    counts as "not seen"."""

    name: str  # the trait, in the learner's terms: "weights that do not sum to 1 over the keys"
    fix: str
    seen: Callable[[Case, Any, Any], bool]


@dataclasses.dataclass
class Verdict:
    passed: bool
    message: str  # in the language the check was asked for
    mistake: str | None = None  # the name of the diagnosed mistake, if any
    english: str = ""  # the message in English (the grader's report), when `message` is in another language

    def __post_init__(self):
        self.english = self.english or self.message


def seeded(seed: int) -> torch.Generator:
    """A generator of its own for each checker, so its cases never depend on global RNG state."""
    return torch.Generator().manual_seed(seed)


def randn(g: torch.Generator, *shape, dtype=torch.float32, scale: float = 1.0, shift: float = 0.0) -> torch.Tensor:
    """Normal samples drawn in float64 and then cast, so a float32 case and its float64
    twin hold the same numbers up to rounding."""
    return (torch.randn(*shape, generator=g, dtype=torch.float64) * scale + shift).to(dtype)


def random_mask(g: torch.Generator, *shape) -> torch.Tensor:
    """A boolean mask (True = may attend) in which every query still sees at least one key."""
    mask = torch.rand(*shape, generator=g) < 0.6  # [..., L_q, L_k]
    mask[..., 0] = True
    return mask


def _describe_value(value) -> str:
    if isinstance(value, torch.Tensor):
        dtype = str(value.dtype).replace("torch.", "")
        return f"tensor{list(value.shape)} {dtype}"
    if isinstance(value, (list, tuple)) and len(value) > 4:
        return f"{type(value).__name__} of {len(value)}"
    return repr(value)


def _plain(value):
    """Turn an output into something `torch.load(weights_only=True)` can read back:
    tensors, numbers, strings and containers of them. Anything else becomes a marker
    that names its type, so the comparison can say what came back."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().clone()
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    if isinstance(value, (list, tuple)):
        items = [_plain(v) for v in value]
        return tuple(items) if isinstance(value, tuple) else items
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    module = type(value).__module__
    if module == "numpy" or module.startswith("numpy."):
        try:
            return {"__type__": "numpy", "value": torch.as_tensor(value)}
        except Exception:
            pass
    return {"__type__": f"{module}.{type(value).__qualname__}"}


def _type_name(value, language: str = ENGLISH) -> str:
    if isinstance(value, dict) and "__type__" in value:
        t = value["__type__"]
        return say("a numpy array", language) if t == "numpy" else t
    if isinstance(value, torch.Tensor):
        return say("a torch.Tensor", language)
    return type(value).__name__


def describe_difference(expected, actual, where: str | None = None, rtol=1e-5, atol=1e-6,
                        language: str = ENGLISH) -> str | None:
    """None when `actual` matches `expected`; otherwise one sentence saying what differs."""
    where = say("output", language) if where is None else where

    def said(template: str, **fields) -> str:
        return say(template, language, where=where, **fields)

    if isinstance(expected, torch.Tensor):
        if not isinstance(actual, torch.Tensor):
            if _type_name(actual) == "a numpy array":
                return said("{where}: expected a torch.Tensor, got a numpy array (convert with torch.as_tensor, "
                            "or stay in torch throughout)")
            return said("{where}: expected a torch.Tensor, got {got}", got=_type_name(actual, language))
        if actual.shape != expected.shape:
            return said("{where}: wrong shape, expected {expected}, got {got}", expected=list(expected.shape),
                        got=list(actual.shape))
        if expected.dtype == torch.bool or not expected.is_floating_point():
            if actual.dtype != expected.dtype:
                return said("{where}: wrong dtype, expected {expected}, got {got}", expected=expected.dtype,
                            got=actual.dtype)
            wrong = (actual != expected).nonzero()
            if len(wrong):
                idx = tuple(wrong[0].tolist())
                return said("{where}: {count} of {total} entries differ, first at index {index}: expected "
                            "{expected}, got {got}", count=len(wrong), total=expected.numel(), index=list(idx),
                            expected=expected[idx].item(), got=actual[idx].item())
            return None
        if not actual.is_floating_point():
            return said("{where}: expected floating point values ({expected}), got {got}", expected=expected.dtype,
                        got=actual.dtype)
        if actual.dtype != expected.dtype:
            return said("{where}: wrong dtype, expected {expected}, got {got} (keep the input's dtype)",
                        expected=expected.dtype, got=actual.dtype)
        nan_actual, nan_expected = actual.isnan(), expected.isnan()
        if (nan_actual & ~nan_expected).any():
            idx = tuple(((nan_actual & ~nan_expected).nonzero()[0]).tolist())
            return said("{where}: NaN at index {index} where {expected} was expected", index=list(idx),
                        expected=f"{expected[idx].item():.4g}")
        if torch.allclose(actual.double(), expected.double(), rtol=rtol, atol=atol, equal_nan=True):
            return None
        error = (actual.double() - expected.double()).abs().nan_to_num(nan=float("inf"))
        flat = int(error.argmax())
        idx = tuple(torch.unravel_index(torch.tensor(flat), error.shape)) if error.dim() else ()
        idx = tuple(int(i) for i in idx)
        return said("{where}: values differ, largest error {error} at index {index}: expected {expected}, got {got}",
                    error=f"{error.max().item():.3g}", index=list(idx), expected=f"{expected[idx].item():.6g}",
                    got=f"{actual[idx].item():.6g}")
    if isinstance(expected, (tuple, list)):
        if not isinstance(actual, (tuple, list)):
            return said("{where}: expected a {kind} of {count} items, got {got}", kind=type(expected).__name__,
                        count=len(expected), got=_type_name(actual, language))
        if len(actual) != len(expected):
            return said("{where}: expected {expected} items, got {got}", expected=len(expected), got=len(actual))
        for i, (e, a) in enumerate(zip(expected, actual)):
            diff = describe_difference(e, a, f"{where}[{i}]", rtol, atol, language)
            if diff:
                return diff
        return None
    if isinstance(expected, dict) and "__type__" not in expected:
        if not isinstance(actual, dict) or set(actual) != set(expected):
            return said("{where}: expected a dict with keys {keys}, got {got}", keys=sorted(expected),
                        got=_type_name(actual, language))
        for key in expected:
            diff = describe_difference(expected[key], actual[key], f"{where}[{key!r}]", rtol, atol, language)
            if diff:
                return diff
        return None
    if isinstance(expected, float) and not isinstance(expected, bool):
        if not isinstance(actual, (int, float)) or isinstance(actual, bool):
            if isinstance(actual, torch.Tensor) and actual.numel() == 1:
                actual = actual.item()
            else:
                return said("{where}: expected a number, got {got}", got=_type_name(actual, language))
        if abs(actual - expected) <= atol + rtol * abs(expected):
            return None
        return said("{where}: expected {expected}, got {got}", expected=f"{expected:.6g}", got=f"{actual:.6g}")
    if type(actual) is not type(expected) or actual != expected:
        return said("{where}: expected {expected}, got {got}", expected=repr(expected), got=repr(actual))
    return None


# torch's default generator (and its default dtype, and the warnings filters) belong to the whole
# process, and building cases, running references and reproducing mistakes seed it
# (torch.random.fork_rng, then torch.manual_seed). The grader judges several submissions at once,
# in threads of one process: without this lock one thread reseeds the generator while another is
# between its own seed and its draws, and a right answer meets a wrong "expected" output.
SHARED_STATE = threading.RLock()


@dataclasses.dataclass
class Checker:
    """Checks a learner's implementation of one exercise against the reference."""

    name: str  # the exercise, e.g. "scaled_attention"
    reference: Callable
    make_cases: Callable[[], list[Case]]  # deterministic: same cases on every call
    mistakes: list[Mistake] = dataclasses.field(default_factory=list)
    rtol: float = 1e-5
    atol: float = 1e-6
    # How to call the function under test on a case; exercises on classes override it.
    invoke: Callable[[Callable, Case], Any] | None = None
    properties: list[Property] = dataclasses.field(default_factory=list)
    # What later cells use when the learner's answer does not pass (default: `reference`);
    # set it when the reference has a different name or signature than the exercise.
    fallback: Callable | None = None
    # APIs an answer to this exercise may not call, as dotted names ("torch.softmax",
    # "torch.nn.functional.softmax", "torch.Tensor.softmax" for the method, "aten._softmax" for
    # the operator whatever the entry point). The grader flags an answer that calls one; the
    # notebook's own check ignores the list.
    forbidden: tuple[str, ...] = ()
    _expected: dict = dataclasses.field(default_factory=dict, init=False, repr=False, compare=False)

    # -- running (may happen in the learner's process) --------------------------------

    def cases(self, hidden: bool = False) -> list[Case]:
        """The visible cases, or with hidden=True the visible and the hidden ones."""
        with SHARED_STATE:
            return [c for c in self.make_cases() if hidden or not c.hidden]

    def _call(self, fn: Callable, case: Case):
        # Fresh copies, so an implementation that modifies its inputs in place cannot
        # change what the next case, or the reference, sees.
        args, kwargs = copy.deepcopy(case.args), copy.deepcopy(case.kwargs)
        if self.invoke is not None:
            return self.invoke(fn, Case(case.name, args, kwargs, case.hidden))
        return fn(*args, **kwargs)

    def collect_outputs(self, fn: Callable, hidden: bool = False) -> list:
        """Run `fn` on every case; an exception becomes {'__error__': ..., '__type__': ...}."""
        outputs = []
        with SHARED_STATE:
            for case in self.cases(hidden):
                try:
                    with torch.no_grad():
                        outputs.append(_plain(self._call(fn, case)))
                except NotImplementedError:
                    outputs.append({"__error__": "NotImplementedError", "__type__": "error"})
                except AnswerHidden:  # not the learner's bug: the cell is skipped, in one line
                    raise
                except Exception as exc:  # the learner's bug, reported in the verdict
                    outputs.append({"__error__": f"{type(exc).__name__}: {exc}", "__type__": "error"})
        return outputs

    def expected_outputs(self, hidden: bool = False) -> list:
        """The reference's outputs on the cases, computed once per process: they are seeded, and
        the grader judges every submission of a class against the same ones."""
        with SHARED_STATE:
            if hidden not in self._expected:
                shipped = None if hidden else _shipped_outputs().get(self.name)  # a hidden reference's
                self._expected[hidden] = shipped["expected"] if shipped else self.collect_outputs(self.reference, hidden)
            return self._expected[hidden]

    def mistake_outputs(self, mistake: Mistake, hidden: bool = False) -> list | None:
        """The outputs of a catalogued mistake on the cases; where it is the hidden reference with a twist,
        those the copy shipped (None if none: it cannot be recognised)."""
        try:
            return self.collect_outputs(mistake.implementation, hidden)
        except AnswerHidden:
            shipped = None if hidden else _shipped_outputs().get(self.name)
            return shipped["mistakes"].get(mistake.name) if shipped else None

    # -- judging (always in a process the learner's code does not run in) ------------

    def _outputs_match(self, expected: list, actual: list) -> bool:
        return all(
            not _is_error(a) and describe_difference(e, a, rtol=self.rtol, atol=self.atol) is None
            for e, a in zip(expected, actual)
        )

    def judge(self, outputs: list, hidden: bool = False, language: str = ENGLISH) -> Verdict:
        """The verdict on `outputs`, its message in `language`, and in English too (the grader's report).
        The diagnosis itself never depends on the language: only its wording does."""
        with SHARED_STATE:  # the mistakes and properties below run seeded code too
            passed, mistake, message = self._judge(outputs, hidden)
        return Verdict(passed, message(language), mistake, english=message(ENGLISH))

    def _judge(self, outputs: list, hidden: bool) -> tuple[bool, str | None, Callable[[str], str]]:
        """(passed, the diagnosed mistake's name, the message as a function of the language)."""
        def said(template: str, language: str, **fields) -> str:
            return say(template, language, exercise=self.name, **fields)

        cases = self.cases(hidden)
        if len(outputs) != len(cases):
            return False, None, lambda lang: said("{exercise}: expected outputs for {expected} cases, got {got}", lang,
                                                  expected=len(cases), got=len(outputs))
        if any(_is_error(o) and o["__error__"] == "NotImplementedError" for o in outputs):
            return False, None, lambda lang: said(
                "{exercise}: not implemented yet: your function still raises NotImplementedError. Replace the "
                "`raise NotImplementedError()` line with your code, then run this cell again.", lang)
        expected = self.expected_outputs(hidden)
        first_failure = None  # (case, a function of the language saying what went wrong)
        for case, e, a in zip(cases, expected, outputs):
            if _is_error(a):
                first_failure = first_failure or (case, lambda lang, a=a: say("your function raised {error}", lang,
                                                                              error=_error_in(a["__error__"], lang)))
                continue
            if first_failure is None and describe_difference(e, a, rtol=self.rtol, atol=self.atol) is not None:
                first_failure = (case, lambda lang, e=e, a=a: describe_difference(e, a, rtol=self.rtol, atol=self.atol,
                                                                                  language=lang))
        if first_failure is None:
            return True, None, lambda lang: said("{exercise}: all {count} cases match the reference.", lang,
                                                 count=len(cases))
        for mistake in self.mistakes:
            reproduced = self.mistake_outputs(mistake, hidden)
            if reproduced is not None and self._outputs_match(reproduced, outputs):
                return False, mistake.name, lambda lang: mistake.message(self.name, lang)
        seen = self._properties_seen(cases, expected, outputs)
        if seen:
            return False, seen[0].name, lambda lang: said(
                "{exercise}: your output shows {traits}. {fixes}", lang,
                traits=say("; and ", lang).join(say(p.name, lang) for p in seen),
                fixes=" ".join(say(p.fix, lang) for p in seen))
        case, difference = first_failure
        return False, None, lambda lang: said("{exercise}: {case}: {difference}", lang, case=case.describe(lang),
                                              difference=difference(lang))

    def _properties_seen(self, cases, expected, outputs) -> list[Property]:
        seen = []
        for prop in self.properties:
            for case, e, a in zip(cases, expected, outputs):
                if _is_error(a) or _is_error(e):
                    continue
                try:
                    hit = bool(prop.seen(case, e, a))
                except Exception:
                    hit = False
                if hit:
                    seen.append(prop)
                    break
        return seen

    # -- the notebook entry point ------------------------------------------------------

    def verdict_for(self, fn: Callable, hidden: bool = False) -> Verdict:
        """Run and judge in this process (the notebook's path), and record the verdict."""
        language = current_language()
        if not callable(fn):
            verdict = Verdict(False, say("{exercise}: expected your function, got {got}", language, exercise=self.name,
                                         got=_type_name(fn, language)),
                              english=say("{exercise}: expected your function, got {got}", ENGLISH,
                                          exercise=self.name, got=_type_name(fn)))
        else:
            verdict = self.judge(self.collect_outputs(fn, hidden), hidden, language)
        RESULTS[self.name] = (fn, verdict)
        return verdict

    def __call__(self, fn: Callable, hidden: bool = False) -> None:
        verdict = self.verdict_for(fn, hidden)
        if not verdict.passed:
            raise CheckFailed(verdict.message)
        print(f"\u2713 {verdict.message}")


# -- the notebook's bookkeeping: which answer later cells use, and the chapter summary -------

# exercise name -> (the function last checked, its verdict). Only the learner's kernel
# writes it; the grader never reads it.
RESULTS: dict[str, tuple[Any, Verdict]] = {}


def yours_or_reference(fn: Callable, checker: Checker):
    """The learner's `fn` if it passes `checker`'s visible cases, else the reference.

    Says which in one line. A verdict recorded for this very function object (by its test
    cell) is reused; otherwise the check runs now, silently. Never raises for a wrong or
    unfinished answer: the chapter goes on with the reference."""
    recorded = RESULTS.get(checker.name)
    if recorded is not None and recorded[0] is fn:
        verdict = recorded[1]
    else:
        verdict = checker.verdict_for(fn)
    name = getattr(fn, "__name__", checker.name)
    language = current_language()
    if verdict.passed:
        print(say("using your `{name}`", language, name=name))
        return fn
    fallback = checker.fallback if checker.fallback is not None else checker.reference
    hidden = _hidden_exercise(fallback)
    if hidden is not None:  # a class whose answers are hidden: there is no reference to run
        print(say("your `{name}` does not pass its check yet, and this class keeps the answers hidden: the cells "
                  "that need it are skipped", language, name=name))
        return _until_it_passes(fallback, name, hidden[3])
    print(say("your `{name}` does not pass its check yet: using the reference", language, name=name))
    return fallback


def model_calls(model: torch.nn.Module, fn: Callable, *inputs, **kwargs) -> int:
    """How many times one forward pass of `model` calls `fn`.

    A chapter builds its model from the learner's functions (`yours_or_reference` hands them
    over) and keeps each one as an attribute of a module. This finds every attribute, anywhere in
    the module tree, that *is* `fn`, counts the calls made through it while running
    `model(*inputs, **kwargs)` once without gradients, and puts everything back. A chapter asserts
    the count, so "the model you trained runs your function" is checked, not just said."""
    count = 0

    def counting(*args, **kw):
        nonlocal count
        count += 1
        return fn(*args, **kw)

    patched = [(module, attr) for module in model.modules() for attr, value in list(vars(module).items())
               if value is fn]
    if not patched:
        return 0
    try:
        for module, attr in patched:
            setattr(module, attr, counting)
        with torch.no_grad():
            model(*inputs, **kwargs)
    finally:
        for module, attr in patched:
            setattr(module, attr, fn)
    return count


def exercise_summary(*checkers: Checker) -> None:
    """Print, for each exercise of a chapter, whether its last check passed."""
    language = current_language()
    passed = [c for c in checkers if c.name in RESULTS and RESULTS[c.name][1].passed]
    print(say("Exercises passing: {passed} of {total}", language, passed=len(passed), total=len(checkers)))
    for checker in checkers:
        if checker.name not in RESULTS:
            print("  \u00b7 " + say("{exercise}: not checked yet (run its test cell)", language, exercise=checker.name))
        elif RESULTS[checker.name][1].passed:
            print(f"  \u2713 {checker.name}")
        else:
            # The verdict's first sentence, in whichever language it was written (a Chinese one after "：").
            message = RESULTS[checker.name][1].message.removeprefix(f"{checker.name}: ").removeprefix(f"{checker.name}：")
            first_sentence = re.split(r"(?<=[.])\s|。", message)[0].rstrip(".")
            print("  \u2717 " + say("{exercise}: {why}", language, exercise=checker.name, why=first_sentence))


def _error_in(error: str, language: str) -> str:
    """An exception raised in the learner's process ("RuntimeError: ..."), its text translated when the
    chapter's catalogue has it (the errors the exercise's models raise on purpose)."""
    kind, colon, text = error.partition(": ")
    return f"{kind}{colon}{say(text, language)}" if colon else error


def _is_error(output) -> bool:
    return isinstance(output, dict) and output.get("__type__") == "error"


# -- reading outputs back from a process the learner's code ran in ---------------------------

PLAIN_DTYPES = frozenset({torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
                          torch.bfloat16, torch.float32, torch.float64, torch.complex64, torch.complex128})


def validate_outputs(outputs, n_cases: int, max_elements: int = 20_000_000, max_items: int = 200_000,
                     max_depth: int = 12, max_string: int = 20_000) -> str | None:
    """None when `outputs` looks like what `collect_outputs` returns for `n_cases` cases: a list
    with one item per case, each made only of plain CPU tensors (exactly `torch.Tensor`, strided,
    a numeric or bool dtype), numbers, strings, None, and lists, tuples and string-keyed dicts of
    them, within the size bounds. Otherwise one sentence saying what is wrong.

    The grader calls it on outputs read back (`torch.load(weights_only=True)`) from the process
    that ran the learner's functions, before `judge` sees them: a subclass of Tensor or int, an
    object of another type, a huge or deeply nested structure, or the wrong number of cases is
    rejected instead of reaching the comparison."""
    if type(outputs) is not list:
        return f"expected a list of outputs, got {type(outputs).__qualname__}"
    if len(outputs) != n_cases:
        return f"expected outputs for {n_cases} cases, got {len(outputs)}"
    budget = {"elements": max_elements, "items": max_items}

    def walk(value, depth: int) -> str | None:
        budget["items"] -= 1
        if budget["items"] < 0:
            return f"more than {max_items} items"
        if depth > max_depth:
            return f"nested more than {max_depth} levels deep"
        kind = type(value)
        if kind is torch.Tensor:
            if value.layout != torch.strided or value.device.type != "cpu" or value.is_meta:
                return f"a tensor with layout {value.layout} on {value.device}"
            if value.dtype not in PLAIN_DTYPES:
                return f"a tensor of dtype {value.dtype}"
            if value.dim() > 16:
                return f"a tensor with {value.dim()} dimensions"
            budget["elements"] -= value.numel()
            if budget["elements"] < 0:
                return f"more than {max_elements} tensor elements in all"
            return None
        if kind in (bool, int, float) or value is None:
            return None
        if kind is str:
            return f"a string of {len(value)} characters" if len(value) > max_string else None
        if kind in (list, tuple):
            for item in value:
                problem = walk(item, depth + 1)
                if problem:
                    return problem
            return None
        if kind is dict:
            for key, item in value.items():
                if type(key) is not str or len(key) > max_string:
                    return f"a dict key of type {type(key).__qualname__}"
                problem = walk(item, depth + 1)
                if problem:
                    return problem
            return None
        return f"an object of type {kind.__module__}.{kind.__qualname__}"

    for i, item in enumerate(outputs):
        problem = walk(item, 1)
        if problem:
            return f"case {i + 1}: {problem}"
    return None
