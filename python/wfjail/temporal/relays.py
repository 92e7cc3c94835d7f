"""The worker's side of what a confined child sends besides its completion, each bounded
and checked as a hostile child's words: the reply's parts (``split_reply``), its log records
and warnings (``LogRelay``), its metric records (``record_metrics``) and its upcalls: extern
functions and the patch activation callback (``upcalls_in_worker``). Nothing a child sends
is unpickled, imported or evaluated."""

from __future__ import annotations

import datetime
import json
import logging
import re
import struct
import sys
import types
import warnings
from typing import Any, Callable, Mapping

import temporalio.worker
import temporalio.workflow
from temporalio.bridge.proto.workflow_completion import WorkflowActivationCompletion

from .. import typed_json
from ..errors import ProtocolError
from . import sdk
from .stack import CHILD_FILE_SUFFIX, MAX_CHILD_MESSAGE, MAX_STACK_NAME, escape, stack_text

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
                ) -> tuple[WorkflowActivationCompletion, dict[str, Any]]:
    """A child's reply: the completion (protobuf), then its side channel, a JSON object
    (``side_channel``, parsed once here): the activation's metric records
    (``metric_records``), the calls wfjail denied, spans. (The serialization contexts of
    the completion's commands are the worker's own, ``contexts.command_contexts``.) A
    completion over ``max_bytes`` or with over MAX_COMPLETION_COMMANDS commands is a
    ``ReplyRefused`` (before it is decoded, for the first); a side channel over
    MAX_SIDE_CHANNEL is not read ({})."""
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
    return completion, side_channel(reply)


def metric_records(side: dict[str, Any]) -> list[Any]:
    """The metric records of a side channel (``split_reply``): a list, or none."""
    records = side.get("metrics")
    return records if isinstance(records, list) else []


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


# -- log records and warnings ---------------------------------------------------------------

# A log record of a child shows at most this many characters of its text, and at most this
# many records of an activation are relayed (a LOG frame costs its child six bytes).
MAX_LOG_TEXT = 16 * 1024
MAX_LOG_RECORDS = 1000
# A structured record (the child's ``_ToWorker``): a LOG frame whose text is RECORD_MARK
# then a JSON object, read only below MAX_RECORD_BYTES (JSON decodes to many times its size).
RECORD_MARK = "wfjail.record:"
MAX_RECORD_BYTES = 256 * 1024
# A warning raised in workflow code: an upcall whose payload is WARNING_MARK then a JSON
# object (the child waits for the worker's warnings machinery: shown, or raised when a
# filter says "error"). At most MAX_WARNINGS of an activation reach the machinery.
WARNING_MARK = b"wfjail.warning:"
MAX_WARNINGS = 100
MAX_WARNING_BYTES = 64 * 1024
# The loggers a child's record may land on: the ones workflow code and the SDK's workflow
# machinery (which runs in the child) log on in process. A record naming any other logger
# (``temporalio.activity``, ``temporalio.worker``, ``temporalio.client``, ``wfjail.*``, a
# user's own...) goes to CHILD_LOGGER, its name in the record's ``wfjail_logger``: a handler
# of the worker's activity or worker loggers never sees a child's record.
WORKFLOW_LOGGERS = frozenset({"temporalio.workflow", "temporalio.worker._workflow_instance",
                              "temporalio.worker._workflow"})
