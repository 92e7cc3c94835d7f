"""In the confined child (and the zygote it is forked from): the session handler that builds
the run's workflow instance and answers each activation (``instance_factory``), the extern
functions it proxies to the worker, the log records and warnings it sends the worker
(``_relay_records``), the metric meter whose records ride on the completions, and the
zygote's warm-up (``warm_up``), called explicitly, never on import."""

from __future__ import annotations

import asyncio
import datetime
import gc
import json
import logging
import os
import struct
import sys
import types
import warnings
from typing import Any, Callable

import temporalio.common
import temporalio.converter
import temporalio.exceptions
import temporalio.worker
import temporalio.workflow
from temporalio.api.common.v1 import Payload, Payloads
from temporalio.bridge.proto.workflow_activation import WorkflowActivation
from temporalio.bridge.proto.workflow_completion import WorkflowActivationCompletion

from .. import guest, typed_json
from . import sdk, spans
from .recipe import Recipe, details, load, recipe
from .relays import (
    FULL_INFO_KEY,
    MAX_METRIC_RECORDS,
    MAX_WARNINGS,
    PATCH_UPCALL,
    RECORD_MARK,
    WARNING_MARK,
)
from .stack import begin_calls, policy_refused_read, take_calls, watch_calls

# The session handler the zygote resolves: a factory called with the run's recipe.
FACTORY = "wfjail.temporal.child:instance_factory"
# What the zygote calls once, right after it imported temporalio.worker (a preload entry
# "module:function"): the warm-up of the workflow classes WARM_ENV names.
WARM_UP = "wfjail.temporal.child:warm_up_from_env"
# The workflow classes (class paths, comma-separated) the zygote warms up: set in the
# zygote's environment by the runner's policy.
WARM_ENV = "WFJAIL_TEMPORAL_WARM"

# A run's activation handler: protobuf bytes in, the completion and its side channel out.
Activate = Callable[[bytes], bytes]


def instance_factory(recipe: Recipe) -> Activate:
    """Session factory (runs in the child): rebuilds the run's details from the recipe, builds
    the workflow instance inside a running event loop, and returns the per-activation
    handler (protobuf bytes in, protobuf bytes out). The loop lives as long as the child."""
    global _session_loop
    activate, _session_loop = _build(recipe)
    return activate


# The session's event loop, held for the child's life: dropped, it was collected at once,
# unclosed, and its ResourceWarning (shown: the child's filter is "always") was two lines
# of every session on the server's stderr, relayed to the worker's log.
_session_loop: asyncio.AbstractEventLoop | None = None


def _build(recipe: Recipe) -> tuple[Activate, asyncio.AbstractEventLoop]:
    """``instance_factory``'s handler, and the event loop its instance was built in."""
    det = details(recipe, {**local_extern_functions(), **{
        name: _extern_proxy(name) for name in recipe.get("extern", [])}}, _patch_proxy)
    _relay_records(recipe.get("logging"))
    relay_spans = bool(recipe.get("otel_spans"))
    if relay_spans:
        spans.record_in_child()
    watch_calls()  # where a call the policy may deny was made, for the worker's failure
    # The instance must be built inside a running event loop (it registers itself on it).
    loop = asyncio.new_event_loop()
    runner: temporalio.worker.WorkflowRunner
    if recipe.get("sandboxed"):
        from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner

        runner = SandboxedWorkflowRunner()
    else:
        runner = temporalio.worker.UnsandboxedWorkflowRunner()
    instance = sdk.build_in_loop(loop, lambda: runner.create_instance(det))

    def activate(request: bytes) -> bytes:
        global _warnings_sent
        _warnings_sent = 0
        act = WorkflowActivation.FromString(request)
        begin_calls()
        try:
            completion = instance.activate(act)
        except Exception as err:  # noqa: BLE001  (the SDK's worker fails the task with it)
            # (Not an interruption, which the worker reads as where the workflow was, nor
            # an eviction, which the worker completes whatever became of the child.)
            if isinstance(err, guest.Interrupted) or any(
                    j.HasField("remove_from_cache") for j in act.jobs):
                raise
            completion = _activation_failed(det, act, err)
        data = completion.SerializeToString()
        side: dict[str, Any] = {
            "metrics": _take_metric_records(), "calls": take_calls(),
            "refused_read": policy_refused_read(completion.failed.failure.message)}
        if relay_spans:
            side["spans"] = spans.take()
        return struct.pack(">I", len(data)) + data + json.dumps(side).encode()

    return activate, loop


