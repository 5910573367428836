"""Checkers for every exercise of the course, and a registry the grader looks them up in.

A notebook test cell calls `check_<exercise>(learner_function)`; the grader finds the
same checker by name in REGISTRY and judges the learner's outputs in its own process.
"""

from .core import (RESULTS, Case, Checker, CheckFailed, Mistake, Property, Verdict, describe_difference,
                   exercise_summary, model_calls, yours_or_reference)
import importlib
import pkgutil

# One module per chapter, chNN.py, each with a CHECKERS list: found by name, in chapter order.
CHAPTER_MODULES = [importlib.import_module(f".{m.name}", __name__)
                   for m in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name)
                   if m.name.startswith("ch") and m.name[2:].isdigit()]

REGISTRY: dict[str, Checker] = {}
for _module in CHAPTER_MODULES:
    for _checker in _module.CHECKERS:
        if _checker.name in REGISTRY:
            raise RuntimeError(f"two checkers are named {_checker.name!r}")
        REGISTRY[_checker.name] = _checker


def get_checker(name: str) -> Checker:
    """The checker for an exercise, by its name or by its test-cell alias `check_<name>`."""
    key = name.removeprefix("check_")
    if key not in REGISTRY:
        raise KeyError(f"no checker named {name!r}; known: {sorted(REGISTRY)}")
    return REGISTRY[key]


__all__ = ["Case", "Checker", "CheckFailed", "Mistake", "Property", "Verdict", "describe_difference", "REGISTRY",
           "RESULTS", "get_checker", "exercise_summary", "model_calls", "yours_or_reference"]
