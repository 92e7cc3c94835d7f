"""What the runner's zygote preloads, against a real dev server: a workflow module that starts
a thread and probes a temporary directory at import; a module that cannot be preloaded (its
error fails the worker's start and is logged once, and a worker made again at once starts no
new server); a
workflow class defined in the script the worker runs.

    WFJAIL_BIN=target/x86_64-unknown-linux-musl/debug/wfjail \\
        target/test-venv/bin/python -m unittest discover -s python/temporal_tests -k Preload
"""

import asyncio
import os
import subprocess
import sys
import tempfile
import unittest
import uuid

from temporalio.worker import Worker
from wfjail.temporal import main_script

from test_jailed_runner import DevServerTestCase, _Capture
from wfjail.temporal import JailedWorkflowRunner, ServerNotReady, server

import preload_broken_workflows as broken
import preload_thread_workflows as threaded

HERE = os.path.dirname(os.path.abspath(__file__))


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

    def test_a_zygote_that_cannot_preload_fails_the_worker_start_with_why_logged_once(self):
        async def go():
            client = await self.server.client()
            queue = "preload-broken-" + uuid.uuid4().hex
            try:
                async with Worker(client, task_queue=queue, workflows=[broken.PreloadBroken],
                                  workflow_runner=JailedWorkflowRunner()):
                    await asyncio.sleep(60)
            except ServerNotReady as e:
                return str(e)
            return None

        before = server.starts()
        with _Capture("wfjail.temporal") as logged:
            first = asyncio.run(go())
            # A worker made again at once finds the failure remembered: no new start.
            again = asyncio.run(go())
        self.assertIsNotNone(first)
        self.assertIn("wfjail serve exited with status", first)
        # The module's own exception, as the zygote raised it, and where.
        self.assertIn("RuntimeError: preload-broken: the license server is unreachable", first)
        self.assertIn("preload_broken_workflows.py", first)
        self.assertIn("did not start the server again", again)
        self.assertEqual(server.starts() - before, 1)
        # The start that failed was logged once on wfjail.temporal; the remembered one not.
        starts = [r.getMessage() for r in logged if "preload-broken" in r.getMessage()]
        self.assertEqual(len(starts), 1, starts)


class MainScriptTests(DevServerTestCase):
    def run_script(self, *how):
        """Runs ``python *how TARGET QUEUE`` in this directory (``how``: a script, ``-m`` and a
        module, or ``-c`` and code)."""
        async def up():
            await self.server.client()

        asyncio.run(up())
        if len(how) == 1:
            how = (os.path.join(HERE, how[0]),)
        return subprocess.run(
            [sys.executable, *how, self.server.target, "main-" + uuid.uuid4().hex],
            capture_output=True, text=True, timeout=180, cwd=HERE)

    def test_a_worker_run_as_python_m_names_its_module(self):
        done = self.run_script("-m", "main_script_worker")
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertEqual(done.stdout.strip(), "hello script from main_script_worker")

    def test_a_main_without_a_file_is_refused_with_the_fix(self):
        with open(os.path.join(HERE, "main_script_worker.py")) as f:
            done = self.run_script("-c", f.read())
        self.assertNotEqual(done.returncode, 0)
        self.assertIn("defined in the script run as __main__, which has no file (a REPL, "
                      "python -c)", done.stderr)

    def test_a_workflow_in_the_script_the_worker_runs_completes_jailed(self):
        done = self.run_script("main_script_worker.py")
        self.assertEqual(done.returncode, 0, done.stderr)
        # Rebuilt in the child from the script imported under another name: its start, under
        # the guard, did not run there.
        self.assertEqual(done.stdout.strip(), "hello script from %s" % main_script.MAIN_ALIAS)

    def test_a_script_without_a_main_guard_is_refused_with_the_fix(self):
        done = self.run_script("main_script_unguarded_worker.py")
        self.assertNotEqual(done.returncode, 0)
        self.assertIn("defined in the script run as __main__", done.stderr)
        self.assertIn('has no `if __name__ == "__main__":` guard', done.stderr)
        self.assertIn("Put the start under that guard", done.stderr)


class MainGuardTests(unittest.TestCase):
    """How the runner tells whether a script guards its start (no server needed)."""

    def guarded(self, text):
        with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
            f.write(text)
        try:
            return main_script.has_main_guard(f.name)
        finally:
            os.unlink(f.name)

    def test_a_top_level_guard_either_way_round(self):
        self.assertTrue(self.guarded('if __name__ == "__main__":\n    main()\n'))
        self.assertTrue(self.guarded("if '__main__' == __name__:\n    main()\n"))

    def test_no_guard_a_nested_one_or_another_comparison(self):
        self.assertFalse(self.guarded("main()\n"))
        self.assertFalse(self.guarded('def f():\n    if __name__ == "__main__":\n        main()\n'))
        self.assertFalse(self.guarded('if __name__ != "__main__":\n    main()\n'))
        self.assertFalse(self.guarded("this is not python"))
