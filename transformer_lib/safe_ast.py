"""`ast.parse` and `ast.literal_eval` that may be called from several threads at once.

CPython 3.11 keeps the recursion-depth bookkeeping of its parse-tree conversion in state that
all threads share (python/cpython#106905). When two threads build parse trees at the same time
and a garbage collection switches threads mid-way, one of them fails with
`SystemError: AST constructor recursion depth mismatch`. It depends on timing, so it shows on one
machine and not another. The grader prepares chapters and grades submissions in threads, and
judges learners' outputs there (chapter 08's pair counts arrive with their keys as text), so every
parse in the grader and the checkers goes through this module, under one lock.
"""

from __future__ import annotations

import ast
import threading

AST_LOCK = threading.RLock()
MAX_LITERAL = 10_000  # characters: a learner's key is a short tuple of strings, never a book


def parse(source: str, *args, **kwargs) -> ast.Module:
    with AST_LOCK:
        return ast.parse(source, *args, **kwargs)


def literal_eval(text: str):
    """`ast.literal_eval` of a short string; ValueError for anything longer than MAX_LITERAL."""
    if isinstance(text, str) and len(text) > MAX_LITERAL:
        raise ValueError(f"a literal of {len(text):,} characters is longer than {MAX_LITERAL:,}")
    with AST_LOCK:
        return ast.literal_eval(text)
