"""What the runner's generated policy lets workflow code read (docs/temporal.md, "What a
workflow can read"): the interpreter and its libraries whole; from the other directories of
the worker's import path (its working directory, its script's directory, PYTHONPATH), only
the files of the modules the runs import, found from the modules the zygote preloads and
the classes a run is rebuilt from, by the imports their source names; those directories
listed, so that Python's import system finds the modules in them. Not the worker's keys,
``.env`` or logs kept beside it. No ``temporalio`` here."""

from __future__ import annotations

import ast
import importlib.machinery
import importlib.util
import os
import site
import sys
import sysconfig
from typing import Iterable, NamedTuple

from . import main_script, source


class Reads(NamedTuple):
    """The grants: ``read`` (directories whole, files one by one) and ``list``."""

    read: list[str]
    list: list[str]


def _unique(paths: Iterable[str]) -> list[str]:
    out: list[str] = []
    for p in paths:
        if p not in out:
            out.append(p)
    return out


def _under(path: str, dirs: Iterable[str]) -> bool:
    """Whether ``path`` is one of ``dirs`` or beneath one (real paths compared)."""
    real = os.path.realpath(path)
    return any(real == d or real.startswith(d.rstrip("/") + "/")
               for d in (os.path.realpath(d) for d in dirs))


def library_dirs() -> list[str]:
    """The directories granted whole: the interpreter's prefixes (a venv's, and the
    interpreter's its ``python`` links to: pyenv, /opt), its standard library and its
    site-packages (the user's too, when on the import path)."""
    dirs = [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
            os.path.dirname(os.path.dirname(os.path.realpath(sys.executable)))]
    getsitepackages = getattr(site, "getsitepackages", None)
    if getsitepackages is not None:
        dirs += getsitepackages()
    user = site.getusersitepackages() if site.ENABLE_USER_SITE else None
    if user and user in sys.path:
        dirs.append(user)
    paths = sysconfig.get_paths()
    dirs += [paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths]
    return _unique(os.path.abspath(d) for d in dirs if d and os.path.isdir(d))


def import_path() -> list[str]:
    """The worker's import path (``sys.path``), absolute, existing, each once."""
    path = [os.path.abspath(p or ".") for p in sys.path]
    return [p for i, p in enumerate(path) if os.path.exists(p) and p not in path[:i]]


def project_dirs(path: list[str], library: list[str]) -> list[str]:
    """The directories of the import path outside the libraries: the worker's own code."""
    return [p for p in path if os.path.isdir(p) and not _under(p, library)]


class _Located(NamedTuple):
    origin: str              # the module's file
    cached: str | None       # its bytecode in __pycache__, when it exists
    package: bool            # a package (its origin is its __init__)


def _locate(name: str) -> _Located | None:
    """Where module ``name`` is, without importing anything: the worker's own module when
    loaded, else what the path finder finds (under its parent package's path)."""
    module = sys.modules.get(name)
    if module is not None:
        origin = getattr(module, "__file__", None)
        cached = getattr(module, "__cached__", None)
        package = hasattr(module, "__path__")
    else:
        parent, _, _ = name.rpartition(".")
        search: list[str] | None = None
        if parent:
            loaded = sys.modules.get(parent)
            found = getattr(loaded, "__path__", None) if loaded is not None else None
            if found is None:
                spec = _spec(parent, None)
                found = spec.submodule_search_locations if spec is not None else None
            if found is None:
                return None
            search = list(found)
        spec = _spec(name, search)
        if spec is None or not spec.has_location:
            return None
        origin, cached = spec.origin, spec.cached
        package = spec.submodule_search_locations is not None
    if not isinstance(origin, str) or not os.path.isfile(origin):
        return None
    if not isinstance(cached, str) or not os.path.isfile(cached):
        cached = None
    return _Located(os.path.abspath(origin), cached and os.path.abspath(cached), package)


