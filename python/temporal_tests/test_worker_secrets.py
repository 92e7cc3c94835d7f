"""The worker's own files against its workflows (issue 27): a real worker run as a script,
laid out as Temporal's samples are (workflows.py, activities.py and worker.py in one
directory), keeps a key, an `.env` and its log beside it and in its working directory; a
workflow under the runner's default policy cannot read any of them, and the refusal names
the policy and the path, in the task's failure and in the worker's log. The samples' own
workflow (an activity imported from activities.py) still runs.

    WFJAIL_BIN=target/x86_64-unknown-linux-musl/debug/wfjail \\
        target/test-venv/bin/python -m unittest discover -s python/temporal_tests -p test_worker_secrets.py
"""

import asyncio
import importlib.util
import json
import os
import py_compile
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import unittest
import uuid

from test_jailed_runner import DevServerTestCase, _Capture
from wfjail.binary import find_wfjail
from wfjail.temporal import reads
from wfjail.temporal.server import policy_file

ACTIVITIES = '''
from dataclasses import dataclass

from temporalio import activity


@dataclass
class ComposeGreetingInput:
    greeting: str
    name: str


@activity.defn
async def compose_greeting(input: ComposeGreetingInput) -> str:
    return "%s, %s!" % (input.greeting, input.name)
'''

WORKFLOWS = '''
import importlib
from datetime import timedelta

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from activities import ComposeGreetingInput, compose_greeting


@workflow.defn
class GreetingWorkflow:
    @workflow.run
    async def run(self, name: str) -> str:
        return await workflow.execute_activity(
            compose_greeting, ComposeGreetingInput("Hello", name),
            start_to_close_timeout=timedelta(seconds=10))


@workflow.defn
class Snoop:
    """What a hostile workflow does with the worker's files."""

    @workflow.run
    async def run(self, path: str) -> str:
        with open(path) as f:
            return f.read()


@workflow.defn
class LateImports:
    """Imports in a run, after the zygote preloaded this module: one this module names (it is
    readable), one only a string names (it is not)."""

    @workflow.run
    async def run(self) -> list:
        import helpers
        try:
            importlib.import_module("unnamed_" + "helper")
            unnamed = "imported"
        except PermissionError as e:
            unnamed = str(e)
        return [helpers.VALUE, unnamed]
'''

WORKER = '''
"""The samples' worker: python worker.py TARGET QUEUE; its log in worker.log (its cwd)."""
import asyncio
import logging
import sys

from temporalio.client import Client
from temporalio.worker import Worker

from activities import compose_greeting
from workflows import GreetingWorkflow, LateImports, Snoop
from wfjail.temporal import JailedWorkflowRunner


async def main(target, queue):
    client = await Client.connect(target)
    worker = Worker(client, task_queue=queue, activities=[compose_greeting],
                    workflows=[GreetingWorkflow, Snoop, LateImports],
                    workflow_runner=JailedWorkflowRunner())
    await worker.run()


if __name__ == "__main__":
    logging.basicConfig(filename="worker.log", level=logging.INFO)
    try:
        asyncio.run(main(sys.argv[1], sys.argv[2]))
    except KeyboardInterrupt:
        pass
'''

# What the worker keeps beside it: an mTLS key, its API key, its own log (another run's line).
SECRETS = {
    "client.key": "-----BEGIN PRIVATE KEY-----\nSECRET-KEY-%s\n",
    ".env": "TEMPORAL_API_KEY=SECRET-API-%s\n",
    "worker.log": "INFO:another run: SECRET-LOG-%s\n",
}


async def _failure_or_result(handle, worker):
    """The first task failure of a run (then terminated), or ``result: ...`` once it
    completed; the first task waits for the worker's server (seconds on a busy machine).
    Raises when the ``worker`` process ended first."""
    while worker.poll() is None:
        async for e in handle.fetch_history_events():
            if e.HasField("workflow_task_failed_event_attributes"):
                await handle.terminate()
                return e.workflow_task_failed_event_attributes.failure.message
            if e.HasField("workflow_execution_completed_event_attributes"):
                return "result: %r" % (await handle.result(),)
        await asyncio.sleep(0.2)
    raise AssertionError("the worker exited with status %s" % worker.returncode)


