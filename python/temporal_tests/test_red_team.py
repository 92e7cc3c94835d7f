"""The red team's attacks of issue 27 that no other test made, against a real dev server
(test_jailed_runner.py's): a span claiming another run's trace, a server shared by runners of
different policies. Each asserts the safe outcome exactly.

    WFJAIL_BIN=target/x86_64-unknown-linux-musl/debug/wfjail target/test-venv/bin/python \\
        -m unittest discover -s python/temporal_tests -p test_red_team.py
"""

import asyncio
import contextlib
import json
import os
import shutil
import sys
import tempfile
import time
import unittest
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from temporalio.client import Client  # noqa: E402
from temporalio.worker import Worker  # noqa: E402

import red_team_workflows as R  # noqa: E402
from test_jailed_runner import DevServerTestCase, in_memory_tracing  # noqa: E402
from wfjail.temporal import JailedWorkflowRunner  # noqa: E402


class SpanClaimTests(DevServerTestCase):
    def test_a_span_claiming_another_runs_trace_lands_only_in_its_own(self):
        from temporalio.contrib.opentelemetry import OpenTelemetryPlugin

        provider, tracer, exporter = in_memory_tracing(__name__)

        async def go():
            await self.server.client()  # the server is up
            client = await Client.connect(
                self.server.target, plugins=[OpenTelemetryPlugin(add_temporal_spans=True)])
            queue = "spans-" + uuid.uuid4().hex
            async with Worker(client, task_queue=queue, workflows=[R.Honest, R.ClaimsATrace],
                              workflow_runner=JailedWorkflowRunner()):
                with tracer.start_as_current_span("victim-caller") as caller:
                    victim = await client.start_workflow(
                        R.Honest.run, id="victim-" + uuid.uuid4().hex, task_queue=queue)
                    self.assertEqual(await victim.result(), "honest")
                theirs = caller.get_span_context()
                with tracer.start_as_current_span("forger-caller") as forger_caller:
                    forger = await client.start_workflow(
                        R.ClaimsATrace.run,
                        {"trace_id": str(theirs.trace_id), "span_id": str(theirs.span_id),
                         "run_id": victim.result_run_id, "workflow_id": victim.id},
                        id="forger-" + uuid.uuid4().hex, task_queue=queue)
                    self.assertEqual(await forger.result(), "claimed")
            return (theirs.trace_id, victim.result_run_id, forger.result_run_id,
                    forger_caller.get_span_context().trace_id)

        exporter.clear()
        victim_trace, victim_run, forger_run, forger_trace = asyncio.run(go())
        got = exporter.get_finished_spans()
        # The victim's trace holds the victim's spans and nothing else.
        self.assertEqual(sorted(s.name for s in got if s.context.trace_id == victim_trace),
                         ["RunWorkflow:Honest", "StartWorkflow:Honest", "honest-inner",
                          "victim-caller"])
        self.assertEqual(sorted(s.name for s in got
                                if (s.attributes or {}).get("temporalRunID") == victim_run),
                         ["RunWorkflow:Honest", "honest-inner"])
        forged = [s for s in got if s.name.startswith("forged")]
        # Those under a remote parent the run was not handed (the victim's caller) are
        # dropped; the rest are kept, each named as its run's (set by the worker), in a trace
        # that is neither the victim's nor any caller's, bounded, under no remote parent and
        # with the worker's resource.
        self.assertEqual(sorted(s.name[:13] for s in forged), ["forged-huge-h", "forged-root"])
        resource = dict(provider._tracer_provider.resource.attributes)
        for s in forged:
            self.assertEqual(s.attributes["temporalRunID"], forger_run, s.name)
            self.assertNotIn(s.context.trace_id, (victim_trace, forger_trace), s.name)
            self.assertFalse(s.parent is not None and s.parent.is_remote, s.name)
            self.assertLessEqual(len(s.name), 256)
            self.assertLessEqual(len(s.attributes), 33)
            self.assertTrue(all(len(k) <= 256 and len(str(v)) <= 256
                                for k, v in s.attributes.items()), s.name)
            self.assertEqual(dict(s.resource.attributes), resource, s.name)
        # The forger's own workflow span is in its caller's trace, as in process.
        run_span, = [s for s in got if s.name == "RunWorkflow:ClaimsATrace"]
        self.assertEqual(run_span.context.trace_id, forger_trace)
        self.assertEqual(run_span.attributes["temporalRunID"], forger_run)


async def _failure(handle, wait=30.0):
    """The first workflow task failure of ``handle`` (None if none came within ``wait``)."""
    end = time.monotonic() + wait
    while time.monotonic() < end:
        async for e in handle.fetch_history_events():
            if e.HasField("workflow_task_failed_event_attributes"):
                return e.workflow_task_failed_event_attributes.failure.message
        await asyncio.sleep(0.2)
    return None


