"""The worker's side of what a confined child sends besides its completion, each bounded
and checked as a hostile child's words: the reply's parts (``split_reply``), its log records
(``LogRelay``), its metric records (``record_metrics``) and its upcalls: extern functions
and the patch activation callback (``upcalls_in_worker``). Nothing a child sends is unpickled
or evaluated."""

from __future__ import annotations

import datetime
import json
import logging
import re
import struct
from typing import Any, Callable

import temporalio.worker
import temporalio.workflow
from temporalio.bridge.proto.workflow_completion import WorkflowActivationCompletion

from .. import typed_json
from ..errors import ProtocolError
from . import sdk
from .stack import escape

# The largest completion taken from a child, by default: what the server takes in a task
# completion (its gRPC limit, 4 MiB). A reply's protobuf decodes to some 30 times its size in
# the worker (an empty command is two bytes), and Core holds each command again.
MAX_REPLY_BYTES = 4 * 1024 * 1024
# At most this many commands in one completion: more than a history holds by default (51,200
# events; each command adds one at least), so such a task could never complete.
MAX_COMPLETION_COMMANDS = 51_200
# At most this many metric records ride on one completion (the child drops and counts the
# rest; the worker takes no more).
MAX_METRIC_RECORDS = 1000
# The side channel (metric records: at most MAX_METRIC_RECORDS small ones) is parsed only
# below this many bytes; JSON, too, decodes to many times its size.
MAX_SIDE_CHANNEL = 1024 * 1024


class ReplyRefused(ProtocolError):
    """A reply the worker's own bounds refuse (``split_reply``): its message says which."""


def split_reply(reply: bytes, max_bytes: int = MAX_REPLY_BYTES,
                ) -> tuple[WorkflowActivationCompletion, list[Any]]:
    """A child's reply: the completion (protobuf), then JSON: the metric records of the
    activation. (Anything else in the JSON is ignored: the serialization contexts of the
    completion's commands are the worker's own, ``contexts.command_contexts``.) A completion
    over ``max_bytes`` or with over MAX_COMPLETION_COMMANDS commands is a ``ReplyRefused``
    (before it is decoded, for the first); a side channel over MAX_SIDE_CHANNEL is not
    read."""
    if len(reply) < 4:
        raise ReplyRefused("truncated", "a reply shorter than its length prefix")
    (n,) = struct.unpack(">I", reply[:4])
    size = min(n, len(reply) - 4)
    if size > max_bytes:
        raise ReplyRefused("oversized", "the child's completion is %d bytes, over the %d the "
                            "worker takes (JailedWorkflowRunner(max_reply_bytes=...))"
                            % (size, max_bytes))
    from google.protobuf.message import DecodeError

    try:
        completion = WorkflowActivationCompletion.FromString(reply[4:4 + n])
    except DecodeError as e:
        raise ReplyRefused("payload", "the child's completion is not a "
                            "WorkflowActivationCompletion: %s" % e) from None
    commands = len(completion.successful.commands)
    if commands > MAX_COMPLETION_COMMANDS:
        raise ReplyRefused("oversized", "the child's completion has %d commands, over the %d "
                            "a history holds" % (commands, MAX_COMPLETION_COMMANDS))
    doc = side_channel(reply)
    metrics: list[Any] = doc["metrics"] if isinstance(doc.get("metrics"), list) else []
    return completion, metrics


def side_channel(reply: bytes) -> dict[str, Any]:
    """The JSON object after a reply's completion (``split_reply``), or {} when it is not
    one or is over MAX_SIDE_CHANNEL (then not read). Each key's value is the child's."""
    (n,) = struct.unpack(">I", reply[:4])
    side = reply[4 + n:]
    try:
        doc = json.loads(side or b"{}") if len(side) <= MAX_SIDE_CHANNEL else {}
    except (ValueError, RecursionError):
        doc = {}
    return doc if isinstance(doc, dict) else {}


# -- log records ----------------------------------------------------------------------------

# A log record of a child shows at most this many characters of its text, and at most this
# many records of an activation are relayed (a LOG frame costs its child six bytes).
MAX_LOG_TEXT = 16 * 1024
MAX_LOG_RECORDS = 1000


class LogRelay:
    """The worker side of the run's log records: they go to the worker's own
    ``temporalio.workflow`` logger, with the workflow's context in ``extra`` as the SDK's
    ``workflow.logger`` puts it (the text already carries it). The text is the child's: one
    line of the worker's log, escaped (``escape``: no forged records, no terminal escapes)
    and cut to MAX_LOG_TEXT characters; the level is kept between DEBUG and CRITICAL. At most
    MAX_LOG_RECORDS records of an activation (``begin``) are relayed; ``dropped`` counts the
    rest."""

    def __init__(self, info: temporalio.workflow.Info) -> None:
        self._logger = logging.getLogger("temporalio.workflow")
        self._extra = {"temporal_workflow": {
            "namespace": info.namespace, "task_queue": info.task_queue,
            "workflow_id": info.workflow_id, "run_id": info.run_id,
            "workflow_type": info.workflow_type, "attempt": info.attempt,
        }, "wfjail": True}
        self.relayed = 0
        self.dropped = 0

    def begin(self) -> None:
        self.relayed = self.dropped = 0

    def __call__(self, level: int, text: str) -> None:
        if self.relayed >= MAX_LOG_RECORDS:
            self.dropped += 1
            return
        self.relayed += 1
        level = min(max(int(level), logging.DEBUG), logging.CRITICAL)
        if self._logger.isEnabledFor(level):
            self._logger.log(level, "%s", escape(text, MAX_LOG_TEXT), extra=self._extra)


