"""The worker's view of a confined run matches the SDK's in process (issue 18): a failure's
stack trace in the history, external storage contexts, check_determinism with the worker's
data converter, a refused read that names the policy. On a real dev server, as
test_jailed_runner.py:

    WFJAIL_BIN=target/x86_64-unknown-linux-musl/debug/wfjail \\
        target/test-venv/bin/python -m unittest discover -s python/temporal_tests -k parity
"""

import asyncio
import decimal
import inspect
import os
import unittest
import uuid

import temporalio.converter
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.converter import (
    ExternalStorage,
    StorageDriver,
    StorageDriverClaim,
    StorageDriverWorkflowInfo,
)
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from test_jailed_runner import DevServerTestCase

import workflows as W  # noqa: E402  (the example's, on the path test_jailed_runner sets)
from starter import task_failure  # noqa: E402  (the example's own helper)
from wfjail.temporal import JailedWorkflowRunner, check_determinism
from wfjail.temporal.stack import MAX_DENIED_CALLS, denied_stack, refused_read_text

import parity_workflows as P


def _denied_line(fn, marker="# denied here"):
    """(line number, source) of the line of ``fn`` with ``marker``."""
    lines, first = inspect.getsourcelines(fn)
    for i, line in enumerate(lines):
        if marker in line:
            return first + i, line.strip()
    raise AssertionError("no %r in %r" % (marker, fn))


async def _task_failure(handle, wait=60.0):
    """The first WorkflowTaskFailed event's failure of a run (waiting up to ``wait`` s for it:
    a new worker's first task waits for its server and zygote, longer on a loaded machine)."""
    await task_failure(handle, wait=wait)
    async for e in handle.fetch_history_events():
        if e.HasField("workflow_task_failed_event_attributes"):
            return e.workflow_task_failed_event_attributes.failure
    raise AssertionError("no workflow task failure of %s within %s s: %s" % (
        handle.id, wait, (await handle.describe()).status))


class RecordingDriver(StorageDriver):
    """An external storage driver in memory that records the context of each store."""

    def __init__(self):
        self.blobs, self.stored = {}, []

    def name(self):
        return "recording"

    async def store(self, context, payloads):
        self.stored.append(context)
        claims = []
        for p in payloads:
            key = str(len(self.blobs))
            self.blobs[key] = p.SerializeToString()
            claims.append(StorageDriverClaim(claim_data={"key": key}))
        return claims

    async def retrieve(self, context, claims):
        from temporalio.api.common.v1 import Payload

        return [Payload.FromString(self.blobs[c.claim_data["key"]]) for c in claims]