def _spec(name: str, search: list[str] | None) -> importlib.machinery.ModuleSpec | None:
    """The path finder's spec of ``name`` (top level on ``sys.path``, else in ``search``):
    no other finder of ``sys.meta_path``, none of which runs a module either."""
    if "." in name and search is None:
        parent = _spec(name.rpartition(".")[0], None)
        if parent is None or parent.submodule_search_locations is None:
            return None
        search = list(parent.submodule_search_locations)
    try:
        return importlib.machinery.PathFinder.find_spec(name, search)
    except Exception:  # noqa: BLE001  (a path hook's own error: the module is not found)
        return None


def imports_of(path: str, name: str, package: bool) -> list[str]:
    """The modules the source at ``path`` (module ``name``) names in an import anywhere (in
    functions too), relative ones resolved, and ``from m import x`` also as ``m.x`` (which
    may be a module), and in ``importlib.import_module("m")`` and ``__import__("m")`` calls
    with a literal name. A module named only by a computed string is not found."""
    try:
        with open(path, "rb") as f:
            tree = source.parse(f.read(), path)
    except (OSError, SyntaxError, ValueError, RecursionError, MemoryError):
        return []
    here = name if package else name.rpartition(".")[0]
    out: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                try:
                    base = importlib.util.resolve_name("." * node.level + base, here)
                except (ImportError, ValueError):
                    continue
            if not base:
                continue
            out.append(base)
            out += ["%s.%s" % (base, a.name) for a in node.names if a.name != "*"]
        elif isinstance(node, ast.Call) and node.args \
                and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str) \
                and ((isinstance(node.func, ast.Name) and node.func.id == "__import__")
                     or (isinstance(node.func, ast.Attribute)
                         and node.func.attr == "import_module")):
            out.append(node.args[0].value.lstrip("."))
    return [m for m in out if m]


def module_files(roots: Iterable[str], library: list[str], main: str | None = None,
                 ) -> list[str]:
    """The files of the modules named ``roots`` and of every module their source imports,
    transitively, that live outside the ``library`` directories (those are granted whole,
    and not followed): each module's file and its bytecode, its parent packages'
    ``__init__`` too. ``main``: the worker's script, when a run imports it (its classes)."""
    files: list[str] = []
    seen: set[str] = set()
    todo = list(roots)

    def add(located: _Located, name: str) -> None:
        files.append(located.origin)
        if located.cached:
            files.append(located.cached)
        if located.origin.endswith(".py"):
            todo.extend(imports_of(located.origin, name, located.package))

    if main:
        add(_Located(main, None, False), "__main__")
    while todo:
        name = todo.pop()
        if name in seen or name in ("__main__", main_script.MAIN_ALIAS):
            continue
        seen.add(name)
        parent = name.rpartition(".")[0]
        if parent:
            todo.append(parent)  # importing a.b imports a first
        located = _locate(name)
        if located is None or _under(located.origin, library):
            continue
        add(located, name)
    return _unique(files)


def reads(roots: Iterable[str], main: str | None = None) -> Reads:
    """The grants for runs that import the modules ``roots`` (and the worker's script
    ``main``, when a class of theirs is defined there)."""
    library = library_dirs()
    path = import_path()
    project = project_dirs(path, library)
    # A zip (or egg) on the path is code, read whole; library directories whole.
    whole = library + [p for p in path if os.path.isfile(p) and not _under(p, library)]
    # Each once: not one beneath another (the grant of /usr covers /usr/lib/python3.11).
    whole = [p for i, p in enumerate(whole)
             if not _under(p, [q for q in whole[:i] + whole[i + 1:]
                               if os.path.realpath(q) != os.path.realpath(p)])
             and os.path.realpath(p) not in [os.path.realpath(q) for q in whole[:i]]]
    files = [f for f in module_files(roots, library, main) if not _under(f, whole)]
    return Reads(read=_unique(whole + files), list=project)


def covering(dirs: Iterable[str], grants: Iterable[str]) -> list[tuple[str, str]]:
    """(dir, grant) for each of ``dirs`` that one of ``grants`` (absolute paths) covers
    whole: a directory the worker keeps files in that workflow code can read."""
    grants = [g for g in grants if os.path.isabs(g) and os.path.isdir(g)]
    out = []
    for d in dirs:
        for g in grants:
            if _under(d, [g]):
                out.append((d, g))
                break
    return out
