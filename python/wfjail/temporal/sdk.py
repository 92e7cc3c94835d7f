"""Every use wfjail.temporal makes of a private ``temporalio`` or ``asyncio`` API, each with
what it is and why, and the one check that the installed ``temporalio`` is a version they
were tested with (``check_version``, called when a ``JailedWorkflowRunner`` is made: never
at import). A new SDK version is taken by reading this module against it, then adding it to
``TESTED_VERSIONS``.

What is public but used here as the SDK uses it, not as documented: the runner API itself
(``WorkflowRunner``, ``WorkflowInstance``, ``WorkflowInstanceDetails``: each field of the
details crosses to the child, ``default_workflow_logic_flags`` a set of a private enum, sent
pickled) and ``temporalio.workflow.Info``'s fields (the warm-up makes one up).
"""

from __future__ import annotations

import asyncio
import sys
from typing import TYPE_CHECKING, Any, Callable, TypeVar

import temporalio
import temporalio.converter
import temporalio.workflow

if TYPE_CHECKING:
    # The type of ``WorkflowInstance.get_serialization_context``'s argument (command_type,
    # command_seq): a private module, for type hints only.
    from temporalio.worker._command_aware_visitor import CommandInfo as CommandInfo

# The temporalio versions (major.minor) whose private parts below wfjail was tested with:
# scripts/test pins 1.35.0.
TESTED_VERSIONS = ("1.35",)

T = TypeVar("T")

# A workflow class's definition, as ``WorkflowRunner.prepare_workflow`` and
# ``WorkflowInstanceDetails.defn`` carry it (``temporalio.workflow._Definition``, private).
Definition = temporalio.workflow._Definition

# The names under which the worker passes two extern functions of its own to an instance
# (``temporalio.worker._workflow``): the run's metric meter, and the check that a local
# activity is registered. The child answers them itself (the meter records for the worker).
METRIC_METER_EXTERN = "__temporal_get_metric_meter"
LOCAL_ACTIVITY_CHECK_EXTERN = "__temporal_assert_local_activity_valid"


class UntestedTemporalio(RuntimeError):
    """The installed ``temporalio`` is not a version wfjail.temporal was tested with."""


def check_version(version: str | None = None) -> None:
    """Raises UntestedTemporalio unless ``version`` (default: the installed ``temporalio``'s)
    is one of ``TESTED_VERSIONS``: the uses below of the SDK's private parts may not hold
    in another, and would fail in a child, mid-workflow, or not at all."""
    if version is None:
        version = temporalio.__version__
    if ".".join(version.split(".")[:2]) in TESTED_VERSIONS:
        return
    raise UntestedTemporalio(
        "wfjail.temporal: temporalio %s is installed, but JailedWorkflowRunner was tested with "
        "temporalio %s only: it relies on private parts of the SDK (listed in %s) that another "
        "version may have changed. Install a tested version (pip install 'temporalio==%s.*'), "
        "or a wfjail that was tested with %s." % (
            version, ", ".join(v + ".x" for v in TESTED_VERSIONS), __file__,
            TESTED_VERSIONS[-1], version))


def definition(cls: type) -> Definition:
    """The workflow definition of ``cls`` (``@workflow.defn``'s), rebuilt in the child from
    the class: ``_Definition.must_from_class``, as the SDK's own runners get it."""
    return temporalio.workflow._Definition.must_from_class(cls)


def workflow_type_of(key: Any) -> Any:
    """A workflow class's workflow type name (the definition ``@workflow.defn`` stores on the
    class as ``__temporal_workflow_definition``), or ``key`` itself when it is not one: a
    policy keyed by class or by name."""
    defn = getattr(key, "__temporal_workflow_definition", None)
    return defn and defn.name or key


def payload_converter_factory(
        converter: temporalio.converter.DataConverter,
) -> Callable[[], temporalio.converter.PayloadConverter]:
    """What the SDK passes as ``WorkflowInstanceDetails.payload_converter_factory``: the data
    converter's (private) ``_new_payload_converter``, bound."""
    return converter._new_payload_converter


def payload_converter_class(factory: Callable[..., Any]) -> type | None:
    """The payload converter class of the data converter whose ``_new_payload_converter``
    (``payload_converter_factory``) is ``factory``, or None: how the child rebuilds the
    worker's converter by its class."""
    return getattr(getattr(factory, "__self__", None), "payload_converter_class", None)


def run_objects(workflow_worker: Any) -> list[Any]:
    """(From ``prepare_workflow``.) What a run of the SDK's ``_WorkflowWorker`` (private)
    ``workflow_worker`` is rebuilt from besides its workflow class, as its constructor set
    them before it prepares the workflows: the data converter's payload and failure
    converter classes, the interceptor classes, the patch activation callback (its
    ``_data_converter``, ``_interceptor_classes``, ``_patch_activation_callback``): the
    runner's policy lets a run read their modules. Empty for another object."""
    converter = getattr(workflow_worker, "_data_converter", None)
    found = [getattr(converter, "payload_converter_class", None),
             getattr(converter, "failure_converter_class", None),
             getattr(workflow_worker, "_patch_activation_callback", None)]
    found += list(getattr(workflow_worker, "_interceptor_classes", None) or [])
    return [o for o in found if o is not None]


