"""OpenTelemetry spans a confined workflow makes, both ends. When the worker's global tracer
provider is ``temporalio.contrib.opentelemetry``'s replay-safe one (``create_tracer_provider``,
which ``OpenTelemetryPlugin`` requires), the child gets one of its own (the same
deterministic span ids as in process, drawn from the run's seed) whose finished spans ride on
each completion as plain data (``take``), and the worker hands them to its own provider's
span processors (``export``), as if the workflow had run in process. A child's spans are its
words: bounded and plain (names, ids, times, attributes, status; no events or links), and
the worker places them: only in the traces the run was handed (``handed``: the trace context
of its start, signals, queries and updates), under a remote parent only when it is the one
handed; a span claiming any other trace is exported in one of the run's own (``_own_trace``),
and every span carries the run's ``temporalRunID``, set by the worker."""

from __future__ import annotations

import hashlib
import json
import struct
import sys
from typing import Any

from . import sdk

# At most this many spans ride on one completion (the rest are dropped in the child; the
# worker takes no more); names, scope and attribute texts are cut to MAX_SPAN_TEXT characters,
# attributes to MAX_SPAN_ATTRIBUTES.
MAX_SPANS = 1000
MAX_SPAN_TEXT = 256
MAX_SPAN_ATTRIBUTES = 32
# At most this many trace contexts handed to one run are kept (``handed``).
MAX_HANDED = 64
# The OpenTelemetry interceptor's header: the trace context a start, signal, query or
# update hands the run.
TRACE_HEADER = "_tracer-data"
# The attribute that names a span's run: the worker's, whatever the child said.
RUN_ATTRIBUTE = "temporalRunID"
# The activation jobs whose headers hand the run a trace context.
_HEADED_JOBS = ("initialize_workflow", "signal_workflow", "query_workflow", "do_update")

# The spans finished in the child since the last completion (``take``).
_finished: list[dict[str, Any]] = []


def worker_provider() -> Any:
    """The worker's global tracer provider if it is a ``ReplaySafeTracerProvider`` (the
    plugin's), else None. Never imports OpenTelemetry: a worker that did not is not using
    it."""
    contrib = sys.modules.get("temporalio.contrib.opentelemetry")
    trace = sys.modules.get("opentelemetry.trace")
    if contrib is None or trace is None:
        return None
    provider = trace.get_tracer_provider()
    return provider if isinstance(provider, contrib.ReplaySafeTracerProvider) else None


def record_in_child() -> None:
    """(In the child.) Sets a replay-safe tracer provider of the child's own as the global
    one, whose finished spans are kept for the worker (``take``)."""
    from opentelemetry import trace
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import SpanProcessor
    from temporalio.contrib.opentelemetry import create_tracer_provider

    class Keep(SpanProcessor):
        def on_end(self, span: Any) -> None:
            if len(_finished) >= MAX_SPANS:
                return
            parent = span.parent
            _finished.append({
                "name": span.name, "scope": getattr(span.instrumentation_scope, "name", ""),
                "trace_id": span.context.trace_id, "span_id": span.context.span_id,
                "parent_id": parent.span_id if parent is not None else None,
                "parent_remote": bool(parent is not None and parent.is_remote),
                "kind": span.kind.name, "start": span.start_time, "end": span.end_time,
                "attributes": dict(span.attributes or {}),
                "status": [span.status.status_code.name, span.status.description],
            })

    # An empty resource (the worker exports the spans with its own): Resource.create() runs
    # its detectors on a thread pool, and the child may not start threads.
    provider = create_tracer_provider(resource=Resource({}))
    provider.add_span_processor(Keep())
    trace.set_tracer_provider(provider)


def take() -> list[dict[str, Any]]:
    """(In the child.) The spans finished since the last call."""
    spans = _finished[:]
    _finished.clear()
    return spans


def from_side(side: dict[str, Any]) -> list[Any]:
    """The span records in a child's side channel (``relays.side_channel``: the JSON after
    the completion, read only up to its bound), or none."""
    spans = side.get("spans")
    return spans[:MAX_SPANS] if isinstance(spans, list) else []


def _text(v: object) -> str | None:
    return v[:MAX_SPAN_TEXT] if isinstance(v, str) else None


def _id(v: object, bits: int) -> int | None:
    """A span or trace id, or a time in nanoseconds, from a child: an int in (0, 2**bits)."""
    if isinstance(v, int) and not isinstance(v, bool) and 0 < v < 2**bits:
        return v
    return None


