"""The red team's attacks of issue 27 that no other test made, against a real dev server
(test_jailed_runner.py's): a span claiming another run's trace, a server shared by runners of
different policies. Each asserts the safe outcome exactly.

    WFJAIL_BIN=target/x86_64-unknown-linux-gnu/debug/wfjail target/test-venv/bin/python \\
        -m unittest discover -s python/temporal_tests -p test_red_team.py
"""

import asyncio
import os
import sys
import unittest
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from temporalio.client import Client  # noqa: E402
from temporalio.worker import Worker  # noqa: E402

import red_team_workflows as R  # noqa: E402
from test_jailed_runner import DevServerTestCase  # noqa: E402
from wfjail.temporal import JailedWorkflowRunner  # noqa: E402


class SpanClaimTests(DevServerTestCase):
    def test_a_span_claiming_another_runs_trace_lands_only_in_its_own(self):
        from opentelemetry import trace
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
            InMemorySpanExporter,
        )
        from temporalio.contrib.opentelemetry import (
            OpenTelemetryPlugin,
            ReplaySafeTracerProvider,
            create_tracer_provider,
        )

        if not isinstance(trace.get_tracer_provider(), ReplaySafeTracerProvider):
            trace.set_tracer_provider(create_tracer_provider())
        provider = trace.get_tracer_provider()
        exporter = InMemorySpanExporter()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        tracer = trace.get_tracer(__name__)

        async def go():
            await self.server.client()  # the server is up
            client = await Client.connect(
                self.server.target, plugins=[OpenTelemetryPlugin(add_temporal_spans=True)])
            queue = "spans-" + uuid.uuid4().hex
            async with Worker(client, task_queue=queue, workflows=[R.Honest, R.ClaimsATrace],
                              workflow_runner=JailedWorkflowRunner()):
                with tracer.start_as_current_span("victim-caller") as caller:
                    victim = await client.start_workflow(
                        R.Honest.run, id="victim-" + uuid.uuid4().hex, task_queue=queue)
                    self.assertEqual(await victim.result(), "honest")
                theirs = caller.get_span_context()
                with tracer.start_as_current_span("forger-caller") as forger_caller:
                    forger = await client.start_workflow(
                        R.ClaimsATrace.run,
                        {"trace_id": str(theirs.trace_id), "span_id": str(theirs.span_id),
                         "run_id": victim.result_run_id, "workflow_id": victim.id},
                        id="forger-" + uuid.uuid4().hex, task_queue=queue)
                    self.assertEqual(await forger.result(), "claimed")
            return (theirs.trace_id, victim.result_run_id, forger.result_run_id,
                    forger_caller.get_span_context().trace_id)

        exporter.clear()
        victim_trace, victim_run, forger_run, forger_trace = asyncio.run(go())
        got = exporter.get_finished_spans()
        # The victim's trace holds the victim's spans and nothing else.
        self.assertEqual(sorted(s.name for s in got if s.context.trace_id == victim_trace),
                         ["RunWorkflow:Honest", "StartWorkflow:Honest", "honest-inner",
                          "victim-caller"])
        self.assertEqual(sorted(s.name for s in got
                                if (s.attributes or {}).get("temporalRunID") == victim_run),
                         ["RunWorkflow:Honest", "honest-inner"])
        forged = [s for s in got if s.name.startswith("forged")]
        # Those under a remote parent the run was not handed (the victim's caller) are
        # dropped; the rest are kept, each named as its run's (set by the worker), in a trace
        # that is neither the victim's nor any caller's, bounded, under no remote parent and
        # with the worker's resource.
        self.assertEqual(sorted(s.name[:13] for s in forged), ["forged-huge-h", "forged-root"])
        resource = dict(provider._tracer_provider.resource.attributes)
        for s in forged:
            self.assertEqual(s.attributes["temporalRunID"], forger_run, s.name)
            self.assertNotIn(s.context.trace_id, (victim_trace, forger_trace), s.name)
            self.assertFalse(s.parent is not None and s.parent.is_remote, s.name)
            self.assertLessEqual(len(s.name), 256)
            self.assertLessEqual(len(s.attributes), 33)
            self.assertTrue(all(len(k) <= 256 and len(str(v)) <= 256
                                for k, v in s.attributes.items()), s.name)
            self.assertEqual(dict(s.resource.attributes), resource, s.name)
        # The forger's own workflow span is in its caller's trace, as in process.
        run_span, = [s for s in got if s.name == "RunWorkflow:ClaimsATrace"]
        self.assertEqual(run_span.context.trace_id, forger_trace)
        self.assertEqual(run_span.attributes["temporalRunID"], forger_run)


if __name__ == "__main__":
    unittest.main()
