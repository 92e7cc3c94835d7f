"""OpenTelemetry spans a confined workflow makes, both ends. When the worker's global tracer
provider is ``temporalio.contrib.opentelemetry``'s replay-safe one (``create_tracer_provider``,
which ``OpenTelemetryPlugin`` requires), the child gets one of its own (the same
deterministic span ids as in process, drawn from the run's seed) whose finished spans ride on
each completion as plain data (``take``), and the worker hands them to its own provider's
span processors (``export``), as if the workflow had run in process. A child's spans are its
words: bounded and plain (names, ids, times, attributes, status; no events or links), and
they can claim any trace id, as its metric records can claim any value."""

from __future__ import annotations

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


def export(provider: Any, records: list[Any]) -> None:
    """(In the worker.) Hands each of the child's span records that is well formed to
    ``provider``'s span processors (those ``add_span_processor`` added: the exporters), as
    a finished span of the worker's resource; the rest are dropped."""
    if not records:
        return
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
            code, description = r.get("status") or ("UNSET", None)
            description = _text(description) if code == "ERROR" else None
            span = ReadableSpan(
                name=name,
                context=SpanContext(trace_id, span_id, is_remote=False, trace_flags=flags),
                parent=(SpanContext(trace_id, parent_id, is_remote=bool(r.get("parent_remote")),
                                    trace_flags=flags) if parent_id is not None else None),
                resource=resource, attributes=_attributes(r.get("attributes")),
                kind=SpanKind[str(r.get("kind"))],
                status=Status(StatusCode[str(code)], description),
                start_time=start, end_time=end,
                instrumentation_scope=InstrumentationScope(scope))
            processor.on_end(span)
        except (AttributeError, KeyError, TypeError, ValueError):
            continue
