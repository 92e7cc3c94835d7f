"""Python source parsed on any of the worker's threads.

CPython 3.11 converts a parse tree to ``ast`` objects with one recursion counter per
interpreter, not per thread: when a thread converting a tree is switched out in the middle
(a finalizer or a ``gc.callbacks`` entry that releases the GIL runs during one of its
allocations) and another thread converts a tree meanwhile, the first fails with
``SystemError: AST constructor recursion depth mismatch``. 3.12 keeps the counter per call.
The runner parses the worker's sources on its start thread while the worker's own threads
run (Temporal's SDK test suite hit it: a worker's start failed). So wfjail's own parses take
turns, and one that still collides with another library's parse is made again (parsing is
pure)."""

from __future__ import annotations

import ast
import threading
from typing import Any

_TURNS = threading.Lock()
_MISMATCH = "AST constructor recursion depth mismatch"
_ATTEMPTS = 3


def parse(source: str | bytes, path: str = "<unknown>") -> ast.Module:
    """``ast.parse(source, path)``, safe against a concurrent parse (module doc)."""
    tree = _parse(source, path, "exec")
    assert isinstance(tree, ast.Module)
    return tree


def literal_eval(text: str) -> Any:
    """``ast.literal_eval(text)`` through the same turns."""
    return ast.literal_eval(_parse(text.lstrip(" \t"), "<unknown>", "eval"))


def _parse(source: str | bytes, path: str, mode: str) -> ast.AST:
    with _TURNS:
        for attempt in range(_ATTEMPTS):
            try:
                return ast.parse(source, path, mode)
            except SystemError as e:
                if _MISMATCH not in str(e) or attempt == _ATTEMPTS - 1:
                    raise
    raise AssertionError("unreachable")
