"""The worker's side of ``wfjail.temporal``: ``JailedWorkflowRunner`` (its servers, one per
policy, in ``server``), the instance proxy that turns each activation of a run into one call
of the run's session (``_JailedInstance``), the watchdog that interrupts an activation
running too long, and the failures the worker writes for a run (what wfjail denied, how the
child ended). What the worker takes from a child is checked in ``relays``, ``contexts`` and
``stack``; the child's side is ``child``."""

from __future__ import annotations

import asyncio
import atexit
import collections
import concurrent.futures
import contextlib
import datetime
import errno
import importlib.util
import logging
import math
import threading
import time
import weakref
from contextlib import AbstractAsyncContextManager
from typing import (Any, AsyncIterator, Awaitable, Callable, Iterable, Iterator, Mapping,
                    Protocol, Sequence)

import temporalio.converter
import temporalio.worker
import temporalio.workflow
from temporalio.bridge.proto.workflow_activation import WorkflowActivation
from temporalio.bridge.proto.workflow_completion import WorkflowActivationCompletion
from temporalio.client import WorkflowHistory
from temporalio.worker import WorkflowInstance, WorkflowInstanceDetails, WorkflowRunner

from ..binary import find_wfjail
from ..client import Busy, Client, GuestError, SessionFailed
from ..client import Session as ClientSession
from ..errors import ProtocolError
from . import metrics, oplog, sdk, spans
from .child import FACTORY
from .contexts import (
    CommandKey,
    command_contexts,
    command_store_contexts,
    keep,
    resolved_keys,
    store_context,
)
from .recipe import ClassRef, class_path, class_ref, recipe
from .relays import (
    MAX_LOG_RECORDS,
    MAX_REPLY_BYTES,
    MAX_SIDE_CHANNEL,
    MAX_UPCALL_BYTES,
    RESERVED_METRIC_PREFIXES,
    LogRelay,
    ReplyRefused,
    Series,
    logging_settings,
    metric_records,
    record_metrics,
    split_reply,
    upcalls_in_worker,
)
from .server import (Server, ServerKey, acquire, policy_digest, release, release_later,
                     server_key)
from .stack import (
    MAX_CHILD_MESSAGE,
    MAX_STACK_NAME,
    denied_stack,
    escape,
    refused_read_text,
    stack_text,
)

# How long an eviction waits for a stuck activation to answer its interruption.
INTERRUPT_WAIT = 1.0
# An activation still running this long after it was sent is interrupted (by the watchdog
# thread, off the worker's event loop), so that its stack reaches the deadlock failure before
# the SDK's 2 s deadlock timeout fires (the SDK's own error then has no frames).
DEADLOCK_INTERRUPT_AFTER = 1.5
# An open refused BUSY while closes of evicted runs are in flight (a CLOSE sent an instant
# before may not be taken by the server yet) asks again when one of those closes ends: its
# slot is free by then. A close whose guest lingers (the server freed its slot when it took
# the CLOSE; the guest's exit, and so the close's end, come up to its 2 s grace later) ends
# too late to be that event: after this long without a close ending, the open asks again
# anyway (a backstop, counted: ``wait_timeouts``). It gives up only when no close is in
# flight (the server is full: "no room"), or when its run left.
ROOM_BACKSTOP = 0.1
# How long the runner's close (and the worker's exit) waits for those closes before it stops
# the servers.
CLOSES_AT_STOP_WAIT = 2.0
# How long a session's close may wait for its answer: the server gives a child EXIT_GRACE
# (2 s, src/serve/phases.rs) to exit once its input ended, then kills it and answers; one
# more second for the kill, the reap and the report. A close still unanswered then (a server
# that does not answer) is abandoned: the worker shuts its connection down, which the server
# takes as a CLOSE.
CLOSE_WAIT = 3.0
# Sessions closed at once, each on a thread of the closer's: a child that does not exit when
# its session closes holds one thread (up to CLOSE_WAIT), not the closes behind it. A thread
# idle this long ends.
MAX_CLOSERS = 64
CLOSER_IDLE = 10.0
# How long after the last ``prepare_workflow`` the runner starts its servers (``_start_soon``).
EARLY_START_AFTER = 0.05
# How long a run's first activation waits for its session's open (which runs on an opener
# thread from the moment the SDK created the run: ``_OpeningSession``), on the SDK's
# workflow-task thread, before its task fails to be retried. A backstop: an open ends on its
# server's answer (milliseconds), on a close that frees a slot, or on its server's start
# (one that died, or a workflow prepared after the worker ran). The open and the first
# call share the SDK's 2 s deadlock timeout: the wait ends before the watchdog's
# DEADLOCK_INTERRUPT_AFTER (measured from the same start), so that a task failed for it
# says what it waited for, not "deadlock", and any open that leaves the call time succeeds.
OPEN_WAIT = 1.4
# Sessions opened at once, each on a thread of the openers' (``_Openers``); an idle one ends
# after this long.
MAX_OPENERS = 64
OPENER_IDLE = 10.0

_log = logging.getLogger("wfjail.temporal")

# What a child needs to unpickle what went by value (recipe.by_value): preloaded by the
# zygote when installed, so that a child does not import it anew.
_BY_VALUE_PRELOAD = ["cloudpickle"] if importlib.util.find_spec("cloudpickle") else []


def _span_preload() -> list[str]:
    """What a child that records spans imports (``spans.record_in_child``), for the zygote
    to preload when the worker uses the OpenTelemetry plugin's provider."""
    if spans.worker_provider() is None:
        return []
    return ["opentelemetry.sdk.trace", "temporalio.contrib.opentelemetry"]


