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
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any, Callable

import torch

NOT_IMPLEMENTED = (
    "not implemented yet: your function still raises NotImplementedError. Replace the "
    "`raise NotImplementedError()` line with your code, then run this cell again."
)


class CheckFailed(AssertionError):
    """A failed check. In IPython it prints only its message: the learner needs the
    diagnosis, not a traceback through the checker's internals."""

    def _render_traceback_(self):
        return [f"\x1b[0;31mCheckFailed\x1b[0m: {self}"]


@dataclasses.dataclass
class Case:
    """One input to an exercise: positional and keyword arguments, and a name for messages."""

    name: str
    args: tuple = ()
    kwargs: dict = dataclasses.field(default_factory=dict)
    hidden: bool = False  # hidden cases run only in the graded, hidden part of a test cell

    def describe(self) -> str:
        parts = [_describe_value(a) for a in self.args]
        parts += [f"{k}={_describe_value(v)}" for k, v in self.kwargs.items()]
        return f"case '{self.name}' ({', '.join(parts)})"


@dataclasses.dataclass
class Mistake:
    """A wrong answer we expect to see, implemented so we can recognise its outputs."""

    name: str  # what the learner did, in their terms: "softmax over the query dimension"
    fix: str  # what to change: "take the softmax over the keys, dim=-1"
    implementation: Callable

    def message(self, checker_name: str) -> str:
        return f"{checker_name}: looks like {self.name}. {self.fix}"


@dataclasses.dataclass
class Verdict:
    passed: bool
    message: str
    mistake: str | None = None  # the name of the diagnosed mistake, if any


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


def _type_name(value) -> str:
    if isinstance(value, dict) and "__type__" in value:
        t = value["__type__"]
        return "a numpy array" if t == "numpy" else t
    if isinstance(value, torch.Tensor):
        return "a torch.Tensor"
    return type(value).__name__