WORKFLOW_LOGGER_PREFIXES = ("temporalio.worker.workflow_sandbox.",)
CHILD_LOGGER = "wfjail.temporal.child"
# A child's ``extra``: at most this many keys (names as Python identifiers, at most 64
# characters), values JSON of at most this depth, items and characters of a string.
MAX_EXTRA_KEYS = 32
MAX_EXTRA_DEPTH = 4
MAX_EXTRA_ITEMS = 256
MAX_EXTRA_TEXT = 1024
# What a child's extra may not set: a LogRecord's own attributes (msg, args, exc_info,
# levelno...), what formatters add (dropped).
RESERVED_RECORD_KEYS = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime"}
# Keys the SDK, OpenTelemetry's logging instrumentation and log pipelines correlate on, and
# the relay's own: a child's value of one is kept as ``GUEST_PREFIX + key`` (never under the
# key itself); the worker sets the true ones it knows (``temporal_workflow``,
# ``workflow_info``, ``wfjail_run``; a record factory of the worker's, such as OpenTelemetry's
# ``otel*``). ``temporal_workflow`` and ``workflow_info`` are the SDK's workflow keys: the
# worker's values (``LogRelay``).
OWNED_EXTRA_KEYS = frozenset({
    "temporal_workflow", "workflow_info", "temporal_activity", "activity_info",
    "trace_id", "span_id", "trace_flags", "run_id", "workflow_id", "workflow_type",
    "namespace", "task_queue", "activity_id", "activity_type", "service", "operation"})
OWNED_EXTRA_PREFIXES = ("otel", "wfjail", "temporal_")
GUEST_PREFIX = "wfjail_guest_"
# The key on every relayed record that names the sending run (the worker's own values).
RUN_KEY = "wfjail_run"
# The keys of the SDK's ``temporal_workflow`` extra that say which run logged: the worker's
# own values, whatever the child says; the child's update id and name (the SDK's, in an
# update handler) are kept, escaped.
IDENTITY_KEYS = ("attempt", "namespace", "run_id", "task_queue", "workflow_id",
                 "workflow_type")
UPDATE_KEYS = ("update_id", "update_name")
# The SDK's extra that carries the whole ``workflow.Info``: the worker's own object.
FULL_INFO_KEY = "workflow_info"
# At most this many characters of logger names and levels cross to a child at session open
# (the session's init is at most 32 KiB).
MAX_LEVELS_TEXT = 4096

_EXTRA_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}\Z")
_DOTTED = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}(\.[A-Za-z_][A-Za-z0-9_]{0,127}){0,15}\Z")


def logging_settings() -> dict[str, Any]:
    """What the worker's logging says that a child applies before its run (the session's
    recipe): the levels set on the worker's loggers (the root's as ``""``; ``temporalio``'s
    first, at most MAX_LEVELS_TEXT characters of names), ``logging.disable``'s level, and
    the boolean settings of the SDK's ``workflow.logger`` (``workflow_info_on_message``,
    ``workflow_info_on_extra``, ``full_workflow_info_on_extra``, ``log_during_replay``...),
    so that a child sends the records the worker would show, as the SDK makes them."""
    manager = logging.Logger.manager
    named = sorted(((n, lg.level) for n, lg in list(manager.loggerDict.items())
                    if isinstance(lg, logging.Logger) and lg.level),
                   key=lambda nl: (not nl[0].startswith("temporalio"), nl[0]))
    levels = {"": logging.getLogger().level}
    size = 0
    for name, level in named:
        size += len(name) + 8
        if size > MAX_LEVELS_TEXT:
            break
        levels[name] = level
    adapter = {k: v for k, v in vars(temporalio.workflow.logger).items()
               if isinstance(v, bool)}
    return {"levels": levels, "disable": manager.disable, "adapter": adapter}


def warning_category(name: object) -> type[Warning] | None:
    """The worker's Warning subclass a child names (``module:qualname``), if the worker has
    it already: looked up in ``sys.modules`` and the namespaces' own dicts (no import, no
    ``__getattr__`` of a module run); None for anything else."""
    if not isinstance(name, str) or len(name) > 512:
        return None
    module, _, qualname = name.partition(":")
    if not _DOTTED.match(module) or not _DOTTED.match(qualname):
        return None
    obj: Any = sys.modules.get(module)
    if not isinstance(obj, types.ModuleType):
        return None
    for part in qualname.split("."):
        try:
            namespace = object.__getattribute__(obj, "__dict__")
        except AttributeError:
            return None
        obj = namespace.get(part) if isinstance(namespace, Mapping) else None
        if obj is None:
            return None
    return obj if isinstance(obj, type) and issubclass(obj, Warning) else None