class JailedWorkflowRunner(WorkflowRunner):
    """A ``WorkflowRunner`` that runs every cached workflow run in a process of its own,
    forked from a preloaded zygote and confined by wfjail (Landlock, seccomp, namespaces).

    ``policy``: a built-in policy name or a policy file (default ``temporal-python``).
    ``max_sessions``: confined runs at once; keep it at least the worker's
    ``max_cached_workflows`` plus its concurrent workflow tasks (default 1100: the SDK's
    default cache of 1000 and 100 task slots). ``socket``: serve on this path (default: a
    temporary directory). ``wfjail``: the ``wfjail`` binary (default: ``WFJAIL_BIN``, else
    the one installed with this package, else ``PATH``: ``wfjail.binary.find_wfjail``).
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
    ``patch_callback_in_child``: run the worker's ``patch_activation_callback`` in each
    child, a copy sent by value (the SDK calls it in the workflow's read-only context, as in
    process; but it sees the worker's state as it was when first pickled, and what it
    changes stays in the child); by default it runs in the worker, through an upcall,
    outside that context.
    ``merge_pages``: opt the zygotes and the runs' processes (not the worker, not the
    server) into the kernel's same-page merging (KSM): the pages alike in every cached run
    are folded back into one once the host merges (``/sys/kernel/mm/ksm/run`` = 1, a
    host-wide setting only root changes; ``wfjail check`` shows it). Off by default: it
    costs the host ``ksmd`` CPU, and a merged page's copy-on-write timing is a side channel
    between every process on the host that opted in (docs/temporal.md, "Same-page
    merging"; docs/security.md). The operator log says at each zygote's start whether
    merging is on, and why not.

    Its own metrics (sessions, violations, latency, each run's CPU time and peak memory,
    zygote restarts: ``metrics``) go on the worker's runtime meter, next to the SDK's; a
    run's confined output and bad ends, naming the run, on the ``wfjail.temporal`` logger
    (``oplog``).

    The Worker that uses it polls only once its servers run (``ready()``, awaited by a step
    the runner adds to ``Worker.run()``, or by ``JailedPlugin``), and fails to start with
    ``ServerNotReady`` when one cannot start.

    Raises ``sdk.UntestedTemporalio`` when the installed ``temporalio`` is not a version
    this runner was tested with (it relies on private parts of the SDK: ``sdk``).
    """

    def __init__(self, policy: str = "temporal-python", *, max_sessions: int = 1100,
                 socket: str | None = None, wfjail: str | None = None,
                 preload: Iterable[str] = (), zygotes: int | None = None,
                 call_timeout: str = "30s", sandboxed: bool = False,
                 policies: Mapping[Any, str] | None = None,
                 reserved_metric_prefixes: Iterable[str] | None = None,
                 max_reply_bytes: int | None = None,
                 patch_callback_in_child: bool = False, merge_pages: bool = False) -> None:
        sdk.check_version()
        self._policy = policy
        self._max_reply_bytes = int(MAX_REPLY_BYTES if max_reply_bytes is None
                                    else max_reply_bytes)
        self._reserved_metrics = tuple(RESERVED_METRIC_PREFIXES if reserved_metric_prefixes
                                       is None else reserved_metric_prefixes)
        # Workflow type (or class) -> its own policy: one server (zygote pool) per policy.
        self._policies = {sdk.workflow_type_of(k): v for k, v in (policies or {}).items()}
        # policy -> its file's text (``policy_digest``) as this runner read it when made (a
        # class's ``wfjail_policy``: when first used), part of its servers' key.
        self._policy_texts = {p: policy_digest(p) for p in [policy, *self._policies.values()]}
        self._max_sessions = int(max_sessions)
        self._socket = socket
        self._wfjail = find_wfjail(wfjail)
        self._preload = list(preload)
        self._zygotes = zygotes
        self._call_timeout = call_timeout
        self._sandboxed = bool(sandboxed)
        self._merge_pages = bool(merge_pages)
        self._modules: list[str] = []
        self._classes: list[str] = []
        # The modules of what runs are rebuilt from besides the workflow classes (converters,
        # interceptors, failure types, the patch callback): the policy lets runs read them.
        self._run_modules: list[str] = []
        self._lock = threading.Lock()
        # policy -> (the configuration, the server) this runner holds (``server.acquire``):
        # shared with other runners of the same configuration in this process. Let go when
        # the runner is closed or dropped (``weakref.finalize``: the finalizer holds this
        # dict, not the runner).
        self._held: dict[str, tuple[ServerKey, Server]] = {}
        weakref.finalize(self, _release_all_later, self._held)
        self._failure_types: list[ClassRef] = []
        self._patch_callback_in_child = bool(patch_callback_in_child)
        # The start of the servers as soon as the worker has prepared its workflows (a timer
        # each prepare_workflow re-arms), not on the first workflow task.
        self._early_start: threading.Timer | None = None
        # policy -> the latest start of its server, on a thread of its own (``_start``).
        self._starts: dict[str, concurrent.futures.Future[Client]] = {}
        self._starts_lock = threading.Lock()
        # The policies of the workflows prepared so far: what ``ready()`` waits for.
        self._used_policies: list[str] = []
        # The SDK's workflow workers (one per Worker) whose Worker awaits ``ready()`` before
        # it polls (``_poll_when_ready``): their runs never wait for a server on the loop.
        self._polls_when_ready: weakref.WeakSet[object] = weakref.WeakSet()

    # -- WorkflowRunner ------------------------------------------------------------------------

    def prepare_workflow(self, defn: sdk.Definition) -> None:
        """Checks that the workflow class can be rebuilt in a confined process by its path, and
        notes its module for the zygote to preload."""
        path = class_path(defn.cls, "workflow class")
        self._classes.append(path)
        module = path.partition(":")[0]
        if module not in self._modules:
            self._modules.append(module)
        self._note_run_modules(sdk.run_objects(sdk.caller_self(1)))
        policy = self._policy_of(defn)
        if policy not in self._used_policies:
            self._used_policies.append(policy)
        self._poll_when_ready(sdk.caller_self(1), sdk.worker_being_built())
        self._start_soon(policy)

    def _poll_when_ready(self, workflow_worker: object, worker: Any) -> None:
        """Makes the ``Worker`` being built (``worker``, None for a Replayer) await
        ``ready()`` before it polls, as ``JailedPlugin`` does: the SDK gives a runner no hook
        into ``Worker.run()``, so the runner adds a step to it (``sdk.add_run_step``)."""
        if worker is None or workflow_worker is None or workflow_worker in self._polls_when_ready:
            return
        self._polls_when_ready.add(workflow_worker)
        sdk.add_run_step(worker, ReadyFirst(self))

    def set_worker_level_failure_exception_types(self, types: Sequence[type[BaseException]],
                                                 ) -> None:
        self._failure_types = [class_ref(t, "failure exception type") for t in types]
        self._note_run_modules(types)

    def _note_run_modules(self, objects: Iterable[Any]) -> None:
        for obj in objects:
            module = getattr(obj, "__module__", None)
            if isinstance(module, str) and module not in self._run_modules:
                self._run_modules.append(module)

    def create_instance(self, det: WorkflowInstanceDetails) -> WorkflowInstance:
        """Makes the run's proxy and starts its session's open on an opener thread
        (``_OPENERS``): the SDK calls this on the worker's event loop, which serves every run
        of the worker, so nothing here waits for a server (its answer, room, its start).
        The zygote forks a child, which builds the workflow instance; the run's first
        activation waits for that open on the event it sets (``_OpeningSession``). Only a
        Replayer's first run waits here, for its server's start."""
        policy = self._policy_of(det.defn)
        made = recipe(det, self._failure_types, self._patch_callback_in_child)
        made["sandboxed"] = self._sandboxed
        # The worker's logger levels and workflow.logger's settings hold in the child.
        made["logging"] = logging_settings()
        run_log = LogRelay(det.info)
        # The runner's metrics on the worker's runtime meter, labelled with the run's, and
        # the operator's log of the run's session (known once it opens).
        meter = metrics.run_meter(det)
        run_metrics = metrics.RunMetrics(meter, det.info)

        client = self._ready_client(policy)
        start: concurrent.futures.Future[Client] | None = None
        if client is None:
            if sdk.caller_self(1) not in self._polls_when_ready:
                # A Replayer (it polls nothing; the SDK gives no hook before its replays):
                # its first run waits here for the start (its first activation could not:
                # the SDK's deadlock timeout).
                client = self._ensure_server(policy)
            else:
                # A Worker's server that is not running any more (it died, or a workflow was
                # prepared since): the event loop does not wait for its start; the open
                # does, on its thread. A start that failed is raised here, with its reason.
                start = self._start(policy)
                if start.done():
                    client = start.result()
                    start = None
        opening = _OpeningSession(policy, run_metrics)
        instance = _JailedInstance(opening, det, self._reserved_metrics,
                                   self._max_reply_bytes, run_log, policy, run_metrics)
        # The OpenTelemetry plugin's provider: the child's spans are exported through it.
        instance._span_provider = spans.worker_provider() if made["otel_spans"] else None

        opened_on: list[Client] = []

        def open_session() -> Session:
            on = client if start is None else opening.until_started(start)
            assert on is not None
            session = self._open_session(on, det, made, run_log, run_metrics, opening)
            opened_on.append(on)
            # Before the open is done: the run's calls and close come after it.
            instance._session_log = oplog.REGISTRY.opened(on.path, session.id, session.pid,
                                                          det.info)
            return session

        def open_then_ask_status() -> None:
            """(On an opener thread.) The open, then (after the run's first call has it)
            the server's STATUS for the metrics (at most every STATUS_EVERY)."""
            opening.run(open_session)
            for on in opened_on:
                metrics.server_restarts(on, policy).poll(meter)

        _OPENERS.submit(open_then_ask_status)
        return instance

    def _open_session(self, client: Client, det: WorkflowInstanceDetails,
                      made: dict[str, Any], run_log: LogRelay,
                      run_metrics: metrics.RunMetrics,
                      opening: "_OpeningSession") -> ClientSession:
        """(On an opener thread.) Opens a run's session on ``client``'s server: the zygote
        forks its child."""
        try:
            # Under the policy's seeded randomness and virtual clock, the child's os.urandom,
            # random and uuid4 draw from the run's randomness seed, and its wall clock reads
            # each activation's time (set per call below): the same on replay.
            session = self._open_when_room(client, det, made, run_log, run_metrics, opening)
        except Busy as e:
            run_metrics.busy()
            raise OpenFailed(
                "wfjail: no room for another confined workflow run (%s of %s open): raise "
                "JailedWorkflowRunner(max_sessions=...) above max_cached_workflows" %
                (e.open, e.capacity)) from None
        except OSError as e:
            if e.errno in (errno.EMFILE, errno.ENFILE):
                raise OpenFailed(
                    "wfjail: the worker is out of file descriptors (%s): each cached "
                    "workflow run holds one; raise the worker's RLIMIT_NOFILE (ulimit -n, "
                    "the pod's nofile limit) above max_cached_workflows plus the worker's "
                    "own (see docs/temporal.md, \"Sizing a pod and the cache\")" % e) from None
            raise
        run_metrics.opened()
        return session

    def _open_when_room(self, client: Client, det: WorkflowInstanceDetails,
                        made: dict[str, Any], run_log: LogRelay,
                        run_metrics: metrics.RunMetrics,
                        opening: "_OpeningSession") -> ClientSession:
        """Opens a run's session. Refused BUSY while sessions of evicted runs are closing
        (``_CLOSER``), asks again when one of those closes ends (its slot is free by then),
        or after ROOM_BACKSTOP without one (counted); BUSY is raised when no close is in
        flight (nothing will free a slot), and ``_Abandoned`` once the run left."""
        while True:
            # Counted before the open: a close that ends while the server says BUSY is one
            # to ask again after, not one to wait for.
            closed = _CLOSER.closes_ended()
            session = self._session_of(client, det, made, run_log)
            opening.attach(session)
            try:
                opening.waiting_for("lane")
                with _lane(client.path).held(opening.abandoned):
                    opening.waiting_for("answer")
                    return session.open()
            except Busy:
                opening.waiting_for("room")
                if _CLOSER.wait_for_a_close(closed, ROOM_BACKSTOP, opening.abandoned):
                    continue
                if opening.abandoned():
                    raise _Abandoned() from None
                if _CLOSER.closes_ended() != closed:
                    continue
                if not _CLOSER.in_flight():
                    raise
                # Closes are in flight, none ended within the backstop: ask again.
                _wait_timed_out("room", run_metrics)
            finally:
                opening.attach(None)

    def _session_of(self, client: Client, det: WorkflowInstanceDetails,
                    made: dict[str, Any], run_log: LogRelay) -> ClientSession:
        """A run's session on ``client``'s server, not yet open."""
        return client.session(handler=FACTORY, init=made, timeout=self._call_timeout,
                              on_log=run_log,
                              # Warnings go through the worker's machinery.
                              on_upcall=run_log.upcalls(upcalls_in_worker(det)),
                              # A child's frames are read only up to what the worker takes
                              # of them (a reply and its side channel).
                              max_frame=max(self._max_reply_bytes + MAX_SIDE_CHANNEL + 4,
                                            MAX_UPCALL_BYTES),
                              seed=det.randomness_seed & 0xFFFFFFFFFFFFFFFF,
                              time_ns=_start_ns(det.info))

    def _policy_of(self, defn: sdk.Definition) -> str:
        """The policy of a workflow: ``policies`` by workflow type, else a ``wfjail_policy``
        attribute of its class, else the runner's."""
        return (self._policies.get(defn.name) or getattr(defn.cls, "wfjail_policy", None)
                or self._policy)

    # -- the servers ---------------------------------------------------------------------------

    def _preload_of(self) -> list[str]:
        return self._modules + self._preload + _BY_VALUE_PRELOAD + _span_preload()

    def _key(self, policy: str) -> ServerKey:
        """The configuration of ``policy``'s server for the workflows prepared so far."""
        # A policy file's text as this runner first read it: runners share a server only
        # when theirs said the same.
        text = self._policy_texts.get(policy)
        if text is None:
            text = self._policy_texts.setdefault(policy, policy_digest(policy))
        return server_key(self._wfjail, policy,
                          socket=self._socket if policy == self._policy else None,
                          classes=self._classes, preload=self._preload_of(),
                          modules=self._run_modules,
                          max_sessions=self._max_sessions, zygotes=self._zygotes,
                          policy_text=text, merge_pages=self._merge_pages)

    def _ensure_server(self, policy: str | None = None) -> Client:
        policy = policy or self._policy
        socket = self._socket if policy == self._policy else None
        preload = self._preload_of()
        key = self._key(policy)
        with self._lock:
            held = self._held.get(policy)
            if held is not None and held[0] == key and held[1].alive():
                return held[1].client
            if held is not None:  # another configuration now (more workflows), or it died
                del self._held[policy]
                release(held[0])
            server = acquire(key, lambda: Server(
                self._wfjail, policy, socket=socket, classes=self._classes,
                preload=preload, modules=self._run_modules, max_sessions=self._max_sessions,
                zygotes=self._zygotes, merge_pages=self._merge_pages))
            self._held[policy] = (key, server)
            return server.client

    def _ready_client(self, policy: str) -> Client | None:
        """The client of ``policy``'s server when this runner holds it running in its
        current configuration; None when it is starting (or not started): never waits."""
        if not self._lock.acquire(blocking=False):
            return None  # a start is in progress
        try:
            held = self._held.get(policy)
            if held is None or not held[1].alive() or held[0] != self._key(policy):
                return None
            return held[1].client
        finally:
            self._lock.release()

    def _start(self, policy: str) -> concurrent.futures.Future[Client]:
        """The start of ``policy``'s server (``_ensure_server``) on a thread of its own:
        the one in progress, or a new one (which returns at once when the server runs)."""
        with self._starts_lock:
            start = self._starts.get(policy)
            if start is not None and not start.done():
                return start
            start = concurrent.futures.Future()
            self._starts[policy] = start
        threading.Thread(target=_start_into, args=(weakref.ref(self), policy, start),
                         daemon=True, name="wfjail-server-start").start()
        return start

    async def ready(self) -> None:
        """Waits, off the event loop, until the server (and zygotes) of every policy the
        worker's workflows use runs, starting them if needed; raises ``ServerNotReady`` with
        the reason (the binary is missing, the policy does not load, a zygote cannot import
        a workflow's module: its last messages) when one cannot start. After it returns,
        a workflow task starts no server (unless one died). ``JailedPlugin`` awaits it before
        the Worker polls."""
        for policy in list(self._used_policies or [self._policy]):
            try:
                await asyncio.wrap_future(self._start(policy))
            except RuntimeError as e:
                raise ServerNotReady(policy, str(e)) from None

    async def settled(self, poll: float = 0.05) -> None:
        """After ``ready()``: waits, off the event loop, until every zygote of the runner's
        servers runs and has settled (its heap marked immortal and collapsed into huge pages
        after READY, between the first forks: SETTLED, counted by the server's STATUS). Runs
        forked before cost more memory (docs/temporal.md, "When the zygote settles"); a
        benchmark of the steady state waits for this first. A server of an older binary,
        which does not count them, is taken as settled."""
        await self.ready()
        for server in list(self._servers.values()):
            while True:
                doc = await asyncio.to_thread(server.client.status)
                if doc.get("zygotes_settled", 0) >= doc.get("zygotes", 0):
                    break
                await asyncio.sleep(poll)

    @property
    def _servers(self) -> dict[str, Server]:
        """policy -> the server this runner holds for it."""
        return {policy: server for policy, (_, server) in self._held.items()}

    def _start_soon(self, policy: str) -> None:
        """Starts ``policy``'s server on a thread of its own shortly after the last of the
        worker's ``prepare_workflow`` calls (they come one by one, in the Worker's
        constructor), so that the first workflow task does not wait for a server and zygote
        to start (seconds). A start that fails there is remembered (``server``) and raised by
        the first workflow task's."""
        policies = {policy}
        if self._early_start is not None:
            self._early_start.cancel()
            policies |= getattr(self._early_start, "policies", set())
        ref = weakref.ref(self)

        def start() -> None:
            runner = ref()
            for p in sorted(policies):
                if runner is None:
                    return
                # A failure is remembered (``server``); ready() or the first task raises it.
                runner._start(p)

        timer = threading.Timer(EARLY_START_AFTER, start)
        timer.policies = policies  # type: ignore[attr-defined]
        timer.daemon = True
        self._early_start = timer
        timer.start()

    def close(self) -> None:
        """Lets go of the runner's servers: each stops unless another runner of the same
        configuration holds it (they also end with the worker's process); the next workflow
        run starts new ones."""
        if self._early_start is not None:
            self._early_start.cancel()
        _CLOSER.wait_for_closes(CLOSES_AT_STOP_WAIT)
        with self._lock:
            _release_all(self._held, linger=False)


