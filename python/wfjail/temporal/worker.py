"""Temporal: run each cached workflow run in a confined process of its own.

    from wfjail.temporal import JailedWorkflowRunner

    worker = Worker(client, task_queue="q", workflows=[MyWorkflow], activities=[...],
                    workflow_runner=JailedWorkflowRunner())

``JailedWorkflowRunner`` is a ``temporalio.worker.WorkflowRunner``. It starts a ``wfjail
serve`` of its own (prefork mode, the worker's interpreter, the policy ``temporal-python``
unless told otherwise) that preloads ``temporalio`` and the worker's workflow modules once;
each workflow run the worker caches is one session forked from it, confined by the kernel
(no network, files, threads, subprocesses), and every activation is one call carrying the
activation's protobuf bytes. Eviction closes the session.

What crosses from a child to the worker is protobuf and JSON only: the worker never
unpickles anything a (possibly hostile) workflow sends. A call during which wfjail denied
something fails the workflow task with what was denied (the syscall, its arguments, the rule
and a hint), even when the workflow caught the error.

Importing this module needs ``temporalio``; the rest of the ``wfjail`` package does not.
Extern functions (interceptors' ``unsafe_extern_functions``, the local-activity check) and
``patch_activation_callback`` run in the worker, called by name from the child (typed JSON
arguments and results, rebuilt from the worker function's own type hints: ``typed_json``);
metric records ride on the completions to the worker's meter.
"""

import asyncio
import base64
import dataclasses
import datetime
import json
import logging
import os
import pickle
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
import time
import weakref

import temporalio.converter
import temporalio.workflow
from temporalio.bridge.proto.workflow_activation import WorkflowActivation
from temporalio.bridge.proto.workflow_completion import WorkflowActivationCompletion
from temporalio.worker import (
    UnsandboxedWorkflowRunner,
    WorkflowInstance,
    WorkflowInstanceDetails,
    WorkflowRunner,
)

from .. import typed_json
from ..client import Busy, Client, GuestError, SessionFailed
from ..errors import ProtocolError

# The session handler the zygote resolves: a factory called with the run's recipe.
_FACTORY = "wfjail.temporal.worker:_instance_factory"
# Completion bytes, then the JSON side channel (the violations of the call are the server's).
_LEN = 4


def _class_path(cls, what):
    """``module:qualname`` of ``cls``, which a fresh interpreter must be able to import."""
    module, qualname = getattr(cls, "__module__", None), getattr(cls, "__qualname__", "")
    if not module or module == "__main__" or "<locals>" in qualname:
        raise ValueError(
            "%s %r cannot run in a confined process: it is defined in %s; move it to a "
            "module the worker imports (JailedWorkflowRunner rebuilds it there by its path)"
            % (what, cls, "the script run as __main__" if module == "__main__" else
               "a function (<locals>)"))
    return "%s:%s" % (module, qualname)


def _load(path):
    import importlib

    module, _, qualname = path.partition(":")
    obj = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


class JailedWorkflowRunner(WorkflowRunner):
    """A ``WorkflowRunner`` that runs every cached workflow run in a process of its own,
    forked from a preloaded zygote and confined by wfjail (Landlock, seccomp, namespaces).

    ``policy``: a built-in policy name or a policy file (default ``temporal-python``).
    ``max_sessions``: confined runs at once; keep it at least the worker's
    ``max_cached_workflows`` plus its concurrent workflow tasks (default 1100: the SDK's
    default cache of 1000 and 100 task slots). ``socket``: serve on this path (default: a
    temporary directory). ``wfjail``: the ``wfjail`` binary (default: found on ``PATH``).
    ``preload``: more modules for the zygote to import before forking. ``sandboxed``: run
    each child's workflow inside Temporal's own sandbox as well (both layers: the SDK's
    checks in the child, the kernel's around it). ``policies``: a policy per workflow (by
    class or workflow type name; a class may also say ``wfjail_policy = "..."``), each with a
    server and zygotes of its own — the analogue of the SDK's ``sandbox_unrestricted``.
    ``reserved_metric_prefixes``: metric names a workflow may not use (the worker's own, so
    that a child cannot register one first; default ``("temporal_",)``, the SDK's and Core's).
    ``max_reply_bytes``: the largest completion the worker takes from a child (default 4 MiB,
    what the server takes in a task completion); raise it only when a payload storage driver
    takes large payloads out of completions in the worker.
    """

    def __init__(self, policy="temporal-python", *, max_sessions=1100, socket=None, wfjail=None,
                 preload=(), zygotes=None, call_timeout="30s", sandboxed=False, policies=None,
                 reserved_metric_prefixes=None, max_reply_bytes=None):
        self._policy = policy
        self._max_reply_bytes = int(MAX_REPLY_BYTES if max_reply_bytes is None
                                    else max_reply_bytes)
        self._reserved_metrics = tuple(RESERVED_METRIC_PREFIXES if reserved_metric_prefixes
                                       is None else reserved_metric_prefixes)
        # Workflow type (or class) -> its own policy: one server (zygote pool) per policy.
        self._policies = {getattr(k, "__temporal_workflow_definition", None) and
                          k.__temporal_workflow_definition.name or k: v
                          for k, v in (policies or {}).items()}
        self._max_sessions = int(max_sessions)
        self._socket = socket
        self._wfjail = wfjail or shutil.which("wfjail")
        self._preload = list(preload)
        self._zygotes = zygotes
        self._call_timeout = call_timeout
        self._sandboxed = bool(sandboxed)
        self._modules = []
        self._classes = []
        self._lock = threading.Lock()
        self._servers = {}  # policy -> _Server
        self._failure_types = []

    # -- WorkflowRunner ------------------------------------------------------------------------

    def prepare_workflow(self, defn):
        """Checks that the workflow class can be rebuilt in a confined process by its path, and
        notes its module for the zygote to preload."""
        path = _class_path(defn.cls, "workflow class")
        self._classes.append(path)
        module = path.partition(":")[0]
        if module not in self._modules:
            self._modules.append(module)

    def set_worker_level_failure_exception_types(self, types):
        self._failure_types = [_class_path(t, "failure exception type") for t in types]

    def create_instance(self, det):
        """Opens the run's session (on the worker's event-loop thread, not on the timed
        activation path): the zygote forks a child, which builds the workflow instance."""
        client = self._ensure_server(self._policy_of(det.defn))
        recipe = _recipe(det, self._failure_types)
        recipe["sandboxed"] = self._sandboxed
        try:
            # Under the policy's seeded randomness and virtual clock, the child's os.urandom,
            # random and uuid4 draw from the run's randomness seed, and its wall clock reads
            # each activation's time (set per call below): the same on replay.
            run_log = _log_to_worker(det.info)
            session = client.session(handler=_FACTORY, init=recipe, timeout=self._call_timeout,
                                     on_log=run_log,
                                     on_upcall=_upcalls_in_worker(det),
                                     # A child's frames are read only up to what the worker
                                     # takes of them (a reply and its side channel).
                                     max_frame=max(self._max_reply_bytes + MAX_SIDE_CHANNEL + 4,
                                                   MAX_UPCALL_BYTES),
                                     seed=det.randomness_seed & 0xFFFFFFFFFFFFFFFF,
                                     time_ns=_start_ns(det.info)).open()
        except Busy as e:
            raise RuntimeError(
                "wfjail: no room for another confined workflow run (%s of %s open): raise "
                "JailedWorkflowRunner(max_sessions=...) above max_cached_workflows" %
                (e.open, e.capacity)) from None
        return _JailedInstance(session, det, self._reserved_metrics, self._max_reply_bytes,
                               run_log)

    def _policy_of(self, defn):
        """The policy of a workflow: ``policies`` by workflow type, else a ``wfjail_policy``
        attribute of its class, else the runner's."""
        return (self._policies.get(defn.name) or getattr(defn.cls, "wfjail_policy", None)
                or self._policy)

    # -- the servers ---------------------------------------------------------------------------

    def _ensure_server(self, policy=None):
        policy = policy or self._policy
        with self._lock:
            server = self._servers.get(policy)
            if server is None or not server.alive():
                server = _Server(self, policy)
                self._servers[policy] = server
                # A server ends with the worker's process; a runner dropped earlier stops it.
                weakref.finalize(self, _stop, server.proc, server.tmp)
            return server.client

    def close(self):
        """Stops the servers (they also end with the worker's process, or when the runner is
        dropped); the next workflow run starts new ones."""
        with self._lock:
            for server in self._servers.values():
                _stop(server.proc, server.tmp)
            self._servers.clear()