class SharedServerTests(DevServerTestCase):
    """Runners of different policies in one worker process: each workflow is served by its
    own runner's policy, never by a looser one's server or zygote."""

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="wfjail-red-team-")
        self.secret = os.path.join(self.tmp, "secret.txt")
        with open(self.secret, "w") as f:
            f.write("only the looser policy reads this")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def policy(self, name, text):
        path = os.path.join(self.tmp, name)
        with open(path, "w") as f:
            f.write(text)
        return path

    async def both(self, runners, run, *args):
        """Runs ``run(*args)`` once under each of ``runners``, their Workers polling at once in
        this process; each run's result, or its task failure (the run terminated)."""
        client = await self.server.client()
        workers, queues = [], []
        for runner in runners:
            queues.append("shared-" + uuid.uuid4().hex)
            workers.append(Worker(client, task_queue=queues[-1], workflow_runner=runner,
                                  workflows=[R.OpensASocket, R.ReadsAFile]))
        out = []
        async with contextlib.AsyncExitStack() as stack:
            for w in workers:
                await stack.enter_async_context(w)
            for queue in queues:
                handle = await client.start_workflow(run, *args, id=str(uuid.uuid4()),
                                                     task_queue=queue)
                done = asyncio.ensure_future(handle.result())
                failure = asyncio.ensure_future(_failure(handle))
                await asyncio.wait([done, failure], return_when=asyncio.FIRST_COMPLETED)
                if done.done():
                    failure.cancel()
                    out.append(done.result())
                else:
                    done.cancel()
                    out.append("failed: %s" % failure.result())
                    await handle.terminate()
        return out

    def assertDenied(self, outcome, says):
        self.assertTrue(outcome.startswith("failed: ") and says in outcome, outcome)

    def test_a_workflow_under_the_stricter_runner_is_never_served_by_the_looser_one(self):
        looser = self.policy("looser.toml", 'extends = "temporal-python"\n[filesystem]\n'
                             'read = [%s]\n' % json.dumps(self.tmp))
        runners = [JailedWorkflowRunner("permissive"), JailedWorkflowRunner(),
                   JailedWorkflowRunner(looser)]
        try:
            permissive, strict, _ = asyncio.run(self.both(runners, R.OpensASocket.run))
            _, strict_read, looser_read = asyncio.run(self.both(runners, R.ReadsAFile.run,
                                                                self.secret))
            pids = [r._servers[p].proc.pid for r, p in zip(runners, (
                "permissive", "temporal-python", looser))]
        finally:
            for r in runners:
                r.close()
        self.assertEqual(permissive, "socket made")
        self.assertDenied(strict, "network socket(AF_INET")
        self.assertEqual(looser_read, "only the looser policy reads this")
        self.assertDenied(strict_read, self.secret)
        self.assertEqual(len(set(pids)), 3, "one server per policy")

    def test_a_policy_file_rewritten_stricter_is_not_served_by_the_server_of_its_old_text(self):
        # One path, two texts: the first runner's server was started with the looser text;
        # a runner made after the file became stricter must not share it.
        path = self.policy("policy.toml", 'extends = "temporal-python"\n[filesystem]\n'
                           'read = [%s]\n' % json.dumps(self.tmp))
        first = JailedWorkflowRunner(path)
        try:
            async def go():
                client = await self.server.client()
                queue = "rewritten-" + uuid.uuid4().hex
                async with Worker(client, task_queue=queue, workflows=[R.ReadsAFile],
                                  workflow_runner=first):
                    before = await client.execute_workflow(
                        R.ReadsAFile.run, self.secret, id=str(uuid.uuid4()), task_queue=queue)
                    self.policy("policy.toml", 'extends = "temporal-python"\n')
                    second = JailedWorkflowRunner(path)
                    try:
                        after, = await self.both([second], R.ReadsAFile.run, self.secret)
                    finally:
                        second.close()
                return before, after

            before, after = asyncio.run(go())
        finally:
            first.close()
        self.assertEqual(before, "only the looser policy reads this")
        self.assertDenied(after, self.secret)

    def test_a_runner_given_another_runners_socket_is_not_served_by_that_server(self):
        # Both runners serve on one path: the looser one's server runs there; the stricter
        # one's cannot bind it, and its worker refuses to run (before the fix its readiness
        # check asked the looser server, which then served its workflows).
        from wfjail.temporal.worker import ServerNotReady

        sock = os.path.join(self.tmp, "shared.sock")
        looser, stricter = (JailedWorkflowRunner("permissive", socket=sock),
                            JailedWorkflowRunner(socket=sock))

        async def go():
            client = await self.server.client()
            queues = ["socket-" + uuid.uuid4().hex for _ in range(2)]
            async with Worker(client, task_queue=queues[0], workflows=[R.OpensASocket],
                              workflow_runner=looser):
                made = await client.execute_workflow(R.OpensASocket.run, id=str(uuid.uuid4()),
                                                     task_queue=queues[0])
                handle = await client.start_workflow(R.OpensASocket.run, id=str(uuid.uuid4()),
                                                     task_queue=queues[1])
                # Whichever comes first: the stricter worker's refusal, or its workflow's
                # result (served by a server of the looser policy).
                run = asyncio.ensure_future(Worker(
                    client, task_queue=queues[1], workflows=[R.OpensASocket],
                    workflow_runner=stricter).run())
                result = asyncio.ensure_future(handle.result())
                await asyncio.wait([run, result], return_when=asyncio.FIRST_COMPLETED)
                if result.done():
                    refused = "served: %s" % result.result()
                    run.cancel()
                else:
                    result.cancel()
                    try:
                        run.result()
                        refused = "ran"
                    except ServerNotReady as e:
                        refused = str(e)
                events = [e.WhichOneof("attributes") async for e in
                          handle.fetch_history_events()]
                if not result.done():
                    await handle.terminate()
            return made, refused, events

        try:
            made, refused, events = asyncio.run(go())
        finally:
            looser.close()
            stricter.close()
        self.assertEqual(made, "socket made")
        self.assertIn("wfjail: the server for policy 'temporal-python' did not start", refused,
                      refused)
        self.assertIn("its socket %s is served by another process" % sock, refused)
        self.assertEqual(events, ["workflow_execution_started_event_attributes",
                                  "workflow_task_scheduled_event_attributes"],
                         "no task of the stricter runner's workflow ran")

    def test_runners_of_one_policy_and_different_max_sessions_have_servers_of_their_own(self):
        runners = [JailedWorkflowRunner(max_sessions=3), JailedWorkflowRunner(max_sessions=5)]
        try:
            out = asyncio.run(self.both(runners, R.OpensASocket.run))
            capacities = [r._servers["temporal-python"].client.status()["capacity"]
                          for r in runners]
        finally:
            for r in runners:
                r.close()
        for outcome in out:
            self.assertDenied(outcome, "network socket(AF_INET")
        self.assertEqual(capacities, [3, 5])