# -- metric records -------------------------------------------------------------------------

# What a metric record may create, by kind: (the meter's method, the operation, the values
# taken: whole numbers from 0 below 2**63, or finite floats; how the value is passed).
_METRICS: dict[str, tuple[str, str, type, Callable[[Any], Any]]] = {
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

# A run's metric series: (kind, name, its attributes sorted).
Series = tuple[str, str, tuple[tuple[str, Any], ...]]


def _metric_value(value: object, taken: type) -> int | float | None:
    """The child's value if it is one a metric of its kind takes, else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if taken is int:
        return value if isinstance(value, int) and 0 <= value < 2**63 else None
    value = float(value)  # an int beyond a float's range raises OverflowError: the caller drops it
    return value if value == value and abs(value) != float("inf") else None


def _metric_attributes(attributes: object) -> dict[str, Any] | None:
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


def _metric_text(t: object) -> str | None:
    """A metric's description or unit from a child: a string of at most MAX_METRIC_TEXT
    characters, or none."""
    return t if isinstance(t, str) and len(t) <= MAX_METRIC_TEXT else None


def record_metrics(det: temporalio.worker.WorkflowInstanceDetails, records: list[Any],
                   series: set[Series],
                   reserved: tuple[str, ...] = RESERVED_METRIC_PREFIXES) -> None:
    """Replays the child's metric records on the worker's own meter (what
    ``workflow.metric_meter()`` gives in process: the run's namespace, task queue and
    workflow type as attributes, set here from the run's info). At most MAX_METRIC_RECORDS
    records of a completion are taken; one that is malformed, names one of the worker's
    metrics (``reserved``: name prefixes), carries a value its kind does not take or would
    add a series past MAX_METRIC_SERIES for the run (``series``: the run's set of them) is
    dropped."""
    if not records:
        return
    get_meter = det.extern_functions.get(sdk.METRIC_METER_EXTERN)
    if get_meter is None:
        return
    meter = None
    for r in records[:MAX_METRIC_RECORDS]:
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


# -- upcalls --------------------------------------------------------------------------------

# The largest upcall (extern function call) the worker reads: their arguments are small (a
# span's parameters, a patch id).
MAX_UPCALL_BYTES = 1024 * 1024
# Extern functions the child answers itself: the metric meter (its records travel with the
# completions instead).
LOCAL_EXTERN = (sdk.METRIC_METER_EXTERN,)
# The name under which the child calls the worker's patch activation callback.
PATCH_UPCALL = "__patch_activation__"


def upcalls_in_worker(det: temporalio.worker.WorkflowInstanceDetails,
                      ) -> Callable[[bytes], bytes]:
    """The worker side of the child's upcalls: extern functions and the patch activation
    callback, called by name with JSON arguments; the result goes back as JSON. Nothing the
    child sends is unpickled or evaluated."""

    def on_upcall(payload: bytes) -> bytes:
        # Parsed on the activation's thread while the child waits: bounded (typed_json
        # bounds the values rebuilt).
        if len(payload) > MAX_UPCALL_BYTES:
            raise ValueError("an upcall of %d bytes, over the %d the worker reads"
                             % (len(payload), MAX_UPCALL_BYTES))
        doc = json.loads(payload)
        if not isinstance(doc, dict) or not isinstance(doc.get("fn"), str):
            raise ValueError("an upcall is a JSON object with a function name")
        name = doc["fn"]
        result: Any
        if name == PATCH_UPCALL:
            callback = det.patch_activation_callback
            if callback is None:
                raise ValueError("the worker has no patch activation callback")
            result = bool(callback(temporalio.worker.PatchActivationInput(
                workflow_info=det.info, patch_id=str(doc.get("patch_id", "")))))
        else:
            fn = det.extern_functions.get(name)
            if fn is None or name in LOCAL_EXTERN:
                raise ValueError("no extern function %r in the worker" % name)
            args = doc.get("args", [])
            if not isinstance(args, list):
                raise ValueError("the arguments of an upcall are a JSON array")
            # Rebuilt as the worker's function declares its parameters (typed_json): a
            # dataclass, enum or exception argument, never a class the child names.
            result = fn(*typed_json.decode_args(fn, args))
        return json.dumps(typed_json.encode(result)).encode()

    return on_upcall
