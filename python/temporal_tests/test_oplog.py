"""What an operator finds of a confined run in the worker's log (issue 19): a child's output
as records of ``wfjail.temporal`` that name the run (workflow id, run id, type, task queue,
attempt, session, pid: in ``extra`` and in the message), escaped, not logged again when a
retried task replays it in a new session; and a WARNING with the report's status and
violations when a session ends badly. On a real dev server:

    WFJAIL_BIN=target/x86_64-unknown-linux-musl/debug/wfjail \\
        target/test-venv/bin/python -m unittest discover -s python/temporal_tests -k Oplog
"""

import asyncio
import logging
import time
import types
import unittest
import uuid
from unittest import mock

from temporalio.worker import Worker

from test_jailed_runner import DevServerTestCase, _Capture  # (puts the examples on the path)

import oplog_workflows as O  # noqa: E402
import workflows as W  # noqa: E402
from wfjail.temporal import JailedWorkflowRunner, oplog  # noqa: E402


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


def _info(run_id):
    return types.SimpleNamespace(namespace="default", task_queue="q", workflow_id="wf-1",
                                 run_id=run_id, workflow_type="T", attempt=1)


class OplogLineTests(unittest.TestCase):
    """How the server's stderr lines are attributed (no server: the lines as its stderr
    thread reads them)."""

    def test_a_long_lines_pieces_a_line_before_its_session_is_known_the_servers_own(self):
        reg = oplog._Registry()
        with _Capture("wfjail.temporal", logging.DEBUG) as records:
            # Read before the worker has the session's OPENED: kept, logged at its open.
            reg.output("sock", b"[session 3] early\n")
            self.assertEqual(records, [])
            reg.opened("sock", 3, 4242, _info("run-a"))
            # A line longer than a read comes in pieces; the pieces after the first have no
            # prefix and are the same session's.
            reg.output("sock", b"[session 3] " + b"x" * 10)
            reg.output("sock", b"y" * 10 + b"\n")
            # Another server's session 3 is another session.
            reg.output("other", b"[session 3] elsewhere\n")
            # The server's own words go to the worker's stderr as they are.
            with mock.patch.object(oplog.os, "write") as write:
                reg.output("sock", b"wfjail: zygote 0 restarted (pid 9)\n")
            write.assert_called_once_with(2, b"wfjail: zygote 0 restarted (pid 9)\n")
        texts = [r.getMessage() for r in records]
        self.assertIn("wrote: early", texts[0])
        self.assertIn("session 3, pid 4242", texts[0])
        self.assertIn("wrote: " + "x" * 10, texts[1])
        self.assertIn("wrote: " + "y" * 10, texts[2])
        self.assertEqual(records[2].temporal_workflow["run_id"], "run-a")
        self.assertEqual(len(texts), 3)  # "elsewhere" waits for its own session
        # Without a handler anywhere (logging not configured): copied as it came.
        with mock.patch.object(logging.getLogger("wfjail.temporal"), "hasHandlers",
                               return_value=False), \
                mock.patch.object(oplog.os, "write") as write:
            reg.output("sock", b"[session 3] raw\n")
        write.assert_called_once_with(2, b"[session 3] raw\n")

    def test_layers_a_host_refused_are_a_warning_once_per_process(self):
        reg = oplog._Registry()
        report = {"status": "ok", "violations": [], "layers": {"degraded": [
            "address-layout: personality(ADDR_NO_RANDOMIZE) refused (EPERM)"]}}
        with _Capture("wfjail.temporal", logging.DEBUG) as records, \
                mock.patch.object(oplog, "_DEGRADED", oplog._Run()):
            for i in range(3):
                reg.opened("sock", 10 + i, None, _info("run-d%d" % i)).ended(report)
            # A hostile report: not a list, not strings; nothing logged, nothing raised.
            reg.opened("sock", 20, None, _info("run-e")).ended(
                {"status": "ok", "layers": {"degraded": [1, None]}})
            reg.opened("sock", 21, None, _info("run-f")).ended(
                {"status": "ok", "layers": {"degraded": "address-layout"}})
        warnings = [r for r in records if r.levelno == logging.WARNING]
        self.assertEqual(len(warnings), 1, [r.getMessage() for r in records])
        self.assertIn("address-layout: personality(ADDR_NO_RANDOMIZE) refused",
                      warnings[0].getMessage())
        self.assertIn("run-d0", warnings[0].getMessage())
        self.assertEqual(warnings[0].wfjail_degraded[0][:14], "address-layout")

    def test_an_end_without_words_says_its_signal_or_code(self):
        reg = oplog._Registry()
        with _Capture("wfjail.temporal", logging.DEBUG) as records:
            reg.opened("sock", 30, None, _info("run-s")).ended(
                {"status": "crashed", "signal": "SIGSEGV", "exit_code": None, "error": None,
                 "stderr_tail": "Fatal Python error: Segmentation fault\n\n"})
            reg.opened("sock", 31, None, _info("run-c")).ended(
                {"status": "guest-error", "exit_code": 3, "error": ""})
            # A hostile report: wrong types everywhere; still words, never an empty reason.
            reg.opened("sock", 32, None, _info("run-h")).ended(
                {"status": "crashed", "signal": 9, "exit_code": True, "stderr_tail": [1]})
        texts = [r.getMessage() for r in records if r.levelno == logging.WARNING]
        self.assertEqual(len(texts), 3, texts)
        self.assertIn("ended: crashed: killed by SIGSEGV, its stderr ended: Fatal Python "
                      "error: Segmentation fault", texts[0])
        self.assertIn("ended: guest-error: exit code 3", texts[1])
        self.assertIn("ended: crashed: no reason given", texts[2])
        self.assertEqual(oplog.end_reason({"exit_code": 0}), "exit code 0")

    def test_what_is_remembered_is_bounded(self):
        reg = oplog._Registry()
        with _Capture("wfjail.temporal", logging.DEBUG):
            for i in range(oplog.MAX_PENDING_SESSIONS + 10):
                reg.output("sock", b"[session %d] never opened\n" % (1000 + i))
            for i in range(oplog.MAX_RUNS + 10):
                reg.opened("sock", i, None, _info("run-%d" % i))
            log = reg.opened("sock", 99999, None, _info("run-big"))
            for i in range(oplog.MAX_LINES_PER_RUN + 10):
                log.output(b"line %d" % i)
        self.assertLessEqual(len(reg._pending), oplog.MAX_PENDING_SESSIONS)
        self.assertLessEqual(len(reg._runs), oplog.MAX_RUNS)
        self.assertLessEqual(len(reg._sessions), oplog.MAX_SESSIONS)
        self.assertEqual(len(log._run.seen), oplog.MAX_LINES_PER_RUN)


if __name__ == "__main__":
    unittest.main()