class _Server:
    """One `wfjail serve --zygote` of the runner, for one policy."""

    def __init__(self, runner, policy):
        r = runner
        if not r._wfjail:
            raise RuntimeError("wfjail: the `wfjail` binary is not on PATH; pass "
                               "JailedWorkflowRunner(wfjail=...)")
        self.tmp = tempfile.mkdtemp(prefix="wfjail-temporal-")
        sock = (r._socket if policy == r._policy and r._socket
                else os.path.join(self.tmp, "serve.sock"))
        preload = ["temporalio.worker", "wfjail.temporal.worker"] + r._modules + r._preload
        argv = [r._wfjail, "serve", "-q", "-p", _policy_file(self.tmp, policy, r._classes),
                "--socket", sock, "--max-executions", str(r._max_sessions), "--zygote",
                "--python", sys.executable, "--preload", ",".join(preload),
                "--exit-with-parent"]
        if r._zygotes:
            argv += ["--zygotes", str(r._zygotes)]
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL)
        self.client = Client(sock)
        deadline = time.monotonic() + 120
        while True:
            try:
                self.client.status()
                return
            except (OSError, ProtocolError):
                if self.proc.poll() is not None:
                    raise RuntimeError("wfjail serve exited with status %s before it was "
                                       "ready (its messages are above)"
                                       % self.proc.returncode) from None
                if time.monotonic() > deadline:
                    raise RuntimeError("wfjail serve was not ready within 120 s") from None
                time.sleep(0.02)

    def alive(self):
        return self.proc.poll() is None


def _policy_file(tmp, policy, classes):
    """A policy extending ``policy`` that lets the zygote import what the worker imports: the
    worker's import path, read-only, and as PYTHONPATH; and the interpreter itself where a
    venv's `python` links to (pyenv, a python.org build...)."""
    base = policy
    if "/" in base or base.endswith(".toml"):
        base = os.path.abspath(base)
    path = [os.path.abspath(p or ".") for p in sys.path]
    path = [p for i, p in enumerate(path) if os.path.exists(p) and p not in path[:i]]
    prefixes = [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
                os.path.dirname(os.path.dirname(os.path.realpath(sys.executable)))]
    reads = path + [p for i, p in enumerate(prefixes)
                    if os.path.isdir(p) and p not in path and p not in prefixes[:i]]
    text = ("extends = %s\n[filesystem]\nread = [%s]\n[env]\n"
            "set = { PYTHONPATH = %s, WFJAIL_TEMPORAL_WARM = %s }\n") % (
        json.dumps(base), ", ".join(json.dumps(p) for p in reads),
        json.dumps(os.pathsep.join(path)), json.dumps(",".join(classes)))
    out = os.path.join(tmp, "policy.toml")
    with open(out, "w") as f:
        f.write(text)
    return out


def _stop(server, tmp):
    if server.poll() is None:
        server.terminate()
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
    if tmp:
        shutil.rmtree(tmp, ignore_errors=True)


def _start_ns(info):
    """The run's start as nanoseconds since the epoch: the child's clock until the first
    activation sets its own time."""
    start = getattr(info, "start_time", None)
    if start is None:
        return None
    delta = start - datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)
    return (delta.days * 86400 + delta.seconds) * 10**9 + delta.microseconds * 1000


def _recipe(det, failure_types):
    """What a child needs to rebuild the instance: class paths, and the details that are plain
    data (pickled: the child unpickles what the worker sends, never the other way round)."""
    factory = det.payload_converter_factory
    converter = getattr(factory, "__self__", None)
    converter_class = getattr(converter, "payload_converter_class", None)
    data = {
        "info": det.info,
        "randomness_seed": det.randomness_seed,
        "disable_eager_activity_execution": det.disable_eager_activity_execution,
        "last_completion_result": det.last_completion_result.SerializeToString(),
        "last_failure": (det.last_failure.SerializeToString()
                         if det.last_failure is not None else None),
        "default_workflow_logic_flags": det.default_workflow_logic_flags,
    }
    return {
        "workflow": _class_path(det.defn.cls, "workflow class"),
        "payload_converter": (_class_path(converter_class, "payload converter class")
                              if converter_class is not None else None),
        "failure_converter": _class_path(det.failure_converter_class, "failure converter class"),
        "interceptors": [_class_path(c, "interceptor class") for c in det.interceptor_classes],
        # Extern functions run in the worker: the child gets proxies by name (upcalls).
        "extern": sorted(n for n in det.extern_functions if n not in _LOCAL_EXTERN),
        "patch_callback": det.patch_activation_callback is not None,
        "failure_types": list(failure_types),
        # Records below what the worker would show are not sent at all.
        "log_level": logging.getLogger("temporalio.workflow").getEffectiveLevel(),
        "data": base64.b64encode(pickle.dumps(data)).decode("ascii"),
    }