class ParityTests(DevServerTestCase):
    async def _stored_contexts(self, runner):
        """The store contexts a recording driver sees for one StoreParent run on a worker
        with ``runner``, the run's own ids written as PARENT, PARENT-RUN, CHILD-RUN."""
        import dataclasses

        driver = RecordingDriver()
        client = await self.server.client()
        client = client.__class__(**{**client.config(), "data_converter": dataclasses.replace(
            temporalio.converter.default(), external_storage=ExternalStorage(
                drivers=[driver], payload_size_threshold=P.BIG // 2))})
        queue = "store-" + uuid.uuid4().hex
        wid = "store-" + uuid.uuid4().hex
        async with Worker(client, task_queue=queue, workflows=[P.StoreParent, P.StoreChild],
                          activities=[P.echo], workflow_runner=runner):
            handle = await client.start_workflow(P.StoreParent.run, "p" * P.BIG, id=wid,
                                                 task_queue=queue)
            result = await handle.result()
        child_run = (await client.get_workflow_handle(wid + "-child").describe()).run_id
        names = {wid: "PARENT", handle.result_run_id: "PARENT-RUN", child_run: "CHILD-RUN",
                 wid + "-child": "CHILD"}
        seen = []
        for ctx in driver.stored:
            t = ctx.target
            seen.append(t and (type(t).__name__, t.namespace, names.get(t.id, t.id),
                               names.get(t.run_id, t.run_id), t.type))
        return result, sorted(seen, key=repr)

    def test_check_determinism_replays_with_the_workers_data_converter(self):
        async def go():
            client = await self.server.client()
            client = client.__class__(**{**client.config(),
                                         "data_converter": pydantic_data_converter})
            queue = "priced-" + uuid.uuid4().hex
            wid = str(uuid.uuid4())
            async with Worker(client, task_queue=queue, workflows=[P.Priced],
                              workflow_runner=JailedWorkflowRunner()):
                result = await client.execute_workflow(
                    P.Priced.run, P.Order(item="tea", price=decimal.Decimal("1.10")),
                    id=wid, task_queue=queue)
            history = await client.get_workflow_handle(wid).fetch_history()
            checked = await check_determinism([history], [P.Priced],
                                              data_converter=pydantic_data_converter)
            # Without the worker's converter the input does not decode: each replay fails.
            unchecked = await check_determinism([history], [P.Priced], runs=1)
            return result, checked, unchecked

        result, checked, unchecked = asyncio.run(go())
        self.assertEqual(result, P.Order(item="TEA", price=decimal.Decimal("2.20")))
        self.assertEqual([r.perturbation for r in checked],
                         ["as given", "PYTHONHASHSEED=1001", "address layout randomised"])
        self.assertEqual([r.failure for r in checked], [None, None, None], checked)
        self.assertEqual(len(unchecked), 1)
        self.assertIsNotNone(unchecked[0].failure)

    def test_a_denied_calls_failure_in_the_history_has_the_workflows_stack(self):
        # The workflow, its function with the denied call, the text on that line.
        denied = {W.Network: (W.Network.run, "socket.create_connection("),
                  W.Thread: (W.Thread.run, "threading.Thread("),
                  P.RunsProgram: (P._system, "# denied here"),
                  P.WritesFile: (P.WritesFile.run, "# denied here")}

        async def go():
            client = await self.server.client()
            queue = "denied-" + uuid.uuid4().hex
            failures = {}
            async with Worker(client, task_queue=queue, workflows=list(denied),
                              workflow_runner=JailedWorkflowRunner()):
                for wf in denied:
                    h = await client.start_workflow(wf.run, id=str(uuid.uuid4()),
                                                    task_queue=queue)
                    try:
                        failures[wf] = await _task_failure(h)
                    except AssertionError as e:
                        raise AssertionError("%s: %s" % (wf.__name__, e)) from None
                    await h.terminate()
            return failures

        failures = asyncio.run(go())
        for wf, (fn, marker) in denied.items():
            failure = failures[wf]
            line, source = _denied_line(fn, marker)
            self.assertIn("wfjail denied workflow %s" % wf.__name__, failure.message)
            # The workflow's frame, at the denied call, marked as the child's words.
            self.assertIn('%s [confined child]", line %d, in %s\n    %s\n'
                          % (inspect.getsourcefile(fn), line, fn.__name__, source),
                          failure.stack_trace, wf.__name__)
            # From the SDK's activation on: not the zygote's frames.
            self.assertNotIn("zygote.py", failure.stack_trace)
        self.assertIn("wfjail denied network socket(", failures[W.Network].stack_trace)
        self.assertIn("wfjail denied filesystem openat(/tmp/wfjail-parity-write",
                      failures[P.WritesFile].stack_trace)
        # No audit event for a thread: the stack of the workflow's own failure.
        self.assertIn("the workflow's failure (can't start new thread)",
                      failures[W.Thread].stack_trace)

    def test_a_storage_driver_sees_the_contexts_it_sees_in_process(self):
        async def go():
            return (await self._stored_contexts(JailedWorkflowRunner()),
                    await self._stored_contexts(UnsandboxedWorkflowRunner()))

        (jailed, seen), (plain, expected) = asyncio.run(go())
        self.assertEqual(jailed, plain)
        self.assertEqual(seen, expected)
        # What the workflows stored: the activity's input under the parent run, the child's
        # input and the signal under the child (its type with the input), the child's
        # result under its parent, the parent's result under itself.
        ns = "default"
        for target in (("StorageDriverWorkflowInfo", ns, "PARENT", "PARENT-RUN", "StoreParent"),
                       ("StorageDriverWorkflowInfo", ns, "CHILD", None, "StoreChild"),
                       ("StorageDriverWorkflowInfo", ns, "CHILD", None, None),
                       ("StorageDriverWorkflowInfo", ns, "PARENT", "PARENT-RUN", None)):
            self.assertIn(target, seen)

    def test_a_read_the_policy_refuses_names_the_policy_and_the_path(self):
        # A file in a granted directory (the worker's import path) that its mode bits refuse:
        # the same EACCES, not the policy's.
        unreadable = os.path.join(os.path.dirname(os.path.abspath(P.__file__)),
                                  ".parity-unreadable-" + uuid.uuid4().hex)
        with open(unreadable, "w") as f:
            f.write("secret")
        os.chmod(unreadable, 0)

        async def go():
            client = await self.server.client()
            queue = "reads-" + uuid.uuid4().hex
            messages = {}
            async with Worker(client, task_queue=queue, workflows=[P.ReadsFile],
                              workflow_runner=JailedWorkflowRunner()):
                for path in ("/etc/hostname", unreadable):
                    h = await client.start_workflow(P.ReadsFile.run, path,
                                                    id=str(uuid.uuid4()), task_queue=queue)
                    messages[path] = (await _task_failure(h)).message
                    await h.terminate()
            return messages

        try:
            messages = asyncio.run(go())
        finally:
            os.unlink(unreadable)
        self.assertEqual(
            messages["/etc/hostname"],
            "[Errno 13] Permission denied: '/etc/hostname' (wfjail: policy temporal-python "
            "does not let workflow code read /etc/hostname: grant it in the [filesystem] read "
            "list of a policy that extends it (docs/policy-format.md) and pass "
            "JailedWorkflowRunner(policy=...), or read it in an activity)")
        # Refused by the file's mode, not the policy: the workflow's own error, as it is.
        self.assertEqual(messages[unreadable], "[Errno 13] Permission denied: %r" % unreadable)

    def test_check_determinism_refuses_an_option_nobody_takes(self):
        with self.assertRaisesRegex(TypeError, "neither Replayer nor JailedWorkflowRunner.*"
                                    "data_convertor"):
            asyncio.run(check_determinism([], [P.Priced], data_convertor=None))



class DeniedStackTests(unittest.TestCase):
    """What the worker takes of a child's stacks of denied calls (no server)."""

    violation = {"category": "network", "syscall": "socket", "args": "AF_INET",
                 "action": "denied"}

    def test_a_childs_forged_stacks_are_bounded_and_escaped(self):
        forged = [{"category": "network", "call": "socket.__new__\x1b[2J", "path": "",
                   "stack": 'File "/w.py\nFORGED", line 3, in run\n    x\n' * 1000}]
        text = denied_stack([self.violation], forged)
        self.assertNotIn("\x1b", text)
        self.assertIn("socket.__new__\\x1b[2J", text)
        self.assertLessEqual(text.count("[confined child]"), 64)
        for calls in (None, "x", [1, {"category": "network"}], {"category": "network"},
                      [{"category": "network", "call": 1, "path": "", "stack": ""}]):
            self.assertEqual(denied_stack([self.violation], calls), "", calls)

    def test_only_the_first_calls_are_read(self):
        other = {"category": "filesystem", "call": "open", "path": "/a", "stack": ""}
        late = {"category": "network", "call": "socket.connect", "path": "",
                "stack": '  File "/w.py", line 9, in run\n'}
        self.assertEqual(denied_stack([self.violation], [other] * MAX_DENIED_CALLS + [late]),
                         "")
        self.assertIn("line 9", denied_stack([self.violation], [other, late]))

    def test_a_childs_refused_read_changes_only_its_own_permission_error(self):
        bare = "[Errno 13] Permission denied: '/x\\n'"
        # Not a PermissionError the child's failure names, or no path: the message as it is.
        for message, path in (("ValueError: /x", "/x"), (bare, "/y"), (bare, None),
                              (bare, ["/x"]), (bare, "")):
            self.assertEqual(refused_read_text(message, path, "p"), message)
        forged = "[Errno 13] Permission denied: '/x\x1b[2J'"
        text = refused_read_text(forged, "/x\x1b[2J", "temporal-python")
        self.assertIn("policy temporal-python does not let workflow code read /x\\x1b[2J:",
                      text)


if __name__ == "__main__":
    unittest.main()
