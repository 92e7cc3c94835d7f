"""Classes defined in the script the worker runs (``python worker.py``, the class in
``__main__``), as many Temporal examples are written: the zygote imports that file under
another module name (``MAIN_ALIAS``), where the script's ``if __name__ == "__main__":``
guard keeps its start from running, and a class path names that module. A worker run as
``python -m package.module`` names the module itself. No ``temporalio`` here."""

from __future__ import annotations

import ast
import importlib.util
import os
import sys
from types import ModuleType
from typing import Any

from . import source

# The module name the worker's script is imported under in the zygote (and so in each child).
MAIN_ALIAS = "__wfjail_main__"
# The script's path, in the zygote's environment (the runner's policy sets it).
MAIN_ENV = "WFJAIL_TEMPORAL_MAIN"
# The preload entry (``module:function``) that imports the script in the zygote.
IMPORT_MAIN = "wfjail.temporal.main_script:import_main"


def main_file() -> str | None:
    """The file of the worker's ``__main__`` (absolute), or None (a REPL, ``python -c``)."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    return os.path.abspath(path) if isinstance(path, str) and os.path.isfile(path) else None


def class_path(cls: Any, what: str) -> str:
    """``module:qualname`` of ``cls``, a class of the worker's ``__main__``, for a confined
    process: ``MAIN_ALIAS:qualname`` (or the module's own name under ``python -m``). Raises
    ValueError with the fix when the confined process could not import it safely."""
    qualname = getattr(cls, "__qualname__", "")
    main = sys.modules.get("__main__")
    path = main_file()
    where = "%s %r cannot run in a confined process: it is defined in the script run as " \
            "__main__" % (what, cls)
    if main is None or path is None:
        raise ValueError("%s, which has no file (a REPL, python -c): move it to a module the "
                         "worker imports" % where)
    if _find(main, qualname) is not cls:
        raise ValueError("%s (%s), where %s does not name it: define it at the script's top "
                         "level, or move it to a module the worker imports"
                         % (where, path, qualname))
    if not has_main_guard(path):
        raise ValueError(
            "%s (%s), which has no `if __name__ == \"__main__\":` guard: the confined process "
            "imports the script to rebuild the class, and would run the worker's start too. "
            "Put the start under that guard (or move the class to a module the worker "
            "imports)" % (where, path))
    spec = getattr(main, "__spec__", None)
    module = getattr(spec, "name", None)
    if module and module != "__main__":
        return "%s:%s" % (module, qualname)  # python -m package.module: importable as such
    return "%s:%s" % (MAIN_ALIAS, qualname)


def has_main_guard(path: str) -> bool:
    """Whether the script at ``path`` has a top-level ``if __name__ == "__main__":`` (either
    way round). What runs outside that guard runs in the zygote too, under the policy."""
    try:
        with open(path, "rb") as f:
            tree = source.parse(f.read(), path)
    except (OSError, SyntaxError, ValueError):
        return False
    for node in tree.body:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Compare) \
                and len(node.test.ops) == 1 and isinstance(node.test.ops[0], ast.Eq):
            sides = [node.test.left, node.test.comparators[0]]
            names = [s.id for s in sides if isinstance(s, ast.Name)]
            strings = [s.value for s in sides if isinstance(s, ast.Constant)]
            if names == ["__name__"] and strings == ["__main__"]:
                return True
    return False


def preload(classes: list[str]) -> list[str]:
    """The preload entries the zygote needs before the warm-up for ``classes`` (class paths):
    ``IMPORT_MAIN`` when one names ``MAIN_ALIAS``."""
    return [IMPORT_MAIN] if any(c.startswith(MAIN_ALIAS + ":") for c in classes) else []


def import_main() -> ModuleType:
    """(In the zygote, or a child whose zygote did not.) The worker's script (``MAIN_ENV``)
    imported as ``MAIN_ALIAS``, once: its ``__name__`` is not ``"__main__"``, so its guarded
    start does not run."""
    module = sys.modules.get(MAIN_ALIAS)
    if module is not None:
        return module
    path = os.environ.get(MAIN_ENV)
    if not path:
        raise ImportError("the worker's script is unknown here (%s is not set)" % MAIN_ENV,
                          name=MAIN_ALIAS)
    spec = importlib.util.spec_from_file_location(MAIN_ALIAS, path)
    if spec is None or spec.loader is None:
        raise ImportError("cannot import the worker's script %s" % path, name=MAIN_ALIAS)
    module = importlib.util.module_from_spec(spec)
    sys.modules[MAIN_ALIAS] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[MAIN_ALIAS]
        raise
    return module


def _find(module: ModuleType, qualname: str) -> Any:
    obj: Any = module
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
    return obj
