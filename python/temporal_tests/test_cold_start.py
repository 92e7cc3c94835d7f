"""A worker's server starts with the worker, off the event loop, shared by the workers of one
process and configuration; a worker run with ``JailedPlugin`` polls only once its server runs
and fails to start, with the reason, when it cannot get one; the first workflow task on a
ready worker starts no server; many cached runs at once fit the worker's descriptor limit.
Against a real dev server.

    WFJAIL_BIN=target/x86_64-unknown-linux-musl/debug/wfjail \\
        target/test-venv/bin/python -m unittest discover -s python/temporal_tests -k ColdStart
"""

import asyncio
import os
import resource
import tempfile
import time
import uuid

from temporalio.worker import Worker

import cold_start_workflows as C
import preload_broken_workflows as broken
from test_jailed_runner import DevServerTestCase
from wfjail.binary import WfjailNotFound
from wfjail.temporal import JailedPlugin, JailedWorkflowRunner, ServerNotReady, server


class _LoopProbe:
    """A coroutine that wakes every ``tick`` s and keeps the longest gap between two wakes:
    how long the event loop was kept from running it."""

    def __init__(self, tick=0.005):
        self.tick, self.max_gap, self._task = tick, 0.0, None

    async def _beat(self):
        last = time.monotonic()
        while True:
            await asyncio.sleep(self.tick)
            now = time.monotonic()
            self.max_gap = max(self.max_gap, now - last)
            last = now

    def __enter__(self):
        self._task = asyncio.get_running_loop().create_task(self._beat())
        return self

    def __exit__(self, *exc):
        self._task.cancel()
        return False


