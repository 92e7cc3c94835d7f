"""When a runner's server starts and who shares it, against a real dev server: started by the
Worker's constructor (not by the first workflow task), shared by runners of the same
configuration made one after the other, stopped by ``close()`` only when no other runner
holds it, and a runner of another configuration gets a server of its own.

    WFJAIL_BIN=target/x86_64-unknown-linux-musl/debug/wfjail \\
        target/test-venv/bin/python -m unittest discover -s python/temporal_tests -k Sharing
"""

import asyncio
import gc
import threading
import time
import unittest
import uuid

from temporalio.worker import Worker

import workflows as W
from test_jailed_runner import DevServerTestCase
from wfjail.temporal import JailedWorkflowRunner, server


def _wait_for_server(runner, policy="temporal-python", within=120.0):
    """The server ``runner`` holds for ``policy`` once it has one (its early start)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        server = runner._servers.get(policy)
        if server is not None:
            return server
        time.sleep(0.05)
    raise AssertionError("the runner started no server within %s s" % within)


class ServerSharingTests(DevServerTestCase):
    def test_the_worker_constructor_starts_the_server_and_the_next_runner_shares_it(self):
        # A configuration of this test's own (max_sessions), so that no runner of another
        # test of this process (dropped, not yet collected) holds the same server.
        first, second, other = (JailedWorkflowRunner(max_sessions=1009),
                                JailedWorkflowRunner(max_sessions=1009),
                                JailedWorkflowRunner(max_sessions=1013))
        try:
            async def go():
                client = await self.server.client()
                results = []
                for runner in (first, second, other):
                    queue = "sharing-" + uuid.uuid4().hex
                    worker = Worker(client, task_queue=queue, workflows=[W.Greeting],
                                    activities=[W.greet], workflow_runner=runner)
                    # Before any workflow task: the constructor's prepare_workflow started it.
                    server = await asyncio.to_thread(_wait_for_server, runner)
                    async with worker:
                        results.append((server, await client.execute_workflow(
                            W.Greeting.run, "sharing", id=str(uuid.uuid4()),
                            task_queue=queue)))
                return results

            (a, ra), (b, rb), (c, rc) = asyncio.run(go())
            self.assertEqual({ra, rb, rc}, {ra}, "each worker ran the workflow")
            self.assertIs(a, b, "a second runner of the same configuration shares the server")
            self.assertIsNot(a, c, "another configuration (max_sessions) has its own")
            self.assertIsNone(a.proc.poll())
            first.close()
            self.assertIsNone(a.proc.poll(), "close() keeps a server another runner holds")
            second.close()
            a.proc.wait(15)  # the last holder's close() stops it at once
            self.assertIsNone(c.proc.poll())
        finally:
            for runner in (first, second, other):
                runner.close()
        self.assertIsNotNone(c.proc.wait(15))


class _Ended:
    """A server that has ended (what ``release`` stops: nothing to wait for)."""

    class proc:
        @staticmethod
        def poll():
            return 0

    tmp = None

    def alive(self):
        return False


class DroppedRunnerTests(unittest.TestCase):
    def test_a_runner_collected_inside_the_shared_lock_is_released_without_a_deadlock(self):
        # The garbage collector may run a dropped runner's finalizer inside any critical
        # section (it did inside acquire's, which deadlocked the worker's event loop): the
        # finalizer only queues the release, which the release thread does.
        key = ("dropped-runner-test", uuid.uuid4().hex)
        ended = _Ended()
        server.acquire(key, lambda: ended)
        runner = JailedWorkflowRunner()
        runner._held["temporal-python"] = (key, ended)
        runner.cycle = runner  # only the collector frees it
        del runner
        collected = threading.Event()

        def collect_inside_the_lock():
            with server._shared_lock:
                gc.collect()
            collected.set()

        threading.Thread(target=collect_inside_the_lock, daemon=True).start()
        self.assertTrue(collected.wait(10), "the finalizer blocked inside the lock")
        deadline = time.monotonic() + 10
        while key in server._shared and time.monotonic() < deadline:
            time.sleep(0.01)
        self.assertNotIn(key, server._shared, "the release thread let the server go")


if __name__ == "__main__":
    unittest.main()