class _JailedInstance(WorkflowInstance):
    """The worker's side of one confined run: each activation is one call."""

    def __init__(self, session, det, reserved_metrics=None, max_reply_bytes=None,
                 run_log=None):
        self._session = session
        # The run's log relay (``_log_to_worker``): its budget of records is per activation.
        self._run_log = run_log
        self._max_reply_bytes = MAX_REPLY_BYTES if max_reply_bytes is None else max_reply_bytes
        self._det = det
        self._reserved_metrics = tuple(RESERVED_METRIC_PREFIXES if reserved_metrics is None
                                       else reserved_metrics)
        self._context = temporalio.converter.WorkflowSerializationContext(
            namespace=det.info.namespace, workflow_id=det.info.workflow_id)
        # (command type, seq) -> the serialization context of a command the run issued, derived
        # here from the run's own info and the command itself (the payload codec asks between
        # activations: for the command's payloads, then for its result's); a key leaves when
        # an activation resolves it, and at most MAX_COMMAND_CONTEXTS are kept.
        self._contexts = {}
        # An activation in progress (on another executor thread when the SDK gave up on it
        # as deadlocked and evicts the run), and whether the eviction aborted it.
        self._calling = False
        self._aborted = False
        self._interrupting = False
        self._idle = threading.Event()
        self._state = threading.Lock()
        # Whether the activation in progress ran past DEADLOCK_INTERRUPT_AFTER (or the SDK
        # suspected a deadlock) and was interrupted for it: it then fails as deadlocked.
        self._overdue = False
        # The metric series the run's child has added (at most MAX_METRIC_SERIES).
        self._metric_series = set()

    def activate(self, act):
        evicting = any(j.HasField("remove_from_cache") for j in act.jobs)
        if evicting and self._calling:
            # The child is stuck in an earlier activation (the SDK gave up on it as
            # deadlocked): interrupt it, so that the worker learns where the workflow was
            # (the stuck activation's thread logs it), then end it, or the eviction would
            # wait behind it (and the SDK retries a slow eviction forever). That thread, which
            # owns the socket, closes the session.
            self._interrupting = True
            self._session.interrupt()
            self._idle.wait(INTERRUPT_WAIT)
            with self._state:
                stuck = self._calling
                self._aborted = stuck
            if stuck:
                self._session.abort()  # its thread closes the session
            else:
                self._session.close()  # the interrupted activation is over
            return _evicted(act)
        self._calling = True
        self._idle.clear()
        if self._run_log is not None:
            self._run_log.begin()
        # The SDK's debug mode runs activations on its event loop, with no deadlock timeout:
        # nothing is interrupted there.
        watched = asyncio._get_running_loop() is None
        if watched:
            _WATCHDOG.arm(self, time.monotonic() + DEADLOCK_INTERRUPT_AFTER)
        try:
            reply = self._session.call(
                act.SerializeToString(),
                time_ns=act.timestamp.ToNanoseconds() if act.HasField("timestamp") else None)
            completion, metrics = _split_reply(reply, self._max_reply_bytes)
            completion.run_id = act.run_id  # the run's own, whatever the child said
            # The activation's results were decoded before this call (with these contexts):
            # what it resolved is done with them; the completion's commands bring theirs.
            for key in _resolved_keys(act):
                self._contexts.pop(key, None)
            self._contexts.update(_command_contexts(self._det.info, completion))
            while len(self._contexts) > MAX_COMMAND_CONTEXTS:
                del self._contexts[next(iter(self._contexts))]
            _record_metrics(self._det, metrics, self._metric_series,
                            self._reserved_metrics)
            where = ""
            if self._interrupting and completion.HasField("failed"):
                failure = completion.failed.failure
                # The child's words, bounded and escaped: frames parsed from its traceback
                # (at most MAX_STACK_FRAMES, the innermost), never a file it names read.
                where = _stack_text(failure.stack_trace)
                logging.getLogger("wfjail.temporal").warning(
                    "workflow %s (run %s) did not yield; where it was when interrupted:\n%s%s",
                    self._det.info.workflow_type, self._det.info.run_id, where,
                    _escape(failure.message, MAX_CHILD_MESSAGE))
            if self._overdue:
                # Interrupted in the middle of workflow code, the child's instance is no
                # longer the run's: the session ends after this call (the SDK evicts the
                # run after a failed task and replays it in a new child).
                with self._state:
                    self._aborted = True
                if evicting:
                    return _evicted(act)
                return _deadlocked(act, where)
            violations = self._session.violations
            # Under a warn policy (permissive) nothing was denied: the worker hears of it.
            warned = [v for v in violations if v.get("action") == "warned"]
            enforced = [v for v in violations if v.get("action") != "warned"]
            if warned:
                logging.getLogger("wfjail.temporal").warning(
                    "%s", _violations_text(self._det, warned, denied=False))
            if enforced and not evicting:
                return _failed(act, _violations_text(self._det, enforced))
            return completion
        except GuestError as e:
            if evicting:
                return _evicted(act)
            if self._overdue:  # interrupted outside the workflow's own code
                with self._state:
                    self._aborted = True
                return _deadlocked(act, _stack_text(e.traceback or ""))
            # The child's handler raised (a workflow's own exceptions come as a failed
            # completion): its type, message and traceback are its words, each up to a
            # frame. Marked as the child's, bounded and escaped; the stack parsed.
            return _failed(act, "wfjail: the confined process of workflow %s (run %s) raised "
                           "outside workflow code: %s: %s" % (
                               self._det.info.workflow_type, self._det.info.run_id,
                               _escape(e.type, MAX_STACK_NAME),
                               _escape(e.message, MAX_CHILD_MESSAGE)),
                           _stack_text(e.traceback or ""))
        except (SessionFailed, ProtocolError, OSError, RuntimeError) as e:
            if evicting:
                return _evicted(act)
            if self._overdue:  # ended by the watchdog: it did not answer its interruption
                return _deadlocked(act, "")
            report = getattr(e, "report", None) or {}
            return _failed(act, _report_text(self._det, report, e))
        finally:
            if watched:
                _WATCHDOG.disarm(self)
            if self._run_log is not None and self._run_log.dropped:
                logging.getLogger("wfjail.temporal").warning(
                    "workflow %s (run %s) dropped %d log records of one activation (the "
                    "worker relays %d)", self._det.info.workflow_type, self._det.info.run_id,
                    self._run_log.dropped, MAX_LOG_RECORDS)
            with self._state:
                self._calling = False
                close = evicting or self._aborted
            self._idle.set()
            if close:
                self._session.close()

    def get_thread_id(self):
        """The SDK calls this on the worker's event loop when an activation did not yield
        within its deadlock timeout, to build ``[TMPRL1101] Potential deadlock detected``
        from that thread's stack, then again to interrupt it. It never waits for the child
        (the loop serves every run of the worker): it asks the watchdog thread to interrupt
        the child and returns None (the SDK's error then has no frames). The child's stack
        comes with its answer, on the activation's thread: logged on ``wfjail.temporal``, and
        in the deadlock failure when the watchdog interrupted it before the SDK's timeout
        (``DEADLOCK_INTERRUPT_AFTER``)."""
        _WATCHDOG.interrupt_now(self)
        return None

    def _interrupt_overdue(self):
        """(On the watchdog's thread.) Interrupts the activation in progress, once; returns
        whether it did. Called again (INTERRUPT_WAIT later) while that activation has not
        answered, ends the child: a child that ignores its interruption (a loop catching it,
        native code) must not hold the activation's thread (and with the SDK's safe
        eviction, the run's slot) until the call timeout."""
        with self._state:
            if not self._calling:
                return False
            stuck = self._interrupting
            if stuck:
                self._aborted = True
            else:
                self._interrupting = True
                self._overdue = True
        if stuck:
            logging.getLogger("wfjail.temporal").warning(
                "workflow %s (run %s) did not answer its interruption within %s s: its "
                "confined process is ended", self._det.info.workflow_type,
                self._det.info.run_id, INTERRUPT_WAIT)
            self._session.abort()
            return False
        self._session.interrupt()
        return True

    def get_serialization_context(self, command_info):
        if command_info is None:
            return self._context
        key = (int(command_info.command_type), int(command_info.command_seq))
        return self._contexts.get(key, self._context)

    def get_external_store_context(self, command_info):
        from temporalio.converter._extstore import StorageDriverStoreContext

        return StorageDriverStoreContext()

    def get_info(self):
        return self._det.info