class ServerNotReady(RuntimeError):
    """A runner's server could not start: the worker cannot serve workflow tasks."""

    def __init__(self, policy: str, reason: str) -> None:
        super().__init__("wfjail: the server for policy %r did not start, so this worker "
                         "cannot run its workflows: %s" % (policy, reason))
        self.policy = policy


class _Plugin(temporalio.worker.Plugin):
    """A Temporal plugin that changes nothing: each step hands on to the next (the SDK's
    ``Plugin`` has no defaults). ``ReadyFirst`` and ``plugin.JailedPlugin`` override what
    they do."""

    def configure_worker(self, config: temporalio.worker.WorkerConfig,
                         ) -> temporalio.worker.WorkerConfig:
        return config

    async def run_worker(self, worker: temporalio.worker.Worker,
                         next: Callable[[temporalio.worker.Worker], Awaitable[None]]) -> None:
        await next(worker)

    def configure_replayer(self, config: temporalio.worker.ReplayerConfig,
                           ) -> temporalio.worker.ReplayerConfig:
        return config

    def run_replayer(
        self, replayer: temporalio.worker.Replayer, histories: AsyncIterator[WorkflowHistory],
        next: Callable[[temporalio.worker.Replayer, AsyncIterator[WorkflowHistory]],
                       AbstractAsyncContextManager[
                           AsyncIterator[temporalio.worker.WorkflowReplayResult]]],
    ) -> AbstractAsyncContextManager[AsyncIterator[temporalio.worker.WorkflowReplayResult]]:
        return next(replayer, histories)


