"""Classes and callbacks made inside a function reach the confined child by value
(cloudpickle), and Temporal's contrib plugins, which make their workflow interceptor classes
so, run under JailedWorkflowRunner: against a real dev server (test_jailed_runner.py's).

    WFJAIL_BIN=target/x86_64-unknown-linux-musl/debug/wfjail target/test-venv/bin/python \\
        -m unittest discover -s python/temporal_tests -p test_byvalue.py
"""

import asyncio
import os
import sys
import time
import unittest
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from temporalio.client import Client  # noqa: E402
from temporalio.converter import DataConverter  # noqa: E402
from temporalio.worker import UnsandboxedWorkflowRunner, Worker  # noqa: E402

import byvalue_workflows as B  # noqa: E402
from test_jailed_runner import DevServerTestCase, in_memory_tracing  # noqa: E402
from wfjail.temporal import JailedWorkflowRunner  # noqa: E402
from wfjail.temporal.recipe import by_value  # noqa: E402


async def task_failure(handle, contains, wait=15.0):
    """The message of the first workflow task failure of ``handle`` that contains
    ``contains`` (or the last one seen), waiting up to ``wait`` seconds."""
    end = time.monotonic() + wait
    seen = None
    while time.monotonic() < end:
        async for e in handle.fetch_history_events():
            if e.HasField("workflow_task_failed_event_attributes"):
                seen = e.workflow_task_failed_event_attributes.failure.message
                if contains in seen:
                    return seen
        await asyncio.sleep(0.2)
    return seen


class ByValueTests(DevServerTestCase):
    async def _run(self, client, workflows, run, *args, runner=None, **worker_options):
        queue = "byvalue-" + uuid.uuid4().hex
        async with Worker(client, task_queue=queue, workflows=workflows,
                          activities=[B.shout],
                          workflow_runner=runner or JailedWorkflowRunner(), **worker_options):
            return await client.execute_workflow(run, *args, id=str(uuid.uuid4()),
                                                 task_queue=queue)

    async def _failure(self, client, workflows, run, contains, **worker_options):
        """The task failure of a run of ``run`` on a jailed worker (the run is terminated)."""
        queue = "byvalue-" + uuid.uuid4().hex
        async with Worker(client, task_queue=queue, workflows=workflows,
                          workflow_runner=JailedWorkflowRunner(), **worker_options):
            handle = await client.start_workflow(run, id=str(uuid.uuid4()), task_queue=queue)
            message = await task_failure(handle, contains)
            await handle.terminate()
            return message

    def test_an_interceptor_class_and_a_converter_made_in_a_function_run_in_the_child(self):
        async def go():
            await self.server.client()  # the server is up
            client = await Client.connect(self.server.target, data_converter=DataConverter(
                payload_converter_class=B.converter_class()))
            options = dict(interceptors=[B.TaggingInterceptor("from the plugin")])
            jailed = await self._run(client, [B.Tagged], B.Tagged.run, "x", **options)
            plain = await self._run(client, [B.Tagged], B.Tagged.run, "x",
                                    runner=UnsandboxedWorkflowRunner(), **options)
            return jailed, plain

        jailed, plain = asyncio.run(go())
        # The class made in the method, with the plugin instance's attribute, ran in the
        # confined child as it runs in process; so did the converter class.
        self.assertEqual(jailed["tag"], "from the plugin (in TagInbound)")
        self.assertEqual({k: v for k, v in jailed.items() if k != "pid"},
                         {k: v for k, v in plain.items() if k != "pid"})
        self.assertEqual(jailed["converter"], "LocalConverter")
        self.assertNotEqual(jailed["pid"], os.getpid())
        self.assertEqual(plain["pid"], os.getpid())

    def test_a_class_that_cannot_be_pickled_fails_the_task_naming_it_and_why(self):
        async def go():
            return await self._failure(await self.server.client(), [B.Tagged], B.Tagged.run,
                                       "LockedInbound", interceptors=[B.LockedInterceptor()])

        message = asyncio.run(go())
        self.assertIsNotNone(message)
        self.assertIn("interceptor class", message)
        self.assertIn("LockedInbound", message)
        self.assertIn("cannot pickle '_thread.lock' object", message)
        self.assertIn("define it in a module the worker imports", message)

    def test_a_class_is_pickled_once(self):
        cls = B.TaggingInterceptor("once").workflow_interceptor_class(None)
        first = by_value(cls, "interceptor class")
        self.assertIs(by_value(cls, "interceptor class"), first)