def build_in_loop(loop: asyncio.AbstractEventLoop, build: Callable[[], T]) -> T:
    """``build()`` with ``loop`` set as the running loop (``asyncio._set_running_loop``): a
    workflow instance registers itself on the running loop when it is built, and the child
    has no loop running (the SDK's workers build it inside theirs)."""
    asyncio._set_running_loop(loop)
    try:
        return build()
    finally:
        asyncio._set_running_loop(None)


def in_running_loop() -> bool:
    """Whether this thread runs an event loop (``asyncio._get_running_loop``, which does not
    raise where the public one does): the SDK's debug mode runs activations on its loop,
    as the SDK itself tells by this call."""
    return asyncio._get_running_loop() is not None


def span_processor_of(provider: Any) -> Any:
    """The span processor that a ``temporalio.contrib.opentelemetry.ReplaySafeTracerProvider``
    feeds (the one its ``add_span_processor`` adds to): its wrapped SDK provider
    (``_tracer_provider``, private) and that provider's ``_active_span_processor`` (private to
    opentelemetry-sdk). The worker hands it the spans a confined child made (``spans``):
    neither package has a public way to export a finished span made elsewhere."""
    return provider._tracer_provider._active_span_processor


def resource_of(provider: Any) -> Any:
    """The resource of a ``ReplaySafeTracerProvider``'s wrapped SDK provider
    (``_tracer_provider``, private): the worker exports a child's spans with it."""
    return provider._tracer_provider.resource


def read_only_shadow(det: Any) -> Any:
    """A workflow instance of the run's details (``det``) made in the worker only to give
    the patch activation callback the workflow's read-only context there: the SDK's own
    ``_WorkflowInstanceImpl`` (``UnsandboxedWorkflowRunner.create_instance``, built with a
    throw-away loop running, as ``build_in_loop``), never activated, so no workflow code
    runs in it; without interceptors (theirs run in the child) or extern functions."""
    import dataclasses

    import temporalio.worker

    shadow_det = dataclasses.replace(det, interceptor_classes=[], extern_functions={},
                                     patch_activation_callback=None)
    loop = asyncio.new_event_loop()
    try:
        return build_in_loop(loop, lambda: temporalio.worker.UnsandboxedWorkflowRunner()
                             .create_instance(shadow_det))
    finally:
        loop.close()


def call_read_only(shadow: Any, fn: Callable[[], T]) -> T:
    """``fn()`` as the SDK calls a patch activation callback in process: with ``shadow``
    (``read_only_shadow``) as the running loop and workflow runtime, inside its read-only
    context (``_WorkflowInstanceImpl._as_read_only``, private), so that a workflow action
    the callback attempts raises the SDK's own ``ReadOnlyContextError``. The thread's
    running loop, if any (the SDK's debug mode), is put back after."""
    previous = asyncio._get_running_loop()
    asyncio._set_running_loop(shadow)
    try:
        with shadow._as_read_only(in_query_or_validator=False):
            return fn()
    finally:
        asyncio._set_running_loop(previous)


def mark_worker_unstarted(worker: Any) -> None:
    """Marks a Worker whose run a plugin ended before it started (``JailedPlugin``: its
    server could not start) as shut down, as ``Worker._run`` does when its own validation
    fails (``_shutdown_complete_event``, private): else ``async with worker``'s exit waits
    for a shutdown that never comes."""
    worker._shutdown_complete_event.set()


def caller_self(depth: int) -> Any:
    """The ``self`` of the function ``depth`` frames above the caller (None if none): the
    SDK's ``_WorkflowWorker`` (private) that calls a runner's ``prepare_workflow`` (from its
    constructor) and ``create_instance`` (``_create_workflow_instance``) is one frame up."""
    frame = sys._getframe(depth + 1)
    return frame.f_locals.get("self")


def worker_being_built(limit: int = 8) -> Any:
    """(From ``prepare_workflow``.) The ``temporalio.worker.Worker`` whose constructor is on
    the stack (``Worker.__init__`` → ``_init_from_config`` → ``_WorkflowWorker.__init__`` →
    ``prepare_workflow``), or None (a ``Replayer``, or another SDK version's stack): the
    runner adds a step to its run (``add_run_step``), as the SDK gives a runner no hook of
    its own into ``Worker.run()``."""
    import temporalio.worker

    frame = sys._getframe(1)
    for _ in range(limit):
        if frame is None:
            return None
        me = frame.f_locals.get("self")
        if isinstance(me, temporalio.worker.Worker):
            return me
        frame = frame.f_back  # type: ignore[assignment]
    return None


def add_run_step(worker: Any, plugin: Any) -> None:
    """Makes ``plugin.run_worker`` the innermost step of ``worker``'s run: ``Worker.run()``
    chains ``Worker._plugins`` (private) when it is called, after the constructor."""
    worker._plugins.append(plugin)