def describe_difference(expected, actual, where: str = "output", rtol=1e-5, atol=1e-6) -> str | None:
    """None when `actual` matches `expected`; otherwise one sentence saying what differs."""
    if isinstance(expected, torch.Tensor):
        if not isinstance(actual, torch.Tensor):
            hint = " (convert with torch.as_tensor, or stay in torch throughout)" if _type_name(actual) == "a numpy array" else ""
            return f"{where}: expected a torch.Tensor, got {_type_name(actual)}{hint}"
        if actual.shape != expected.shape:
            return f"{where}: wrong shape, expected {list(expected.shape)}, got {list(actual.shape)}"
        if expected.dtype == torch.bool or not expected.is_floating_point():
            if actual.dtype != expected.dtype:
                return f"{where}: wrong dtype, expected {expected.dtype}, got {actual.dtype}"
            wrong = (actual != expected).nonzero()
            if len(wrong):
                idx = tuple(wrong[0].tolist())
                return (f"{where}: {len(wrong)} of {expected.numel()} entries differ, first at index "
                        f"{list(idx)}: expected {expected[idx].item()}, got {actual[idx].item()}")
            return None
        if not actual.is_floating_point():
            return f"{where}: expected floating point values ({expected.dtype}), got {actual.dtype}"
        if actual.dtype != expected.dtype:
            return f"{where}: wrong dtype, expected {expected.dtype}, got {actual.dtype} (keep the input's dtype)"
        nan_actual, nan_expected = actual.isnan(), expected.isnan()
        if (nan_actual & ~nan_expected).any():
            idx = tuple(((nan_actual & ~nan_expected).nonzero()[0]).tolist())
            return f"{where}: NaN at index {list(idx)} where {expected[idx].item():.4g} was expected"
        if torch.allclose(actual.double(), expected.double(), rtol=rtol, atol=atol, equal_nan=True):
            return None
        error = (actual.double() - expected.double()).abs().nan_to_num(nan=float("inf"))
        flat = int(error.argmax())
        idx = tuple(torch.unravel_index(torch.tensor(flat), error.shape)) if error.dim() else ()
        idx = tuple(int(i) for i in idx)
        return (f"{where}: values differ, largest error {error.max().item():.3g} at index {list(idx)}: "
                f"expected {expected[idx].item():.6g}, got {actual[idx].item():.6g}")
    if isinstance(expected, (tuple, list)):
        if not isinstance(actual, (tuple, list)):
            return f"{where}: expected a {type(expected).__name__} of {len(expected)} items, got {_type_name(actual)}"
        if len(actual) != len(expected):
            return f"{where}: expected {len(expected)} items, got {len(actual)}"
        for i, (e, a) in enumerate(zip(expected, actual)):
            diff = describe_difference(e, a, f"{where}[{i}]", rtol, atol)
            if diff:
                return diff
        return None
    if isinstance(expected, dict) and "__type__" not in expected:
        if not isinstance(actual, dict) or set(actual) != set(expected):
            return f"{where}: expected a dict with keys {sorted(expected)}, got {_type_name(actual)}"
        for key in expected:
            diff = describe_difference(expected[key], actual[key], f"{where}[{key!r}]", rtol, atol)
            if diff:
                return diff
        return None
    if isinstance(expected, float) and not isinstance(expected, bool):
        if not isinstance(actual, (int, float)) or isinstance(actual, bool):
            if isinstance(actual, torch.Tensor) and actual.numel() == 1:
                actual = actual.item()
            else:
                return f"{where}: expected a number, got {_type_name(actual)}"
        if abs(actual - expected) <= atol + rtol * abs(expected):
            return None
        return f"{where}: expected {expected:.6g}, got {actual:.6g}"
    if type(actual) is not type(expected) or actual != expected:
        return f"{where}: expected {expected!r}, got {actual!r}"
    return None


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

    # -- running (may happen in the learner's process) --------------------------------

    def cases(self, hidden: bool = False) -> list[Case]:
        """The visible cases, or with hidden=True the visible and the hidden ones."""
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
        for case in self.cases(hidden):
            try:
                with torch.no_grad():
                    outputs.append(_plain(self._call(fn, case)))
            except NotImplementedError:
                outputs.append({"__error__": "NotImplementedError", "__type__": "error"})
            except Exception as exc:  # the learner's bug, reported in the verdict
                outputs.append({"__error__": f"{type(exc).__name__}: {exc}", "__type__": "error"})
        return outputs

    # -- judging (always in a process the learner's code does not run in) ------------

    def _outputs_match(self, expected: list, actual: list) -> bool:
        return all(
            not _is_error(a) and describe_difference(e, a, rtol=self.rtol, atol=self.atol) is None
            for e, a in zip(expected, actual)
        )

    def judge(self, outputs: list, hidden: bool = False) -> Verdict:
        cases = self.cases(hidden)
        if len(outputs) != len(cases):
            return Verdict(False, f"{self.name}: expected outputs for {len(cases)} cases, got {len(outputs)}")
        if any(_is_error(o) and o["__error__"] == "NotImplementedError" for o in outputs):
            return Verdict(False, f"{self.name}: {NOT_IMPLEMENTED}")
        expected = self.collect_outputs(self.reference, hidden)
        first_failure = None
        for case, e, a in zip(cases, expected, outputs):
            if _is_error(a):
                first_failure = first_failure or (case, f"your function raised {a['__error__']}")
                continue
            diff = describe_difference(e, a, rtol=self.rtol, atol=self.atol)
            if diff and first_failure is None:
                first_failure = (case, diff)
        if first_failure is None:
            return Verdict(True, f"{self.name}: all {len(cases)} cases match the reference.")
        for mistake in self.mistakes:
            if self._outputs_match(self.collect_outputs(mistake.implementation, hidden), outputs):
                return Verdict(False, mistake.message(self.name), mistake.name)
        case, diff = first_failure
        return Verdict(False, f"{self.name}: {case.describe()}: {diff}")

    # -- the notebook entry point ------------------------------------------------------

    def __call__(self, fn: Callable, hidden: bool = False) -> None:
        if not callable(fn):
            raise CheckFailed(f"{self.name}: expected your function, got {_type_name(fn)}")
        verdict = self.judge(self.collect_outputs(fn, hidden), hidden)
        if not verdict.passed:
            raise CheckFailed(verdict.message)
        print(f"\u2713 {verdict.message}")


def _is_error(output) -> bool:
    return isinstance(output, dict) and output.get("__type__") == "error"
