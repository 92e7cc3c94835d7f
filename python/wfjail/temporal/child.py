"""In the confined child (and the zygote it is forked from): the session handler that builds
the run's workflow instance and answers each activation (``instance_factory``), the extern
functions it proxies to the worker, the metric meter whose records ride on the completions,
and the zygote's warm-up (``warm_up``), called explicitly, never on import."""

from __future__ import annotations

import asyncio
import datetime
import json
import logging
import os
import struct
from typing import Any, Callable

import temporalio.common
import temporalio.converter
import temporalio.worker
import temporalio.workflow
from temporalio.api.common.v1 import Payloads
from temporalio.bridge.proto.workflow_activation import WorkflowActivation

from .. import guest, typed_json
from . import sdk
from .recipe import Recipe, details, load, recipe
from .relays import MAX_METRIC_RECORDS, PATCH_UPCALL
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
    return _build(recipe)[0]


def _build(recipe: Recipe) -> tuple[Activate, asyncio.AbstractEventLoop]:
    """``instance_factory``'s handler, and the event loop its instance was built in."""
    det = details(recipe, {**local_extern_functions(), **{
        name: _extern_proxy(name) for name in recipe.get("extern", [])}},
        _patch_proxy if recipe.get("patch_callback") else None)
    _relay_workflow_logs(recipe.get("log_level", logging.INFO))
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
        act = WorkflowActivation.FromString(request)
        begin_calls()
        completion = instance.activate(act)
        data = completion.SerializeToString()
        side = {"metrics": _take_metric_records(), "calls": take_calls(),
                "refused_read": policy_refused_read(completion.failed.failure.message)}
        return struct.pack(">I", len(data)) + data + json.dumps(side).encode()

    return activate, loop


class _ToWorker(logging.Handler):
    """Sends each record of ``workflow.logger`` to the worker (a LOG frame)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            guest.log(record.getMessage(), record.levelno)
        except Exception:  # noqa: BLE001  (a log record must never fail the workflow)
            pass


def _relay_workflow_logs(level: int) -> None:
    """``workflow.logger``'s records at ``level`` and above travel to the worker, not to this
    child's stderr: through one handler per process, however many instances it builds (the
    zygote's warm-up builds several before it forks this child; each added its own, and
    every record went to the worker once per handler)."""
    wf_logger = logging.getLogger("temporalio.workflow")
    if not any(isinstance(h, _ToWorker) for h in wf_logger.handlers):
        wf_logger.addHandler(_ToWorker())
    wf_logger.setLevel(level)
    wf_logger.propagate = False


def warm_up_from_env() -> None:
    """The zygote's warm-up (its preload list names ``WARM_UP``): ``warm_up`` of the classes
    ``WARM_ENV`` names, if any."""
    classes = os.environ.get(WARM_ENV)
    if classes:
        warm_up(classes.split(","))


def warm_up(paths: list[str]) -> None:
    """In the zygote, before it forks: build each workflow's instance a few times with
    made-up details, so that the code a child runs to build its own is already specialised
    and its objects' pages already written here (a child then copies fewer pages)."""
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
            cls = load(path)
            det = temporalio.worker.WorkflowInstanceDetails(
                payload_converter_factory=sdk.payload_converter_factory(
                    temporalio.converter.DataConverter()),
                failure_converter_class=temporalio.converter.DefaultFailureConverter,
                interceptor_classes=[], defn=sdk.definition(cls),
                info=info, randomness_seed=0, extern_functions=local_extern_functions(),
                disable_eager_activity_execution=False, worker_level_failure_exception_types=[],
                patch_activation_callback=None, last_completion_result=Payloads(),
                last_failure=None)
            made = recipe(det, [])
            for _ in range(3):
                # Closed here: a loop left to the garbage collector would be closed after the
                # zygote has closed the descriptors it does not keep (its self-pipe among
                # them), which Python reports as an ignored exception.
                _build(made)[1].close()
        except Exception:  # noqa: BLE001  (warming is an optimisation; children rebuild anyway)
            pass


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


def _patch_proxy(input: temporalio.worker.PatchActivationInput) -> bool:
    return bool(json.loads(guest.upcall(json.dumps(
        {"fn": PATCH_UPCALL, "patch_id": input.patch_id}).encode())))


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
