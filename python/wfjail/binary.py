"""Finds the ``wfjail`` binary that runs confined code for this package (the Temporal runner's
``wfjail serve``).

The wheel (the repository root's ``pyproject.toml``, maturin's ``bin`` bindings) carries the
static binary as a script: pip puts it in the scripts directory of the scheme it installs
into (a venv's ``bin/``, ``~/.local/bin`` for ``--user``), which is often not on ``PATH`` (a
worker started as ``.venv/bin/python worker.py``). So the package looks for its own binary
in its own install record before it trusts ``PATH``. Standard library only; imported by the
worker, never by confined code.
"""

from __future__ import annotations

import os
import shutil
from typing import TYPE_CHECKING, List, Optional

if TYPE_CHECKING:
    from importlib import metadata

ENV = "WFJAIL_BIN"
NAME = "wfjail"

INSTALL_HINT = (
    "install the wheel that carries it (`pip install 'wfjail[temporal]'`, built from the "
    "repository with `pip install '.[temporal]'` or `maturin build --release`: README, "
    "Install), or the binary alone (`cargo install --locked --path .`, then put "
    "~/.cargo/bin on PATH), or name it: JailedWorkflowRunner(wfjail=PATH) or %s=PATH" % ENV)


class WfjailNotFound(FileNotFoundError):
    """No usable ``wfjail`` binary; the message names every place tried and how to install
    one."""


def find_wfjail(explicit: Optional[str] = None) -> str:
    """The absolute path of the ``wfjail`` binary to run, the first of: ``explicit`` (a path,
    or a name looked up on ``PATH``), the ``WFJAIL_BIN`` environment variable, the binary
    installed with this package (from the wheel), ``wfjail`` on ``PATH``.

    A binary named explicitly or by ``WFJAIL_BIN`` that is not there is an error, not a
    reason to run another one. Raises ``WfjailNotFound``.
    """
    if explicit:
        return _named(explicit, "the wfjail argument")
    from_env = os.environ.get(ENV)
    if from_env:
        return _named(from_env, "%s=%s" % (ENV, from_env))
    tried: List[str] = ["no wfjail argument", "%s unset" % ENV]
    packaged, why_not = packaged_wfjail()
    if packaged:
        return packaged
    tried.append(why_not)
    on_path = shutil.which(NAME)
    if on_path:
        return os.path.abspath(on_path)
    tried.append("no `%s` on PATH (%s)" % (NAME, os.environ.get("PATH", "")))
    raise WfjailNotFound("wfjail: no wfjail binary found (%s): %s" % ("; ".join(tried),
                                                                      INSTALL_HINT))


def packaged_wfjail() -> tuple[Optional[str], str]:
    """The binary the wheel that installed this very module put in its scripts directory, as
    its install record (RECORD) lists it, or None and why not (installed from
    ``python/``, which carries no binary; or imported from a source tree)."""
    from importlib import metadata

    try:
        dist = metadata.distribution(NAME)
    except metadata.PackageNotFoundError:
        return None, "no installed `%s` distribution (imported from %s)" % (
            NAME, os.path.dirname(os.path.abspath(__file__)))
    # The distribution found first on sys.path must be the one this module came from: a
    # source tree on PYTHONPATH does not get an installed wheel's binary of another version.
    if not _owns_this_module(dist):
        return None, "this module (%s) is not the installed `%s` %s's (%s)" % (
            os.path.abspath(__file__), NAME, dist.version, dist.locate_file(""))
    for entry in dist.files or ():
        if entry.name == NAME:
            path = os.path.abspath(str(entry.locate()))
            if os.path.isfile(path) and os.access(path, os.X_OK):
                return path, ""
            return None, "the installed package's binary %s is missing or not executable" % (
                path)
    return None, ("the installed `%s` %s carries no binary (installed from python/, the "
                  "guest library alone?)" % (NAME, dist.version))


def _owns_this_module(dist: "metadata.Distribution") -> bool:
    """Whether ``dist`` installed this module: its files include it, or (an editable
    install: ``pip install -e .``, ``maturin develop``) one of its ``.pth`` files puts this
    package's directory on ``sys.path``."""
    here = os.path.realpath(__file__)
    source_root = os.path.dirname(os.path.dirname(here))
    if os.path.realpath(str(dist.locate_file(os.path.join(NAME, "binary.py")))) == here:
        return True
    for entry in dist.files or ():
        if entry.suffix == ".pth":
            try:
                lines = entry.read_text().splitlines()
            except (OSError, UnicodeDecodeError):
                continue
            site = os.path.dirname(str(entry.locate()))
            if any(os.path.realpath(os.path.join(site, line.strip())) == source_root
                   for line in lines
                   if line.strip() and not line.startswith(("#", "import"))):
                return True
    return False


def _named(value: str, what: str) -> str:
    """``value`` (a path, or a bare name looked up on ``PATH``) as an absolute path to an
    executable file, or ``WfjailNotFound`` naming ``what`` gave it."""
    if os.sep in value:
        if os.path.isfile(value) and os.access(value, os.X_OK):
            return os.path.abspath(value)
        raise WfjailNotFound("wfjail: %s names %s, which is not an executable file: %s" % (
            what, value, INSTALL_HINT))
    found = shutil.which(value)
    if found:
        return os.path.abspath(found)
    raise WfjailNotFound("wfjail: %s names `%s`, which is not on PATH (%s): %s" % (
        what, value, os.environ.get("PATH", ""), INSTALL_HINT))