def _text(value: object, limit: int) -> str | None:
    """A string of a child's, escaped and cut to ``limit``; None when it is not a string."""
    return escape(value, limit) if isinstance(value, str) else None


def _line(value: object) -> int:
    """A line number of a child's: an int in [0, 10**9), else 0."""
    return value if isinstance(value, int) and not isinstance(value, bool) \
        and 0 <= value < 10**9 else 0


class _Budget:
    """The items one record's extra may still have (MAX_EXTRA_ITEMS)."""

    def __init__(self) -> None:
        self.left = MAX_EXTRA_ITEMS

    def take(self) -> bool:
        self.left -= 1
        return self.left >= 0


def _extra_value(value: object, depth: int, budget: _Budget) -> Any:
    """A child's extra value as the worker keeps it: JSON scalars (strings escaped and cut
    to MAX_EXTRA_TEXT), lists and dicts (string keys) to MAX_EXTRA_DEPTH; the rest of a
    container past MAX_EXTRA_ITEMS, or deeper, is left out (None for a value left out)."""
    if not budget.take():
        return None
    if value is None or isinstance(value, (bool, int, float)):
        return value
    if isinstance(value, str):
        return escape(value, MAX_EXTRA_TEXT)
    if depth >= MAX_EXTRA_DEPTH:
        return None
    if isinstance(value, list):
        out = []
        for v in value:
            if budget.left <= 0:
                break
            out.append(_extra_value(v, depth + 1, budget))
        return out
    if isinstance(value, dict):
        kept = {}
        for k, v in value.items():
            if budget.left <= 0:
                break
            if isinstance(k, str):
                kept[escape(k, MAX_EXTRA_TEXT)] = _extra_value(v, depth + 1, budget)
        return kept
    return None


def workflow_logger(name: object) -> bool:
    """Whether a child's record may land on the worker's logger of this name
    (WORKFLOW_LOGGERS)."""
    if not isinstance(name, str):
        return False
    if name in WORKFLOW_LOGGERS:
        return True
    # Under the sandbox's prefix, only a logger the worker has (a child makes none).
    return name.startswith(WORKFLOW_LOGGER_PREFIXES) and _DOTTED.match(name) is not None \
        and isinstance(logging.Logger.manager.loggerDict.get(name), logging.Logger)


def guest_key(key: str) -> str:
    """The key a child's extra key is kept under: its own, or GUEST_PREFIX and it for a key
    the SDK, OpenTelemetry or the relay owns (OWNED_EXTRA_KEYS, OWNED_EXTRA_PREFIXES; the
    prefix itself is owned, so no key of a child's lands on another's renamed name)."""
    if key in OWNED_EXTRA_KEYS or key.lower().startswith(OWNED_EXTRA_PREFIXES):
        return GUEST_PREFIX + key
    return key


