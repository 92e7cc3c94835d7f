"""Time and entropy a workflow reads without the SDK's API, run under the jailed runner
(`temporal-python`: virtual clock, seeded randomness) on a real Temporal dev server and
replayed: every value must be the same in the replay (issue 16). Run like
test_jailed_runner.py:

    WFJAIL_BIN=target/x86_64-unknown-linux-musl/debug/wfjail \\
        target/test-venv/bin/python -m unittest discover -s python/temporal_tests -k time_entropy
"""

import asyncio
import os
import socket
import tempfile
import unittest

from temporalio.worker import Replayer

from test_jailed_runner import DevServerTestCase
from wfjail.temporal import JailedWorkflowRunner

import time_entropy_workflows as P


class TimeAndEntropyTests(DevServerTestCase):
    def test_time_and_entropy_read_directly_replay_the_same(self):
        async def go():
            seen, history = await self.run_jailed([P.Probes], P.Probes.run, "probes")
            replay = await Replayer(workflows=[P.Probes], workflow_runner=JailedWorkflowRunner()
                                    ).replay_workflow(history, raise_on_replay_failure=False)
            return seen, replay

        seen, replay = asyncio.run(go())
        self.assertIsNone(replay.replay_failure,
                          "a value differed in the replay: %s (first run: %s)"
                          % (replay.replay_failure, seen))
        # What the first run saw: the zygote's preload instant, pinned usage.
        self.assertEqual(seen["time at import"], 946_684_800 * 10**9, seen)
        self.assertEqual(seen["os.getpid()"], seen["posix.getpid()"])
        self.assertEqual(seen["resource.getrusage()"], [0.0, 0.0, 0, 0, 0], seen)

    def test_replays_in_a_used_zygote_read_the_same(self):
        """Issue 27: a replay in a zygote that served sessions before (its history moved the
        collector's counts), after the host made pipes and wrote to the disk (the inode
        counter and the free space moved), reads what the run read."""
        async def go():
            seen, history = await self.run_jailed([P.Probes], P.Probes.run, "probes-used")
            pipes = [socket.socketpair() for _ in range(64)]
            with tempfile.NamedTemporaryFile(dir=os.getcwd()) as f:
                f.write(b"\7" * (8 << 20))
                f.flush()
                os.fsync(f.fileno())

                async def histories():
                    for _ in range(3):
                        yield history

                replay = await Replayer(workflows=[P.Probes],
                                        workflow_runner=JailedWorkflowRunner()
                                        ).replay_workflows(histories(),
                                                           raise_on_replay_failure=False)
            for a, b in pipes:
                a.close()
                b.close()
            return seen, replay

        seen, replay = asyncio.run(go())
        self.assertEqual(dict(replay.replay_failures), {},
                         "a value differed in a replay (first run: %s)" % seen)


if __name__ == "__main__":
    unittest.main()
