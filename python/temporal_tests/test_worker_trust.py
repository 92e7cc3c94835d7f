"""What the Temporal worker takes from a confined child: each test is a child that lies.

The worker-side handlers of ``wfjail.temporal`` are fed forged replies, log records, metric
records and upcalls directly (a session whose "child" answers what the test says), as a
hostile workflow that reaches into the child-side wfjail code could send them. No server is
needed:

    target/test-venv/bin/python -m unittest discover -s python/temporal_tests -k WorkerTrust
"""

import asyncio
import datetime
import json
import linecache
import logging
import struct
import sys
import threading
import types
import unittest
from unittest import mock

import temporalio.common
import temporalio.workflow
from temporalio.api.enums.v1 import CommandType
from temporalio.bridge.proto.workflow_activation import WorkflowActivation
from temporalio.bridge.proto.workflow_completion import WorkflowActivationCompletion
from temporalio.worker._command_aware_visitor import CommandInfo

from wfjail import temporal as T


def _info(**kw):
    fields = dict(
        attempt=1, continued_run_id=None, cron_schedule=None, execution_timeout=None,
        first_execution_run_id="run-1", headers={}, namespace="tenant-a",
        original_execution_run_id="run-1", parent=None, root=None, raw_memo={},
        retry_policy=None, run_id="run-1", run_timeout=None, search_attributes={},
        start_time=datetime.datetime.fromtimestamp(0, datetime.timezone.utc),
        workflow_start_time=datetime.datetime.fromtimestamp(0, datetime.timezone.utc),
        task_queue="queue-a", task_timeout=datetime.timedelta(),
        typed_search_attributes=temporalio.common.TypedSearchAttributes.empty,
        workflow_id="wf-a", workflow_type="Honest",
        priority=temporalio.common.Priority.default)
    fields.update(kw)
    return temporalio.workflow.Info(**fields)


def _det(**extern):
    return types.SimpleNamespace(info=_info(), extern_functions=extern,
                                 patch_activation_callback=None)


def _reply(completion, side=None):
    data = completion.SerializeToString()
    return struct.pack(">I", len(data)) + data + json.dumps(side or {}).encode()


class FakeSession:
    """A session whose child answers each call with the next of ``replies`` (bytes, or a
    callable of the session giving bytes)."""

    def __init__(self, *replies):
        self.replies = list(replies)
        self.violations = []
        self.interrupted = threading.Event()
        self.closed = False

    def call(self, request, time_ns=None):
        reply = self.replies.pop(0)
        return reply(self) if callable(reply) else reply

    def interrupt(self):
        self.interrupted.set()

    def abort(self):
        self.closed = True

    def close(self):
        self.closed = True


def _activation(*jobs):
    act = WorkflowActivation(run_id="run-1")
    for job in jobs:
        act.jobs.add().CopyFrom(job)
    return act


def _start_job():
    from temporalio.bridge.proto.workflow_activation import WorkflowActivationJob

    job = WorkflowActivationJob()
    job.initialize_workflow.workflow_type = "Honest"
    return job


class SerializationContextTests(unittest.TestCase):
    """The payload codec's contexts are the worker's: derived from the run's info and the
    completion's own commands, never from what the child says about them."""

    def _completion(self, seqs):
        completion = WorkflowActivationCompletion(run_id="run-1")
        for seq in seqs:
            cmd = completion.successful.commands.add()
            cmd.schedule_activity.seq = seq
            cmd.schedule_activity.activity_id = str(seq)
            cmd.schedule_activity.activity_type = "greet"
            cmd.schedule_activity.task_queue = "queue-a"
        return completion

    def test_a_child_cannot_choose_the_tenant_of_its_activitys_payloads(self):
        # The child's side channel claims another tenant's namespace and workflow for its
        # activity, and contexts for 1,000 commands it never issued.
        act_kind = int(CommandType.COMMAND_TYPE_SCHEDULE_ACTIVITY_TASK)
        forged = [[act_kind, 1, "ActivitySerializationContext", {
            "namespace": "tenant-b", "workflow_id": "victim", "workflow_type": "Victim",
            "activity_type": "greet", "activity_id": "1", "activity_task_queue": "queue-b",
            "is_local": False}]]
        forged += [[act_kind, seq, "WorkflowSerializationContext",
                    {"namespace": "tenant-b", "workflow_id": "victim-%d" % seq}]
                   for seq in range(2, 1002)]
        inst = T._JailedInstance(
            FakeSession(_reply(self._completion([1]), {"contexts": forged})), _det())
        inst.activate(_activation(_start_job()))
        ctx = inst.get_serialization_context(CommandInfo(act_kind, 1))
        self.assertEqual(type(ctx).__name__, "ActivitySerializationContext")
        self.assertEqual((ctx.namespace, ctx.workflow_id, ctx.workflow_type),
                         ("tenant-a", "wf-a", "Honest"))
        self.assertEqual((ctx.activity_type, ctx.activity_id, ctx.activity_task_queue,
                          ctx.is_local), ("greet", None, "queue-a", False))
        # Commands it never issued get the workflow's own context; only the completion's
        # command has one of its own.
        other = inst.get_serialization_context(CommandInfo(act_kind, 5))
        self.assertEqual((other.namespace, other.workflow_id), ("tenant-a", "wf-a"))
        self.assertEqual(len(inst._contexts), 1)

    def test_a_resolved_command_drops_its_context_and_the_map_is_bounded(self):
        from temporalio.bridge.proto.workflow_activation import WorkflowActivationJob

        act_kind = int(CommandType.COMMAND_TYPE_SCHEDULE_ACTIVITY_TASK)
        resolve = WorkflowActivationJob()
        resolve.resolve_activity.seq = 1
        many = self._completion(range(1, T.MAX_COMMAND_CONTEXTS + 51))
        inst = T._JailedInstance(FakeSession(
            _reply(self._completion([1, 2])), _reply(WorkflowActivationCompletion(
                run_id="run-1", successful={})), _reply(many)), _det())
        inst.activate(_activation(_start_job()))
        self.assertEqual(len(inst._contexts), 2)
        inst.activate(_activation(resolve))
        self.assertEqual(list(inst._contexts), [(act_kind, 2)])
        inst.activate(_activation())
        self.assertEqual(len(inst._contexts), T.MAX_COMMAND_CONTEXTS)


if __name__ == "__main__":
    unittest.main()
