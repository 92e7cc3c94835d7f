"""What the runner's zygote preloads, against a real dev server: a workflow module that starts
a thread and probes a temporary directory at import; a module that cannot be preloaded (its
error in the task failure and the worker's log, and no new server per retried task).

    WFJAIL_BIN=target/x86_64-unknown-linux-gnu/debug/wfjail \\
        target/test-venv/bin/python -m unittest discover -s python/temporal_tests -k Preload
"""

import asyncio
import uuid

from temporalio.worker import Worker

from test_jailed_runner import DevServerTestCase, _Capture
from starter import task_failure
from wfjail.temporal import JailedWorkflowRunner

import preload_broken_workflows as broken
import preload_thread_workflows as threaded


class PreloadTests(DevServerTestCase):
    def test_a_module_that_starts_a_thread_and_probes_temp_at_import_runs_jailed(self):
        async def go():
            client = await self.server.client()
            queue = "preload-thread-" + uuid.uuid4().hex
            async with Worker(client, task_queue=queue, workflows=[threaded.PreloadedThread],
                              workflow_runner=JailedWorkflowRunner()):
                return await client.execute_workflow(
                    threaded.PreloadedThread.run, "zygote", id=str(uuid.uuid4()),
                    task_queue=queue)

        # The zygote's thread stays in the zygote: the run's process has only its own.
        self.assertEqual(asyncio.run(go()), "hello zygote (1 thread)")

    def test_a_zygote_that_cannot_preload_says_why_in_the_task_failure_and_once_in_the_log(self):
        def message(record):
            return str(record.exc_info[1]) if record.exc_info else record.getMessage()

        async def go(tasks):
            client = await self.server.client()
            queue = "preload-broken-" + uuid.uuid4().hex
            async with Worker(client, task_queue=queue, workflows=[broken.PreloadBroken],
                              workflow_runner=JailedWorkflowRunner()):
                handle = await client.start_workflow(broken.PreloadBroken.run,
                                                     id=str(uuid.uuid4()), task_queue=queue)
                first = await task_failure(handle, wait=60)
                # Temporal keeps only a task's first failure in the history: the retried
                # tasks' failures are read from the SDK's log, until one found the server's
                # start remembered instead of trying it again.
                for _ in range(300):
                    if any("did not start the server again" in message(r) for r in tasks):
                        break
                    await asyncio.sleep(0.2)
                await handle.terminate()
                return first

        with _Capture("wfjail.temporal") as logged, \
                _Capture("temporalio.worker._workflow") as tasks:
            first = asyncio.run(go(tasks))
        self.assertIsNotNone(first)
        self.assertIn("wfjail serve exited with status", first)
        # The module's own exception, as the zygote raised it, and where.
        self.assertIn("RuntimeError: preload-broken: the license server is unreachable", first)
        self.assertIn("preload_broken_workflows.py", first)
        failures = [message(r) for r in tasks if "preload-broken" in message(r)]
        remembered = [m for m in failures if "did not start the server again" in m]
        self.assertTrue(remembered, failures)
        # Each start that failed was logged once on wfjail.temporal; a remembered one not.
        starts = [r.getMessage() for r in logged if "preload-broken" in r.getMessage()]
        self.assertEqual(len(starts), len(failures) - len(remembered), (starts, failures))