class PatchActivationTests(DevServerTestCase):
    """``patch_activation_callback`` runs in the worker by default (it records into the
    worker's memory, as in process), its result checked as strictly as the SDK checks it;
    with ``patch_callback_in_child=True`` the SDK's instance in the child calls a copy, in
    the workflow's read-only context, as in process."""

    async def _worker(self, client, callback, in_child):
        queue = "patch-" + uuid.uuid4().hex
        return queue, Worker(client, task_queue=queue, workflows=[B.Patched],
                             workflow_runner=JailedWorkflowRunner(
                                 patch_callback_in_child=in_child),
                             patch_activation_callback=callback)

    async def _patched(self, callback, in_child=False):
        client = await self.server.client()
        queue, worker = await self._worker(client, callback, in_child)
        async with worker:
            return await client.execute_workflow(B.Patched.run, id=str(uuid.uuid4()),
                                                 task_queue=queue)

    async def _failure(self, callback, contains, in_child=False):
        client = await self.server.client()
        queue, worker = await self._worker(client, callback, in_child)
        async with worker:
            handle = await client.start_workflow(B.Patched.run, id=str(uuid.uuid4()),
                                                 task_queue=queue)
            message = await task_failure(handle, contains)
            await handle.terminate()
            return message

    def test_a_callback_decides_in_the_worker_with_the_workers_state(self):
        calls = []
        self.assertIs(asyncio.run(self._patched(B.recording(calls, False))), False)
        self.assertEqual([patch for _, patch in calls], ["my-patch"])
        self.assertIs(asyncio.run(self._patched(B.recording(calls, True))), True)
        self.assertEqual(len(calls), 2)

    def test_in_the_worker_a_callback_runs_in_the_read_only_context(self):
        # The run's read-only context in the worker (a shadow instance of the SDK's, never
        # activated): a workflow action fails with the SDK's own error, as in process, while
        # workflow.info() is the run's.
        for callback, expected in ((B.upserting_memo, "action attempted: add command"),
                                   (B.drawing_random, "action attempted: random"),
                                   (B.scheduling_a_task, "action attempted: schedule task")):
            message = asyncio.run(self._failure(callback, expected))
            self.assertIn("While in read-only function, " + expected, message or "", callback)
        seen = []
        self.assertIs(asyncio.run(self._patched(B.reading_info(seen))), True)
        self.assertEqual(len(seen), 1)
        self.assertEqual(seen[0][1], "Patched")

    def test_a_callback_that_raises_in_the_worker_fails_the_task_naming_it(self):
        message = asyncio.run(self._failure(B.raising, "flag service down"))
        self.assertIn("ValueError: flag service down", message or "")

    def test_a_callback_that_returns_no_bool_fails_the_task(self):
        expected = "Patch activation callback must return true or false"
        for in_child in (False, True):
            message = asyncio.run(self._failure(B.not_a_bool, expected, in_child))
            self.assertIn(expected, message or "", in_child)

    def test_in_the_child_a_callback_decides_in_the_read_only_context(self):
        self.assertIs(asyncio.run(self._patched(B.deciding(True), True)), True)
        self.assertIs(asyncio.run(self._patched(B.deciding(False), True)), False)
        for callback, expected in ((B.upserting_memo, "action attempted: add command"),
                                   (B.drawing_random, "action attempted: random")):
            message = asyncio.run(self._failure(callback, expected, True))
            self.assertIn(expected, message or "", callback)

    def test_in_the_child_a_callback_that_cannot_be_pickled_runs_in_the_worker(self):
        calls = []
        self.assertIs(asyncio.run(self._patched(B.locked_recording(calls, False), True)),
                      False)
        self.assertEqual([patch for _, patch in calls], ["my-patch"])


