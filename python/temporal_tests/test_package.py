"""The ``wfjail.temporal`` package itself, no server needed: the SDK version check, no work at
import time, one command-type table for the contexts, the failure hints.

    target/test-venv/bin/python -m unittest discover -s python/temporal_tests -p test_package.py
"""

import os
import subprocess
import sys
import unittest
from unittest import mock

import temporalio
from temporalio.api.enums.v1 import CommandType
from temporalio.bridge.proto.workflow_activation import WorkflowActivationJob
from temporalio.bridge.proto.workflow_completion import WorkflowActivationCompletion

from test_worker_trust import FakeSession, _activation, _det, _empty_commands
from wfjail.errors import ProtocolError
from wfjail.temporal import JailedWorkflowRunner, UntestedTemporalio, contexts, relays, sdk
from wfjail.temporal import worker

HERE = os.path.dirname(os.path.abspath(__file__))


class VersionCheckTests(unittest.TestCase):
    def test_an_untested_temporalio_fails_loudly_naming_both_versions_and_the_private_uses(self):
        with self.assertRaises(UntestedTemporalio) as raised:
            sdk.check_version("1.99.0")
        said = str(raised.exception)
        self.assertIn("temporalio 1.99.0 is installed", said)
        self.assertIn("1.35.x", said)
        self.assertIn(os.path.join("temporal", "sdk.py"), said)

    def test_the_tested_versions_pass(self):
        sdk.check_version()  # the installed one: the version scripts/test pins
        sdk.check_version("1.35.0")
        sdk.check_version("1.35.9")

    def test_the_runner_checks_the_version_when_it_is_made(self):
        with mock.patch.object(temporalio, "__version__", "2.0.0"):
            with self.assertRaises(UntestedTemporalio):
                JailedWorkflowRunner(wfjail="/nonexistent/wfjail")


def _python(code):
    """``code``'s stdout in a fresh interpreter of this venv (this directory importable)."""
    return subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(
            [HERE] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])},
        timeout=120).stdout.strip()


class NoWorkAtImportTests(unittest.TestCase):
    WARM = {"WFJAIL_TEMPORAL_WARM": "direct_workflows:Direct"}

    def test_importing_the_package_warms_nothing_up_even_with_classes_named(self):
        with mock.patch.dict(os.environ, self.WARM):
            out = _python("import sys, wfjail.temporal.child; "
                          "print('direct_workflows' in sys.modules)")
        self.assertEqual(out, "False")

    def test_the_zygotes_warm_up_is_the_call_its_preload_list_names(self):
        from wfjail.temporal import child

        module, _, function = child.WARM_UP.partition(":")
        with mock.patch.dict(os.environ, self.WARM):
            out = _python("import sys, importlib; importlib.import_module(%r).%s(); "
                          "print('direct_workflows' in sys.modules)" % (module, function))
        self.assertEqual(out, "True")


class WorkflowLogTests(unittest.TestCase):
    def test_a_record_reaches_the_worker_once_however_many_instances_the_process_built(self):
        # The zygote's warm-up builds three instances per class before it forks a child,
        # which builds its own: each added a handler, and a record went out once per handler.
        out = _python("import logging; from wfjail.temporal import child; "
                      "child.warm_up(['direct_workflows:Direct']); "
                      "child.warm_up(['direct_workflows:Direct']); "
                      "sent = []; child.guest.log = lambda text, level: sent.append(text); "
                      "child.guest.connected = lambda: True; "
                      "logging.getLogger('temporalio.workflow').warning('once'); "
                      "import json; print([json.loads(t[len(child.RECORD_MARK):])['msg'] "
                      "for t in sent])")
        self.assertEqual(out, "['once']")


