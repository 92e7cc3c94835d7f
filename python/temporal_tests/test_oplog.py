"""What an operator finds of a confined run in the worker's log (issue 19): a child's output
as records of ``wfjail.temporal`` that name the run (workflow id, run id, type, task queue,
attempt, session, pid: in ``extra`` and in the message), escaped, not logged again when a
retried task replays it in a new session; and a WARNING with the report's status and
violations when a session ends badly. On a real dev server:

    WFJAIL_BIN=target/x86_64-unknown-linux-gnu/debug/wfjail \\
        target/test-venv/bin/python -m unittest discover -s python/temporal_tests -k Oplog
"""

import asyncio
import logging
import time
import uuid

from temporalio.worker import Worker

from test_jailed_runner import DevServerTestCase, _Capture  # (puts the examples on the path)

import oplog_workflows as O  # noqa: E402
import workflows as W  # noqa: E402
from wfjail.temporal import JailedWorkflowRunner  # noqa: E402


class OplogTests(DevServerTestCase):
    def run_until(self, workflows, run, done, timeout=60.0):
        """Starts ``run`` on a jailed worker until ``done()`` (polled), then terminates it;
        returns its workflow id, run id and task queue."""
        async def go():
            client = await self.server.client()
            queue = "oplog-" + uuid.uuid4().hex
            async with Worker(client, task_queue=queue, workflows=workflows,
                              workflow_runner=JailedWorkflowRunner()):
                h = await client.start_workflow(run, id="oplog-" + uuid.uuid4().hex,
                                                task_queue=queue)
                deadline = time.monotonic() + timeout
                while not done() and time.monotonic() < deadline:
                    await asyncio.sleep(0.1)
                await h.terminate()
                return h.id, h.result_run_id, queue

        return asyncio.run(go())

    def test_a_childs_output_names_its_run_once_across_retries(self):
        with _Capture("wfjail.temporal", logging.DEBUG) as records:
            def repeats():
                return [r for r in records if "not logged again" in r.getMessage()]

            wid, run_id, queue = self.run_until([O.PrintsThenFails], O.PrintsThenFails.run,
                                                lambda: len(repeats()) >= 1)
        lines = [r for r in records if "oplog: a line of" in r.getMessage()]
        # Written by each session of the run (each retry replays it): logged once.
        self.assertEqual(len(lines), 1, [r.getMessage() for r in lines])
        line = lines[0]
        self.assertEqual(line.levelno, logging.WARNING)
        self.assertEqual(line.name, "wfjail.temporal")
        ident = line.temporal_workflow
        self.assertEqual((ident["workflow_id"], ident["run_id"], ident["task_queue"],
                          ident["workflow_type"], ident["namespace"], ident["attempt"]),
                         (wid, run_id, queue, "PrintsThenFails", "default", 1))
        self.assertIsInstance(line.wfjail_session, int)
        self.assertIsInstance(line.wfjail_pid, int)
        text = line.getMessage()
        for part in (wid, run_id, queue, "PrintsThenFails", "attempt 1",
                     "session %d" % line.wfjail_session, "pid %d" % line.wfjail_pid):
            self.assertIn(part, text)
        # The child's bytes escaped: no terminal escape reaches the log.
        self.assertNotIn("\x1b", text)
        self.assertIn("oplog: a line of %s\\x1b[31m" % wid, text)
        # A later session of the run says how many of its lines were left out.
        again = repeats()[0]
        self.assertEqual(again.levelno, logging.INFO)
        self.assertEqual(again.temporal_workflow["run_id"], run_id)
        self.assertNotEqual(again.wfjail_session, line.wfjail_session)
        self.assertIn("1 lines of its output", again.getMessage())

    def test_a_session_that_ends_with_a_violation_is_a_warning_naming_the_run(self):
        with _Capture("wfjail.temporal", logging.DEBUG) as records:
            def ends():
                return [r for r in records if getattr(r, "wfjail_status", None)]

            wid, run_id, queue = self.run_until([W.Network], W.Network.run,
                                                lambda: len(ends()) >= 2)
        first, *later = ends()
        self.assertEqual(first.levelno, logging.WARNING)
        self.assertEqual(first.wfjail_status, "violation")
        self.assertEqual(first.temporal_workflow["run_id"], run_id)
        text = first.getMessage()
        for part in (wid, run_id, queue, "Network", "ended: violation",
                     "network socket(AF_INET", "denied"):
            self.assertIn(part, text)
        # The same end again (a retry of the same task): DEBUG, said to repeat.
        self.assertEqual(later[0].levelno, logging.DEBUG)
        self.assertIn("as an earlier session of the run", later[0].getMessage())


if __name__ == "__main__":
    import unittest

    unittest.main()