# How long an eviction waits for a stuck activation to answer its interruption.
INTERRUPT_WAIT = 1.0
# An activation still running this long after it was sent is interrupted (by the watchdog
# thread, off the worker's event loop), so that its stack reaches the deadlock failure before
# the SDK's 2 s deadlock timeout fires (the SDK's own error then has no frames).
DEADLOCK_INTERRUPT_AFTER = 1.5
# Bounds on a stack a child tells: the text read (its end: the innermost frames), frames kept,
# digits of a line number, length of a file or function name or a source line; and on the
# message of its failure.
MAX_STACK_TEXT = 256 * 1024
MAX_STACK_FRAMES = 64
MAX_STACK_NAME = 256
MAX_CHILD_MESSAGE = 4096
# A log record of a child shows at most this many characters of its text, and at most this
# many records of an activation are relayed (a LOG frame costs its child six bytes).
MAX_LOG_TEXT = 16 * 1024
MAX_LOG_RECORDS = 1000
# Frames of the child show with this after their file name: the worker never reads a file a
# child names (the source lines are the child's own text), so a hostile workflow cannot get
# lines of the worker's files into its failure.
CHILD_FILE_SUFFIX = " [confined child]"

_FRAME_LINE = re.compile(r'^\s*File "(.*)", line (\d{1,9}), in (.*)$')


def _parse_stack(text):
    """[(file, line, function, source line)] from a Python traceback's text, outermost
    first (the child's failure stack trace): at most MAX_STACK_FRAMES, the innermost, each
    field bounded. Only the last MAX_STACK_TEXT characters are read."""
    frames = []
    # Split on newlines only: other line breaks a child puts in a field stay in it (escaped).
    lines = text[-MAX_STACK_TEXT:].split("\n")
    for i, line in enumerate(lines):
        m = _FRAME_LINE.match(line)
        if not m:
            continue
        source = ""
        if i + 1 < len(lines) and not _FRAME_LINE.match(lines[i + 1]):
            source = lines[i + 1].strip()
        frames.append((m.group(1)[:MAX_STACK_NAME], int(m.group(2)),
                       m.group(3)[:MAX_STACK_NAME], source[:MAX_STACK_NAME]))
    # The interruption's own frame (where wfjail raised in the child) is not the workflow's.
    while frames and frames[-1][0].endswith(os.path.join("wfjail", "guest.py")):
        frames.pop()
    return frames[-MAX_STACK_FRAMES:]


def _stack_text(text):
    """The child's traceback as the worker shows it: its frames (``_parse_stack``), each file
    marked ``[confined child]``, every field escaped (``_escape``)."""
    out = []
    for filename, lineno, name, source in _parse_stack(text):
        out.append('  File "%s%s", line %d, in %s\n' % (_escape(filename), CHILD_FILE_SUFFIX,
                                                          lineno, _escape(name)))
        if source:
            out.append("    %s\n" % _escape(source))
    return "".join(out)


def _deadlocked(act, stack):
    """The failure of an activation the watchdog interrupted: the SDK's deadlock message,
    with the workflow's stack as the child told it."""
    completion = WorkflowActivationCompletion(run_id=act.run_id)
    failure = completion.failed.failure
    failure.message = ("[TMPRL1101] Potential deadlock detected: workflow didn't yield within "
                       "%s second(s) (wfjail interrupted it in its confined process; the stack "
                       "trace is where it was)" % DEADLOCK_INTERRUPT_AFTER)
    failure.stack_trace = stack
    failure.source = "wfjail"
    return completion


class _Watchdog:
    """One thread of the worker that interrupts confined activations which run past their
    deadline, or which the SDK suspects of a deadlock: what waits on a child never runs on
    the worker's event loop."""

    def __init__(self):
        self._cond = threading.Condition()
        self._due = {}  # instance -> monotonic deadline
        self._thread = None

    def arm(self, instance, deadline):
        with self._cond:
            wake = not self._due or deadline < min(self._due.values())
            self._due[instance] = deadline
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="wfjail-watchdog",
                                                daemon=True)
                self._thread.start()
            elif wake:
                self._cond.notify()

    def disarm(self, instance):
        with self._cond:
            self._due.pop(instance, None)

    def interrupt_now(self, instance):
        """Interrupt ``instance``'s activation now (if it is in progress and was not
        interrupted yet: its answer then has INTERRUPT_WAIT), off this thread."""
        with self._cond:
            if instance in self._due and not instance._interrupting:
                self._due[instance] = 0.0
                self._cond.notify()

    def _run(self):
        while True:
            with self._cond:
                now = time.monotonic()
                overdue = [i for i, d in self._due.items() if d <= now]
                for i in overdue:
                    del self._due[i]
                if not overdue:
                    self._cond.wait(min(self._due.values()) - now if self._due else None)
                    continue
            for instance in overdue:
                try:
                    if instance._interrupt_overdue():
                        # Its answer has INTERRUPT_WAIT; then the child is ended (unless the
                        # activation disarmed it by answering).
                        with self._cond:
                            if instance._calling:
                                self._due[instance] = time.monotonic() + INTERRUPT_WAIT
                except Exception:  # noqa: BLE001  (one run's session must not stop the watch)
                    logging.getLogger("wfjail.temporal").exception("interrupting a run failed")


_WATCHDOG = _Watchdog()

# What a child's text may not carry into the worker's log or a failure: control characters
# (C0 but the tab, DEL, C1: line breaks, ANSI/OSC escapes) and Unicode line and paragraph
# separators, each shown as an escape (as `wfjail run` shows a guest's stderr).
_ESCAPES = {c: "\\x%02x" % c for c in list(range(0x00, 0x20)) + list(range(0x7F, 0xA0))
            if c != 0x09}
_ESCAPES.update({0x2028: "\\u2028", 0x2029: "\\u2029"})


def _escape(text, limit=None):
    """``text`` from a child, safe for one line of the worker's log: escaped (``_ESCAPES``),
    and cut to ``limit`` characters (saying how many were left out)."""
    text = str(text)
    more = ""
    if limit is not None and len(text) > limit:
        more = "... (%d more characters)" % (len(text) - limit)
        text = text[:limit]
    return text.translate(_ESCAPES) + more


# The largest completion taken from a child, by default: what the server takes in a task
# completion (its gRPC limit, 4 MiB). A reply's protobuf decodes to some 30 times its size in
# the worker (an empty command is two bytes), and Core holds each command again.
MAX_REPLY_BYTES = 4 * 1024 * 1024
# At most this many commands in one completion: more than a history holds by default (51,200
# events; each command adds one at least), so such a task could never complete.
MAX_COMPLETION_COMMANDS = 51_200
# The side channel (metric records: at most _MAX_METRIC_RECORDS small ones) is parsed only
# below this many bytes; JSON, too, decodes to many times its size.
MAX_SIDE_CHANNEL = 1024 * 1024