class HostileHistoryTests(DevServerTestCase):
    """``check_determinism`` fed hostile histories: each is refused before any replay with
    ``HistoryError`` naming it and what is wrong, or replays to a failure; none passes, none
    hangs (an empty history stopped the SDK's replayer for good: the check never returned)."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        import workflows as W  # the example's (test_jailed_runner put it on sys.path)

        cls.W = W

        async def record():
            client = await cls.server.client()
            queue = "history-" + uuid.uuid4().hex
            wid = "recorded-" + uuid.uuid4().hex
            async with Worker(client, task_queue=queue, workflows=[W.Greeting],
                              activities=[W.greet], workflow_runner=JailedWorkflowRunner()):
                await client.execute_workflow(W.Greeting.run, "x", id=wid, task_queue=queue)
            return await client.get_workflow_handle(wid).fetch_history()

        cls.history = asyncio.run(record())

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="wfjail-history-")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def check(self, histories, workflows=None):
        from wfjail.temporal import check_determinism

        return asyncio.run(check_determinism(histories, workflows or [self.W.Greeting],
                                             runs=1))

    def refused(self, histories, says, workflows=None):
        from wfjail.temporal import HistoryError

        with self.assertRaises(HistoryError) as cm:
            self.check(histories, workflows)
        self.assertEqual(str(cm.exception), says)

    def variant(self, change):
        from temporalio.client import WorkflowHistory

        doc = self.history.to_json_dict()
        change(doc)
        return WorkflowHistory.from_json(self.history.workflow_id, doc)

    def started(self, doc):
        return doc["events"][0]["workflowExecutionStartedEventAttributes"]

    def test_malformed_histories_are_refused_naming_them(self):
        from temporalio.client import WorkflowHistory

        wid = self.history.workflow_id
        name = "history 0 (workflow id %r)" % wid
        self.refused([], "check_determinism() was given no histories: there is nothing to "
                     "judge (did the list of history files come out empty?)")
        self.refused([WorkflowHistory(wid, [])], name + ": has no events")
        self.refused([{"events": []}],
                     "history 0 is a dict, not a WorkflowHistory or the path of a history file")

        def reverse(doc):
            doc["events"].reverse()

        def swap(doc):
            doc["events"][3], doc["events"][4] = doc["events"][4], doc["events"][3]

        def cut(doc):
            del doc["events"][3:]

        def retype(doc):
            self.started(doc)["workflowType"]["name"] = "Counter"

        self.refused([self.variant(reverse)],
                     name + ": its first event is not WorkflowExecutionStarted")
        self.refused([self.variant(swap)], name + ": its events are not numbered 1, 2, 3... in "
                     "order (event 4 has id 5)")
        self.refused([self.variant(cut)], name + ": no workflow task of it completed: there "
                     "are no commands to compare a replay with (cannot judge)")
        self.refused([self.variant(retype)], name + ": is a history of workflow type "
                     "'Counter', which is not among the workflows given ('Greeting')")
        # One bad history among good ones: nothing is replayed.
        self.refused([self.history, self.variant(cut)], name.replace("history 0",
                     "history 1") + ": no workflow task of it completed: there are no commands "
                     "to compare a replay with (cannot judge)")

    def test_histories_that_replay_to_a_failure_never_pass(self):
        import base64

        def retype(doc):
            self.started(doc)["workflowType"]["name"] = "Counter"

        def deep(doc):  # decodes to a list nested 200,000 deep
            self.started(doc)["input"]["payloads"][0]["data"] = base64.b64encode(
                b"[" * 200_000 + b"]" * 200_000).decode()

        def huge(doc):  # a 30 MiB string argument
            self.started(doc)["input"]["payloads"][0]["data"] = base64.b64encode(
                b'"' + b"a" * (30 << 20) + b'"').decode()

        results = self.check([self.variant(retype), self.variant(deep), self.variant(huge)],
                             [self.W.Greeting, self.W.Counter])
        failures = [r.failure or "" for r in results]
        self.assertEqual(len(failures), 3)
        self.assertIn("Nondeterminism error", failures[0])
        self.assertIn("Failed decoding arguments", failures[1])
        self.assertIn("exceeds the 16777216-byte", failures[2])
        # The history as recorded replays.
        self.assertEqual([r.failure for r in self.check([self.history])], [None])

    def test_history_files_are_read_only_when_regular_and_bounded(self):
        good = os.path.join(self.tmp, self.history.workflow_id + ".json")
        with open(good, "w") as f:
            f.write(self.history.to_json())
        secret = os.path.join(self.tmp, "secret")
        with open(secret, "w") as f:
            f.write('{"events": [], "api_key": "s3cr3t"}')
        link = os.path.join(self.tmp, "link.json")
        os.symlink(secret, link)
        fifo = os.path.join(self.tmp, "fifo.json")
        os.mkfifo(fifo)
        big = os.path.join(self.tmp, "big.json")
        with open(big, "wb") as f:
            f.truncate((64 << 20) + 1)
        nested = os.path.join(self.tmp, "nested.json")
        with open(nested, "w") as f:
            f.write("[" * 100_000 + "]" * 100_000)
        garbage = os.path.join(self.tmp, "garbage.json")
        with open(garbage, "w") as f:
            f.write("not json")
        other = os.path.join(self.tmp, "other.json")
        with open(other, "w") as f:
            f.write('{"api_key": "s3cr3t"}')

        self.assertEqual([(r.workflow_id, r.failure) for r in self.check([good])],
                         [(self.history.workflow_id, None)])
        self.refused([link], link + ": is a symbolic link; give the history file itself")
        self.refused([fifo], fifo + ": is not a regular file; give the history file itself")
        self.refused([big], big + ": is larger than 67108864 bytes, more than a Temporal "
                     "history can be")
        self.refused([nested], nested + ": its JSON is nested too deeply to be a history")
        self.refused([garbage], garbage + ": is not JSON (Expecting value: line 1 column 1 "
                     "(char 0))")
        self.refused([os.path.join(self.tmp, "missing.json")],
                     os.path.join(self.tmp, "missing.json") + ": cannot be read: No such file "
                     "or directory")
        from wfjail.temporal import HistoryError

        with self.assertRaises(HistoryError) as cm:
            self.check([other])
        self.assertTrue(str(cm.exception).startswith(
            other + ": is not a workflow history as WorkflowHistory.to_json() writes it ("),
            cm.exception)


class PolicyDigestTests(unittest.TestCase):
    """What of a policy goes into its servers' key (``server.policy_digest``), no server."""

    def test_the_text_of_the_file_and_of_each_file_it_extends(self):
        from wfjail.temporal.server import policy_digest

        tmp = tempfile.mkdtemp(prefix="wfjail-digest-")
        try:
            def write(name, text):
                with open(os.path.join(tmp, name), "w") as f:
                    f.write(text)

            write("base.toml", 'extends = "permissive"\n')
            write("p.toml", 'extends = "./base.toml"\n')
            path = os.path.join(tmp, "p.toml")
            first = policy_digest(path)
            write("base.toml", 'extends = "temporal-python"\n')
            second = policy_digest(path)
            os.remove(os.path.join(tmp, "base.toml"))
            missing = policy_digest(path)
        finally:
            shutil.rmtree(tmp)
        self.assertEqual(len({first, second, missing}), 3)
        self.assertEqual(policy_digest("temporal-python"), "")


if __name__ == "__main__":
    unittest.main()
