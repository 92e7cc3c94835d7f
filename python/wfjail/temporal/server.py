"""The ``wfjail serve --zygote`` a ``JailedWorkflowRunner`` starts per policy: its argv, the
policy file that lets the zygote import what the worker imports, its start and its stop."""

from __future__ import annotations

import atexit
import collections
import hashlib
import json
import logging
import os
import queue
import re
import resource
import shutil
import socket as socket_module
import struct
import subprocess
import sys
import tempfile
import threading
import time
from typing import IO, Any, Callable, Sequence

from ..client import Client, Session
from ..errors import ProtocolError
from . import main_script, oplog, reads
from .child import WARM_ENV, WARM_UP
from .stack import escape

# How long a server may take to say it is ready (its zygotes preloaded and warmed up).
READY_WITHIN = 120
# How long ``wfjail policy show`` may take (the policy the generated one extends).
POLICY_SHOW_WITHIN = 60
# What a failed start's error keeps of the server's stderr (its own error, its zygotes'
# ``[zygote i]`` lines): the last lines, each cut, all escaped.
STDERR_TAIL_LINES = 40
STDERR_LINE_CHARS = 1024
# After a failed start, the same server is not started again for this long (doubling with
# each failure in a row, up to RETRY_AFTER_MAX): every retried workflow task fails at once
# with the remembered error instead of starting (and failing) a new server.
RETRY_AFTER = 5.0
RETRY_AFTER_MAX = 300.0

_log = logging.getLogger("wfjail.temporal")


class _StderrTail:
    """Passes a server's stderr as it comes to the worker's log (``oplog``: a session's lines
    as records that name its run) and keeps its last lines for a failed start."""

    def __init__(self, stream: IO[bytes], socket: str = "") -> None:
        self._socket = socket  # which server, for the operator log (oplog)
        self._lines: collections.deque[bytes] = collections.deque(maxlen=STDERR_TAIL_LINES)
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._copy, args=(stream,), daemon=True,
                                        name="wfjail-serve-stderr")
        self._thread.start()

    def _copy(self, stream: IO[bytes]) -> None:
        with stream:
            # Lines read up to a bound: a longer one comes in pieces.
            for line in iter(lambda: stream.readline(STDERR_LINE_CHARS * 4), b""):
                with self._lock:
                    self._lines.append(line)
                # A session's lines as records naming its run (or copied as they are).
                oplog.REGISTRY.output(self._socket, line)

    def text(self, wait: float = 1.0) -> str:
        """The last lines, escaped (one line each, cut to STDERR_LINE_CHARS), after waiting
        up to ``wait`` s for the server's stderr to end (it has exited)."""
        self._thread.join(wait)
        with self._lock:
            lines = list(self._lines)
        return "\n".join(escape(line.decode("utf-8", "replace").rstrip("\n"),
                                 STDERR_LINE_CHARS) for line in lines)


class _Failed:
    """A start that failed: its error, when, and how many failed in a row."""

    def __init__(self, message: str, at: float, in_a_row: int) -> None:
        self.message, self.at, self.in_a_row = message, at, int(in_a_row)

    @property
    def retry_after(self) -> float:
        return min(RETRY_AFTER * 2.0 ** (self.in_a_row - 1), RETRY_AFTER_MAX)


# The last failed start of each server configuration (wfjail, argv but its socket and
# temporary directory): not started again within its retry_after.
_failed: dict[tuple[str, ...], _Failed] = {}
_failed_lock = threading.Lock()

# How many servers this process has started (``starts``).
_starts = 0
# Descriptors the worker keeps for itself beyond one per session (its SDK, logs, sockets).
FDS_BESIDES_SESSIONS = 256


def starts() -> int:
    """How many ``wfjail serve`` this process has started so far (failed starts included):
    a workflow task on a ready worker starts none."""
    return _starts