class ReadyFirst(_Plugin):
    """The step a ``JailedWorkflowRunner`` adds to the run of the Worker that uses it
    (``JailedWorkflowRunner._poll_when_ready``): ``runner.ready()`` before the Worker polls,
    as ``plugin.JailedPlugin`` does (which re-exports it). It configures nothing (it is added
    after the Worker's configuration)."""

    def __init__(self, runner: JailedWorkflowRunner) -> None:
        self._runner = runner

    async def run_worker(self, worker: temporalio.worker.Worker,
                         next: Callable[[temporalio.worker.Worker], Awaitable[None]]) -> None:
        await _ready(worker, self._runner)
        await next(worker)


async def _ready(worker: temporalio.worker.Worker, runner: JailedWorkflowRunner) -> None:
    """``runner.ready()``; when it raises, ``worker`` is marked as never started (its
    shutdown, ``async with``'s exit, must not wait for a run that never began)."""
    try:
        await runner.ready()
    except BaseException:
        sdk.mark_worker_unstarted(worker)
        raise


def _start_into(ref: "weakref.ref[JailedWorkflowRunner]", policy: str,
                start: concurrent.futures.Future[Client]) -> None:
    """(A start's thread.) ``_ensure_server(policy)`` into ``start``."""
    runner = ref()
    try:
        if runner is None:
            raise RuntimeError("wfjail: the runner was dropped")
        start.set_result(runner._ensure_server(policy))
    except BaseException as e:  # noqa: BLE001  (the future carries it)
        start.set_exception(e)


class OpenFailed(RuntimeError):
    """A run's session did not open (no room, the server did not start or answer in time):
    its first workflow task fails with this message, and Temporal retries it."""


class _Abandoned(Exception):
    """(On an opener thread.) The run left (evicted, closed) before its session opened: the
    open stops."""