class WorkerSecretsTests(DevServerTestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="wfjail-secrets-test-")
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.app = os.path.join(self.tmp, "app")    # the worker's script directory
        self.run_dir = os.path.join(self.tmp, "run")  # another working directory
        for d in (self.app, self.run_dir):
            os.mkdir(d)
            for name, text in SECRETS.items():
                path = os.path.join(d, name)
                with open(path, "w") as f:
                    f.write(text % os.path.basename(d))
                os.chmod(path, 0o600)  # as keys are kept: the worker's user's alone
        for name, text in (("activities.py", ACTIVITIES), ("workflows.py", WORKFLOWS),
                           ("worker.py", WORKER), ("helpers.py", "VALUE = 'helped'\n"),
                           ("unnamed_helper.py", "VALUE = 'unnamed'\n")):
            with open(os.path.join(self.app, name), "w") as f:
                f.write(textwrap.dedent(text))

    def start_worker(self, cwd):
        """``python worker.py`` (the app's) started in ``cwd``, as a samples worker is; stopped
        (SIGINT, its pid) at the test's end."""
        asyncio.run(self.server.client())  # the dev server is up
        queue = "secrets-" + uuid.uuid4().hex
        script = os.path.relpath(os.path.join(self.app, "worker.py"), cwd)
        err = open(os.path.join(self.tmp, "worker.stderr"), "w+")
        self.addCleanup(err.close)
        proc = subprocess.Popen([sys.executable, script, self.server.target, queue], cwd=cwd,
                                stdin=subprocess.DEVNULL, stdout=err, stderr=err)

        def stop():
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
                try:
                    proc.wait(60)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        self.addCleanup(stop)
        return proc, queue, err

    async def snoop(self, worker, queue, paths):
        """path -> the first task failure of a Snoop of it, or its result if it completed."""
        client = await self.server.client()
        out = {}
        for path in paths:
            handle = await client.start_workflow("Snoop", path, id=str(uuid.uuid4()),
                                                 task_queue=queue)
            out[path] = await _failure_or_result(handle, worker)
        return out

    def assert_refused(self, failures, cwd):
        for path, message in failures.items():
            full = os.path.normpath(os.path.join(cwd, path))
            self.assertNotIn("SECRET", message, path)
            self.assertEqual(
                message,
                "[Errno 13] Permission denied: %r (wfjail: policy temporal-python does not "
                "let workflow code read %s: grant it in the [filesystem] read list of a "
                "policy that extends it (docs/policy-format.md) and pass "
                "JailedWorkflowRunner(policy=...), or read it in an activity)" % (path, full))

    def worker_log(self, cwd):
        with open(os.path.join(cwd, "worker.log")) as f:
            return f.read()

    def test_a_samples_layout_worker_runs_and_its_files_are_not_readable(self):
        proc, queue, err = self.start_worker(self.app)

        async def go():
            client = await self.server.client()
            greeting = await client.execute_workflow(
                "GreetingWorkflow", "World", id=str(uuid.uuid4()), task_queue=queue)
            late = await client.execute_workflow(
                "LateImports", id=str(uuid.uuid4()), task_queue=queue)
            return greeting, late, await self.snoop(proc, queue, list(SECRETS) + [
                os.path.join(self.app, name) for name in SECRETS])

        greeting, late, failures = asyncio.run(go())
        err.seek(0)
        self.assertIsNone(proc.poll(), err.read())
        self.assertEqual(greeting, "Hello, World!")
        unnamed = os.path.join(self.app, "unnamed_helper.py")
        self.assertEqual(late, ["helped", "[Errno 13] Permission denied: %r" % unnamed])
        self.assertEqual(len(failures), 6)
        self.assert_refused(failures, self.app)
        # The worker's log (the SDK's warning of each failed activation) names both too.
        log = self.worker_log(self.app)
        for path in failures:
            self.assertIn("(wfjail: policy temporal-python does not let workflow code read "
                          "%s:" % os.path.join(self.app, path), log)

    def test_a_worker_run_from_another_directory_keeps_both_directories_files(self):
        proc, queue, err = self.start_worker(self.run_dir)
        here = list(SECRETS)
        beside = [os.path.join(self.app, name) for name in SECRETS]
        failures = asyncio.run(self.snoop(proc, queue, here + beside + ["../app/.env"]))
        err.seek(0)
        self.assertIsNone(proc.poll(), err.read())
        self.assertEqual(len(failures), 7)
        self.assert_refused(failures, self.run_dir)
        log = self.worker_log(self.run_dir)
        self.assertIn("read %s:" % os.path.join(self.run_dir, ".env"), log)
        self.assertIn("read %s:" % os.path.join(self.app, "client.key"), log)


# A project's modules: what the workflow module imports at import, in a function, by a
# literal name, relatively in a package; and what nothing names.
PROJECT = {
    "wf.py": "import importlib\nimport helpers\nfrom pkg import sub\n\n\ndef later():\n"
             "    import late\n    importlib.import_module('named_by_literal')\n",
    "helpers.py": "import json\n",
    "late.py": "",
    "named_by_literal.py": "",
    "unnamed.py": "",
    "pkg/__init__.py": "from . import rel\n",
    "pkg/rel.py": "",
    "pkg/sub.py": "",
    "pkg/data.json": "{}",
    "client.key": "SECRET",
    ".env": "SECRET",
}


