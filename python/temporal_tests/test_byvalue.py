"""Classes and callbacks made inside a function reach the confined child by value
(cloudpickle), and Temporal's contrib plugins, which make their workflow interceptor classes
so, run under JailedWorkflowRunner: against a real dev server (test_jailed_runner.py's).

    WFJAIL_BIN=target/x86_64-unknown-linux-gnu/debug/wfjail target/test-venv/bin/python \\
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
from test_jailed_runner import DevServerTestCase  # noqa: E402
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
    """``patch_activation_callback`` is called by the SDK's instance in the child, in the
    workflow's read-only context, as in process; one that cannot be pickled runs in the
    worker, its result checked as strictly."""

    async def _patched(self, callback):
        client = await self.server.client()
        queue = "patch-" + uuid.uuid4().hex
        async with Worker(client, task_queue=queue, workflows=[B.Patched],
                          workflow_runner=JailedWorkflowRunner(),
                          patch_activation_callback=callback):
            return await client.execute_workflow(B.Patched.run, id=str(uuid.uuid4()),
                                                 task_queue=queue)

    async def _failure(self, callback, contains):
        client = await self.server.client()
        queue = "patch-" + uuid.uuid4().hex
        async with Worker(client, task_queue=queue, workflows=[B.Patched],
                          workflow_runner=JailedWorkflowRunner(),
                          patch_activation_callback=callback):
            handle = await client.start_workflow(B.Patched.run, id=str(uuid.uuid4()),
                                                 task_queue=queue)
            message = await task_failure(handle, contains)
            await handle.terminate()
            return message

    def test_a_callback_decides_in_the_child(self):
        self.assertIs(asyncio.run(self._patched(B.deciding(True))), True)
        self.assertIs(asyncio.run(self._patched(B.deciding(False))), False)

    def test_a_callback_that_returns_no_bool_fails_the_task(self):
        message = asyncio.run(self._failure(
            B.not_a_bool, "Patch activation callback must return true or false"))
        self.assertIn("Patch activation callback must return true or false", message or "")

    def test_a_callback_runs_in_the_read_only_context(self):
        for callback, expected in ((B.upserting_memo, "action attempted: add command"),
                                   (B.drawing_random, "action attempted: random")):
            message = asyncio.run(self._failure(callback, expected))
            self.assertIn(expected, message or "", callback)

    def test_a_callback_that_cannot_be_pickled_runs_in_the_worker(self):
        calls = []
        self.assertIs(asyncio.run(self._patched(B.recording_in_worker(calls, False))), False)
        self.assertEqual([patch for _, patch in calls], ["my-patch"])
        # Its result is checked as strictly as in process.
        broken = B.recording_in_worker([], "yes")
        message = asyncio.run(self._failure(
            broken, "Patch activation callback must return true or false"))
        self.assertIn("Patch activation callback must return true or false", message or "")


if __name__ == "__main__":
    unittest.main()