class PluginTests(DevServerTestCase):
    """``temporalio.contrib``'s plugins, whose workflow interceptor classes are made inside
    ``workflow_interceptor_class``, on a worker with ``JailedWorkflowRunner()``."""

    async def _run_with_plugin(self, plugin, workflows, run, arg, runner, activities=()):
        await self.server.client()  # the server is up
        client = await Client.connect(self.server.target, plugins=[plugin])
        queue = "plugin-" + uuid.uuid4().hex
        async with Worker(client, task_queue=queue, workflows=workflows,
                          activities=list(activities), workflow_runner=runner):
            return await client.execute_workflow(run, arg, id=str(uuid.uuid4()),
                                                 task_queue=queue)

    def test_the_opentelemetry_plugin_exports_the_workflows_spans(self):
        from temporalio.contrib.opentelemetry import OpenTelemetryPlugin

        _, tracer, exporter = in_memory_tracing(__name__)

        def spans(runner):
            exporter.clear()

            async def go():
                with tracer.start_as_current_span("caller") as caller:
                    result = await self._run_with_plugin(
                        OpenTelemetryPlugin(add_temporal_spans=True), [B.Traced],
                        B.Traced.run, "traced", runner, [B.shout])
                return result, caller.get_span_context().trace_id

            result, trace_id = asyncio.run(go())
            self.assertEqual(result, "TRACED")
            return {s.name: s for s in exporter.get_finished_spans()}, trace_id

        plain, plain_trace = spans(UnsandboxedWorkflowRunner())
        jailed, trace_id = spans(JailedWorkflowRunner())
        # The spans made in the confined workflow (RunWorkflow, StartActivity) reach the
        # worker's exporter too: the same spans as in process, in the caller's trace, the
        # activity's the child of the workflow's StartActivity.
        self.assertEqual(sorted(jailed), sorted(plain))
        for got, caller in ((plain, plain_trace), (jailed, trace_id)):
            for name in ("StartWorkflow:Traced", "RunWorkflow:Traced", "StartActivity:shout",
                         "RunActivity:shout"):
                self.assertEqual(got[name].context.trace_id, caller, name)
            self.assertEqual(got["RunActivity:shout"].parent.span_id,
                             got["StartActivity:shout"].context.span_id)
            self.assertEqual(got["StartActivity:shout"].parent.span_id,
                             got["RunWorkflow:Traced"].context.span_id)

    def test_the_langgraph_plugin_runs_a_graph_whose_node_is_an_activity(self):
        from temporalio.langgraph import LangGraphPlugin

        import byvalue_langgraph_workflows as G

        def run(runner):
            return asyncio.run(self._run_with_plugin(
                LangGraphPlugin(graphs={"shouting": G.make_graph()}), [G.Graphed],
                G.Graphed.run, "graphed", runner))

        self.assertEqual(run(JailedWorkflowRunner()), {"text": "GRAPHED!"})
        self.assertEqual(run(UnsandboxedWorkflowRunner()), {"text": "GRAPHED!"})


class SpanRecordTests(unittest.TestCase):
    """What the worker takes of a child's span records (no server): well-formed ones reach
    the provider's processors, bounded; anything else is dropped."""

    def test_forged_and_oversized_records_are_dropped(self):
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
            InMemorySpanExporter,
        )
        from temporalio.contrib.opentelemetry import create_tracer_provider

        import json

        from wfjail.temporal import relays, spans

        provider = create_tracer_provider()
        exporter = InMemorySpanExporter()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        good = {"name": "RunWorkflow:X", "scope": "s", "trace_id": 7, "span_id": 9,
                "parent_id": 3, "parent_remote": True, "kind": "SERVER", "start": 1, "end": 2,
                "attributes": {"a": "x" * 10_000, "b": [1], "c": 1}, "status": ["ERROR", "e"]}
        forged = [None, 1, "span", {}, dict(good, trace_id=0), dict(good, span_id=2**64),
                  dict(good, kind="NOPE"), dict(good, status=["NOPE", None]),
                  dict(good, start=True), dict(good, parent_id="3"), dict(good, name=5)]
        spans.export(provider, forged + [good] * (spans.MAX_SPANS + 5), "run-1", {7: {3}})
        got = exporter.get_finished_spans()
        self.assertEqual(len(got), spans.MAX_SPANS - len(forged))
        span = got[0]
        self.assertEqual((span.name, span.context.trace_id, span.context.span_id,
                          span.parent.span_id, span.parent.is_remote),
                         ("RunWorkflow:X", 7, 9, 3, True))
        self.assertEqual(dict(span.attributes), {"a": "x" * spans.MAX_SPAN_TEXT, "c": 1,
                                                 "temporalRunID": "run-1"})
        self.assertEqual(span.status.description, "e")
        self.assertEqual(spans.from_side(relays.side_channel(b"\x00\x00\x00\x00" + b"not json")),
                         [])
        # A side channel over its bound is not read at all (no spans from it).
        big = json.dumps({"spans": [[]] * 10, "pad": "x" * relays.MAX_SIDE_CHANNEL}).encode()
        self.assertEqual(spans.from_side(relays.side_channel(b"\x00\x00\x00\x00" + big)), [])


if __name__ == "__main__":
    unittest.main()