class _OpeningSession:
    """A run's session while it opens, then the session itself. The open runs on an opener
    thread (``_OPENERS``, ``run``), never on the worker's event loop; the run's first call
    waits for it on the event the open sets when done (OPEN_WAIT is a backstop: the call's
    task then fails with what the open waited for, and Temporal retries it). A run that
    leaves first (evicted, closed, aborted) abandons it: an open waiting for room or for its
    server's start stops, one the server is answering is cut (``abort``), and a session that
    opens all the same is closed by the run's close (which waits for the open to be done)."""

    def __init__(self, policy: str, run_metrics: metrics.RunMetrics | None = None) -> None:
        self._policy = policy
        self._run_metrics = run_metrics
        self._cond = threading.Condition()
        self._session: Session | None = None
        self._error: BaseException | None = None
        self._done = False
        self._abandoned = False
        # The run's close gave up waiting for the open: a session that opens after is cut.
        self._left = False
        # The client session being opened (its socket: ``abort`` shuts it down).
        self._opening: ClientSession | None = None
        # What the open waits for (the message of a first call that gives up on it).
        self._phase = "answer"

    # -- the opener's side --------------------------------------------------------------------

    def run(self, open_session: Callable[[], Session]) -> None:
        """(An opener thread.) Opens the session, then sets the event the run waits on."""
        session: Session | None = None
        error: BaseException | None = None
        try:
            session = open_session()
        except BaseException as e:  # noqa: BLE001  (the run's first call raises it)
            error = e
        with self._cond:
            self._session, self._error, self._done = session, error, True
            cut = self._left
            self._cond.notify_all()
        if cut and session is not None:
            session.abort()

    def attach(self, session: ClientSession | None) -> None:
        """The client session being opened (None between attempts); ``_Abandoned`` when the
        run left."""
        with self._cond:
            if session is not None and self._abandoned:
                raise _Abandoned()
            self._opening = session

    def waiting_for(self, phase: str) -> None:
        with self._cond:
            self._phase = phase

    def abandoned(self) -> bool:
        return self._abandoned

    def until_started(self, start: concurrent.futures.Future[Client]) -> Client:
        """Waits for ``start`` (its server's) to be done, or for the run to leave."""
        self.waiting_for("start")
        start.add_done_callback(lambda _: self._wake())
        with self._cond:
            self._cond.wait_for(lambda: start.done() or self._abandoned)
            if not start.done():
                raise _Abandoned()
            self._phase = "answer"
        try:
            return start.result()
        except RuntimeError as e:  # the start's reason (the binary, the policy, a zygote)
            raise OpenFailed(str(e)) from None

    def _wake(self) -> None:
        with self._cond:
            self._cond.notify_all()

    # -- the run's side -----------------------------------------------------------------------

    @property
    def opened(self) -> bool:
        """Whether the session is open (or was: its calls and close go to it)."""
        return self._session is not None

    def _opened(self) -> Session:
        """The session once open: waits for the open's end, up to OPEN_WAIT."""
        with self._cond:
            if not self._cond.wait_for(lambda: self._done or self._abandoned, OPEN_WAIT):
                phase = self._phase
            elif self._session is not None:
                return self._session
            elif self._abandoned:
                raise RuntimeError("the session is not open")
            elif isinstance(self._error, _Abandoned):
                raise RuntimeError("the session is not open")
            else:
                assert self._error is not None
                raise self._error
        _wait_timed_out("open", self._run_metrics)
        if phase == "start":
            why = ("the server for policy %r is still starting (it was no longer running: it "
                   "ended, or a workflow was prepared after the worker ran)" % self._policy)
        elif phase == "room":
            why = ("no room yet for its confined process: every session of the server for "
                   "policy %r is open and the closes of evicted runs in flight freed none"
                   % self._policy)
        elif phase == "lane":
            why = ("the opens before it on the server for policy %r (one at a time: "
                   "OPEN_LANES) did not end in time" % self._policy)
        else:
            why = "the server for policy %r did not answer its open" % self._policy
        raise OpenFailed("wfjail: this run's session did not open within %s s: %s; this "
                         "workflow task fails and Temporal retries it" % (OPEN_WAIT, why))

    @property
    def violations(self) -> list[dict[str, Any]]:
        return self._session.violations if self._session is not None else []

    @property
    def report(self) -> dict[str, Any] | None:
        return self._session.report if self._session is not None else None

    def call(self, request: bytes, time_ns: int | None = None) -> bytes:
        session = self._session if self._session is not None else self._opened()
        return session.call(request, time_ns)

    def interrupt(self) -> None:
        if self._session is not None:
            self._session.interrupt()

    def _abandon(self) -> ClientSession | None:
        with self._cond:
            self._abandoned = True
            opening = self._opening if not self._done else None
            self._cond.notify_all()
        _CLOSER.wake()  # an open waiting for room stops
        _wake_lanes()  # and one waiting for a lane
        return opening

    def abort(self) -> None:
        opening = self._abandon()
        if opening is not None:
            opening.abort()
        if self._session is not None:
            self._session.abort()

    def send_close(self) -> None:
        if self._session is not None:
            self._session.send_close()
        else:
            self._abandon()  # an open waiting for room or a start stops; one answering ends

    def close(self) -> object:
        """(The closer's thread.) Waits for the open to be done (bounded by the closer's
        CLOSE_WAIT, whose ``abort`` cuts it), then closes the session if one opened."""
        self._abandon()
        with self._cond:
            if not self._cond.wait_for(lambda: self._done, CLOSE_WAIT):
                self._left = True
                return None
        return self._session.close() if self._session is not None else None


def _name_thread(name: str) -> None:
    """Names the calling thread for the kernel too (``/proc/PID/task/TID/comm``, 15 bytes
    kept), as Python before 3.14 does not: per-thread CPU (top -H, bench-temporal's split by
    thread name) then tells the runner's threads from the SDK's. Best effort."""
    try:
        with open("/proc/self/task/%d/comm" % threading.get_native_id(), "w") as f:
            f.write(name)
    except OSError:
        pass


