"""Same-page merging for a worker's runs (``JailedWorkflowRunner(merge_pages=True)``), against
a real dev server: each cached run's process is opted in (``ksm_merge_any: yes`` in its
``/proc/PID/ksm_stat``) and the worker is not, the workflows complete, and the operator log
(the ``wfjail.temporal`` logger) says whether the host merges, and why not. The host's KSM
``run`` is only read here (a host-wide setting; docs/temporal.md, "Same-page merging").
The opt-in is the server's, made before the zygote's exec: a workflow that tries to opt its
own process in (``prctl(PR_SET_MEMORY_MERGE, 1)``, ``madvise(MADV_MERGEABLE)``) fails its
task on the violation, with or without ``merge_pages``."""

import asyncio
import logging
import os
import unittest
import uuid

from temporalio.worker import Worker

from test_immortal import session_children
from test_jailed_runner import DevServerTestCase  # (puts the example's directory on sys.path)
import workflows as W
import merging_workflows as M
from test_red_team import _failure
from wfjail.temporal import JailedWorkflowRunner

OPEN_RUNS = 3


def merge_any(pid):
    """``ksm_merge_any`` of a process ("yes"/"no"), or None once it is gone."""
    try:
        with open("/proc/%d/ksm_stat" % pid) as f:
            for line in f:
                if line.startswith("ksm_merge_any:"):
                    return line.split()[1]
    except OSError:
        return None
    return None


class MergingTests(DevServerTestCase):
    def test_merge_pages_opts_the_runs_in_and_the_log_says_whether_the_host_merges(self):
        runner = JailedWorkflowRunner(merge_pages=True, max_sessions=64)
        before = set(session_children())

        async def go():
            client = await self.server.client()
            queue = "merging-" + uuid.uuid4().hex
            async with Worker(client, task_queue=queue, workflows=[W.Counter], activities=[],
                              workflow_runner=runner, max_cached_workflows=OPEN_RUNS + 10):
                handles = [await client.start_workflow(W.Counter.run, id=str(uuid.uuid4()),
                                                       task_queue=queue)
                           for _ in range(OPEN_RUNS)]
                for h in handles:
                    await h.signal(W.Counter.add, 1)
                for h in handles:
                    self.assertEqual(await h.query(W.Counter.value), 1)
                kids = [p for p in session_children() if p not in before]
                flags = [merge_any(k) for k in kids]
                for h in handles:
                    self.assertEqual(await h.execute_update(W.Counter.finish), 1)
                return flags

        try:
            with self.assertLogs("wfjail.temporal", logging.INFO) as logs:
                flags = asyncio.run(go())
        finally:
            runner.close()
        flags = [f for f in flags if f is not None]
        self.assertGreaterEqual(len(flags), OPEN_RUNS, "a child per cached run")
        self.assertEqual(set(flags), {"yes"}, "every run's process opted in")
        self.assertEqual(merge_any(os.getpid()), "no", "the worker is not opted in")
        said = [r.getMessage() for r in logs.records if "same-page merging" in r.getMessage()]
        self.assertTrue(said, "the log says it: %s" % [r.getMessage() for r in logs.records])
        with open("/sys/kernel/mm/ksm/run") as f:
            run = f.read().strip()
        self.assertIn("set by wfjail serve before the zygote's exec", said[0])
        if run == "1":
            self.assertIn("merging on: ", said[0])
        else:
            self.assertIn("merging off: ", said[0])
            self.assertIn("/sys/kernel/mm/ksm/run = %s" % run, said[0])

    def test_a_workflow_cannot_opt_its_own_process_in(self):
        for merge_pages in (False, True):
            runner = JailedWorkflowRunner(merge_pages=merge_pages)

            async def go():
                client = await self.server.client()
                queue = "opts-in-" + uuid.uuid4().hex
                async with Worker(client, task_queue=queue, workflows=[M.OptsIn],
                                  activities=[], workflow_runner=runner):
                    handle = await client.start_workflow(M.OptsIn.run, id=str(uuid.uuid4()),
                                                         task_queue=queue)
                    failure = await _failure(handle)
                    await handle.terminate()
                    return failure

            try:
                failure = asyncio.run(go())
            finally:
                runner.close()
            self.assertIsNotNone(failure, "merge_pages=%s: the task failed" % merge_pages)
            self.assertIn("prctl(PR_SET_MEMORY_MERGE", failure)
            self.assertIn("same-page merging", failure)


if __name__ == "__main__":
    unittest.main()