class ColdStartTests(DevServerTestCase):
    def test_two_plugin_workers_share_one_server_started_off_the_loop_before_any_task(self):
        # A configuration of this test's own (max_sessions): no other test's server is reused.
        plugin = JailedPlugin(max_sessions=1019)

        async def go():
            client = await self.server.client()
            queues = ["cold-" + uuid.uuid4().hex for _ in range(2)]
            before = server.starts()
            with _LoopProbe() as probe:
                began = time.monotonic()
                workers = [Worker(client, task_queue=q, workflows=[C.OneActivation],
                                  plugins=[plugin]) for q in queues]
                runners = [w.config(active_config=True)["workflow_runner"] for w in workers]
                # What the plugin awaits before the Worker polls, measured here.
                await asyncio.gather(*(r.ready() for r in runners))
                start_took = time.monotonic() - began
                started = server.starts() - before
                start_gap = probe.max_gap
                probe.max_gap = 0.0
                async with workers[0], workers[1]:
                    results = await asyncio.gather(*(client.execute_workflow(
                        C.OneActivation.run, q[-6:], id=str(uuid.uuid4()), task_queue=q)
                        for q in queues))
                task_gap = probe.max_gap
            held = [r._servers["temporal-python"] for r in runners]
            for r in runners:
                r.close()
            return (results, ["cold " + q[-6:] for q in queues], started,
                    server.starts() - before, start_took, start_gap, task_gap, held)

        results, wanted, started, after, took, start_gap, task_gap, held = asyncio.run(go())
        self.assertEqual(results, wanted)
        self.assertEqual(started, 1, "one server for the two workers of one configuration")
        self.assertIs(held[0], held[1])
        self.assertEqual(after, 1, "the first workflow tasks started no server")
        # Liveness, not speed: the loop ran its heartbeat while the server started (which
        # took `took` s) and while the first tasks ran.
        self.assertLess(start_gap, took, (start_gap, took))
        self.assertLess(task_gap, took, (task_gap, took))

    def _fails_to_start(self, plain=False, **options):
        """What ``async with Worker(..., plugins=[JailedPlugin(**options)])`` raises (with
        ``plain``: ``workflow_runner=JailedWorkflowRunner(**options)``, no plugin)."""
        async def go():
            client = await self.server.client()
            queue = "cold-fail-" + uuid.uuid4().hex
            how = ({"workflow_runner": JailedWorkflowRunner(**options)} if plain
                   else {"plugins": [JailedPlugin(**options)]})
            worker = Worker(client, task_queue=queue, workflows=workflows, **how)
            try:
                async with worker:
                    await asyncio.sleep(60)
            except ServerNotReady as e:
                return e
            except asyncio.CancelledError:
                # async with: the run task's error cancels the body, and __aexit__ raises it
                return getattr(worker, "_async_context_run_exception", None)
            return None

        workflows = options.pop("workflows")
        error = asyncio.run(asyncio.wait_for(go(), 180))
        self.assertIsInstance(error, ServerNotReady)
        return str(error)

    def test_a_missing_binary_is_refused_before_the_worker_is_made(self):
        # Earlier than the server's start: the runner looks for its binary when it is made
        # (wfjail.binary), with the plugin and without it, naming the path it was given.
        for make in (JailedPlugin, JailedWorkflowRunner):
            with self.subTest(make.__name__):
                with self.assertRaises(WfjailNotFound) as raised:
                    make(wfjail="/nonexistent/bin/wfjail")
                self.assertIn("/nonexistent/bin/wfjail", str(raised.exception))

    def test_a_policy_that_does_not_load_fails_the_worker_start_with_serves_error(self):
        with tempfile.TemporaryDirectory() as tmp:
            bad = os.path.join(tmp, "bad.toml")
            with open(bad, "w") as f:
                f.write("extends = \"temporal-python\"\n[filesystem]\nread = 12\n")
            message = self._fails_to_start(workflows=[C.OneActivation], policy=bad)
        self.assertIn("wfjail serve exited with status", message)
        self.assertIn("read", message)

    def test_a_module_the_zygote_cannot_import_fails_the_worker_start_with_its_error(self):
        message = self._fails_to_start(workflows=[broken.PreloadBroken], max_sessions=1021)
        self.assertIn("preload-broken: the license server is unreachable", message)
        self.assertIn("preload_broken_workflows.py", message)

    def test_without_the_plugin_the_worker_polls_once_its_server_runs(self):
        # A fresh configuration: its server starts with this Worker, and the workflow is
        # started as soon as the worker runs. The worker polls only once the server runs (the
        # runner added that step to its run): the first task does not fail, nor wait on the
        # event loop.
        runner = JailedWorkflowRunner(max_sessions=1031)

        async def go():
            client = await self.server.client()
            queue = "cold-plain-" + uuid.uuid4().hex
            before = server.starts()
            with _LoopProbe() as probe:
                began = time.monotonic()
                worker = Worker(client, task_queue=queue, workflows=[C.OneActivation],
                                workflow_runner=runner)
                async with worker:
                    handle = await client.start_workflow(
                        C.OneActivation.run, "plain", id=str(uuid.uuid4()), task_queue=queue)
                    result = await handle.result()
                    took = time.monotonic() - began
                events = [e async for e in handle.fetch_history_events()]
            failed = [e for e in events if e.HasField("workflow_task_failed_event_attributes")]
            return result, probe.max_gap, took, server.starts() - before, failed

        try:
            result, gap, took, started, failed = asyncio.run(go())
        finally:
            runner.close()
        self.assertEqual(result, "cold plain")
        self.assertEqual(failed, [], "no task failed")
        self.assertEqual(started, 1)
        self.assertLess(gap, took, (gap, took))

    def test_a_server_that_died_is_started_again_off_the_loop_and_the_run_completes(self):
        runner = JailedWorkflowRunner(max_sessions=1033)

        async def go():
            client = await self.server.client()
            queue = "cold-died-" + uuid.uuid4().hex
            async with Worker(client, task_queue=queue, workflows=[C.OneActivation],
                              workflow_runner=runner):
                await runner.ready()
                died = runner._servers["temporal-python"]
                died.proc.kill()
                await asyncio.to_thread(died.proc.wait)
                before = server.starts()
                with _LoopProbe() as probe:
                    began = time.monotonic()
                    # The run's session opens on its first activation's thread, once the
                    # new server runs (its first task may fail as "still starting": retried).
                    result = await client.execute_workflow(
                        C.OneActivation.run, "again", id=str(uuid.uuid4()), task_queue=queue)
                    took = time.monotonic() - began
                return (result, server.starts() - before, probe.max_gap, took,
                        runner._servers["temporal-python"] is not died)

        try:
            result, started, gap, took, new = asyncio.run(go())
        finally:
            runner.close()
        self.assertEqual(result, "cold again")
        self.assertEqual(started, 1)
        self.assertTrue(new)
        self.assertLess(gap, took, (gap, took))

    def test_many_cached_runs_fit_a_low_descriptor_limit_the_runner_raises(self):
        # Each open run holds one socket in the worker: 150 of them do not fit a soft limit
        # of 128 descriptors, which the runner raises (up to the hard limit) when it starts
        # its server. The server's own limits (sessions, its descriptors) follow max_sessions.
        runs = 150
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if hard != resource.RLIM_INFINITY and hard < runs + 512:
            self.skipTest("the hard RLIMIT_NOFILE (%d) is too low for this test" % hard)
        runner = JailedWorkflowRunner(max_sessions=runs + 10)

        async def go():
            client = await self.server.client()
            queue = "cold-many-" + uuid.uuid4().hex
            async with Worker(client, task_queue=queue, workflows=[C.WaitsForSignal],
                              workflow_runner=runner, max_cached_workflows=runs + 10):
                await runner.ready()
                handles = [await client.start_workflow(
                    C.WaitsForSignal.run, i, id=str(uuid.uuid4()), task_queue=queue)
                    for i in range(runs)]
                srv = runner._servers["temporal-python"]
                deadline = time.monotonic() + 300
                while (await asyncio.to_thread(srv.client.status))["open"] < runs:
                    self.assertLess(time.monotonic(), deadline, "not all runs got cached")
                    await asyncio.sleep(0.5)
                open_runs = (await asyncio.to_thread(srv.client.status))["open"]
                for h in handles:
                    await h.signal(C.WaitsForSignal.go)
                return open_runs, sorted([await h.result() for h in handles])

        resource.setrlimit(resource.RLIMIT_NOFILE, (128, hard))
        try:
            open_runs, results = asyncio.run(go())
            raised = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        finally:
            runner.close()
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        self.assertEqual(open_runs, runs, "every run open at once, each in its child")
        self.assertEqual(results, list(range(runs)))
        self.assertGreaterEqual(raised, runs + server.FDS_BESIDES_SESSIONS)
