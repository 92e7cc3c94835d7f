"""What the Temporal worker takes from a confined child: each test is a child that lies.

The worker-side handlers of ``wfjail.temporal`` are fed forged replies, log records, metric
records and upcalls directly (a session whose "child" answers what the test says), as a
hostile workflow that reaches into the child-side wfjail code could send them. No server is
needed:

    target/test-venv/bin/python -m unittest discover -s python/temporal_tests -k WorkerTrust
"""

import asyncio
import contextlib
import datetime
import json
import linecache
import logging
import struct
import sys
import threading
import time
import types
import unittest
from unittest import mock

import temporalio.common
import temporalio.workflow
from temporalio.api.enums.v1 import CommandType
from temporalio.bridge.proto.workflow_activation import WorkflowActivation
from temporalio.bridge.proto.workflow_completion import WorkflowActivationCompletion
from temporalio.worker._command_aware_visitor import CommandInfo

from wfjail.errors import ProtocolError
from wfjail.temporal import contexts, relays, worker
from wfjail.temporal import stack as child_stack


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


@contextlib.contextmanager
def _workflow_records():
    """The records of the worker's ``temporalio.workflow`` logger while in use, at every
    level (the logger's handlers and level as they were after)."""
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = logging.getLogger("temporalio.workflow")
    logger.addHandler(handler)
    old_level = logger.level
    logger.setLevel(logging.DEBUG)
    try:
        yield records
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)


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
        inst = worker._JailedInstance(
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
        many = self._completion(range(1, contexts.MAX_COMMAND_CONTEXTS + 51))
        inst = worker._JailedInstance(FakeSession(
            _reply(self._completion([1, 2])), _reply(WorkflowActivationCompletion(
                run_id="run-1", successful={})), _reply(many)), _det())
        inst.activate(_activation(_start_job()))
        self.assertEqual(len(inst._contexts), 2)
        inst.activate(_activation(resolve))
        self.assertEqual(list(inst._contexts), [(act_kind, 2)])
        inst.activate(_activation())
        self.assertEqual(len(inst._contexts), contexts.MAX_COMMAND_CONTEXTS)

    def test_a_command_with_an_oversized_name_keeps_no_context(self):
        act_kind = int(CommandType.COMMAND_TYPE_SCHEDULE_ACTIVITY_TASK)
        completion = self._completion([1, 2])
        completion.successful.commands[0].schedule_activity.activity_type = "a" * 1_000_000
        inst = worker._JailedInstance(FakeSession(_reply(completion)), _det())
        inst.activate(_activation(_start_job()))
        self.assertEqual(list(inst._contexts), [(act_kind, 2)])
        ctx = inst.get_serialization_context(CommandInfo(act_kind, 1))
        self.assertEqual(type(ctx).__name__, "WorkflowSerializationContext")


def _interrupted_failure(stack, message="wfjail.Interrupted: the worker interrupted this call"):
    completion = WorkflowActivationCompletion(run_id="run-1")
    completion.failed.failure.message = message
    completion.failed.failure.stack_trace = stack
    return _reply(completion)


def _forged_stack(frames=200, line=100_000):
    """200 frames at line 100,000 with long names carrying escapes and forged log lines."""
    out = ["Traceback (most recent call last):\n"]
    for i in range(frames):
        out.append('  File "/app/wf%d.py\x1b]0;owned\x07", line %d, in run%s\n'
                   '    x = 1 # \nWARNING forged record\x1b[2J\n'
                   % (i, line, "\u2028" + "n" * 400))
    return "".join(out)


class DeadlockTests(unittest.TestCase):
    """A run that never yields: the worker's event loop never waits on its child, and what the
    child tells of its stack is bounded, escaped and left nowhere in the worker."""

    def _stuck(self, answer_after_interrupt):
        """A session whose call answers only once interrupted (``answer_after_interrupt``:
        its reply), or never (None: stuck outside Python code, until ``release``)."""
        release = threading.Event()

        def call(session):
            if answer_after_interrupt is None:
                release.wait(60)
                return _reply(WorkflowActivationCompletion(run_id="run-1", successful={}))
            session.interrupted.wait(60)
            return answer_after_interrupt

        return FakeSession(call), release

    def _activate_in_thread(self, inst):
        out = {}
        thread = threading.Thread(target=lambda: out.update(c=inst.activate(_activation())))
        thread.start()
        for _ in range(500):
            if inst._calling:
                break
            threading.Event().wait(0.01)
        return thread, out

    def test_the_sdks_deadlock_handler_never_waits_on_the_loop_for_the_child(self):
        # The child is stuck outside Python code: it never answers the interruption. The SDK
        # calls get_thread_id on its event loop; with the old wait made 30 s long, a loop that
        # waited on the child would be blocked for it.
        session, release = self._stuck(None)
        inst = worker._JailedInstance(session, _det())
        with mock.patch.object(worker, "DEADLOCK_INTERRUPT_AFTER", 600.0, create=True), \
                mock.patch.object(worker, "DEADLOCK_STACK_WAIT", 30.0, create=True):
            thread, _ = self._activate_in_thread(inst)

            async def sdk_deadlock_handler():
                loop = asyncio.get_running_loop()
                start = loop.time()
                first = inst.get_thread_id()
                second = inst.get_thread_id()  # attempt_deadlock_interruption
                return first, second, loop.time() - start

            try:
                first, second, blocked = asyncio.run(sdk_deadlock_handler())
                # Asked off the loop, the child is interrupted all the same.
                self.assertTrue(session.interrupted.wait(10))
            finally:
                release.set()
                thread.join(10)
        self.assertEqual((first, second), (None, None))
        self.assertLess(blocked, 5.0)

    def test_a_forged_stack_is_bounded_escaped_and_leaves_nothing_in_linecache(self):
        stack = _forged_stack()
        session, _ = self._stuck(_interrupted_failure(stack))
        inst = worker._JailedInstance(session, _det())
        cached = set(linecache.cache)
        records = []
        handler = logging.Handler()
        handler.emit = records.append
        logger = logging.getLogger("wfjail.temporal")
        logger.addHandler(handler)
        try:
            with mock.patch.object(worker, "DEADLOCK_INTERRUPT_AFTER", 600.0, create=True):
                thread, out = self._activate_in_thread(inst)

                async def sdk_deadlock_handler():
                    tid = inst.get_thread_id()
                    frames = sys._current_frames().get(tid) if tid else None
                    inst.get_thread_id()
                    return frames

                frames = asyncio.run(sdk_deadlock_handler())
                thread.join(30)
        finally:
            logger.removeHandler(handler)
        self.assertFalse(thread.is_alive())
        self.assertIsNone(frames)
        self.assertEqual(set(linecache.cache) - cached, set())
        # The activation fails as deadlocked, with the child's stack: its innermost frames
        # only, each field cut and escaped.
        failure = out["c"].failed.failure
        self.assertIn("[TMPRL1101] Potential deadlock detected", failure.message)
        shown = failure.stack_trace
        self.assertEqual(shown.count(" [confined child]"), child_stack.MAX_STACK_FRAMES)
        self.assertIn('File "/app/wf199.py\\x1b]0;owned\\x07 [confined child]", '
                      'line 100000, in run\\u2028nnn', shown)
        self.assertLess(len(shown), child_stack.MAX_STACK_FRAMES * 4 * child_stack.MAX_STACK_NAME)
        worker._CLOSER.wait_for_closes(10)  # an interrupted run's close is the closer thread's
        self.assertTrue(session.closed)
        logged = [r.getMessage() for r in records if "did not yield" in r.getMessage()]
        self.assertEqual(len(logged), 1)
        self.assertEqual(logged[0].count(" [confined child]"), child_stack.MAX_STACK_FRAMES)
        for text in (shown, logged[0]):
            self.assertNotIn("\x1b", text)
            self.assertNotIn("\x07", text)
            self.assertNotIn("\u2028", text)
            self.assertNotIn("\nWARNING forged record", text)

    def test_a_run_past_its_deadline_is_interrupted_off_the_loop_and_fails_as_deadlocked(self):
        # Nothing calls get_thread_id: the watchdog interrupts the child itself, in time for
        # the failure to carry where the workflow was.
        told = ('Traceback (most recent call last):\n'
                '  File "/app/wf.py", line 40, in run\n'
                '    while True: x += 1\n'
                '  File "/x/wfjail/guest.py", line 114, in _interrupt\n'
                '    raise Interrupted()\n')
        session, _ = self._stuck(_interrupted_failure(told))
        inst = worker._JailedInstance(session, _det())
        with mock.patch.object(worker, "DEADLOCK_INTERRUPT_AFTER", 0.2, create=True):
            thread, out = self._activate_in_thread(inst)
            thread.join(30)
        failure = out["c"].failed.failure
        self.assertIn("[TMPRL1101] Potential deadlock detected", failure.message)
        self.assertEqual(failure.stack_trace, '  File "/app/wf.py [confined child]", line 40, '
                                              'in run\n    while True: x += 1\n')
        worker._CLOSER.wait_for_closes(10)  # an interrupted run's close is the closer thread's
        self.assertTrue(session.closed)

    def test_an_eviction_of_a_run_that_answers_its_interruption_leaves_the_close_to_the_closer(self):
        # The SDK evicts a run whose activation it gave up on; the child answers the
        # interruption, and its close (the child's exit and reap, here held until the test
        # lets it end) comes off the eviction's path, as any evicted run's.
        session, _ = self._stuck(_interrupted_failure("Traceback (most recent call last):\n"))
        let_close = threading.Event()

        def held_close():
            let_close.wait(10)
            session.closed = True

        session.close = held_close
        inst = worker._JailedInstance(session, _det())
        from temporalio.bridge.proto.workflow_activation import WorkflowActivationJob
        evict = WorkflowActivationJob()
        evict.remove_from_cache.message = "deadlocked"
        with mock.patch.object(worker, "DEADLOCK_INTERRUPT_AFTER", 600.0, create=True):
            thread, _ = self._activate_in_thread(inst)
            try:
                completion = inst.activate(_activation(evict))
                closed_before_eviction_returned = session.closed
            finally:
                let_close.set()
            thread.join(30)
        self.assertTrue(session.interrupted.is_set())
        self.assertTrue(completion.HasField("successful"), completion)
        self.assertFalse(closed_before_eviction_returned,
                         "the eviction returned before the child's close ended")
        self.assertTrue(worker._CLOSER.wait_for_closes(10))
        self.assertTrue(session.closed)

class LogTests(unittest.TestCase):
    def test_a_childs_log_text_cannot_forge_records_or_send_escapes(self):
        with _workflow_records() as records:
            on_log = relays.LogRelay(_info())
            said = ("done\n2026-12-01 ERROR temporalio.worker credentials rotated\r\x1b[2J"
                    "\x1b]0;owned\x07\u2028\x85tab\tkept " + "x" * 100_000)
            on_log(logging.INFO, said)
            on_log(10_000, "loud")
        text = records[0].getMessage()
        self.assertTrue(text.startswith(
            "done\\x0a2026-12-01 ERROR temporalio.worker credentials rotated\\x0d\\x1b[2J"
            "\\x1b]0;owned\\x07\\u2028\\x85tab\tkept xxx"), text[:200])
        # Cut, then the sender's identity suffix, the worker's (issue 27).
        self.assertTrue(text.endswith("x... (%d more characters) (%s)" % (
            len(said) - relays.MAX_LOG_TEXT, records[0].temporal_workflow)), text[-300:])
        self.assertEqual(records[0].wfjail_run, records[0].temporal_workflow)
        self.assertNotIn("\n", text)
        self.assertEqual(records[0].temporal_workflow["workflow_id"], "wf-a")
        self.assertEqual(records[1].levelno, logging.CRITICAL)


class MetricTests(unittest.TestCase):
    """A child's metric records on the worker's real meter (a Core runtime with a buffer)."""

    def test_a_child_cannot_take_the_workers_names_forge_run_labels_or_flood_series(self):
        from temporalio.runtime import MetricBuffer, Runtime, TelemetryConfig

        buffer = MetricBuffer(100_000)
        runtime = Runtime(telemetry=TelemetryConfig(metrics=buffer))
        det = _det(__temporal_get_metric_meter=lambda: runtime.metric_meter)
        first = [
            ["gauge", "temporal_workflow_completed", "forged", "ms", 5, {}],
            ["counter", "jobs", None, None, 1, {"workflow_type": "Victim",
                                                "namespace": "tenant-b", "k": "v"}],
            ["counter", "big", None, None, 2**64, {}],
            ["histogram_float", "inf", None, None, float("inf"), {}],
            ["gauge", "text", None, None, "12", {}],
            ["counter", "bad name\n", None, None, 1, {}],
        ]
        spray = [["counter", "spray", None, None, 1, {"i": i}] for i in range(4998)]
        replies = [_reply(WorkflowActivationCompletion(run_id="run-1", successful={}),
                          {"metrics": batch})
                   for batch in [first + spray[:994]] + [spray[i:i + 1000]
                                                         for i in range(994, 4998, 1000)]]
        inst = worker._JailedInstance(FakeSession(*replies), det)
        for _ in replies:
            self.assertTrue(inst.activate(_activation()).HasField("successful"))
        updates = buffer.retrieve_updates()
        names = {u.metric.name for u in updates}
        self.assertEqual(names, {"jobs", "spray"})
        jobs = [dict(u.attributes) for u in updates if u.metric.name == "jobs"]
        self.assertEqual(len(jobs), 1)
        self.assertEqual((jobs[0]["namespace"], jobs[0]["workflow_type"],
                          jobs[0]["task_queue"], jobs[0]["k"]),
                         ("tenant-a", "Honest", "queue-a", "v"))
        series = {tuple(sorted(dict(u.attributes).items())) for u in updates
                  if u.metric.name == "spray"}
        self.assertEqual(len(series), relays.MAX_METRIC_SERIES - 1)


class ReplyTests(unittest.TestCase):
    def test_a_malformed_reply_fails_the_task_and_a_completion_is_the_runs_own(self):
        other = WorkflowActivationCompletion(run_id="another-run", successful={})
        inst = worker._JailedInstance(FakeSession(
            struct.pack(">I", 3) + b"\xff\xff\xff" + b"[" * 100_000,
            _reply(other) + b"[" * 100_000), _det())
        failed = inst.activate(_activation())
        self.assertIn("not a WorkflowActivationCompletion", failed.failed.failure.message)
        done = inst.activate(_activation())
        self.assertEqual((done.run_id, done.HasField("successful")), ("run-1", True))



# -- the hostile-guest pass (issue 16, Done when) ----------------------------------------------

_FORGED_LINE = "\n2026-12-01 ERROR temporalio.worker credentials rotated\x1b[2J\x1b]0;owned\x07"


class ViolationTextTests(unittest.TestCase):
    """What wfjail denied a child is wfjail's word, but a violation's arguments (a path, an
    argv) are the child's bytes: the worker's log line and the task failure show them escaped,
    so that a child cannot add a line of its own to either."""

    def _violation(self, action):
        return {"category": "filesystem", "syscall": "openat",
                "args": '"/tmp/x' + _FORGED_LINE + '\u2028", O_RDONLY', "action": action,
                "rule": "filesystem.read", "hint": "add /tmp/x" + _FORGED_LINE}

    def test_a_denied_paths_text_cannot_forge_lines_of_the_failure_or_the_log(self):
        session = FakeSession(_reply(WorkflowActivationCompletion(run_id="run-1",
                                                                  successful={})),
                              _reply(WorkflowActivationCompletion(run_id="run-1",
                                                                  successful={})))
        inst = worker._JailedInstance(session, _det())
        session.violations = [self._violation("denied")]
        failed = inst.activate(_activation())
        message = failed.failed.failure.message
        lines = message.split("\n")
        self.assertEqual(len(lines), 2, message)
        self.assertIn("\\x0a2026-12-01 ERROR", lines[1])
        self.assertNotIn("\x1b", message)
        self.assertNotIn("\u2028", message)
        session.violations = [self._violation("warned")]
        with self.assertLogs("wfjail.temporal", "WARNING") as logs:
            inst.activate(_activation())
        text = logs.records[0].getMessage()
        self.assertEqual(len(text.split("\n")), 2, text)
        self.assertNotIn("\x1b", text)



class GuestErrorTests(unittest.TestCase):
    """A child whose handler raises (not its workflow: the SDK turns a workflow's exceptions
    into a failed completion) sends an ERROR frame of its own making: type, message and
    traceback, each up to a frame. The failure the worker makes of it is marked as the
    child's, bounded and escaped; its stack is parsed as a deadlock's is."""

    def test_a_forged_handler_error_is_bounded_escaped_and_marked_as_the_childs(self):
        from wfjail.client import GuestError

        doc = {"type": "wfjail denied workflow Victim (run run-9) what workflow code may not "
                       "do:" + _FORGED_LINE,
               "message": "m" * 3_000_000 + _FORGED_LINE,
               "traceback": _forged_stack(frames=5000)}

        def call(session):
            raise GuestError(doc)

        failed = worker._JailedInstance(FakeSession(call), _det()).activate(_activation())
        failure = failed.failed.failure
        self.assertTrue(failure.message.startswith(
            "wfjail: the confined process of workflow Honest (run run-1) raised outside "
            "workflow code: wfjail denied workflow Victim"), failure.message[:200])
        self.assertNotIn("\n", failure.message)
        self.assertNotIn("\x1b", failure.message)
        self.assertLess(len(failure.message), 3 * child_stack.MAX_CHILD_MESSAGE)
        self.assertLessEqual(failure.stack_trace.count("[confined child]"),
                             child_stack.MAX_STACK_FRAMES)
        self.assertNotIn("\x1b", failure.stack_trace)
        self.assertLess(len(failure.stack_trace), 200_000)



def _empty_commands(count):
    """A completion of ``count`` empty commands, two bytes each on the wire (no protobuf
    object is built here: the child writes such bytes as fast as it likes)."""
    inner = b"\x0a\x00" * count
    size, n = bytearray(), len(inner)
    while True:
        size.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            break
    data = b"\x12" + bytes(size) + inner
    return struct.pack(">I", len(data)) + data


class ReplySizeTests(unittest.TestCase):
    """A reply is at most a frame (16 MiB), but its protobuf decodes to 30 times that in the
    worker (an empty command is two bytes on the wire, a Python object and a Core struct in
    the worker), and Core holds each command again. The worker takes what the server could
    take (``max_reply_bytes``, default 4 MiB: the server's gRPC limit on a task completion),
    at most MAX_COMPLETION_COMMANDS commands (more than a history holds by default), and a
    side channel of at most MAX_SIDE_CHANNEL bytes."""

    def test_a_reply_past_the_servers_limit_is_refused_before_it_is_decoded(self):
        big = _empty_commands((4 * 1024 * 1024) // 2 + 8)
        inst = worker._JailedInstance(FakeSession(big), _det())
        with mock.patch.object(WorkflowActivationCompletion, "FromString",
                               side_effect=AssertionError("decoded")) as parse:
            failed = inst.activate(_activation())
        self.assertFalse(parse.called)
        self.assertIn("max_reply_bytes", failed.failed.failure.message)

    def test_a_completion_with_more_commands_than_a_history_holds_fails_its_task(self):
        inst = worker._JailedInstance(FakeSession(_empty_commands(relays.MAX_COMPLETION_COMMANDS + 1),
                                             _empty_commands(10)), _det())
        failed = inst.activate(_activation())
        self.assertIn("%d commands" % (relays.MAX_COMPLETION_COMMANDS + 1),
                      failed.failed.failure.message)
        done = inst.activate(_activation())
        self.assertEqual(len(done.successful.commands), 10)

    def test_a_side_channel_past_its_bound_is_not_parsed(self):
        record = ["counter", "jobs", None, None, 1, {}]
        side = {"metrics": [record], "pad": "x" * relays.MAX_SIDE_CHANNEL}
        with mock.patch.object(json, "loads", side_effect=AssertionError("parsed")):
            completion, side = relays.split_reply(
                _reply(WorkflowActivationCompletion(run_id="run-1", successful={}), side))
        self.assertEqual(side, {})
        self.assertEqual(relays.metric_records(side), [])
        self.assertTrue(completion.HasField("successful"))



class UpcallSizeTests(unittest.TestCase):
    """An upcall is decoded on the activation's thread while the child waits: 3 MB of JSON
    (a million zeros) took 2.8 s of the worker's GIL to rebuild, whatever the extern function
    declares. The worker reads at most MAX_UPCALL_BYTES and rebuilds at most
    typed_json.MAX_VALUES values of an upcall; the function is not called past them."""

    def _on_upcall(self, calls):
        def fn(values: list):
            calls.append(len(values))
            return None

        return relays.upcalls_in_worker(_det(fn=fn))

    def test_an_upcall_of_too_many_values_is_refused_before_the_function_runs(self):
        calls = []
        payload = json.dumps({"fn": "fn", "args": [[0] * 200_000]}).encode()
        self.assertLess(len(payload), relays.MAX_UPCALL_BYTES)
        with self.assertRaises(ValueError):
            self._on_upcall(calls)(payload)
        self.assertEqual(calls, [])
        self._on_upcall(calls)(json.dumps({"fn": "fn", "args": [[0] * 1000]}).encode())
        self.assertEqual(calls, [1000])

    def test_an_oversized_upcall_is_not_parsed(self):
        calls = []
        payload = json.dumps({"fn": "fn", "args": [["x" * relays.MAX_UPCALL_BYTES]]}).encode()
        with mock.patch.object(json, "loads", side_effect=AssertionError("parsed")):
            with self.assertRaises(ValueError):
                self._on_upcall(calls)(payload)
        self.assertEqual(calls, [])



class LogFloodTests(unittest.TestCase):
    """A LOG frame costs its child six bytes of limits.output: a session's 16 MiB is 2.8
    million records, each a record of the worker's log (and its handlers' time). The worker
    relays at most MAX_LOG_RECORDS of an activation, then says once how many it dropped."""

    def test_a_flood_of_log_records_is_cut_per_activation_and_counted(self):
        on_log = relays.LogRelay(_info())

        def flood(session):
            for i in range(5000):
                on_log(logging.INFO, "spam %d" % i)
            return _reply(WorkflowActivationCompletion(run_id="run-1", successful={}))

        def quiet(session):
            on_log(logging.INFO, "next activation")
            return _reply(WorkflowActivationCompletion(run_id="run-1", successful={}))

        inst = worker._JailedInstance(FakeSession(flood, quiet), _det(), run_log=on_log)
        with _workflow_records() as records:
            with self.assertLogs("wfjail.temporal", "WARNING") as said:
                inst.activate(_activation())
            inst.activate(_activation())
        texts = [r.getMessage() for r in records]
        self.assertEqual(len(texts), relays.MAX_LOG_RECORDS + 1)
        self.assertEqual(texts[-1], "next activation (%s)" % records[-1].temporal_workflow)
        self.assertEqual(len(said.records), 1)
        self.assertIn("dropped %d log records" % (5000 - relays.MAX_LOG_RECORDS),
                      said.records[0].getMessage())



class SessionFrameTests(unittest.TestCase):
    """The worker's session reads a child's RESULT (or ERROR, LOG, UPCALL) only up to what it
    takes: a 16 MiB frame was read whole (twice its size in memory, per activation in
    flight) before the reply's bound refused it. A frame announced past ``max_frame`` ends
    the session unread."""

    def test_a_result_announced_past_max_frame_is_not_read(self):
        import socket

        from wfjail import client as C
        from wfjail.errors import ProtocolError

        serve, worker = socket.socketpair()
        try:
            worker.settimeout(10)
            session = C.Session("unused", "{}")
            session._max_frame = 1024 * 1024
            session._sock = worker
            # serve relays a RESULT of 8 MiB; only its first MiB has arrived yet.
            serve.sendall(struct.pack("<IB", 8 * 1024 * 1024 + 1, C.RESULT))
            def send_a_mebibyte():
                try:
                    serve.sendall(b"\x00" * (1024 * 1024))
                except OSError:
                    pass  # the worker's end is closed: what the test wants

            threading.Thread(target=send_a_mebibyte, daemon=True).start()
            with self.assertRaises(ProtocolError) as raised:
                session.call(b"activation")
            self.assertEqual(raised.exception.code, "oversized")
            self.assertIsNone(session._sock)
        finally:
            serve.close()
            worker.close()



class StubbornChildTests(unittest.TestCase):
    """A child that ignores its interruption (a workflow loop that catches
    ``wfjail.Interrupted``, or native code) held the activation's executor thread until the
    call timeout (30 s by default), and with the SDK's safe eviction, which waits on a
    deadlocked activation before it evicts, the run's slot: a few such runs took every
    thread of the worker's workflow executor. The watchdog ends such a child INTERRUPT_WAIT
    after it interrupted it."""

    def test_a_child_that_ignores_its_interruption_is_ended_by_the_watchdog(self):
        release = threading.Event()

        class Stubborn(FakeSession):
            def call(self, request, time_ns=None):
                # Neither the interruption nor anything but the end of the session stops it.
                if not release.wait(60):
                    return _reply(WorkflowActivationCompletion(run_id="run-1", successful={}))
                raise ProtocolError("truncated", "wfjail closed the session connection")

            def abort(self):
                self.closed = True
                release.set()

        session = Stubborn()
        inst = worker._JailedInstance(session, _det())
        out = {}
        with mock.patch.object(worker, "DEADLOCK_INTERRUPT_AFTER", 0.1, create=True), \
                mock.patch.object(worker, "INTERRUPT_WAIT", 0.2, create=True), \
                self.assertLogs("wfjail.temporal", "WARNING") as said:
            thread = threading.Thread(target=lambda: out.update(c=inst.activate(_activation())))
            thread.start()
            thread.join(30)
        self.assertTrue(session.interrupted.is_set())
        self.assertTrue(session.closed)
        self.assertIn("[TMPRL1101] Potential deadlock detected", out["c"].failed.failure.message)
        self.assertIn("did not answer its interruption", said.records[0].getMessage())


if __name__ == "__main__":
    unittest.main()
