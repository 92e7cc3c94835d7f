"""Issue 20: what left the workflow's path keeps its behaviour. An evicted run's session is
closed on the worker's closer thread: a server with one slot still takes run after run (an
open refused BUSY waits for the close in flight), and every session's report comes whole,
the last ones' too (the runner's close waits for the closes in flight)."""

import asyncio
import unittest

from temporalio.worker import Replayer

from test_jailed_runner import DevServerTestCase, _Capture  # (puts the examples on the path)

import workflows as W  # noqa: E402
from wfjail.temporal import JailedWorkflowRunner  # noqa: E402
from wfjail.temporal import worker as jailed_worker  # noqa: E402


async def _repeat(history, n):
    for _ in range(n):
        yield history


class CloseOffPathTests(DevServerTestCase):
    def test_one_slot_takes_run_after_run_and_every_session_ends_ok(self):
        async def scenario():
            _, history = await self.run_jailed([W.Greeting], W.Greeting.run, "close", "x")
            runner = JailedWorkflowRunner(max_sessions=1)
            try:
                with _Capture("wfjail.temporal") as records:
                    results = await Replayer(workflows=[W.Greeting], workflow_runner=runner
                                             ).replay_workflows(_repeat(history, 8),
                                                                raise_on_replay_failure=False)
                    # The last run's close may still be in flight: the runner's close waits.
                    await asyncio.to_thread(runner.close)
            finally:
                runner.close()
            return results, records

        results, records = asyncio.run(scenario())
        self.assertEqual(results.replay_failures, {})
        texts = [r.getMessage() for r in records]
        # No run was refused for want of room, and none ended other than ok.
        self.assertEqual([t for t in texts if "no room" in t or "ended" in t], [])
        self.assertFalse(jailed_worker._CLOSER.wait_for_closes(0.0))  # none in flight


if __name__ == "__main__":
    unittest.main()