def _split_reply(reply, max_bytes=MAX_REPLY_BYTES):
    """A child's reply: the completion (protobuf), then JSON: the metric records of the
    activation. (Anything else in the JSON is ignored: the serialization contexts of the
    completion's commands are the worker's own, ``_command_contexts``.) A completion over
    ``max_bytes`` or with over MAX_COMPLETION_COMMANDS commands is a ProtocolError (before it
    is decoded, for the first); a side channel over MAX_SIDE_CHANNEL is not read."""
    if len(reply) < 4:
        raise ProtocolError("truncated", "a reply shorter than its length prefix")
    (n,) = struct.unpack(">I", reply[:4])
    size = min(n, len(reply) - 4)
    if size > max_bytes:
        raise ProtocolError("oversized", "the child's completion is %d bytes, over the %d the "
                            "worker takes (JailedWorkflowRunner(max_reply_bytes=...))"
                            % (size, max_bytes))
    from google.protobuf.message import DecodeError

    try:
        completion = WorkflowActivationCompletion.FromString(reply[4:4 + n])
    except DecodeError as e:
        raise ProtocolError("payload", "the child's completion is not a "
                            "WorkflowActivationCompletion: %s" % e) from None
    commands = len(completion.successful.commands)
    if commands > MAX_COMPLETION_COMMANDS:
        raise ProtocolError("oversized", "the child's completion has %d commands, over the %d "
                            "a history holds" % (commands, MAX_COMPLETION_COMMANDS))
    side = reply[4 + n:]
    try:
        doc = json.loads(side or b"{}") if len(side) <= MAX_SIDE_CHANNEL else {}
    except (ValueError, RecursionError):
        doc = {}
    if not isinstance(doc, dict):
        doc = {}
    metrics = doc.get("metrics") if isinstance(doc.get("metrics"), list) else []
    return completion, metrics


# At most this many command contexts are kept per run (the oldest go first; a command whose
# context went gets the workflow's own, the run's namespace and workflow id).
MAX_COMMAND_CONTEXTS = 10_000
# A command with a longer name or id (the server refuses ids and names past 1,000 characters
# by default) gets the workflow's context: what a run keeps stays small.
MAX_CONTEXT_FIELD = 1000


def _command_contexts(info, completion):
    """{(command type, seq): serialization context} of the completion's commands, as the
    SDK's ``get_serialization_context`` gives them in process, derived from the run's own
    ``info`` (namespace, workflow id and type, task queue) and the commands' fields: nothing
    the child says about a context is taken, and the namespace is always the run's."""
    from temporalio.api.enums.v1 import CommandType
    from temporalio.converter import (
        ActivitySerializationContext,
        NexusSerializationContext,
        WorkflowSerializationContext,
    )

    out = {}
    for c in completion.successful.commands:
        which = c.WhichOneof("variant")
        if which in ("schedule_activity", "schedule_local_activity"):
            v = getattr(c, which)
            local = which == "schedule_local_activity"
            out[(CommandType.COMMAND_TYPE_SCHEDULE_ACTIVITY_TASK, v.seq)] = (
                ActivitySerializationContext(
                    namespace=info.namespace, workflow_id=info.workflow_id,
                    workflow_type=info.workflow_type, activity_type=v.activity_type,
                    # The SDK's context has the id the workflow gave, None when it gave none
                    # (the command then carries the seq as the id).
                    activity_id=None if v.activity_id == str(v.seq) else v.activity_id,
                    activity_task_queue=(info.task_queue if local
                                         else v.task_queue or info.task_queue),
                    is_local=local))
        elif which == "start_child_workflow_execution":
            v = c.start_child_workflow_execution
            out[(CommandType.COMMAND_TYPE_START_CHILD_WORKFLOW_EXECUTION, v.seq)] = (
                WorkflowSerializationContext(namespace=info.namespace,
                                             workflow_id=v.workflow_id))
        elif which == "signal_external_workflow_execution":
            v = c.signal_external_workflow_execution
            out[(CommandType.COMMAND_TYPE_SIGNAL_EXTERNAL_WORKFLOW_EXECUTION, v.seq)] = (
                WorkflowSerializationContext(
                    namespace=info.namespace,
                    workflow_id=v.child_workflow_id or v.workflow_execution.workflow_id))
        elif which == "schedule_nexus_operation":
            v = c.schedule_nexus_operation
            import temporalio.nexus.system

            # A system endpoint's context is built from the operation's input object, which
            # only the child has: such a command gets the workflow's context.
            if not temporalio.nexus.system.is_system_endpoint(v.endpoint):
                out[(CommandType.COMMAND_TYPE_SCHEDULE_NEXUS_OPERATION, v.seq)] = (
                    NexusSerializationContext(endpoint=v.endpoint, service=v.service,
                                              operation=v.operation))
    return {k: ctx for k, ctx in out.items()
            if not any(isinstance(getattr(ctx, f.name), str)
                       and len(getattr(ctx, f.name)) > MAX_CONTEXT_FIELD
                       for f in dataclasses.fields(ctx))}


def _resolved_keys(act):
    """The command keys whose last payloads an activation carries (their results)."""
    from temporalio.api.enums.v1 import CommandType

    keys = []
    for job in act.jobs:
        which = job.WhichOneof("variant")
        if which == "resolve_activity":
            keys.append((CommandType.COMMAND_TYPE_SCHEDULE_ACTIVITY_TASK, job.resolve_activity.seq))
        elif which == "resolve_child_workflow_execution":
            keys.append((CommandType.COMMAND_TYPE_START_CHILD_WORKFLOW_EXECUTION,
                         job.resolve_child_workflow_execution.seq))
        elif (which == "resolve_child_workflow_execution_start"
              and not job.resolve_child_workflow_execution_start.HasField("succeeded")):
            keys.append((CommandType.COMMAND_TYPE_START_CHILD_WORKFLOW_EXECUTION,
                         job.resolve_child_workflow_execution_start.seq))
        elif which == "resolve_signal_external_workflow":
            keys.append((CommandType.COMMAND_TYPE_SIGNAL_EXTERNAL_WORKFLOW_EXECUTION,
                         job.resolve_signal_external_workflow.seq))
        elif which == "resolve_nexus_operation":
            keys.append((CommandType.COMMAND_TYPE_SCHEDULE_NEXUS_OPERATION,
                         job.resolve_nexus_operation.seq))
    return keys