def _attributes(attributes: object) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if not isinstance(attributes, dict):
        return out
    for k, v in list(attributes.items())[:MAX_SPAN_ATTRIBUTES]:
        if not isinstance(k, str):
            continue
        if isinstance(v, str):
            v = v[:MAX_SPAN_TEXT]
        elif isinstance(v, bool) or (isinstance(v, int) and -2**63 <= v < 2**63):
            pass
        elif isinstance(v, float) and v == v:
            pass
        else:
            continue
        out[k[:MAX_SPAN_TEXT]] = v
    return out


def handed(act: Any, into: dict[int, set[int]]) -> None:
    """(In the worker.) Adds to ``into`` (trace id -> span ids) the trace contexts that the
    jobs of activation ``act`` hand the run (their ``TRACE_HEADER``, as the interceptor in
    the child reads it), at most MAX_HANDED; a header that does not parse hands nothing."""
    for job in act.jobs:
        which = job.WhichOneof("variant")
        if which not in _HEADED_JOBS:
            continue
        header = getattr(job, which).headers.get(TRACE_HEADER)
        if header is None:
            continue
        try:
            from opentelemetry.trace import get_current_span
            from opentelemetry.trace.propagation.tracecontext import (
                TraceContextTextMapPropagator,
            )
            from temporalio.converter import PayloadConverter

            carrier = PayloadConverter.default.from_payloads([header])[0]
            context = get_current_span(
                TraceContextTextMapPropagator().extract(carrier)).get_span_context()
        except Exception:  # the header is the starter's or signaller's words
            continue
        if not context.is_valid:
            continue
        ids = into.get(context.trace_id)
        if ids is None:
            if len(into) >= MAX_HANDED:
                continue
            ids = into[context.trace_id] = set()
        if len(ids) < MAX_HANDED:
            ids.add(context.span_id)


def _own_trace(run_id: str, claimed: int) -> int:
    """The trace a span claiming ``claimed``, which the run was not handed, is exported in:
    one derived from the run's id (the same for all its spans that claim ``claimed``, in
    every worker), that no other run's spans can claim."""
    digest = hashlib.sha256(b"wfjail-span-trace\0%s\0%d" % (run_id.encode(), claimed)).digest()
    return int.from_bytes(digest[:16], "big") or 1


def export(provider: Any, records: list[Any], run_id: str = "",
           contexts: dict[int, set[int]] | None = None) -> None:
    """(In the worker.) Hands each of the child's span records that is well formed to
    ``provider``'s span processors (those ``add_span_processor`` added: the exporters), as
    a finished span of the worker's resource, of run ``run_id`` (its RUN_ATTRIBUTE), in a
    trace it was handed (``contexts``, from ``handed``) or else one of its own
    (``_own_trace``); one that names a remote parent it was not handed, and the rest, are
    dropped."""
    if not records:
        return
    contexts = contexts or {}
    from opentelemetry.sdk.trace import ReadableSpan
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope
    from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

    processor, resource = sdk.span_processor_of(provider), sdk.resource_of(provider)
    flags = TraceFlags(TraceFlags.SAMPLED)
    for r in records[:MAX_SPANS]:
        try:
            name, scope = _text(r.get("name")), _text(r.get("scope")) or ""
            trace_id, span_id = _id(r.get("trace_id"), 128), _id(r.get("span_id"), 64)
            start, end = _id(r.get("start"), 64), _id(r.get("end"), 64)
            parent_id = r.get("parent_id")
            if (name is None or trace_id is None or span_id is None or start is None
                    or end is None or (parent_id is not None and _id(parent_id, 64) is None)):
                continue
            handed_ids = contexts.get(trace_id)
            if handed_ids is None:
                trace_id = _own_trace(run_id, trace_id)
            # A remote parent is the caller's span: only the one the run was handed.
            remote = parent_id is not None and handed_ids is not None and parent_id in handed_ids
            if r.get("parent_remote") and not remote:
                continue
            attributes = _attributes(r.get("attributes"))
            attributes.pop(RUN_ATTRIBUTE, None)
            if len(attributes) >= MAX_SPAN_ATTRIBUTES:
                attributes.pop(next(reversed(attributes)))
            attributes[RUN_ATTRIBUTE] = run_id
            code, description = r.get("status") or ("UNSET", None)
            description = _text(description) if code == "ERROR" else None
            span = ReadableSpan(
                name=name,
                context=SpanContext(trace_id, span_id, is_remote=False, trace_flags=flags),
                parent=(SpanContext(trace_id, parent_id, is_remote=remote, trace_flags=flags)
                        if parent_id is not None else None),
                resource=resource, attributes=attributes,
                kind=SpanKind[str(r.get("kind"))],
                status=Status(StatusCode[str(code)], description),
                start_time=start, end_time=end,
                instrumentation_scope=InstrumentationScope(scope))
            processor.on_end(span)
        except (AttributeError, KeyError, TypeError, ValueError):
            continue