class LogRelay:
    """The worker side of a run's log records and warnings.

    A record (the child's ``_ToWorker``: RECORD_MARK and JSON) is made again on the worker's
    logger of the same name when it is one of the workflow loggers (``workflow_logger``:
    ``temporalio.workflow`` and the SDK's workflow machinery); any other name (the SDK's
    activity, worker or client loggers, ``wfjail.*``, the workflow's own loggers) on
    CHILD_LOGGER, the child's name in ``wfjail_logger``. It keeps its level, message,
    function, line, file (``pathname`` and ``filename`` marked ``[confined child]``: the
    worker never opens it), traceback and stack (parsed: ``stack.stack_text``) and the
    child's ``extra``, less what the child may not set. The worker names the sending run on
    every record: ``wfjail_run`` (the run's namespace, task queue, workflow id, run id,
    workflow type and attempt), ``temporal_workflow`` as the SDK sets it (when the worker's
    ``workflow.logger.workflow_info_on_extra``: those values, and the child's update id and
    name) and ``workflow_info`` (the worker's ``Info``, when the child's SDK or the worker's
    adapter asks for it); on ``temporalio.workflow``, the SDK's identity suffix after the
    child's text, made by the worker (when its ``workflow_info_on_message``; the child's SDK
    adds none), so that the last ``(...)`` of such a line is always the sender's. A key of
    the child's extra that the SDK, OpenTelemetry or the relay owns is kept as
    ``wfjail_guest_<key>`` (``guest_key``), and one a record factory of the worker's sets is
    the factory's. A LOG frame of plain text (``wfjail.guest.log``) goes to
    ``temporalio.workflow`` the same way. Every text is one line of the worker's log,
    escaped (``escape``: no forged records, no terminal escapes) and bounded; every record
    carries ``wfjail = True``. At most MAX_LOG_RECORDS records of an activation (``begin``)
    are relayed; ``dropped`` counts the rest.

    A warning (``warning``, an upcall) goes through the worker's ``warnings`` machinery
    while the child waits, with the worker's Warning class of the name the child gives
    (``warning_category``; an unknown name is a ``UserWarning`` that says it), the
    workflow's file (marked) and line, and its text followed by the sending run
    (``warning_suffix``); when a filter makes it an error, the child raises it in workflow
    code, as in process. At most MAX_WARNINGS of an activation."""

    def __init__(self, info: temporalio.workflow.Info) -> None:
        self._info = info
        self._logger = logging.getLogger("temporalio.workflow")
        # As the SDK's Info._logger_details, in its order.
        self._identity = {
            "attempt": info.attempt, "namespace": info.namespace, "run_id": info.run_id,
            "task_queue": info.task_queue, "workflow_id": info.workflow_id,
            "workflow_type": info.workflow_type,
        }
        self._warning_suffix = " [wfjail: warned by workflow %s, workflow_id %s, run_id %s]" % (
            escape(info.workflow_type, MAX_STACK_NAME), escape(info.workflow_id, MAX_STACK_NAME),
            escape(info.run_id, MAX_STACK_NAME))
        # The "default"/"module" actions' registry for this run's warnings (bounded).
        self._warning_registry: dict[Any, Any] = {}
        self.relayed = 0
        self.dropped = 0
        self.warned = 0

    def begin(self) -> None:
        self.relayed = self.dropped = self.warned = 0

    def __call__(self, level: int, text: str) -> None:
        if self.relayed >= MAX_LOG_RECORDS:
            self.dropped += 1
            return
        self.relayed += 1
        if text.startswith(RECORD_MARK) and len(text) <= MAX_RECORD_BYTES:
            try:
                doc = json.loads(text[len(RECORD_MARK):])
            except (ValueError, RecursionError):
                doc = None
            if isinstance(doc, dict):
                self._record(doc)
                return
        level = min(max(int(level), logging.DEBUG), logging.CRITICAL)
        if self._logger.isEnabledFor(level):
            msg, extra = self._identify(self._logger, escape(text, MAX_LOG_TEXT), {}, None)
            self._logger.log(level, "%s", msg, extra=extra)

    def _identify(self, logger: logging.Logger, text: str, updates: dict[str, Any],
                  child_full: object) -> tuple[str, dict[str, Any]]:
        """The record's text and the extra the worker sets on it: the sending run, as the
        class says; ``updates`` the child's update id and name (escaped strings)."""
        adapter = temporalio.workflow.logger
        extra: dict[str, Any] = {"wfjail": True, RUN_KEY: dict(self._identity)}
        if getattr(adapter, "workflow_info_on_extra", True):
            extra["temporal_workflow"] = {**self._identity, **updates}
        if child_full is not None or getattr(adapter, "full_workflow_info_on_extra", False):
            extra[FULL_INFO_KEY] = self._info
        if logger is self._logger and getattr(adapter, "workflow_info_on_message", True):
            text = "%s (%s)" % (text, {**self._identity, **updates})
        return text, extra

    def _record(self, doc: dict[str, Any]) -> None:
        level = doc.get("level")
        level = min(max(level if isinstance(level, int) else logging.INFO, logging.DEBUG),
                    logging.CRITICAL)
        name = doc.get("name")
        marked: dict[str, Any] = {}
        if workflow_logger(name):
            logger = logging.getLogger(name)  # (one of a few names: bounded)
        else:
            logger = logging.getLogger(CHILD_LOGGER)
            marked["wfjail_logger"] = escape(name, MAX_STACK_NAME)
        if not logger.isEnabledFor(level):
            return
        given = doc.get("extra")
        given = given if isinstance(given, dict) else {}
        child_extra, updates = self._child_extra(given)
        msg, extra = self._identify(logger, escape(doc.get("msg", ""), MAX_LOG_TEXT), updates,
                                    given.get(FULL_INFO_KEY))
        path = _text(doc.get("path"), MAX_STACK_NAME * 4)
        stack = doc.get("stack")
        # No extra to makeRecord: what the worker's record factory sets stays its own
        # (makeRecord would raise on a child's key that overwrites it).
        record = logger.makeRecord(
            logger.name, level, (path or "(unknown file)") + CHILD_FILE_SUFFIX,
            _line(doc.get("line")), msg, (), None,
            _text(doc.get("func"), MAX_STACK_NAME), None,
            "Stack (most recent call last) [confined child]:\n" + stack_text(stack).rstrip("\n")
            if isinstance(stack, str) else None)
        for key, value in child_extra.items():
            if key in record.__dict__:
                key = GUEST_PREFIX + key
            record.__dict__.setdefault(key, value)
        record.__dict__.update(extra)
        record.__dict__.update(marked)
        exc = doc.get("exc")
        if isinstance(exc, dict):
            # The child's exception as a formatter shows it (exc_text), its frames parsed;
            # exc_info stays None: the worker has no exception object of the child's.
            tb = exc.get("traceback")
            record.exc_text = "Traceback (most recent call last) [confined child]:\n%s%s: %s" % (
                stack_text(tb) if isinstance(tb, str) else "",
                escape(exc.get("type"), MAX_STACK_NAME), escape(exc.get("message"),
                                                               MAX_CHILD_MESSAGE))
        logger.handle(record)

    def _child_extra(self, given: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """The child's extra as the record gets it (see the class), and the update id and
        name of its ``temporal_workflow``."""
        out: dict[str, Any] = {}
        updates: dict[str, Any] = {}
        budget = _Budget()
        for key, value in list(given.items())[:MAX_EXTRA_KEYS]:
            if not isinstance(key, str) or not _EXTRA_KEY.match(key) \
                    or key in RESERVED_RECORD_KEYS or key == FULL_INFO_KEY:
                continue
            if key == "temporal_workflow" and isinstance(value, dict):
                for k in UPDATE_KEYS:
                    if isinstance(value.get(k), str):
                        updates[k] = escape(value[k], MAX_EXTRA_TEXT)
                continue
            out[guest_key(key)] = _extra_value(value, 0, budget)
        return out, updates

    def warning(self, payload: bytes) -> bytes:
        """A warning of the child's (WARNING_MARK and JSON: ``category``, ``message``,
        ``filename``, ``lineno``, ``module``) through the worker's ``warnings`` machinery;
        the answer is ``"raise"`` when a filter made it an error, else ``"shown"`` (or
        ``"dropped"`` past MAX_WARNINGS of an activation, or when it is malformed)."""
        if self.warned >= MAX_WARNINGS or len(payload) > MAX_WARNING_BYTES:
            return b'"dropped"'
        self.warned += 1
        try:
            doc = json.loads(payload[len(WARNING_MARK):])
        except (ValueError, RecursionError):
            return b'"dropped"'
        if not isinstance(doc, dict):
            return b'"dropped"'
        # The sending run after the child's text: a filter's message pattern (matched at
        # the start) still matches; the child cannot remove what follows its text.
        given = escape(doc.get("message", ""), MAX_LOG_TEXT)
        text = given + self._warning_suffix
        category = warning_category(doc.get("category"))
        message: Warning | None = None
        if category is not None:
            try:
                message = category(text)
            except Exception:  # noqa: BLE001  (a class whose constructor wants more)
                message = None
        if message is None:
            category = UserWarning
            message = UserWarning("%s (warning category %s of the confined child, not one "
                                  "the worker has)%s" % (
                                      given, escape(doc.get("category"), MAX_STACK_NAME),
                                      self._warning_suffix))
        if len(self._warning_registry) > 1000:
            self._warning_registry.clear()
        try:
            warnings.warn_explicit(
                message, category,
                (_text(doc.get("filename"), MAX_STACK_NAME * 4) or "(unknown file)")
                + CHILD_FILE_SUFFIX, _line(doc.get("lineno")),
                module=_text(doc.get("module"), MAX_STACK_NAME) or "(unknown module)",
                registry=self._warning_registry)
        except Exception:  # noqa: BLE001  (a filter said "error": the workflow raises it)
            return b'"raise"'
        return b'"shown"'

    def upcalls(self, on_upcall: Callable[[bytes], bytes]) -> Callable[[bytes], bytes]:
        """``on_upcall`` that takes the child's warnings (``warning``) first."""

        def either(payload: bytes) -> bytes:
            if payload.startswith(WARNING_MARK):
                return self.warning(payload)
            return on_upcall(payload)

        return either


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


def patch_answer(det: temporalio.worker.WorkflowInstanceDetails, shadow: Any,
                 patch_id: object) -> dict[str, Any]:
    """The worker's patch activation callback called as the SDK calls it in process: in the
    workflow's read-only context (``sdk.call_read_only`` with the run's ``shadow``), so a
    workflow action it attempts fails with the SDK's ``ReadOnlyContextError``, while it sees
    and changes the worker's own state. The answer for the child's proxy
    (``child._patch_proxy``): ``{"use": bool}``, ``{"use": None}`` for a result that is not a
    bool (the SDK then fails the task in the child as in process: "must return true or
    false"), or what it raised: ``{"read_only": message}`` (raised again in the child as
    ``ReadOnlyContextError``) or ``{"raised": type, "message": message}``."""
    callback = det.patch_activation_callback
    if callback is None:
        raise ValueError("the worker has no patch activation callback")
    import temporalio.workflow

    given = temporalio.worker.PatchActivationInput(workflow_info=det.info,
                                                   patch_id=str(patch_id or ""))
    try:
        result = sdk.call_read_only(shadow, lambda: callback(given))
    except temporalio.workflow.ReadOnlyContextError as e:
        return {"read_only": str(e)}
    except Exception as e:  # noqa: BLE001  (the workflow's task fails with it, in the child)
        return {"raised": type(e).__name__, "message": str(e)}
    # Not coerced: anything but a bool goes back as None.
    return {"use": result if type(result) is bool else None}


def upcalls_in_worker(det: temporalio.worker.WorkflowInstanceDetails,
                      ) -> Callable[[bytes], bytes]:
    """The worker side of the child's upcalls: extern functions and the patch activation
    callback, called by name with JSON arguments; the result goes back as JSON. Nothing the
    child sends is unpickled or evaluated."""

    # The run's read-only shadow instance (``sdk.read_only_shadow``), made on the first
    # patch upcall.
    shadow: list[Any] | None = None

    def on_upcall(payload: bytes) -> bytes:
        nonlocal shadow
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
            if shadow is None:
                shadow = [sdk.read_only_shadow(det)]
            return json.dumps(patch_answer(det, shadow[0], doc.get("patch_id"))).encode()
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