class WarmUpTests(unittest.TestCase):
    # What the zygote's warm-up leaves in the process every session child is forked from,
    # read in a fresh interpreter after the warm-up as the zygote runs it (and a collection,
    # as the zygote's before its freeze).
    LEFT = """
import asyncio, gc, io, json, logging, sys
err = io.StringIO(); sys.stderr = err
from wfjail.temporal import child
import temporalio.worker._workflow_instance as wi
child.warm_up_from_env()
gc.collect()
kinds = (wi._WorkflowInstanceImpl, child._WarmUp, asyncio.Task, asyncio.Future,
         asyncio.AbstractEventLoop, logging.LogRecord)
left = sorted({type(o).__name__ for o in gc.get_objects() if isinstance(o, kinds)})
sys.stderr = sys.__stderr__
print(json.dumps({
    "left": left, "running": asyncio._get_running_loop() is not None,
    "set_loop": asyncio.get_event_loop_policy()._local._loop is not None,
    "handlers": [type(h).__name__ for h in logging.getLogger().handlers],
    "metrics": child._metric_records, "calls": child.take_calls(),
    "warnings_sent": child._warnings_sent, "stderr": err.getvalue(),
    "direct": "direct_workflows" in sys.modules}))
"""

    def test_the_warm_up_workflow_completes_every_activation(self):
        from wfjail.temporal import child

        child.warm_runs(2)  # raises if an activation of the warm-up workflow failed

    def test_the_code_a_run_writes_is_relocated_and_its_originals_kept(self):
        # The named classes' code and what a run writes are copies made together; the
        # originals stay alive (freed, their holes were filled by each child's allocations).
        out = _python("""
import types, direct_workflows as d
from wfjail.temporal import child
orig = d.Direct.run.__code__
activate = child._build.__code__
child.warm_up(['direct_workflows:Direct'])
print(d.Direct.run.__code__ is not orig, d.Direct.run.__code__.co_qualname == orig.co_qualname,
      any(c is orig for c in child._relocated_originals),
      child._build.__code__ is not activate)
""")
        self.assertEqual(out, "True True True True")

    def test_the_warm_up_leaves_no_loop_task_instance_handler_record_or_counter(self):
        for env in ({"WFJAIL_TEMPORAL_WARM": "direct_workflows:Direct"},
                    {"WFJAIL_TEMPORAL_WARM": ""}):
            with self.subTest(env=env), mock.patch.dict(os.environ, env):
                import json

                got = json.loads(_python(self.LEFT))
                self.assertEqual(got["left"], [])
                self.assertFalse(got["running"])
                self.assertFalse(got["set_loop"])
                self.assertEqual(got["handlers"], ["_ToWorker"])
                self.assertEqual(got["metrics"], [])
                self.assertEqual(got["calls"], [])
                self.assertEqual(got["warnings_sent"], 0)
                self.assertEqual(got["stderr"], "")  # no record, no warning
                self.assertEqual(got["direct"], bool(env["WFJAIL_TEMPORAL_WARM"]))


class CommandTypeTests(unittest.TestCase):
    def test_every_resolving_job_resolves_a_command_that_has_a_context(self):
        for job, command in contexts.RESOLVED_BY.items():
            self.assertIn(command, contexts.COMMAND_TYPES, job)
            self.assertIn(job, WorkflowActivationJob.DESCRIPTOR.fields_by_name, job)

    def test_a_child_start_that_succeeded_leaves_the_childs_context_until_it_resolves(self):
        started, failed = WorkflowActivationJob(), WorkflowActivationJob()
        started.resolve_child_workflow_execution_start.seq = 3
        started.resolve_child_workflow_execution_start.succeeded.run_id = "child-run"
        failed.resolve_child_workflow_execution_start.seq = 4
        failed.resolve_child_workflow_execution_start.failed.workflow_id = "child"
        child = int(CommandType.COMMAND_TYPE_START_CHILD_WORKFLOW_EXECUTION)
        self.assertEqual(contexts.resolved_keys(_activation(started, failed)), [(child, 4)])

    def test_a_local_activity_shares_the_activity_command_type(self):
        completion = WorkflowActivationCompletion(run_id="run-1")
        cmd = completion.successful.commands.add()
        cmd.schedule_local_activity.seq = 7
        cmd.schedule_local_activity.activity_type = "greet"
        got = contexts.command_contexts(_det().info, completion)
        key = (int(CommandType.COMMAND_TYPE_SCHEDULE_ACTIVITY_TASK), 7)
        self.assertEqual(list(got), [key])
        self.assertTrue(got[key].is_local)


class FailureHintTests(unittest.TestCase):
    def test_too_many_commands_are_not_blamed_on_max_reply_bytes(self):
        inst = worker._JailedInstance(
            FakeSession(_empty_commands(relays.MAX_COMPLETION_COMMANDS + 1)), _det())
        message = inst.activate(_activation()).failed.failure.message
        self.assertIn("commands, over the", message)
        self.assertNotIn("max_reply_bytes", message)

    def test_a_frame_over_the_sessions_bound_names_max_reply_bytes(self):
        def oversized(session):
            raise ProtocolError("oversized", "a RESULT frame of 9 bytes from the guest, over "
                                "the 8 this session reads")

        inst = worker._JailedInstance(FakeSession(oversized), _det())
        message = inst.activate(_activation()).failed.failure.message
        self.assertIn("over the 8 this session reads", message)
        self.assertIn("JailedWorkflowRunner(max_reply_bytes=...)", message)

    def test_a_completion_over_max_reply_bytes_says_it_once(self):
        inst = worker._JailedInstance(FakeSession(_empty_commands(20)), _det(),
                                      max_reply_bytes=16)
        message = inst.activate(_activation()).failed.failure.message
        self.assertEqual(message.count("max_reply_bytes"), 1, message)


if __name__ == "__main__":
    unittest.main()