class _Openers:
    """The threads of the worker that open runs' sessions (``_OpeningSession.run``), off its
    event loop: each open on a thread of its own (up to MAX_OPENERS at once; more wait in
    line), so that one waiting for room or for its server does not hold the others. Idle
    threads are kept for OPENER_IDLE."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._queue: collections.deque[Callable[[], None]] = collections.deque()
        self._threads = 0
        self._idle = 0  # threads waiting for an open

    def submit(self, job: Callable[[], None]) -> None:
        with self._cond:
            self._queue.append(job)
            if self._idle < len(self._queue) and self._threads < MAX_OPENERS:
                self._threads += 1
                threading.Thread(target=self._run, name="wfjail-opener", daemon=True).start()
            self._cond.notify()

    def _run(self) -> None:
        _name_thread("wfjail-opener")
        while True:
            with self._cond:
                self._idle += 1
                try:
                    while not self._queue:
                        if not self._cond.wait(OPENER_IDLE) and not self._queue:
                            self._threads -= 1
                            return
                finally:
                    self._idle -= 1
                job = self._queue.popleft()
            try:
                job()
            except Exception:  # noqa: BLE001  (``run`` keeps the open's error for the run)
                _log.exception("opening a run's session failed")


_OPENERS = _Openers()

# Opens in flight at once on one server (its socket path): the others wait for a lane (an
# open's end frees it), on their opener threads. Only the server's answer holds a lane; a
# wait for room does not. It was 1 while `wfjail serve` answered some concurrent opens only
# after 0.5 or 1 s (its router blocked on a FORKED: issue 28); with that fixed,
# test_cache_churn at 8 lanes: open max 127-163 ms, no backstop fired (1 lane: 24-267 ms).
OPEN_LANES = 8


class _Lane:
    """The OPEN_LANES of one server: an open takes one for the server's answer. A wait for
    one ends when an open frees it, or when the waiting run left (``wake``)."""

    def __init__(self, lanes: int) -> None:
        self._cond = threading.Condition()
        self._free = lanes

    @contextlib.contextmanager
    def held(self, left: Callable[[], bool]) -> Iterator[None]:
        with self._cond:
            self._cond.wait_for(lambda: self._free > 0 or left())
            if left():
                if self._free > 0:
                    self._cond.notify()  # the lane it was woken for goes to the next
                raise _Abandoned()
            self._free -= 1
        try:
            yield
        finally:
            with self._cond:
                self._free += 1
                self._cond.notify()

    def wake(self) -> None:
        with self._cond:
            self._cond.notify_all()


_lanes: dict[str, _Lane] = {}
_lanes_lock = threading.Lock()


def _lane(path: str) -> _Lane:
    """The lanes of the server at ``path``."""
    with _lanes_lock:
        lane = _lanes.get(path)
        if lane is None:
            if len(_lanes) >= 256:  # servers long stopped
                _lanes.clear()
            lane = _lanes[path] = _Lane(OPEN_LANES)
        return lane


def _wake_lanes() -> None:
    """Wakes the opens waiting for a lane (one of their runs left)."""
    with _lanes_lock:
        lanes = list(_lanes.values())
    for lane in lanes:
        lane.wake()

# The waits on a session's path in the worker that ended on their backstop, not on the
# event they wait for: "room" (an open refused BUSY heard no close end within
# ROOM_BACKSTOP), "open" (a first activation gave up on its open after OPEN_WAIT).
_wait_timeouts: collections.Counter[str] = collections.Counter()
_wait_timeouts_lock = threading.Lock()


def wait_timeouts() -> dict[str, int]:
    """How many of the worker's waits on a session's path ended on their backstop, by wait
    (``room``, ``open``), since the process started."""
    with _wait_timeouts_lock:
        return dict(_wait_timeouts)


def _wait_timed_out(wait: str, run_metrics: metrics.RunMetrics | None) -> None:
    with _wait_timeouts_lock:
        _wait_timeouts[wait] += 1
    if run_metrics is not None:
        run_metrics.wait_timeout(wait)
    _log.info("wfjail: a session's %s wait ended on its backstop (%s so far)", wait,
              _wait_timeouts[wait])


def _release_all_later(held: dict[str, tuple[ServerKey, Server]]) -> None:
    """(A dropped runner's finalizer.) ``_release_all``, on the release thread: it takes no
    lock here (``server.release_later``)."""
    while held:
        _, (key, _server) = held.popitem()
        release_later(key)


def _release_all(held: dict[str, tuple[ServerKey, Server]], linger: bool = True) -> None:
    """Lets go of every server in ``held`` (a runner's), emptying it."""
    while held:
        _, (key, _server) = held.popitem()
        release(key, linger=linger)


def _start_ns(info: temporalio.workflow.Info) -> int | None:
    """The run's start as nanoseconds since the epoch: the child's clock until the first
    activation sets its own time."""
    start: datetime.datetime | None = getattr(info, "start_time", None)
    if start is None:
        return None
    delta = start - datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)
    return (delta.days * 86400 + delta.seconds) * 10**9 + delta.microseconds * 1000


class Session(Protocol):
    """What ``_JailedInstance`` asks of its run's session (``wfjail.client.Session``)."""

    @property
    def violations(self) -> list[dict[str, Any]]:
        """What wfjail denied (or warned of) during the last call."""

    def call(self, request: bytes, time_ns: int | None = None) -> bytes: ...

    def interrupt(self) -> None: ...

    def abort(self) -> None: ...

    def send_close(self) -> None: ...

    def close(self) -> object: ...

    @property
    def report(self) -> dict[str, Any] | None:
        """The session's report once it ended."""


class _JailedInstance(WorkflowInstance):
    """The worker's side of one confined run: each activation is one call."""

    def __init__(self, session: Session, det: WorkflowInstanceDetails,
                 reserved_metrics: Iterable[str] | None = None,
                 max_reply_bytes: int | None = None, run_log: LogRelay | None = None,
                 policy: str = "temporal-python",
                 run_metrics: metrics.RunMetrics | None = None,
                 session_log: oplog.SessionLog | None = None) -> None:
        self._session = session
        # What the run's session adds to the worker's metrics and log (create_instance).
        self._run_metrics = run_metrics
        self._session_log = session_log
        # Whether the session's end went to the metrics and the log (``_note_end``).
        self._session_over = False
        self._policy = policy  # the run's policy, as its failures name it
        # The run's log relay (``LogRelay``): its budget of records is per activation.
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
        self._contexts: dict[CommandKey, temporalio.converter.SerializationContext] = {}
        # The same for the external storage contexts of commands that target another
        # workflow (a child, a signal's target); any other payload's is the run's own.
        self._store_contexts: dict[CommandKey, temporalio.converter.StorageDriverStoreContext] \
            = {}
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
        self._metric_series: set[Series] = set()
        # The worker's replay-safe tracer provider, when the child relays its spans, and the
        # trace contexts the run was handed (trace id -> span ids): its spans go only there.
        self._span_provider: Any = None
        self._span_contexts: dict[int, set[int]] = {}

    def activate(self, act: WorkflowActivation) -> WorkflowActivationCompletion:
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
                # The interrupted activation is over: its close (the child's exit and reap)
                # comes off the eviction's path and is bounded, as any evicted run's.
                _CLOSER.close(self)
            return _evicted(act)
        if evicting and not getattr(self._session, "opened", True):
            # The run leaves before its session opened (its first task failed waiting for
            # the open): no child to tell; the open stops, or what it opens is closed.
            self._send_close()
            _CLOSER.close(self)
            return _evicted(act)
        self._calling = True
        self._idle.clear()
        if self._span_provider is not None:
            spans.handed(act, self._span_contexts)
        if self._run_log is not None:
            self._run_log.begin()
        # The SDK's debug mode runs activations on its event loop, with no deadlock timeout:
        # nothing is interrupted there.
        watched = not sdk.in_running_loop()
        if watched:
            _WATCHDOG.arm(self, time.monotonic() + DEADLOCK_INTERRUPT_AFTER)
        sent = time.monotonic()
        try:
            try:
                reply = self._session.call(
                    act.SerializeToString(),
                    time_ns=act.timestamp.ToNanoseconds() if act.HasField("timestamp")
                    else None)
            finally:
                if self._run_metrics is not None:
                    self._run_metrics.call(time.monotonic() - sent)
            # The side channel's keys (bounded: relays.side_channel): each the child's words.
            completion, side = split_reply(reply, self._max_reply_bytes)
            completion.run_id = act.run_id  # the run's own, whatever the child said
            # The activation's results were decoded before this call (with these contexts):
            # what it resolved is done with them; the completion's commands bring theirs.
            resolved = resolved_keys(act)
            keep(self._contexts, command_contexts(self._det.info, completion), resolved)
            keep(self._store_contexts, command_store_contexts(self._det.info, completion),
                 resolved)
            record_metrics(self._det, metric_records(side), self._metric_series,
                           self._reserved_metrics)
            if self._span_provider is not None:
                spans.export(self._span_provider, spans.from_side(side), act.run_id,
                             self._span_contexts)
            if completion.HasField("failed"):
                failure = completion.failed.failure
                refused = refused_read_text(failure.message, side.get("refused_read"),
                                            self._policy)
                if refused != failure.message:
                    # The SDK's warning of the failed activation (relayed from the child)
                    # names the path only: the worker's log names the policy too.
                    _log.warning("workflow %s (run %s) failed its task: %s",
                                 self._det.info.workflow_type, self._det.info.run_id,
                                 escape(refused, MAX_CHILD_MESSAGE))
                failure.message = refused
            where = ""
            if self._interrupting and completion.HasField("failed"):
                failure = completion.failed.failure
                # The child's words, bounded and escaped: frames parsed from its traceback
                # (at most MAX_STACK_FRAMES, the innermost), never a file it names read.
                where = stack_text(failure.stack_trace)
                _log.warning(
                    "workflow %s (run %s) did not yield; where it was when interrupted:\n%s%s",
                    self._det.info.workflow_type, self._det.info.run_id, where,
                    escape(failure.message, MAX_CHILD_MESSAGE))
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
                _log.warning("%s", _violations_text(self._det, warned, denied=False))
            if enforced and not evicting:
                failure = completion.failed.failure
                return _failed(act, _violations_text(self._det, enforced), denied_stack(
                    enforced, side.get("calls"), failure.stack_trace,
                    failure.message))
            return completion
        except GuestError as e:
            if evicting:
                return _evicted(act)
            if self._overdue:  # interrupted outside the workflow's own code
                with self._state:
                    self._aborted = True
                return _deadlocked(act, stack_text(e.traceback or ""))
            # The child's handler raised (a workflow's own exceptions come as a failed
            # completion): its type, message and traceback are its words, each up to a
            # frame. Marked as the child's, bounded and escaped; the stack parsed.
            return _failed(act, "wfjail: the confined process of workflow %s (run %s) raised "
                           "outside workflow code: %s: %s" % (
                               self._det.info.workflow_type, self._det.info.run_id,
                               escape(e.type, MAX_STACK_NAME),
                               escape(e.message, MAX_CHILD_MESSAGE)),
                           stack_text(e.traceback or ""))
        except OpenFailed as e:  # the run's session did not open: the message says why
            if evicting:
                return _evicted(act)
            return _failed(act, str(e))
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
                _log.warning(
                    "workflow %s (run %s) dropped %d log records of one activation (the "
                    "worker relays %d)", self._det.info.workflow_type, self._det.info.run_id,
                    self._run_log.dropped, MAX_LOG_RECORDS)
            with self._state:
                self._calling = False
                close = evicting or self._aborted
            self._idle.set()
            if close:
                # CLOSE goes now (a small write): the server frees the run's slot when it
                # takes it, whether or not the child exits; the child's exit and reap, and its
                # report, come off the activation's path.
                self._send_close()
                _CLOSER.close(self)
            else:
                self._note_end(closed=False)

    def _send_close(self) -> None:
        try:
            self._session.send_close()
        except Exception:  # noqa: BLE001  (the closer's close says why)
            pass

    def _close(self) -> None:
        """(On the closer's thread.) Ends the session; its end in metrics and log (of a
        session that opened: one that never did was never counted)."""
        self._session.close()
        if getattr(self._session, "opened", True):
            self._note_end(closed=True)
        else:
            with self._state:
                self._session_over = True

    def _note_end(self, closed: bool) -> None:
        """Once the session has ended (its report came, or the worker closed it): its end
        in the worker's metrics and log. The one place that knows whether the run's session
        is over (``_session_over``): called from the activation's thread, the eviction's and
        the closer's, it tells the metrics and the log once."""
        report = getattr(self._session, "report", None)
        with self._state:
            if self._session_over or (report is None and not closed):
                return
            self._session_over = True
        if self._run_metrics is not None:
            self._run_metrics.ended(report)
        if self._session_log is not None:
            self._session_log.ended(report)

    def get_thread_id(self) -> int | None:
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

    def _interrupt_overdue(self) -> bool:
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
            _log.warning(
                "workflow %s (run %s) did not answer its interruption within %s s: its "
                "confined process is ended", self._det.info.workflow_type,
                self._det.info.run_id, INTERRUPT_WAIT)
            self._session.abort()
            return False
        self._session.interrupt()
        return True

    def get_serialization_context(self, command_info: sdk.CommandInfo | None,
                                  ) -> temporalio.converter.SerializationContext | None:
        if command_info is None:
            return self._context
        key = (int(command_info.command_type), int(command_info.command_seq))
        return self._contexts.get(key, self._context)

    def get_external_store_context(self, command_info: sdk.CommandInfo | None,
                                   ) -> temporalio.converter.StorageDriverStoreContext:
        return store_context(self._det.info, command_info, self._store_contexts)

    def get_info(self) -> temporalio.workflow.Info:
        return self._det.info


class _Watchdog:
    """One thread of the worker that interrupts confined activations which run past their
    deadline, or which the SDK suspects of a deadlock: what waits on a child never runs on
    the worker's event loop. Its thread starts with the first activation it watches."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._due: dict[_JailedInstance, float] = {}  # instance -> monotonic deadline
        self._thread: threading.Thread | None = None
        # When the thread's wait ends on its own (monotonic; inf: it waits to be woken). An
        # activation armed with a later deadline does not wake it: it looks when it wakes.
        # With nothing armed it waits DEADLOCK_INTERRUPT_AFTER while activations come (none
        # armed meanwhile is due before it wakes), then until woken: one wake-up per such
        # period, not one per activation.
        self._wakes_at = math.inf
        self._armed = False  # an activation was armed since the thread last looked

    def arm(self, instance: _JailedInstance, deadline: float) -> None:
        with self._cond:
            self._due[instance] = deadline
            self._armed = True
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="wfjail-watchdog",
                                                daemon=True)
                self._thread.start()
            elif deadline < self._wakes_at:
                self._wakes_at = -math.inf  # woken: it sets its next wait itself
                self._cond.notify()

    def disarm(self, instance: _JailedInstance) -> None:
        with self._cond:
            self._due.pop(instance, None)

    def interrupt_now(self, instance: _JailedInstance) -> None:
        """Interrupt ``instance``'s activation now (if it is in progress and was not
        interrupted yet: its answer then has INTERRUPT_WAIT), off this thread."""
        with self._cond:
            if instance in self._due and not instance._interrupting:
                self._due[instance] = 0.0
                self._wakes_at = -math.inf
                self._cond.notify()

    def _run(self) -> None:
        _name_thread("wfjail-watchdog")
        while True:
            with self._cond:
                now = time.monotonic()
                overdue = [i for i, d in self._due.items() if d <= now]
                for i in overdue:
                    del self._due[i]
                if not overdue:
                    if self._due:
                        self._wakes_at = min(self._due.values())
                    elif self._armed:
                        self._wakes_at = now + DEADLOCK_INTERRUPT_AFTER
                    else:
                        self._wakes_at = math.inf
                    self._armed = False
                    wakes_at = self._wakes_at
                    self._cond.wait(None if wakes_at == math.inf else wakes_at - now)
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
                    _log.exception("interrupting a run failed")


_WATCHDOG = _Watchdog()


class _Closer:
    """The threads of the worker that close the sessions of evicted runs (and of those ended
    by an interruption): the close waits for the child's exit and reap (its report), which
    need not be on the eviction's path. Each close runs on a thread of its own (up to
    MAX_CLOSERS at once, idle ones kept for CLOSER_IDLE), so that a child that does not exit
    when its session closes (the server kills it after its 2 s grace) holds its own close,
    not the closes queued behind it; and each is bounded: one not answered within CLOSE_WAIT
    (a server that does not answer) is abandoned to the server, its connection shut down.
    CLOSE itself is sent before the close is queued (``_JailedInstance._send_close``): the
    server frees the slot when it takes it, and a child that does not exit lingers there
    holding none. An open refused BUSY while closes are in flight (one sent an instant before
    may not be taken yet) waits for one of them to end (``wait_for_a_close``) and asks again,
    on its opener thread (``_OpeningSession``), so that a closing run never refuses a new
    one."""

    def __init__(self) -> None:
        lock = threading.Lock()
        # Waits for closes to end (``wait_for_closes``, ``wait_for_a_close``) and the watch
        # thread's; the idle closer threads wait on ``_work`` (same lock), each woken alone
        # by a close queued: a close wakes one thread, not every idle one (with 64 idle,
        # ~46 futex calls a close in a real worker).
        self._cond = threading.Condition(lock)
        self._work = threading.Condition(lock)
        # The watch thread's (``_abandon_overdue``), woken only when it waits for no
        # deadline (``_watch_waits``): a close queued later is due after those it waits for.
        self._watched = threading.Condition(lock)
        self._watch_waits = False
        self._queue: collections.deque[_JailedInstance] = collections.deque()
        self._in_flight = 0
        self._done = 0  # closes ended so far
        self._threads = 0
        self._idle = 0  # threads waiting for a close
        # A close in progress -> when it is abandoned (monotonic), watched by one thread.
        self._due: dict[_JailedInstance, float] = {}
        self._watch: threading.Thread | None = None

    def close(self, instance: _JailedInstance) -> None:
        with self._cond:
            self._queue.append(instance)
            self._in_flight += 1
            if self._idle < len(self._queue) and self._threads < MAX_CLOSERS:
                self._threads += 1
                threading.Thread(target=self._run, name="wfjail-closer", daemon=True).start()
            self._work.notify()

    def wait_for_closes(self, timeout: float) -> bool:
        """Waits up to ``timeout`` for the closes in flight; whether there were any and all
        are done."""
        with self._cond:
            if not self._in_flight:
                return False
            return self._cond.wait_for(lambda: not self._in_flight, timeout)

    def closes_ended(self) -> int:
        """How many closes have ended so far (for ``wait_for_a_close``)."""
        with self._cond:
            return self._done

    def in_flight(self) -> int:
        """How many closes are in flight (queued or in progress)."""
        with self._cond:
            return self._in_flight

    def wait_for_a_close(self, since: int, timeout: float,
                         stop: Callable[[], bool] | None = None) -> bool:
        """Waits up to ``timeout`` for a close to end after the first ``since`` had
        (``closes_ended()``; its slot is free by then), or until ``stop()`` (checked when
        woken: ``wake``); whether one has (False at once when none has and none is in
        flight)."""
        with self._cond:
            if self._done == since and not self._in_flight:
                return False
            self._cond.wait_for(lambda: self._done != since or (stop is not None and stop()),
                                max(timeout, 0.0))
            return self._done != since

    def wake(self) -> None:
        """Wakes the waits of ``wait_for_a_close`` (to check their ``stop``)."""
        with self._cond:
            self._cond.notify_all()

    def _run(self) -> None:
        _name_thread("wfjail-closer")
        while True:
            with self._cond:
                self._idle += 1
                try:
                    while not self._queue:
                        if not self._work.wait(CLOSER_IDLE) and not self._queue:
                            self._threads -= 1
                            return
                finally:
                    self._idle -= 1
                instance = self._queue.popleft()
                self._due[instance] = time.monotonic() + CLOSE_WAIT
                if self._watch is None:
                    self._watch = threading.Thread(target=self._abandon_overdue,
                                                   name="wfjail-close-watch", daemon=True)
                    self._watch.start()
                elif self._watch_waits:  # it waits for no deadline: it learns this one
                    self._watch_waits = False
                    self._watched.notify()
            try:
                instance._close()
            except Exception:  # noqa: BLE001  (one run's session must not stop the closes)
                _log.exception("closing a run's session failed")
            finally:
                with self._cond:
                    self._due.pop(instance, None)
                    self._in_flight -= 1
                    self._done += 1
                    self._cond.notify_all()

    def _abandon_overdue(self) -> None:
        """(The watch thread.) Shuts down the connection of each close not answered within
        CLOSE_WAIT: its thread's close then returns without a report, and the server takes
        the worker's leaving as a CLOSE (it kills the guest if it has not exited within its
        own grace)."""
        while True:
            with self._cond:
                now = time.monotonic()
                overdue = [i for i, d in self._due.items() if d <= now]
                if not overdue:
                    pending = [d for d in self._due.values() if d > now]
                    self._watch_waits = not pending
                    self._watched.wait(min(pending) - now if pending else None)
                    continue
                for i in overdue:
                    # Abandoned once, and watched no more (its thread's close ends soon).
                    del self._due[i]
            for instance in overdue:
                _log.warning(
                    "the session of workflow %s (run %s) was not closed within %s s: it is "
                    "left to the server, which ends its confined process",
                    instance._det.info.workflow_type, instance._det.info.run_id, CLOSE_WAIT)
                try:
                    instance._session.abort()
                except Exception:  # noqa: BLE001  (one run's session must not stop the watch)
                    _log.exception("abandoning a run's session failed")


_CLOSER = _Closer()
# Before the servers stop at exit (``server._stop_all``, registered first, runs after): the
# last runs' closes, so that their reports come whole, not as zygotes that died.
atexit.register(_CLOSER.wait_for_closes, CLOSES_AT_STOP_WAIT)


# -- the failures the worker writes ---------------------------------------------------------


def _failed(act: WorkflowActivation, message: str, stack_trace: str = "",
            ) -> WorkflowActivationCompletion:
    """A completion that fails the workflow task with ``message`` (the worker retries it)."""
    completion = WorkflowActivationCompletion(run_id=act.run_id)
    completion.failed.failure.message = message
    completion.failed.failure.stack_trace = stack_trace
    completion.failed.failure.source = "wfjail"
    return completion


def _deadlocked(act: WorkflowActivation, stack: str) -> WorkflowActivationCompletion:
    """The failure of an activation the watchdog interrupted: the SDK's deadlock message,
    with the workflow's stack as the child told it."""
    return _failed(act, "[TMPRL1101] Potential deadlock detected: workflow didn't yield within "
                   "%s second(s) (wfjail interrupted it in its confined process; the stack "
                   "trace is where it was)" % DEADLOCK_INTERRUPT_AFTER, stack)