# What a metric record may create, by kind: (the meter's method, the operation, the values
# taken: whole numbers from 0 below 2**63, or finite floats; how the value is passed).
_METRICS = {
    "counter": ("create_counter", "add", int, int),
    "histogram": ("create_histogram", "record", int, int),
    "histogram_float": ("create_histogram_float", "record", float, float),
    "histogram_timedelta": ("create_histogram_timedelta", "record", float,
                            lambda ms: datetime.timedelta(milliseconds=ms)),
    "gauge": ("create_gauge", "set", int, int),
    "gauge_float": ("create_gauge_float", "set", float, float),
}
# A child's metric name is an OpenTelemetry instrument name: a letter, then letters, digits,
# "_", ".", "-" or "/", at most 255 in all; none of the worker's own (RESERVED_METRIC_PREFIXES:
# the SDK's and Core's metrics are "temporal_..."), so that a child cannot register one of
# them first with another kind or unit.
_METRIC_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_.\-/]{0,254}\Z")
RESERVED_METRIC_PREFIXES = ("temporal_",)
# The attributes the worker sets on a run's metrics from the run's own info (as the SDK's
# workflow.metric_meter() does in process): a child's values for them are dropped.
RUN_METRIC_ATTRIBUTES = ("namespace", "task_queue", "workflow_type")
# Per run: distinct series (kind, name and attributes) at most; per record: attributes at most,
# and characters of an attribute's key or text value, a description or a unit.
MAX_METRIC_SERIES = 200
MAX_METRIC_ATTRIBUTES = 16
MAX_METRIC_TEXT = 256


