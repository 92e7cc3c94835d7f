"""Workflows of the red team's tests (test_red_team.py): an honest one whose trace a hostile
one claims, and workflows that try a call only a looser policy allows."""

import socket
import sys

from temporalio import workflow

HUGE = "h" * 100_000


@workflow.defn
class Honest:
    """Makes one span of its own under the caller's trace."""

    @workflow.run
    async def run(self) -> str:
        from opentelemetry import trace

        with trace.get_tracer("honest").start_as_current_span("honest-inner"):
            pass
        return "honest"


@workflow.defn
class ClaimsATrace:
    """Claims another run's trace (``victim``: its trace id, its caller's span id, its run
    and workflow ids) for its spans: through the tracer with the victim's span as parent,
    and as raw records put in the child's relay (``wfjail.temporal.spans._finished``) with a
    remote parent, the victim's identity attributes, a forged resource and oversized
    names and attributes."""

    @workflow.run
    async def run(self, victim: dict) -> str:
        from opentelemetry import trace
        from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

        theirs = SpanContext(int(victim["trace_id"]), int(victim["span_id"]), is_remote=True,
                             trace_flags=TraceFlags(TraceFlags.SAMPLED))
        identity = {"temporalRunID": victim["run_id"],
                    "temporalWorkflowID": victim["workflow_id"]}
        with trace.get_tracer("forger").start_as_current_span(
                "forged-by-tracer", context=trace.set_span_in_context(NonRecordingSpan(theirs)),
                attributes=identity):
            pass
        relay = sys.modules["wfjail.temporal.spans"]._finished
        raw = {"name": "forged-raw", "scope": "temporalio", "trace_id": theirs.trace_id,
               "span_id": 0xF0F0F0F0, "parent_id": theirs.span_id, "parent_remote": True,
               "kind": "SERVER", "start": 1, "end": 2,
               "resource": {"service.name": "payments"},
               "attributes": dict(identity, **{"a%d" % i: "x" * 300 for i in range(500)}),
               "status": ["OK", None]}
        relay.append(raw)
        relay.append(dict(raw, name="forged-root", span_id=0xF1F1F1F1, parent_id=None,
                          parent_remote=False))
        relay.append(dict(raw, name="forged-huge-" + HUGE, span_id=0xF2F2F2F2,
                          parent_remote=False, attributes={"k" * 1000: HUGE}))
        return "claimed"


@workflow.defn
class OpensASocket:
    """Makes a network socket: `permissive` lets it through, `temporal-python` denies it."""

    @workflow.run
    async def run(self) -> str:
        socket.socket(socket.AF_INET, socket.SOCK_STREAM).close()
        return "socket made"


@workflow.defn
class ReadsAFile:
    """Reads a file named by its argument: a policy that grants it lets it, `temporal-python`
    denies it."""

    @workflow.run
    async def run(self, path: str) -> str:
        with open(path) as f:
            return f.read()