def _evicted(act: WorkflowActivation) -> WorkflowActivationCompletion:
    """An eviction always completes, whatever became of the child."""
    completion = WorkflowActivationCompletion(run_id=act.run_id)
    completion.successful.SetInParent()
    return completion


def _violations_text(det: WorkflowInstanceDetails, violations: list[dict[str, Any]],
                     denied: bool = True) -> str:
    lines = ["wfjail %s workflow %s (run %s) what workflow code may not do:" % (
        "denied" if denied else "let through (policy in warn mode)",
        det.info.workflow_type, det.info.run_id)]
    for v in violations:
        # A violation's arguments (a path, an argv) and its hint carry the child's bytes:
        # escaped, so that each violation stays one line (no forged ones after it).
        lines.append("  %s %s(%s) %s [%s]: %s" % tuple(
            escape(v.get(k), MAX_CHILD_MESSAGE)
            for k in ("category", "syscall", "args", "action", "rule", "hint")))
    return "\n".join(lines)


# What the worker adds to a frame over the session's bound: the bound is max_reply_bytes'.
_FRAME_BOUND_HINT = " (JailedWorkflowRunner(max_reply_bytes=...) bounds what the worker reads)"


def _report_text(det: WorkflowInstanceDetails, report: dict[str, Any], exc: BaseException,
                 ) -> str:
    if report.get("violations"):
        return _violations_text(det, report["violations"])
    return "wfjail: the confined run of workflow %s ended: %s: %s%s" % (
        det.info.workflow_type, escape(report.get("status", type(exc).__name__)),
        escape(report.get("error") or str(exc) or oplog.end_reason(report), MAX_CHILD_MESSAGE),
        _hint(exc))


def _hint(exc: BaseException) -> str:
    """What the worker's failure adds to ``exc``: for a frame of the child's over what the
    session reads, that ``max_reply_bytes`` sets it. A reply the worker itself refused
    (``ReplyRefused``: too large, too many commands) says its own bound."""
    if isinstance(exc, ProtocolError) and not isinstance(exc, ReplyRefused) \
            and exc.code == "oversized":
        return _FRAME_BOUND_HINT
    return ""