class ReadsRuleTests(unittest.TestCase):
    """The rule the generated policy follows, on a project laid out in a temporary
    directory put on the import path (no server)."""

    def setUp(self):
        self.proj = os.path.realpath(tempfile.mkdtemp(prefix="wfjail-reads-test-"))
        self.addCleanup(shutil.rmtree, self.proj, True)
        os.mkdir(os.path.join(self.proj, "pkg"))
        for name, text in PROJECT.items():
            with open(os.path.join(self.proj, name), "w") as f:
                f.write(text)
        # Bytecode as a worker that may write it leaves it (this one may not: the tests'
        # environment sets PYTHONDONTWRITEBYTECODE).
        for name in ("wf.py", "helpers.py"):
            source = os.path.join(self.proj, name)
            py_compile.compile(source, importlib.util.cache_from_source(source))
        sys.path.insert(0, self.proj)
        self.addCleanup(sys.path.remove, self.proj)
        before = set(sys.modules)
        self.addCleanup(lambda: [sys.modules.pop(m) for m in set(sys.modules) - before])
        import wf  # noqa: F401  (the worker imports the workflow module)

    def path(self, name):
        return os.path.join(self.proj, name)

    def test_the_modules_the_workflow_module_imports_are_read_and_nothing_else_there(self):
        granted = reads.reads(["wf"])
        mine = sorted(p for p in granted.read if p.startswith(self.proj))
        self.assertEqual(mine, sorted(
            [self.path(n) for n in ("wf.py", "helpers.py", "late.py", "named_by_literal.py",
                                    "pkg/__init__.py", "pkg/rel.py", "pkg/sub.py")]
            + [importlib.util.cache_from_source(self.path(n)) for n in ("wf.py",
                                                                          "helpers.py")]))
        self.assertIn(self.proj, granted.list)
        # The interpreter whole: its prefix (this venv's, inside the repository's
        # directory, which is listed only: the working directory of the tests).
        self.assertIn(os.path.abspath(sys.prefix), granted.read)
        self.assertNotIn(os.getcwd(), granted.read)

    def test_the_worker_script_is_read_when_a_class_is_defined_there(self):
        script = self.path("worker.py")
        with open(script, "w") as f:
            f.write("import helpers\n")
        granted = reads.reads([], main=script)
        self.assertEqual(sorted(p for p in granted.read if p.startswith(self.proj)), sorted(
            [script, self.path("helpers.py"),
             importlib.util.cache_from_source(self.path("helpers.py"))]))

    def generated(self, policy):
        tmp = tempfile.mkdtemp(prefix="wfjail-reads-policy-")
        self.addCleanup(shutil.rmtree, tmp, True)
        path = policy_file(tmp, policy, ["wf:Workflow"], ["temporalio.worker", "wf"], (),
                           find_wfjail())
        shown = subprocess.run([find_wfjail(), "policy", "show", "--json", path],
                               capture_output=True, text=True, check=True)
        return json.loads(shown.stdout)["filesystem"]

    def test_temporal_pythons_cwd_grant_is_dropped_and_a_users_own_grant_kept(self):
        fs = self.generated("temporal-python")
        self.assertNotIn("${cwd}", fs["read"])
        self.assertIn("${exe_dir}/..", fs["read"])
        self.assertIn(self.path("wf.py"), fs["read"])
        self.assertIn(self.proj, fs["list"])
        self.assertNotIn(self.proj, fs["read"])
        # A user's policy that grants a directory whole: theirs to grant.
        mine = self.path("mine.toml")
        with open(mine, "w") as f:
            f.write('extends = "temporal-python"\n[filesystem]\nread = [%s]\n'
                    % json.dumps(self.path("pkg")))
        fs = self.generated(mine)
        self.assertNotIn("${cwd}", fs["read"])
        self.assertIn(self.path("pkg"), fs["read"])
        # A policy without ${cwd}: nothing to drop.
        self.assertIn(self.path("wf.py"), self.generated("strict")["read"])

    def test_a_worker_run_from_a_directory_read_whole_is_warned_about(self):
        here = os.getcwd()
        os.chdir(sys.prefix)  # as if the project were inside the venv
        try:
            with _Capture("wfjail.temporal") as logged:
                self.generated("temporal-python")
        finally:
            os.chdir(here)
        warnings = [r.getMessage() for r in logged if "which workflow code may read" in
                    r.getMessage()]
        self.assertEqual(len(warnings), 1, warnings)
        self.assertIn("the worker's directory %s lies under %s" % (
            os.path.abspath(sys.prefix), os.path.abspath(sys.prefix)), warnings[0])
