"""Hostile workflows against a real Temporal server (issue 16's hostile-guest pass): each
attacks its worker from inside its confined child (``hostile_workflows``); the worker keeps
its log and the operator's view its own, and goes on serving.

    WFJAIL_BIN=target/x86_64-unknown-linux-musl/debug/wfjail \\
        target/test-venv/bin/python -m unittest discover -s python/temporal_tests -k Hostile
"""

import asyncio
import logging
import unittest
import uuid

from temporalio.worker import Worker

from test_jailed_runner import DevServerTestCase, _Capture  # (puts the examples on the path)

import hostile_workflows as H  # noqa: E402
from starter import task_failure  # noqa: E402  (the example's own helper)
from wfjail.temporal import relays  # noqa: E402
from wfjail.temporal import JailedWorkflowRunner  # noqa: E402

ALL = [H.DeniedPath, H.HandlerRaises, H.LogFlood, H.HugeReply]


class HostileWorkflowTests(DevServerTestCase):
    def test_hostile_children_cannot_forge_the_failure_flood_the_log_or_swell_the_worker(self):
        async def go():
            client = await self.server.client()
            queue = "hostile-" + uuid.uuid4().hex
            out = {}
            async with Worker(client, task_queue=queue, workflows=ALL,
                              workflow_runner=JailedWorkflowRunner()):
                for wf in (H.DeniedPath, H.HandlerRaises, H.HugeReply):
                    h = await client.start_workflow(wf.run, id=str(uuid.uuid4()),
                                                    task_queue=queue)
                    out[wf.__name__] = await task_failure(h, wait=30.0)
                    await h.terminate()
                out["flood"] = await asyncio.wait_for(client.execute_workflow(
                    H.LogFlood.run, id=str(uuid.uuid4()), task_queue=queue), 60)
            return out

        with _Capture("temporalio.workflow", logging.INFO) as kept, \
                _Capture("wfjail.temporal", logging.WARNING) as said:
            out = asyncio.run(go())
        denied = out["DeniedPath"]
        self.assertIn("filesystem openat(/tmp/wfjail-hostile\\x0a2026-12-01 ERROR", denied)
        self.assertEqual(len(denied.split("\n")), 2, denied)
        self.assertNotIn("\x1b", denied)
        raised = out["HandlerRaises"]
        self.assertTrue(raised.startswith("wfjail: the confined process of workflow "
                                          "HandlerRaises"), raised)
        self.assertNotIn("\n", raised)
        self.assertIn("max_reply_bytes", out["HugeReply"])
        self.assertEqual(out["flood"], "flooded")
        flood = [r for r in kept if getattr(r, "wfjail", False)
                 and r.getMessage().startswith("flood ")]
        # Its one activation relays MAX_LOG_RECORDS of them.
        self.assertEqual(len(flood), relays.MAX_LOG_RECORDS)
        self.assertTrue([r for r in said if "dropped" in r.getMessage()],
                        [r.getMessage() for r in said])

    def test_a_child_that_ignores_its_interruption_does_not_hold_a_worker_thread(self):
        # One executor thread, and a call timeout of 300 s: before the watchdog ended such a
        # child, the thread (and a greeting behind it) waited until a limit of the child's
        # ended it, and no child was ended by the worker.
        import concurrent.futures

        import workflows as W

        def ended(records):
            return [r for r in records if "did not answer its interruption" in r.getMessage()]

        async def go(said):
            client = await self.server.client()
            queue = "stubborn-" + uuid.uuid4().hex
            with concurrent.futures.ThreadPoolExecutor(max_workers=1) as executor:
                async with Worker(client, task_queue=queue, workflows=[H.Stubborn, W.Greeting],
                                  activities=[W.greet], workflow_task_executor=executor,
                                  workflow_runner=JailedWorkflowRunner(call_timeout="300s")):
                    h = await client.start_workflow(H.Stubborn.run, id=str(uuid.uuid4()),
                                                    task_queue=queue)
                    for _ in range(600):  # the worker ends the child (a liveness bound only)
                        if ended(said):
                            break
                        await asyncio.sleep(0.1)
                    await h.terminate()
                    return await asyncio.wait_for(client.execute_workflow(
                        W.Greeting.run, "after", id=str(uuid.uuid4()), task_queue=queue), 120)

        with _Capture("wfjail.temporal", logging.WARNING) as said:
            after = asyncio.run(go(said))
        self.assertTrue(ended(said), [r.getMessage() for r in said])
        self.assertIn("workflow Stubborn", ended(said)[0].getMessage())
        self.assertEqual(after, "Hello, after!")

if __name__ == "__main__":
    unittest.main()