# A LogRecord's own attributes: what is not one of them is the record's ``extra``.
_RECORD_ATTRIBUTES = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime"}
# What the child sends of a record's text, traceback or stack (the worker cuts them further).
_MAX_SENT_TEXT = 64 * 1024


def _plain(value: Any, depth: int = 0) -> Any:
    """An extra value as JSON: scalars, lists and dicts as they are (to a depth), anything
    else as its repr (cut); the worker bounds them again."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value if not isinstance(value, str) else value[:_MAX_SENT_TEXT]
    if depth < 8 and isinstance(value, (list, tuple)):
        return [_plain(v, depth + 1) for v in value[:1000]]
    if depth < 8 and isinstance(value, dict):
        return {str(k): _plain(v, depth + 1) for k, v in list(value.items())[:1000]}
    return repr(value)[:1024]


def _activation_failed(det: temporalio.worker.WorkflowInstanceDetails, act: WorkflowActivation,
                       err: Exception) -> WorkflowActivationCompletion:
    """The completion the SDK's worker makes of an activation that raised out of the
    instance (a warning that the worker's filters made an error, among others), and its
    log record: the task fails with the exception (a non-retryable ApplicationError fails
    the workflow), as in process (``temporalio.worker._workflow``)."""
    logging.getLogger("temporalio.worker._workflow").exception(
        "Failed handling activation on workflow with run ID %s", act.run_id)
    completion = WorkflowActivationCompletion(run_id=act.run_id)
    payloads = det.payload_converter_factory()
    if isinstance(err, temporalio.exceptions.ApplicationError) and err.non_retryable:
        failure = completion.successful.commands.add().fail_workflow_execution.failure
    else:
        failure = completion.failed.failure
    failure.SetInParent()
    try:
        det.failure_converter_class().to_failure(err, payloads, failure)
    except Exception as inner:  # noqa: BLE001
        logging.getLogger("temporalio.worker._workflow").exception(
            "Failed converting activation exception on workflow with run ID %s", act.run_id)
        failure.message = "Failed converting activation exception: %s" % inner
    return completion


class _ToWorker(logging.Handler):
    """Sends each record that reaches the root logger to the worker, as the record: a LOG
    frame whose text is ``RECORD_MARK`` and JSON (logger name, level, message, function,
    line, file, exception, stack, extra); the worker makes it again on its own logger
    (``relays.LogRelay``). Outside a session (the zygote) it goes to stderr."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            if not guest.connected():
                sys.stderr.write("%s %s: %s\n" % (record.levelname, record.name,
                                                   record.getMessage()))
                return
            doc: dict[str, Any] = {
                "name": record.name, "level": record.levelno,
                "msg": record.getMessage()[:_MAX_SENT_TEXT], "func": record.funcName,
                "line": record.lineno, "path": record.pathname,
            }
            if record.exc_info and record.exc_info[1] is not None:
                import traceback

                exc = record.exc_info[1]
                kind = type(exc)
                doc["exc"] = {
                    "type": kind.__qualname__ if kind.__module__ == "builtins" else
                    "%s.%s" % (kind.__module__, kind.__qualname__),
                    "message": str(exc)[:_MAX_SENT_TEXT],
                    "traceback": "".join(traceback.format_exception(
                        kind, exc, exc.__traceback__))[-_MAX_SENT_TEXT:]}
            if record.stack_info:
                doc["stack"] = record.stack_info[-_MAX_SENT_TEXT:]
            extra = {k: (True if k == FULL_INFO_KEY else _plain(v))
                     for k, v in record.__dict__.items() if k not in _RECORD_ATTRIBUTES}
            if extra:
                doc["extra"] = extra
            guest.log(RECORD_MARK + json.dumps(doc), min(max(record.levelno, 0), 255))
        except Exception:  # noqa: BLE001  (a log record must never fail the workflow)
            self.handleError(record)


def _relay_records(settings: dict[str, Any] | None) -> None:
    """Every record that reaches this child's root logger travels to the worker, through
    one handler per process, however many instances it builds (the zygote's warm-up builds
    several before it forks this child; when each added its own, every record went to the
    worker once per handler). ``settings`` (``relays.logging_settings``, the worker's; none
    in the zygote's warm-up, whose warnings stay its own) set the loggers' levels and
    ``workflow.logger``'s settings as the worker has them, and send every warning to the
    worker (``_warning_to_worker``)."""
    root = logging.getLogger()
    if not any(isinstance(h, _ToWorker) for h in root.handlers):
        root.addHandler(_ToWorker())
    if not settings:
        return
    global _show_here
    if warnings.showwarning is not _warning_to_worker:
        _show_here = warnings.showwarning
        warnings.showwarning = _warning_to_worker
    # Every warning reaches the worker, whose filters decide (workflow code's own filters,
    # set later, come first).
    warnings.simplefilter("always")
    # Only what differs from the zygote's: each setLevel and disable walks every logger of
    # the process to clear its cache, writing pages the child would otherwise share.
    for name, level in settings.get("levels", {}).items():
        if isinstance(level, int):
            named = logging.getLogger(name or None)
            if named.level != level:
                named.setLevel(level)
    disable = settings.get("disable")
    if isinstance(disable, int) and disable != logging.root.manager.disable:
        logging.disable(disable)
    adapter = temporalio.workflow.logger
    for key, value in settings.get("adapter", {}).items():
        if isinstance(value, bool) and isinstance(getattr(adapter, key, None), bool):
            setattr(adapter, key, value)
    # The worker adds the run's identity to the text itself (relays.LogRelay), and takes
    # the update's id and name from temporal_workflow: the child's SDK adds no suffix and
    # always sends them.
    adapter.workflow_info_on_message = False
    adapter.workflow_info_on_extra = True


# The warnings sent to the worker in the activation in progress (at most MAX_WARNINGS),
# and where a warning goes outside a call (the zygote; between calls): Python's own
# showwarning, to this child's stderr.
_warnings_sent = 0
_show_here: Callable[..., None] = warnings.showwarning


def _warning_to_worker(message: Warning | str, category: type[Warning], filename: str,
                       lineno: int, file: Any = None, line: str | None = None) -> None:
    """``warnings.showwarning`` in the child: the warning goes through the worker's
    ``warnings`` machinery, during the activation (an upcall); when the worker's filters
    make it an error, it is raised here, in the workflow's code, as in process."""
    global _warnings_sent
    if file is not None or not guest.in_call():  # (an upcall is legal only in a call)
        _show_here(message, category, filename, lineno, file, line)
        return
    if _warnings_sent >= MAX_WARNINGS:
        return
    _warnings_sent += 1
    # The module that warned (the worker's filters match module names): the innermost
    # frame of the warning's file.
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename != filename:
        frame = frame.f_back  # type: ignore[assignment]
    module = frame.f_globals.get("__name__") if frame is not None else None
    doc = {"category": "%s:%s" % (category.__module__, category.__qualname__),
           "message": str(message)[:_MAX_SENT_TEXT], "filename": filename,
           "lineno": lineno, "module": module}
    try:
        answer = json.loads(guest.upcall(WARNING_MARK + json.dumps(doc).encode()))
    except Exception:  # noqa: BLE001  (no worker to ask: shown here)
        _show_here(message, category, filename, lineno, file, line)
        return
    if answer == "raise":
        raise message if isinstance(message, Warning) else category(message)


def warm_up_from_env() -> None:
    """The zygote's warm-up (its preload list names ``WARM_UP``): ``warm_up`` of the classes
    ``WARM_ENV`` names, if any (wfjail's own warm-up workflow runs either way)."""
    classes = os.environ.get(WARM_ENV)
    warm_up(classes.split(",") if classes else [])


def warm_up(paths: list[str]) -> None:
    """In the zygote, before it forks: build each workflow's instance a few times with
    made-up details, so that the code a child runs to build its own is already specialised
    and its objects' pages already written here (a child then copies fewer pages); then run
    wfjail's own workflow (``_WarmUp``, never the user's) through the SDK's common
    activations (``warm_runs``)."""
    info = _warm_info()
    classes = []
    for path in paths:
        try:
            cls = load(path)
            classes.append(cls)
            made = recipe(_warm_details(cls, info), [])
            for _ in range(3):
                # Closed here: a loop left to the garbage collector would be closed after the
                # zygote has closed the descriptors it does not keep (its self-pipe among
                # them), which Python reports as an ignored exception.
                _build(made)[1].close()
        except Exception:  # noqa: BLE001  (warming is an optimisation; children rebuild anyway)
            pass
    try:
        warm_runs(_WARM_RUNS)
        # What a run still writes of the code it runs (counters of instructions that did not
        # specialise, and the like), and the workflows' own code (not run here): copies
        # made one after another, so that a child's writes to them land on fewer pages.
        written, ran = _written_code(lambda: warm_runs(1))
        for cls in classes:
            written.update(id(c) for c in _code_of(vars(cls).values()))
        written.update(id(c) for c in _code_of(_wfjail_functions()))
        _relocate_code(written, ran)
        del ran  # (the originals it held)
        warm_runs(_WARM_RUNS)  # the copies quickened and specialised in their turn
    except Exception:  # noqa: BLE001  (as above)
        pass


def _code_of(objects: Any) -> list[types.CodeType]:
    """The code objects of the functions among ``objects`` (also static and class methods
    and properties' accessors), and those nested in them (in their constants)."""
    found: dict[int, types.CodeType] = {}
    stack: list[types.CodeType] = []
    for obj in objects:
        for fn in ((obj.fget, obj.fset, obj.fdel) if isinstance(obj, property)
                   else (getattr(obj, "__func__", obj),)):
            code = getattr(fn, "__code__", None) if isinstance(fn, types.FunctionType) else None
            if code is not None and id(code) not in found:
                found[id(code)] = code
                stack.append(code)
    while stack:
        for const in stack.pop().co_consts:
            if isinstance(const, types.CodeType) and id(const) not in found:
                found[id(const)] = const
                stack.append(const)
    return list(found.values())


def _wfjail_functions() -> list[Any]:
    """The functions and classes' methods of wfjail's modules (the zygote's own among them,
    run as ``__main__``): what a session child runs around the workflow's activations."""
    from .. import guest as _guest, protocol  # noqa: F401  (the children's; loaded here first)

    found: list[Any] = []
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    modules = [m for name, m in list(sys.modules.items())
               if name == "wfjail" or name.startswith("wfjail.")]
    if main is not None and getattr(spec, "name", None) == "wfjail.zygote":
        modules.append(main)
    for module in modules:
        for value in list(vars(module).values()):
            if getattr(value, "__module__", None) != module.__name__:
                continue
            found.append(value)
            if isinstance(value, type):
                found.extend(vars(value).values())
    return found


def _written_code(run: Callable[[], None]) -> tuple[set[int], dict[int, types.CodeType]]:
    """The ids of the code objects whose bytecode (the specialising interpreter's inline
    caches and counters, CPython 3.11+) a third ``run`` writes, and the code objects the
    first one ran (a profile hook sees them)."""
    ran: dict[int, types.CodeType] = {}

    def seen(frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            ran[id(frame.f_code)] = frame.f_code

    adaptive = getattr(types.CodeType, "_co_code_adaptive", None)
    if adaptive is None:  # (not CPython 3.11+: nothing to find)
        return set(), ran
    previous = sys.getprofile()
    sys.setprofile(seen)
    try:
        run()
    finally:
        sys.setprofile(previous)
    run()  # (3.12+ takes the profile hook's instrumentation out of the code as it runs it)
    before = {i: bytes(adaptive.__get__(c)) for i, c in ran.items()}
    run()
    return {i for i, c in ran.items() if bytes(adaptive.__get__(c)) != before[i]}, ran


def _relocate_code(ids: set[int], ran: dict[int, types.CodeType]) -> int:
    """Gives every function whose code object is in ``ids`` (or, among the code that ``ran``,
    holds one in its constants, as a function that defines a closure does) a copy of it,
    the copies made one after another while the originals are still alive (else each copy
    took its original's place), so that they lie together. The number of functions
    changed."""
    copies: dict[int, types.CodeType] = {}
    needs: dict[int, bool] = {}

    def needed(code: types.CodeType) -> bool:
        if id(code) not in needs:
            needs[id(code)] = False  # (a cycle of constants cannot be, but ends here)
            needs[id(code)] = id(code) in ids or (id(code) in ran and any(
                isinstance(k, types.CodeType) and needed(k) for k in code.co_consts))
        return needs[id(code)]

    def copy(code: types.CodeType) -> types.CodeType:
        if id(code) not in copies:
            copies[id(code)] = code.replace(co_consts=tuple(
                copy(k) if isinstance(k, types.CodeType) and needed(k) else k
                for k in code.co_consts))
        return copies[id(code)]

    functions = [f for f in gc.get_objects() if isinstance(f, types.FunctionType)
                 and (id(f.__code__) in ids or id(f.__code__) in ran) and needed(f.__code__)]
    originals = [f.__code__ for f in functions]
    made = [copy(c) for c in originals]
    for fn, code in zip(functions, made):
        fn.__code__ = code
    # The originals kept for the process's life: freed, they left holes in the zygote's pools
    # and heap pages that each child's own allocations then filled, writing those pages.
    _relocated_originals.extend(originals)
    _relocated_originals.extend(c for i, c in ran.items() if i in copies)
    return len(functions)


# The code objects ``_relocate_code`` replaced (see there).
_relocated_originals: list[types.CodeType] = []


# How many times the zygote drives its warm-up workflow through a whole run: CPython 3.11's
# code objects quicken after 8 calls (its warm-up counter) and an instruction specialises
# after a few executions; more runs only cost the zygote's start.
_WARM_RUNS = 16


def _warm_info() -> temporalio.workflow.Info:
    return temporalio.workflow.Info(
        attempt=1, continued_run_id=None, cron_schedule=None, execution_timeout=None,
        first_execution_run_id="warm", headers={}, namespace="warm",
        original_execution_run_id="warm", parent=None, root=None, raw_memo={},
        retry_policy=None, run_id="warm", run_timeout=None, search_attributes={},
        start_time=datetime.datetime.fromtimestamp(0, datetime.timezone.utc),
        workflow_start_time=datetime.datetime.fromtimestamp(0, datetime.timezone.utc),
        task_queue="warm", task_timeout=datetime.timedelta(),
        typed_search_attributes=temporalio.common.TypedSearchAttributes.empty,
        workflow_id="warm", workflow_type="warm", priority=temporalio.common.Priority.default)


def _warm_details(cls: type, info: temporalio.workflow.Info,
                  ) -> temporalio.worker.WorkflowInstanceDetails:
    return temporalio.worker.WorkflowInstanceDetails(
        payload_converter_factory=sdk.payload_converter_factory(
            temporalio.converter.DataConverter()),
        failure_converter_class=temporalio.converter.DefaultFailureConverter,
        interceptor_classes=[], defn=sdk.definition(cls),
        info=info, randomness_seed=0, extern_functions=local_extern_functions(),
        disable_eager_activity_execution=False, worker_level_failure_exception_types=[],
        patch_activation_callback=None, last_completion_result=Payloads(),
        last_failure=None)


@temporalio.workflow.defn(name="__wfjail_warm_up", sandboxed=False)
class _WarmUp:
    """wfjail's warm-up workflow (``warm_runs``): the SDK's common calls (an activity, a timer,
    a signal, a query) and nothing else (no log record, no metric, no upcall). Defined here,
    at the module's level as the SDK requires, in the zygote that imports this module."""

    def __init__(self) -> None:
        self.signals: list[str] = []

    @temporalio.workflow.run
    async def run(self, name: str) -> str:
        result = await temporalio.workflow.execute_activity(
            "__wfjail_warm_up", name, start_to_close_timeout=datetime.timedelta(seconds=10))
        await temporalio.workflow.sleep(0.01)
        return "%s %s %d" % (result, name, len(self.signals))

    @temporalio.workflow.signal
    def note(self, value: str) -> None:
        self.signals.append(value)

    @temporalio.workflow.query
    def noted(self) -> int:
        return len(self.signals)


def warm_runs(runs: int) -> None:
    """Drives ``runs`` runs of the warm-up workflow through the activations of a run like the
    SDK's own (start and a signal → schedule the activity; the activity's result → start the
    timer; a query; the timer → complete; eviction), each through ``_build``'s handler as a
    session's, and leaves nothing of them behind: each run's loop is closed, its instance
    evicted (its tasks ended), and the handler's per-activation state taken."""
    from temporalio.bridge.proto.activity_result import ActivityResolution

    cls = _WarmUp
    info = _warm_info()
    made = recipe(_warm_details(cls, info), [])
    arg = temporalio.converter.default().payload_converter.to_payloads(["warm"])
    name = sdk.definition(cls).name or "__wfjail_warm_up"
    for n in range(runs):
        activate, loop = _build(made)
        try:
            clock = 1_000_000_000 + n
            history = 0

            def act(**job: Any) -> None:
                nonlocal clock, history
                clock += 1
                history += 4
                a = WorkflowActivation(run_id=info.run_id, history_length=history,
                                       history_size_bytes=history * 100)
                a.timestamp.FromSeconds(clock)
                a.jobs.add(**job)
                _warm_check(activate(a.SerializeToString()))

            start = WorkflowActivation(run_id=info.run_id, history_length=3)
            start.timestamp.FromSeconds(clock)
            init = start.jobs.add().initialize_workflow
            init.workflow_type, init.workflow_id = name, info.workflow_id
            init.arguments.extend(arg)
            init.randomness_seed = n
            init.first_execution_run_id = info.run_id
            init.attempt = 1
            start.jobs.add().signal_workflow.MergeFrom(_warm_signal(arg))
            _warm_check(activate(start.SerializeToString()))
            resolution = ActivityResolution()
            resolution.completed.result.CopyFrom(arg[0])
            act(resolve_activity={"seq": 1, "result": resolution})
            act(query_workflow={"query_id": "warm", "query_type": "noted"})
            act(signal_workflow=_warm_signal(arg))
            act(fire_timer={"seq": 1})
            act(remove_from_cache={"message": "warm", "reason": 10})
        finally:
            loop.close()
    # What an activation leaves for the next (none after the last one's handler took it).
    _take_metric_records()
    take_calls()


def _warm_check(answer: bytes) -> None:
    """Raises if the warm-up's activation failed (a warm-up that fails warms a failure path,
    and its tests would not see it)."""
    (size,) = struct.unpack(">I", answer[:4])
    if WorkflowActivationCompletion.FromString(answer[4:4 + size]).HasField("failed"):
        raise RuntimeError("wfjail: the warm-up workflow's activation failed")


def _warm_signal(arg: list[Payload]) -> Any:
    from temporalio.bridge.proto.workflow_activation import SignalWorkflow

    return SignalWorkflow(signal_name="note", input=arg, identity="warm", originating_event_id=5)


def _extern_proxy(name: str) -> Callable[..., Any]:
    """An extern function that runs in the worker. Arguments and result are typed JSON
    (``typed_json``: JSON values, bytes, tuples, dataclasses, enums, exceptions); anything
    else raises TypeError here, in the workflow."""

    def call(*args: Any) -> Any:
        doc = {"fn": name, "args": [typed_json.encode(a) for a in args]}
        answer = guest.upcall(json.dumps(doc).encode())
        return typed_json.decode(json.loads(answer))

    call.__name__ = name
    return call


def _patch_proxy(input: temporalio.worker.PatchActivationInput) -> Any:
    """The worker's patch activation callback when it runs in the worker, in the read-only
    context of the run there (``relays.patch_answer``): its answer as the worker says it
    (None for a result that was not a bool: the SDK then fails the task as in process,
    "Patch activation callback must return true or false"), or what it raised, raised here:
    the SDK's ``ReadOnlyContextError`` for a workflow action it attempted, else a
    ``RuntimeError`` naming the worker's exception (the worker's words, cut)."""
    answer = json.loads(guest.upcall(json.dumps(
        {"fn": PATCH_UPCALL, "patch_id": input.patch_id}).encode()))
    if not isinstance(answer, dict):
        raise RuntimeError("wfjail: the worker's patch activation answer is not an object")
    if "read_only" in answer:
        raise temporalio.workflow.ReadOnlyContextError(str(answer["read_only"])[:4096])
    if "raised" in answer:
        raise RuntimeError("the patch activation callback raised in the worker: %s: %s" % (
            str(answer["raised"])[:256], str(answer.get("message", ""))[:4096]))
    use = answer.get("use")
    return use if isinstance(use, bool) else None


def local_extern_functions() -> dict[str, Callable[..., Any]]:
    """The extern functions answered in the child: a metric meter that records what the
    workflow measures (sent to the worker with each completion), and (when the worker's own
    check is not proxied) local activities taken as valid."""
    return {
        sdk.METRIC_METER_EXTERN: _recording_meter,
        sdk.LOCAL_ACTIVITY_CHECK_EXTERN: lambda name: None,
    }


# -- the metric meter ---------------------------------------------------------------------------

# The metric records of the activation in progress: [kind, name, description, unit, value,
# attributes] each, at most MAX_METRIC_RECORDS (the rest are dropped).
_metric_records: list[list[Any]] = []


def _take_metric_records() -> list[list[Any]]:
    records = _metric_records[:]
    _metric_records.clear()
    return records


def _recording_meter_class() -> Callable[[], temporalio.common.MetricMeter]:
    """The child's metric meter: each record is kept for the worker (a function, so that the
    classes are built only when a workflow first asks for the meter)."""
    import temporalio.common as tc

    class Metric:
        def __init__(self, kind: str, name: str, description: str | None, unit: str | None,
                     attributes: tc.MetricAttributes) -> None:
            self._kind, self._name, self._description, self._unit = kind, name, description, unit
            self._attributes = dict(attributes)

        @property
        def name(self) -> str:
            return self._name

        @property
        def description(self) -> str | None:
            return self._description

        @property
        def unit(self) -> str | None:
            return self._unit

        def with_additional_attributes(self, additional_attributes: tc.MetricAttributes,
                                       ) -> Metric:
            return type(self)(self._kind, self._name, self._description, self._unit,
                              {**self._attributes, **additional_attributes})

        def _keep(self, value: int | float,
                  additional_attributes: tc.MetricAttributes | None) -> None:
            if len(_metric_records) < MAX_METRIC_RECORDS:
                _metric_records.append([self._kind, self._name, self._description, self._unit,
                                        value, {**self._attributes,
                                                **(additional_attributes or {})}])

    def kinded(base: type, kind: str, op: str, conv: Callable[[Any], int | float]) -> type:
        def act(self: Metric, value: Any,
                additional_attributes: tc.MetricAttributes | None = None) -> None:
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
        def __init__(self, attributes: tc.MetricAttributes | None = None) -> None:
            self._attributes = dict(attributes or {})

        def _make(self, kind: str, name: str, description: str | None = None,
                  unit: str | None = None) -> Any:
            return kinds[kind](kind, name, description, unit, self._attributes)

        def create_counter(self, name: str, description: str | None = None,
                           unit: str | None = None) -> tc.MetricCounter:
            return self._make("counter", name, description, unit)  # type: ignore[no-any-return]

        def create_histogram(self, name: str, description: str | None = None,
                             unit: str | None = None) -> tc.MetricHistogram:
            return self._make("histogram", name, description, unit)  # type: ignore[no-any-return]

        def create_histogram_float(self, name: str, description: str | None = None,
                                   unit: str | None = None) -> tc.MetricHistogramFloat:
            return self._make("histogram_float", name, description, unit)  # type: ignore[no-any-return]

        def create_histogram_timedelta(self, name: str, description: str | None = None,
                                       unit: str | None = None) -> tc.MetricHistogramTimedelta:
            return self._make("histogram_timedelta", name, description, unit)  # type: ignore[no-any-return]

        def create_gauge(self, name: str, description: str | None = None,
                         unit: str | None = None) -> tc.MetricGauge:
            return self._make("gauge", name, description, unit)  # type: ignore[no-any-return]

        def create_gauge_float(self, name: str, description: str | None = None,
                               unit: str | None = None) -> tc.MetricGaugeFloat:
            return self._make("gauge_float", name, description, unit)  # type: ignore[no-any-return]

        def with_additional_attributes(self, additional_attributes: tc.MetricAttributes,
                                       ) -> Meter:
            return Meter({**self._attributes, **additional_attributes})

    return Meter


def _recording_meter() -> temporalio.common.MetricMeter:
    """The extern function ``METRIC_METER_EXTERN`` of the child: a recording meter (its
    classes built on the first call)."""
    global _meter_class
    if _meter_class is None:
        _meter_class = _recording_meter_class()
    return _meter_class()


_meter_class: Callable[[], temporalio.common.MetricMeter] | None = None