def _metric_value(value, taken):
    """The child's value if it is one a metric of its kind takes, else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if taken is int:
        return value if isinstance(value, int) and 0 <= value < 2**63 else None
    value = float(value)  # an int beyond a float's range raises OverflowError: the caller drops it
    return value if value == value and abs(value) != float("inf") else None


def _metric_attributes(attributes):
    """The child's attributes that the worker keeps (bounded, plain, not the run's own), or
    None when the record is to be dropped."""
    if not isinstance(attributes, dict) or len(attributes) > MAX_METRIC_ATTRIBUTES + len(
            RUN_METRIC_ATTRIBUTES):
        return None
    out = {}
    for k, v in attributes.items():
        if not isinstance(k, str) or not k or len(k) > MAX_METRIC_TEXT:
            return None
        if k in RUN_METRIC_ATTRIBUTES:
            continue
        if isinstance(v, str):
            if len(v) > MAX_METRIC_TEXT:
                return None
        elif isinstance(v, bool):
            pass
        elif isinstance(v, int):
            if not -2**63 <= v < 2**63:
                return None
        elif isinstance(v, float):
            if v != v or abs(v) == float("inf"):
                return None
        else:
            return None
        out[k] = v
    return out if len(out) <= MAX_METRIC_ATTRIBUTES else None


def _metric_text(t):
    """A metric's description or unit from a child: a string of at most MAX_METRIC_TEXT
    characters, or none."""
    return t if isinstance(t, str) and len(t) <= MAX_METRIC_TEXT else None


def _record_metrics(det, records, series, reserved=RESERVED_METRIC_PREFIXES):
    """Replays the child's metric records on the worker's own meter (what
    ``workflow.metric_meter()`` gives in process: the run's namespace, task queue and
    workflow type as attributes, set here from the run's info). At most
    ``_MAX_METRIC_RECORDS`` records of a completion are taken; one that is malformed, names
    one of the worker's metrics (``reserved``: name prefixes), carries a value its kind does not take or would add a
    series past MAX_METRIC_SERIES for the run (``series``: the run's set of them) is
    dropped."""
    if not records:
        return
    get_meter = det.extern_functions.get("__temporal_get_metric_meter")
    if get_meter is None:
        return
    meter = None
    for r in records[:_MAX_METRIC_RECORDS]:
        try:
            kind, name, description, unit, value, attributes = r
            make, op, taken, conv = _METRICS[kind]
            if (not isinstance(name, str) or not _METRIC_NAME.match(name)
                    or name.startswith(reserved)):
                continue
            value = _metric_value(value, taken)
            attributes = _metric_attributes(attributes)
            if value is None or attributes is None:
                continue
            key = (kind, name, tuple(sorted(attributes.items())))
            if key not in series:
                if len(series) >= MAX_METRIC_SERIES:
                    continue
                series.add(key)
            if meter is None:
                info = det.info
                meter = get_meter().with_additional_attributes({
                    "namespace": info.namespace, "task_queue": info.task_queue,
                    "workflow_type": info.workflow_type})
            metric = getattr(meter, make)(name, _metric_text(description), _metric_text(unit))
            getattr(metric, op)(conv(value), attributes)
        except (KeyError, TypeError, ValueError, OverflowError):
            continue


# The largest upcall (extern function call) the worker reads: their arguments are small (a
# span's parameters, a patch id).
MAX_UPCALL_BYTES = 1024 * 1024
# Extern functions the child answers itself: the metric meter (its records travel with the
# completions instead).
_LOCAL_EXTERN = ("__temporal_get_metric_meter",)


def _upcalls_in_worker(det):
    """The worker side of the child's upcalls: extern functions and the patch activation
    callback, called by name with JSON arguments; the result goes back as JSON. Nothing the
    child sends is unpickled or evaluated."""
    import temporalio.worker

    def on_upcall(payload):
        # Parsed on the activation's thread while the child waits: bounded (typed_json
        # bounds the values rebuilt).
        if len(payload) > MAX_UPCALL_BYTES:
            raise ValueError("an upcall of %d bytes, over the %d the worker reads"
                             % (len(payload), MAX_UPCALL_BYTES))
        doc = json.loads(payload)
        if not isinstance(doc, dict) or not isinstance(doc.get("fn"), str):
            raise ValueError("an upcall is a JSON object with a function name")
        name = doc["fn"]
        if name == "__patch_activation__":
            callback = det.patch_activation_callback
            if callback is None:
                raise ValueError("the worker has no patch activation callback")
            result = bool(callback(temporalio.worker.PatchActivationInput(
                workflow_info=det.info, patch_id=str(doc.get("patch_id", "")))))
        else:
            fn = det.extern_functions.get(name)
            if fn is None or name in _LOCAL_EXTERN:
                raise ValueError("no extern function %r in the worker" % name)
            args = doc.get("args", [])
            if not isinstance(args, list):
                raise ValueError("the arguments of an upcall are a JSON array")
            # Rebuilt as the worker's function declares its parameters (typed_json): a
            # dataclass, enum or exception argument, never a class the child names.
            result = fn(*typed_json.decode_args(fn, args))
        return json.dumps(typed_json.encode(result)).encode()

    return on_upcall


class _log_to_worker:  # noqa: N801  (called as the function it was)
    """The worker side of the run's log records: they go to the worker's own
    ``temporalio.workflow`` logger, with the workflow's context in ``extra`` as the SDK's
    ``workflow.logger`` puts it (the text already carries it). The text is the child's: one
    line of the worker's log, escaped (``_escape``: no forged records, no terminal escapes)
    and cut to MAX_LOG_TEXT characters; the level is kept between DEBUG and CRITICAL. At most
    MAX_LOG_RECORDS records of an activation (``begin``) are relayed; ``dropped`` counts the
    rest."""

    def __init__(self, info):
        self._logger = logging.getLogger("temporalio.workflow")
        self._extra = {"temporal_workflow": {
            "namespace": info.namespace, "task_queue": info.task_queue,
            "workflow_id": info.workflow_id, "run_id": info.run_id,
            "workflow_type": info.workflow_type, "attempt": info.attempt,
        }, "wfjail": True}
        self.relayed = 0
        self.dropped = 0

    def begin(self):
        self.relayed = self.dropped = 0

    def __call__(self, level, text):
        if self.relayed >= MAX_LOG_RECORDS:
            self.dropped += 1
            return
        self.relayed += 1
        level = min(max(int(level), logging.DEBUG), logging.CRITICAL)
        if self._logger.isEnabledFor(level):
            self._logger.log(level, "%s", _escape(text, MAX_LOG_TEXT), extra=self._extra)


def _failed(act, message, stack_trace=""):
    """A completion that fails the workflow task with ``message`` (the worker retries it)."""
    completion = WorkflowActivationCompletion(run_id=act.run_id)
    completion.failed.failure.message = message
    completion.failed.failure.stack_trace = stack_trace
    completion.failed.failure.source = "wfjail"
    return completion


def _evicted(act):
    """An eviction always completes, whatever became of the child."""
    completion = WorkflowActivationCompletion(run_id=act.run_id)
    completion.successful.SetInParent()
    return completion


def _violations_text(det, violations, denied=True):
    lines = ["wfjail %s workflow %s (run %s) what workflow code may not do:" % (
        "denied" if denied else "let through (policy in warn mode)",
        det.info.workflow_type, det.info.run_id)]
    for v in violations:
        # A violation's arguments (a path, an argv) and its hint carry the child's bytes:
        # escaped, so that each violation stays one line (no forged ones after it).
        lines.append("  %s %s(%s) %s [%s]: %s" % tuple(
            _escape(v.get(k), MAX_CHILD_MESSAGE)
            for k in ("category", "syscall", "args", "action", "rule", "hint")))
    return "\n".join(lines)


def _report_text(det, report, exc):
    if report.get("violations"):
        return _violations_text(det, report["violations"])
    hint = ""
    if getattr(exc, "code", None) == "oversized" and "max_reply_bytes" not in str(exc):
        hint = " (JailedWorkflowRunner(max_reply_bytes=...) bounds what the worker reads)"
    return "wfjail: the confined run of workflow %s ended: %s: %s%s" % (
        det.info.workflow_type, _escape(report.get("status", type(exc).__name__)),
        _escape(report.get("error") or exc, MAX_CHILD_MESSAGE), hint)


# -- in the confined child ------------------------------------------------------------------------


def _instance_factory(recipe):
    """Session factory (runs in the child): rebuilds the run's details from the recipe, builds
    the workflow instance inside a running event loop, and returns the per-activation
    handler (protobuf bytes in, protobuf bytes out)."""
    import temporalio.converter
    from temporalio.api.common.v1 import Payloads
    from temporalio.api.failure.v1 import Failure

    data = pickle.loads(base64.b64decode(recipe["data"]))
    defn = temporalio.workflow._Definition.must_from_class(_load(recipe["workflow"]))
    converter_class = (_load(recipe["payload_converter"]) if recipe.get("payload_converter")
                       else temporalio.converter.DefaultPayloadConverter)
    converter = temporalio.converter.DataConverter(payload_converter_class=converter_class)
    last_failure = None
    if data["last_failure"] is not None:
        last_failure = Failure.FromString(data["last_failure"])
    det = WorkflowInstanceDetails(
        payload_converter_factory=converter._new_payload_converter,
        failure_converter_class=_load(recipe["failure_converter"]),
        interceptor_classes=[_load(p) for p in recipe["interceptors"]],
        defn=defn,
        info=data["info"],
        randomness_seed=data["randomness_seed"],
        extern_functions={**_local_extern_functions(), **{
            name: _extern_proxy(name) for name in recipe.get("extern", [])}},
        disable_eager_activity_execution=data["disable_eager_activity_execution"],
        worker_level_failure_exception_types=[_load(p) for p in recipe["failure_types"]],
        patch_activation_callback=_patch_proxy if recipe.get("patch_callback") else None,
        last_completion_result=Payloads.FromString(data["last_completion_result"]),
        last_failure=last_failure,
        default_workflow_logic_flags=data["default_workflow_logic_flags"],
    )
    # workflow.logger's records travel to the worker (LOG frames), not to this child's stderr.
    from .. import guest

    class _ToWorker(logging.Handler):
        def emit(self, record):
            try:
                guest.log(record.getMessage(), record.levelno)
            except Exception:  # noqa: BLE001  (a log record must never fail the workflow)
                pass

    wf_logger = logging.getLogger("temporalio.workflow")
    wf_logger.addHandler(_ToWorker())
    wf_logger.setLevel(recipe.get("log_level", logging.INFO))
    wf_logger.propagate = False
    # The instance must be built inside a running event loop (it registers itself on it).
    loop = asyncio.new_event_loop()
    asyncio._set_running_loop(loop)
    if recipe.get("sandboxed"):
        from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner

        runner = SandboxedWorkflowRunner()
    else:
        runner = UnsandboxedWorkflowRunner()
    try:
        instance = runner.create_instance(det)
    finally:
        asyncio._set_running_loop(None)

    def activate(request):
        act = WorkflowActivation.FromString(request)
        completion = instance.activate(act)
        data = completion.SerializeToString()
        side = {"metrics": _take_metric_records()}
        return struct.pack(">I", len(data)) + data + json.dumps(side).encode()

    activate.loop = loop  # the warm-up closes it; a child's lives as long as the child
    return activate


def _warm_up(paths):
    """In the zygote, before it forks: build each workflow's instance a few times with
    made-up details, so that the code a child runs to build its own is already specialised
    and its objects' pages already written here (a child then copies fewer pages)."""
    import datetime

    import temporalio.common
    import temporalio.converter
    from temporalio.api.common.v1 import Payloads

    info = temporalio.workflow.Info(
        attempt=1, continued_run_id=None, cron_schedule=None, execution_timeout=None,
        first_execution_run_id="warm", headers={}, namespace="warm",
        original_execution_run_id="warm", parent=None, root=None, raw_memo={},
        retry_policy=None, run_id="warm", run_timeout=None, search_attributes={},
        start_time=datetime.datetime.fromtimestamp(0, datetime.timezone.utc),
        workflow_start_time=datetime.datetime.fromtimestamp(0, datetime.timezone.utc),
        task_queue="warm", task_timeout=datetime.timedelta(),
        typed_search_attributes=temporalio.common.TypedSearchAttributes.empty,
        workflow_id="warm", workflow_type="warm", priority=temporalio.common.Priority.default)
    for path in paths:
        try:
            cls = _load(path)
            det = WorkflowInstanceDetails(
                payload_converter_factory=temporalio.converter.DataConverter()._new_payload_converter,
                failure_converter_class=temporalio.converter.DefaultFailureConverter,
                interceptor_classes=[], defn=temporalio.workflow._Definition.must_from_class(cls),
                info=info, randomness_seed=0, extern_functions=_local_extern_functions(),
                disable_eager_activity_execution=False, worker_level_failure_exception_types=[],
                patch_activation_callback=None, last_completion_result=Payloads(),
                last_failure=None)
            recipe = _recipe(det, [])
            for _ in range(3):
                # Closed here: a loop left to the garbage collector would be closed after the
                # zygote has closed the descriptors it does not keep (its self-pipe among
                # them), which Python reports as an ignored exception.
                _instance_factory(recipe).loop.close()
        except Exception:  # noqa: BLE001  (warming is an optimisation; children rebuild anyway)
            pass


def _extern_proxy(name):
    """In the child: an extern function that runs in the worker. Arguments and result are
    typed JSON (``typed_json``: JSON values, bytes, tuples, dataclasses, enums, exceptions);
    anything else raises TypeError here, in the workflow."""
    from .. import guest

    def call(*args):
        doc = {"fn": name, "args": [typed_json.encode(a) for a in args]}
        answer = guest.upcall(json.dumps(doc).encode())
        return typed_json.decode(json.loads(answer))

    call.__name__ = name
    return call


def _patch_proxy(input):
    from .. import guest

    return bool(json.loads(guest.upcall(json.dumps(
        {"fn": "__patch_activation__", "patch_id": input.patch_id}).encode())))


def _local_extern_functions():
    """The extern functions answered in the child: a metric meter that records what the
    workflow measures (sent to the worker with each completion), and (when the worker's own
    check is not proxied) local activities taken as valid."""
    return {
        "__temporal_get_metric_meter": _RecordingMeter,
        "__temporal_assert_local_activity_valid": lambda name: None,
    }


# The metric records of the activation in progress, in the child.
_metric_records = []
# At most this many records ride on one completion (the rest are dropped and counted).
_MAX_METRIC_RECORDS = 1000


def _take_metric_records():
    records = _metric_records[:]
    _metric_records.clear()
    return records


def _recording_meter_classes():
    """The child's metric meter: each record is kept for the worker (a function, so that the
    classes are built only where temporalio is imported)."""
    import temporalio.common as tc

    class Metric:
        def __init__(self, kind, name, description, unit, attributes):
            self._kind, self._name, self._description, self._unit = kind, name, description, unit
            self._attributes = dict(attributes)

        name = property(lambda self: self._name)
        description = property(lambda self: self._description)
        unit = property(lambda self: self._unit)

        def with_additional_attributes(self, additional_attributes):
            return type(self)(self._kind, self._name, self._description, self._unit,
                              {**self._attributes, **additional_attributes})

        def _keep(self, value, additional_attributes):
            if len(_metric_records) < _MAX_METRIC_RECORDS:
                _metric_records.append([self._kind, self._name, self._description, self._unit,
                                        value, {**self._attributes,
                                                **(additional_attributes or {})}])

    def kinded(base, kind, op, conv):
        def act(self, value, additional_attributes=None):
            self._keep(conv(value), additional_attributes)

        return type(base.__name__ + "Recorder", (Metric, base), {op: act})

    kinds = {
        "counter": kinded(tc.MetricCounter, "counter", "add", int),
        "histogram": kinded(tc.MetricHistogram, "histogram", "record", int),
        "histogram_float": kinded(tc.MetricHistogramFloat, "histogram_float", "record", float),
        "histogram_timedelta": kinded(tc.MetricHistogramTimedelta, "histogram_timedelta",
                                      "record", lambda d: d.total_seconds() * 1000.0),
        "gauge": kinded(tc.MetricGauge, "gauge", "set", int),
        "gauge_float": kinded(tc.MetricGaugeFloat, "gauge_float", "set", float),
    }

    class Meter(tc.MetricMeter):
        def __init__(self, attributes=None):
            self._attributes = dict(attributes or {})

        def _make(self, kind, name, description=None, unit=None):
            return kinds[kind](kind, name, description, unit, self._attributes)

        def create_counter(self, name, description=None, unit=None):
            return self._make("counter", name, description, unit)

        def create_histogram(self, name, description=None, unit=None):
            return self._make("histogram", name, description, unit)

        def create_histogram_float(self, name, description=None, unit=None):
            return self._make("histogram_float", name, description, unit)

        def create_histogram_timedelta(self, name, description=None, unit=None):
            return self._make("histogram_timedelta", name, description, unit)

        def create_gauge(self, name, description=None, unit=None):
            return self._make("gauge", name, description, unit)

        def create_gauge_float(self, name, description=None, unit=None):
            return self._make("gauge_float", name, description, unit)

        def with_additional_attributes(self, additional_attributes):
            return Meter({**self._attributes, **additional_attributes})

    return Meter


def _RecordingMeter():  # noqa: N802  (an extern function returning the meter)
    global _METER_CLASS
    if _METER_CLASS is None:
        _METER_CLASS = _recording_meter_classes()
    return _METER_CLASS()


_METER_CLASS = None


if os.environ.get("WFJAIL_TEMPORAL_WARM"):
    _warm_up(os.environ["WFJAIL_TEMPORAL_WARM"].split(","))


@dataclasses.dataclass
class DeterminismResult:
    """One replay of :func:`check_determinism`: a history, the perturbation it was replayed
    under, and the replay's failure (the SDK's nondeterminism error names the first command
    that diverged), or ``None``."""

    workflow_id: str
    run_id: str
    perturbation: str
    failure: str | None


def _perturbations(runs):
    """(name, policy text added) for each of ``runs`` replays: as given, then, in turn,
    another Python hash seed and a randomised address layout. The seed and the workflow time
    are the history's own: a replay under the jailed runner always has them."""
    out = [("as given", "")]
    for i in range(1, runs):
        if i % 2:
            seed = 1000 + i
            out.append(("PYTHONHASHSEED=%d" % seed,
                        '[env]\nset = { PYTHONHASHSEED = "%d" }\n' % seed))
        else:
            out.append(("address layout randomised",
                        '[process]\naddress_randomization = "allow"\n'))
    return out


async def check_determinism(histories, workflows, *, policy="temporal-python", runs=3,
                            **runner_options):
    """Replays each of ``histories`` (``WorkflowHistory`` objects, e.g. from
    ``handle.fetch_history()`` or ``WorkflowHistory.from_json``) ``runs`` times with
    ``JailedWorkflowRunner(policy)``: as given, then under perturbations that deterministic
    workflow code must not notice (Python's hash seed, the address layout). Returns a
    :class:`DeterminismResult` per replay; a ``failure`` names the first diverging command.
    A CI step for workflow repositories: keep histories of real runs, check them on every
    change.

        results = await check_determinism([history], [MyWorkflow])
        assert not [r for r in results if r.failure], results
    """
    from temporalio.worker import Replayer

    base = policy
    if "/" in base or base.endswith(".toml"):
        base = os.path.abspath(base)
    tmp = tempfile.mkdtemp(prefix="wfjail-determinism-")
    results = []
    try:
        for i, (name, extra) in enumerate(_perturbations(runs)):
            chosen = policy
            if extra:
                chosen = os.path.join(tmp, "perturbed-%d.toml" % i)
                with open(chosen, "w") as f:
                    f.write("extends = %s\n%s" % (json.dumps(base), extra))
            runner = JailedWorkflowRunner(chosen, **runner_options)
            try:
                replayer = Replayer(workflows=list(workflows), workflow_runner=runner)
                for history in histories:
                    r = await replayer.replay_workflow(history, raise_on_replay_failure=False)
                    results.append(DeterminismResult(
                        workflow_id=history.workflow_id,
                        run_id=getattr(history, "run_id", "") or "",
                        perturbation=name,
                        failure=None if r.replay_failure is None else str(r.replay_failure)))
            finally:
                runner.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return results