def raise_fd_limit(sessions: int) -> None:
    """Raises this process's soft RLIMIT_NOFILE so that ``sessions`` open sessions (one
    socket each) fit besides the worker's own descriptors, up to the hard limit; logs when
    the hard limit is too low (a session opened past it fails with the fix)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = sessions + FDS_BESIDES_SESSIONS
    if soft != resource.RLIM_INFINITY and soft < want:
        new = want if hard == resource.RLIM_INFINITY else min(want, hard)
        if new > soft:
            resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
        if new < want:
            _log.warning("wfjail: the worker's RLIMIT_NOFILE (hard %d) holds fewer than "
                         "max_sessions=%d sessions and the worker's own descriptors (%d): "
                         "raise the pod's nofile limit or lower max_cached_workflows",
                         hard, sessions, want)


class Server:
    """One ``wfjail serve --zygote`` of the runner, for one policy."""

    def __init__(self, wfjail: str | None, policy: str, *, socket: str | None,
                 classes: Sequence[str], preload: Sequence[str], max_sessions: int,
                 zygotes: int | None, modules: Sequence[str] = (),
                 merge_pages: bool = False) -> None:
        if not wfjail:
            raise RuntimeError("wfjail: the `wfjail` binary is not on PATH; pass "
                               "JailedWorkflowRunner(wfjail=...)")
        # The warm-up (WARM_UP) where the import of this package warmed up before: right
        # after temporalio.worker, before the workflows' modules (it imports them).
        # The worker's script first when a workflow class is defined there (main_script).
        preload = (["temporalio.worker"] + main_script.preload(list(classes)) + [WARM_UP]
                   + list(preload))
        key = (wfjail, policy, ",".join(classes), ",".join(preload), ",".join(modules),
               str(max_sessions), str(zygotes), socket or "", str(merge_pages))
        _raise_if_failed_recently(key)
        self.tmp = tempfile.mkdtemp(prefix="wfjail-temporal-")
        sock = socket or os.path.join(self.tmp, "serve.sock")
        argv = [wfjail, "serve", "-q", "-p",
                policy_file(self.tmp, policy, classes, preload, modules, wfjail),
                "--socket", sock, "--max-executions", str(max_sessions), "--zygote",
                "--python", sys.executable, "--preload", ",".join(preload),
                "--exit-with-parent"]
        if zygotes:
            argv += ["--zygotes", str(zygotes)]
        if merge_pages:
            # The zygote family only (wfjail.merging); serve says whether the host merges.
            argv.append("--merge-pages")
        raise_fd_limit(max_sessions)
        global _starts
        with _failed_lock:
            _starts += 1
        try:
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL,
                                         stderr=subprocess.PIPE)
        except OSError as e:
            shutil.rmtree(self.tmp, ignore_errors=True)
            message = "wfjail: cannot run the wfjail binary %r: %s" % (wfjail, e)
            _remember_failure(key, message)
            raise RuntimeError(message) from None
        assert self.proc.stderr is not None
        self._stderr = _StderrTail(self.proc.stderr, sock)
        self.client = Client(sock)
        try:
            self._await_ready()
        except RuntimeError as e:
            stop(self.proc, self.tmp)
            _remember_failure(key, str(e))
            raise
        with _failed_lock:
            _failed.pop(key, None)

    def _await_ready(self) -> None:
        deadline = time.monotonic() + READY_WITHIN
        other: int | None = None
        while True:
            try:
                other = None
                served_by = _status_of(self.client.path)
                if not _descends(served_by, self.proc.pid):
                    # Another server on this path (another runner's, of another policy?):
                    # never ours to use; ours fails to bind it and exits.
                    other = served_by
                    raise OSError("served by another process")
                return
            except (OSError, ProtocolError):
                if self.proc.poll() is not None:
                    raise RuntimeError(
                        "wfjail serve exited with status %s before it was ready%s; its last "
                        "messages:\n%s" % (
                            self.proc.returncode,
                            "" if other is None else
                            " (its socket %s is served by another process, pid %d: give each "
                            "runner a socket of its own)" % (self.client.path, other),
                            self._stderr.text())) from None
                if time.monotonic() > deadline:
                    raise RuntimeError("wfjail serve was not ready within %d s; its last "
                                       "messages:\n%s" % (READY_WITHIN, self._stderr.text(0)),
                                       ) from None
                time.sleep(0.02)

    def alive(self) -> bool:
        return self.proc.poll() is None


def _status_of(path: str) -> int:
    """Asks the server on ``path`` its status (STATUS); the pid of the process that listens
    there (SO_PEERCRED), which is the server started only if it is that process."""
    session = Session(path, "")
    with socket_module.socket(socket_module.AF_UNIX, socket_module.SOCK_STREAM) as sock:
        sock.connect(path)
        creds = sock.getsockopt(socket_module.SOL_SOCKET, socket_module.SO_PEERCRED,
                                struct.calcsize("3i"))
        sock.sendall(session._conversation.status())
        session._sock = sock
        session._answer()
        session._sock = None
    pid: int = struct.unpack("3i", creds)[0]
    return pid


def _descends(pid: int, ancestor: int) -> bool:
    """Whether process ``pid`` is ``ancestor`` or its descendant (a `wfjail` that is a
    wrapper script runs the server as its child)."""
    for _ in range(16):
        if pid == ancestor:
            return True
        try:
            with open("/proc/%d/stat" % pid, "rb") as f:
                # The parent's pid follows the command's closing parenthesis and state.
                pid = int(f.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return False
        if pid <= 1:
            return False
    return False


def _raise_if_failed_recently(key: tuple[str, ...]) -> None:
    """Raises the remembered error of the last start of ``key`` if it failed less than its
    retry_after ago, saying when the next start is."""
    with _failed_lock:
        failed = _failed.get(key)
    if failed is None:
        return
    ago = time.monotonic() - failed.at
    if ago < failed.retry_after:
        raise RuntimeError("%s\n(wfjail did not start the server again: it failed %.0f s ago, "
                           "%d time(s) in a row; the next start is tried after %.0f s)" % (
                               failed.message, ago, failed.in_a_row,
                               failed.retry_after - ago))


def _remember_failure(key: tuple[str, ...], message: str) -> None:
    """Notes a failed start of ``key`` (and logs it, once per start)."""
    _log.error("%s", message)
    with _failed_lock:
        last = _failed.get(key)
        _failed[key] = _Failed(message, time.monotonic(), last.in_a_row + 1 if last else 1)


# A server no runner holds any more is stopped this long after its last runner let it go
# (``release``), unless a runner of the same configuration takes it again first: a worker
# made again in the same process (a test suite makes one per test, a worker restarted with
# new options) reuses the running server and its warm zygotes instead of waiting seconds for
# new ones on its first workflow task.
LINGER = 60.0

# A shared server's configuration: everything that goes into its argv and policy file but
# the warm-up's class list (any class of the same modules runs in its zygote's children).
ServerKey = tuple[object, ...]


def server_key(wfjail: str | None, policy: str, *, socket: str | None, classes: Sequence[str],
               preload: Sequence[str], max_sessions: int, zygotes: int | None,
               modules: Sequence[str] = (), policy_text: str = "",
               merge_pages: bool = False) -> ServerKey:
    """The configuration a server of these arguments would have (``Server``);
    ``policy_text``: ``policy_digest(policy)`` as the runner first read it."""
    return (wfjail, absolute_policy(policy), policy_text, socket or "", tuple(preload),
            tuple(modules),
            tuple(main_script.preload(list(classes))), main_script.main_file() or "",
            tuple(sys.path), sys.executable, max_sessions, zygotes, merge_pages)


class _Shared:
    """A server of one configuration, the runners that hold it and its pending stop."""

    def __init__(self) -> None:
        self.starting = threading.Lock()  # one start at a time per configuration
        self.server: Server | None = None
        self.holders = 0
        self.stop_timer: threading.Timer | None = None


_shared: dict[ServerKey, _Shared] = {}
_shared_lock = threading.Lock()
# Releases of dropped runners (``release_later``), done by a thread of their own.
_released: "queue.SimpleQueue[ServerKey]" = queue.SimpleQueue()
_release_thread: threading.Thread | None = None


def release_later(key: ServerKey) -> None:
    """``release(key)``, on the release thread: for a dropped runner's finalizer, which takes
    no lock (the garbage collector may run it inside any critical section, ``acquire``'s
    own included: releasing there deadlocked)."""
    _released.put(key)


def _release_loop() -> None:
    while True:
        release(_released.get())


def acquire(key: ServerKey, start: Callable[[], Server]) -> Server:
    """The running server of configuration ``key``, started by ``start()`` when there is
    none (or it died); the caller holds it until ``release``."""
    global _release_thread
    fresh = _Shared()  # made outside the lock: a collection it starts may run finalizers
    with _shared_lock:
        if _release_thread is None:
            _release_thread = threading.Thread(target=_release_loop, daemon=True,
                                               name="wfjail-server-release")
            _release_thread.start()
        entry = _shared.setdefault(key, fresh)
        entry.holders += 1
        if entry.stop_timer is not None:
            entry.stop_timer.cancel()
            entry.stop_timer = None
    try:
        with entry.starting:
            if entry.server is None or not entry.server.alive():
                if entry.server is not None:
                    stop(entry.server.proc, entry.server.tmp)
                entry.server = None
                entry.server = start()
            return entry.server
    except BaseException:
        release(key, linger=False)
        raise


def release(key: ServerKey, linger: bool = True) -> None:
    """Lets go of a server ``acquire`` gave: the last holder's release stops it, after
    LINGER seconds (``linger``) or now."""
    with _shared_lock:
        entry = _shared.get(key)
        if entry is None or entry.holders <= 0:
            return
        entry.holders -= 1
        if entry.holders:
            return
        if linger and entry.server is not None and entry.server.alive():
            entry.stop_timer = threading.Timer(LINGER, _stop_unheld, (key, entry))
            entry.stop_timer.daemon = True
            entry.stop_timer.start()
            return
        del _shared[key]
        server = entry.server
    if server is not None:
        stop(server.proc, server.tmp)


def _stop_all() -> None:
    """(At the worker's exit.) Stops every server, held or lingering, and waits for each, as
    a runner's finalizer did before servers were shared: they would end with the worker
    anyway (``--exit-with-parent``), but a worker that exits at once, its servers still
    running, crashed now and then in the SDK's native threads ("PyGILState_Release: thread
    state must be current", 1 exit in 12 of a script worker)."""
    with _shared_lock:
        entries = list(_shared.values())
        _shared.clear()
    for entry in entries:
        if entry.stop_timer is not None:
            entry.stop_timer.cancel()
        if entry.server is not None:
            stop(entry.server.proc, entry.server.tmp)


atexit.register(_stop_all)


def _stop_unheld(key: ServerKey, entry: _Shared) -> None:
    """(A LINGER timer.) Stops ``entry``'s server unless a runner took it again."""
    with _shared_lock:
        if entry.holders or _shared.get(key) is not entry:
            return
        del _shared[key]
        server = entry.server
    if server is not None:
        stop(server.proc, server.tmp)


# How many files of an ``extends`` chain ``policy_digest`` reads (wfjail allows 8 levels).
MAX_EXTENDS = 8
_EXTENDS = re.compile(r'^\s*extends\s*=\s*"([^"]*)"', re.MULTILINE)


def policy_digest(policy: str) -> str:
    """The text of policy file ``policy`` and of the files it extends, as a digest ("" for a
    built-in name: the binary's, in the key already). Servers are shared by key: without it,
    a runner of a file rewritten stricter was served by the server started with its looser
    text. A file that cannot be read digests as its error (the server's start says why)."""
    digest = hashlib.sha256()
    path = absolute_policy(policy)
    if not path.startswith("/"):
        return ""
    for _ in range(MAX_EXTENDS + 1):
        if not path.startswith("/"):
            break  # a built-in name ends the chain
        try:
            with open(path, "rb") as f:
                text = f.read(1 << 20)
        except OSError as e:
            digest.update(b"\0error\0%s" % str(e).encode())
            break
        digest.update(b"\0%s\0%s" % (path.encode(), text))
        found = _EXTENDS.search(text.decode("utf-8", "replace"))
        if found is None:
            break
        parent = found.group(1)
        if "/" not in parent and not parent.endswith(".toml"):
            break
        path = os.path.normpath(os.path.join(os.path.dirname(path), parent))
    return digest.hexdigest()


def absolute_policy(policy: str) -> str:
    """``policy`` as an ``extends`` value that holds wherever the policy file is: a built-in
    name as it is, a file's path made absolute."""
    if "/" in policy or policy.endswith(".toml"):
        return os.path.abspath(policy)
    return policy


def policy_file(tmp: str, policy: str, classes: Sequence[str], preload: Sequence[str] = (),
                modules: Sequence[str] = (), wfjail: str | None = None) -> str:
    """A policy extending ``policy`` that lets the zygote and its runs import what they
    import and read nothing else of the worker's (``reads``): the interpreter, its standard
    library and site-packages whole; from the other directories of the worker's import path
    (also PYTHONPATH), listed, the files of the modules the zygote ``preload``s, of the
    workflow ``classes`` and the ``modules`` of what runs are rebuilt from, and of what
    those import; the worker's script when a class is defined there. A ``${cwd}`` grant of
    ``policy`` (``temporal-python``'s) is dropped: it would give workflow code the worker's
    working directory whole, with the keys, ``.env`` and logs kept there. Its environment
    names the workflow ``classes`` for the zygote's warm-up."""
    path = reads.import_path()
    env = {"PYTHONPATH": os.pathsep.join(path), WARM_ENV: ",".join(classes)}
    script = main_script.main_file()
    if script:  # classes defined in the worker's script are imported from it
        env[main_script.MAIN_ENV] = script
    runs_main = bool(main_script.preload(list(classes))) or "__main__" in modules
    roots = ([c.partition(":")[0] for c in list(preload) + list(classes)] + list(modules))
    granted = reads.reads(roots, script if runs_main else None)
    resolved = _resolved(wfjail, policy)
    fs = resolved.get("filesystem", {}) if resolved else {}
    drop = ["${cwd}"] if ("${cwd}" in fs.get("read", ())
                          and "${cwd}" not in fs.get("write", ())) else []
    _warn_covered(policy, granted.read + [g for g in fs.get("read", ()) if g not in drop],
                  script)
    text = ("extends = %s\n[filesystem]\ndrop = [%s]\nread = [%s]\nlist = [%s]\n"
            "[env]\nset = { %s }\n") % (
        json.dumps(absolute_policy(policy)), _toml_list(drop), _toml_list(granted.read),
        _toml_list(granted.list),
        ", ".join("%s = %s" % (k, json.dumps(v)) for k, v in env.items()))
    out = os.path.join(tmp, "policy.toml")
    with open(out, "w") as f:
        f.write(text)
    return out


def _toml_list(items: Sequence[str]) -> str:
    return ", ".join(json.dumps(p) for p in items)


def _resolved(wfjail: str | None, policy: str) -> dict[str, Any] | None:
    """``policy`` with what it extends applied (``wfjail policy show --json``), or None
    when it does not load or the binary does not run (``wfjail serve`` then fails, saying
    why). Raises when it does not answer: a server started without knowing whether to
    drop ``${cwd}`` could grant it."""
    if not wfjail:
        return None
    argv = [wfjail, "policy", "show", "--json", absolute_policy(policy)]
    try:
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True,
                              timeout=POLICY_SHOW_WITHIN)
    except OSError:
        return None
    except subprocess.TimeoutExpired:
        raise RuntimeError("wfjail: `%s` did not answer within %d s: the runner cannot tell "
                           "what policy %r grants, so its server does not start"
                           % (" ".join(argv), POLICY_SHOW_WITHIN, policy)) from None
    try:
        shown = json.loads(done.stdout) if done.returncode == 0 else None
    except ValueError:
        return None
    return shown if isinstance(shown, dict) else None


# The worker's directories already warned about, per policy (once each).
_warned: set[tuple[str, str]] = set()


def _warn_covered(policy: str, grants: Sequence[str], script: str | None) -> None:
    """Logs once when the worker's working directory or its script's lies under a directory
    the policy lets workflow code read whole (a project inside a venv or site-packages,
    under /usr): the files kept there are readable."""
    # The script's directory when it was run by its path (python worker.py); under
    # python -m, the working directory is the import path's first entry.
    run_as_file = getattr(sys.modules.get("__main__"), "__spec__", None) is None
    dirs = [os.getcwd()] + ([os.path.dirname(script)] if script and run_as_file else [])
    for d, grant in reads.covering(dict.fromkeys(dirs), grants):
        if (policy, d) in _warned:
            continue
        _warned.add((policy, d))
        _log.warning("wfjail: the worker's directory %s lies under %s, which workflow code "
                     "may read whole (policy %s and the interpreter's directories): keys, "
                     ".env files and logs kept there are readable by workflows; keep them "
                     "elsewhere, or run the worker from another directory", d, grant, policy)


def stop(server: subprocess.Popen[bytes], tmp: str | None) -> None:
    """Ends ``server`` (SIGTERM, then SIGKILL after 10 s) and removes its directory."""
    if server.poll() is None:
        server.terminate()
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
    if tmp:
        shutil.rmtree(tmp, ignore_errors=True)
