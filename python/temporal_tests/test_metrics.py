"""The runner's metrics on the worker's Temporal runtime meter (issue 19): through a real
``Runtime`` with a Prometheus endpoint on 127.0.0.1, a dev server and jailed workers running
workflows that complete, that wfjail denies, that are evicted, that find no free slot, and
a zygote killed under them; the endpoint scraped with urllib, names, labels and values
asserted. On a real dev server:

    WFJAIL_BIN=target/x86_64-unknown-linux-musl/debug/wfjail \\
        target/test-venv/bin/python -m unittest discover -s python/temporal_tests -k Metrics
"""

import asyncio
import os
import re
import signal
import socket
import time
import unittest
import urllib.request
import uuid

from temporalio.client import Client
from temporalio.runtime import PrometheusConfig, Runtime, TelemetryConfig
from temporalio.worker import Worker

from test_jailed_runner import DevServerTestCase  # (puts the examples on the path)

import workflows as W  # noqa: E402
from wfjail.temporal import JailedWorkflowRunner  # noqa: E402
from wfjail.temporal import metrics as M  # noqa: E402

_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Endpoint:
    """A runtime whose metrics are served on a free loopback port, and its scrapes."""

    def __init__(self):
        self.port = _free_port()
        self.runtime = Runtime(telemetry=TelemetryConfig(
            metrics=PrometheusConfig(bind_address="127.0.0.1:%d" % self.port)))

    def scrape(self):
        """[(name, labels, value)] of the endpoint now."""
        with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % self.port, timeout=5) as r:
            text = r.read().decode()
        out = []
        for line in text.splitlines():
            m = _SAMPLE.match(line)
            if m and not line.startswith("#"):
                out.append((m.group(1), dict(_LABEL.findall(m.group(2) or "")),
                            float(m.group(3))))
        return out

    def value(self, name, **labels):
        """The sum of ``name``'s samples whose labels include ``labels``."""
        return sum(v for n, ls, v in self.scrape()
                   if n == name and all(ls.get(k) == str(w) for k, w in labels.items()))

    def wait_for(self, name, at_least, timeout=30.0, **labels):
        deadline = time.monotonic() + timeout
        while True:
            got = self.value(name, **labels)
            if got >= at_least or time.monotonic() > deadline:
                return got
            time.sleep(0.1)


def _zygotes(server_pid):
    """The zygotes of a `wfjail serve --zygote` (its children). A child belongs to the thread
    that started it; a server thread that ends between the listing and the read (a session's,
    as sessions close) hands its children to another thread: the scan starts again."""
    while True:
        kids = set()
        try:
            for task in os.listdir("/proc/%d/task" % server_pid):  # the server gone: raises
                with open("/proc/%d/task/%s/children" % (server_pid, task)) as f:
                    kids |= {int(p) for p in f.read().split()}
        except FileNotFoundError:
            if not os.path.exists("/proc/%d/task" % server_pid):
                raise
            continue
        return sorted(kids)


class MetricsTests(DevServerTestCase):
    async def metered_client(self, endpoint):
        await self.server.client()  # the server is up
        return await Client.connect(self.server.target, runtime=endpoint.runtime)

    def test_runs_sessions_violations_cpu_and_memory_on_the_sdks_prometheus_endpoint(self):
        ep = Endpoint()
        queue = "metrics-" + uuid.uuid4().hex
        ours = dict(namespace="default", task_queue=queue)

        async def go():
            client = await self.metered_client(ep)
            runner = JailedWorkflowRunner()
            # A cache of two runs: a third evicts the oldest.
            async with Worker(client, task_queue=queue,
                              workflows=[W.Greeting, W.Counter, W.Network],
                              activities=[W.greet], workflow_runner=runner,
                              max_cached_workflows=2):
                # One that completes.
                self.assertEqual(await client.execute_workflow(
                    W.Greeting.run, "metrics", id="metrics-ok-" + uuid.uuid4().hex,
                    task_queue=queue), "Hello, metrics!")
                # One that wfjail denies: its task fails (and is retried) until terminated.
                bad = await client.start_workflow(W.Network.run, id="metrics-bad-"
                                                  + uuid.uuid4().hex, task_queue=queue)
                self.assertGreaterEqual(await asyncio.to_thread(
                    ep.wait_for, M.VIOLATIONS, 1, workflow_type="Network",
                    category="network", **ours), 1)
                await bad.terminate()
                # Three runs left in the cache: the first is evicted (its session ends),
                # and comes back (a new session replays it) when it is asked again.
                counters = [await client.start_workflow(
                    W.Counter.run, id="metrics-cached-%d-%s" % (i, uuid.uuid4().hex),
                    task_queue=queue) for i in range(3)]
                for i, counter in enumerate(counters):
                    await counter.signal(W.Counter.add, i)
                    self.assertEqual(await counter.query(W.Counter.value), i)
                self.assertGreaterEqual(await asyncio.to_thread(
                    ep.wait_for, M.SESSIONS_ENDED, 1, workflow_type="Counter", **ours), 1)
                self.assertEqual(await counters[0].execute_update(W.Counter.finish), 0)
                self.assertEqual(await counters[0].result(), 0)
                for counter in counters[1:]:
                    await counter.terminate()

        asyncio.run(go())
        samples = ep.scrape()
        names = {n for n, _, _ in samples}
        # Next to the SDK's own.
        self.assertIn("temporal_workflow_completed", names)
        for name in (M.SESSIONS_OPENED, M.SESSIONS_ENDED, M.VIOLATIONS,
                     M.ACTIVATION_LATENCY + "_count", M.WORKFLOW_CPU_TIME + "_count",
                     M.WORKFLOW_PEAK_MEMORY + "_count"):
            self.assertIn(name, names)
        # The completed run: one session, ended ok, its CPU time and peak memory.
        self.assertEqual(ep.value(M.SESSIONS_OPENED, workflow_type="Greeting", **ours), 1)
        self.assertEqual(ep.value(M.SESSIONS_ENDED, workflow_type="Greeting", status="ok",
                                  **ours), 1)
        self.assertGreaterEqual(ep.value(M.ACTIVATION_LATENCY + "_count",
                                         workflow_type="Greeting", **ours), 2)
        self.assertEqual(ep.value(M.WORKFLOW_CPU_TIME + "_count", workflow_type="Greeting",
                                  **ours), 1)
        cpu_ms = ep.value(M.WORKFLOW_CPU_TIME + "_sum", workflow_type="Greeting", **ours)
        self.assertTrue(0 < cpu_ms < 60_000, cpu_ms)  # milliseconds, as the SDK's durations
        self.assertEqual(ep.value(M.WORKFLOW_PEAK_MEMORY + "_count", workflow_type="Greeting",
                                  **ours), 1)
        mib = ep.value(M.WORKFLOW_PEAK_MEMORY + "_sum", workflow_type="Greeting", **ours)
        self.assertTrue(5 < mib < 2048, mib)
        # The denied run: each of its sessions opened and ended with its violation counted.
        opened = ep.value(M.SESSIONS_OPENED, workflow_type="Network", **ours)
        self.assertGreaterEqual(opened, 1)
        self.assertEqual(ep.value(M.SESSIONS_ENDED, workflow_type="Network", **ours), opened)
        self.assertGreaterEqual(ep.value(M.VIOLATIONS, workflow_type="Network",
                                         category="network", **ours), opened)
        self.assertEqual(ep.value(M.VIOLATIONS, workflow_type="Greeting"), 0)
        # The cached runs: the first evicted (ended ok), opened again and completed (ended
        # ok); at least the three first sessions and the one that completed.
        opened = ep.value(M.SESSIONS_OPENED, workflow_type="Counter", **ours)
        self.assertGreaterEqual(opened, 4)
        self.assertGreaterEqual(ep.value(M.SESSIONS_ENDED, workflow_type="Counter",
                                         status="ok", **ours), 2)
        # Every series of the runner's carries the run's labels.
        for name, labels, _ in samples:
            if name.startswith("wfjail_sessions") or name.startswith("wfjail_workflow"):
                self.assertEqual(labels.get("task_queue"), queue, (name, labels))
                self.assertIn(labels.get("workflow_type"), {"Greeting", "Counter", "Network"})

    def test_busy_sessions_and_zygote_restarts(self):
        ep = Endpoint()
        queue = "metrics-busy-" + uuid.uuid4().hex
        ours = dict(namespace="default", task_queue=queue)

        async def go():
            client = await self.metered_client(ep)
            # One slot: the cached Counter holds it, the Greeting finds none.
            runner = JailedWorkflowRunner(max_sessions=1)
            async with Worker(client, task_queue=queue, workflows=[W.Greeting, W.Counter],
                              activities=[W.greet], workflow_runner=runner):
                counter = await client.start_workflow(W.Counter.run, id="metrics-hold-"
                                                      + uuid.uuid4().hex, task_queue=queue)
                await counter.signal(W.Counter.add, 1)
                self.assertEqual(await counter.query(W.Counter.value), 1)
                refused = await client.start_workflow(W.Greeting.run, "busy",
                                                      id="metrics-busy-" + uuid.uuid4().hex,
                                                      task_queue=queue)
                self.assertGreaterEqual(await asyncio.to_thread(
                    ep.wait_for, M.SESSIONS_BUSY, 1, workflow_type="Greeting", **ours), 1)
                await refused.terminate()
                self.assertEqual(await counter.execute_update(W.Counter.finish), 1)
                self.assertEqual(await counter.result(), 1)
                # A zygote killed: the server replaces it, and the worker relays the count
                # when it next opens a session.
                server = runner._servers["temporal-python"]
                os.kill(_zygotes(server.proc.pid)[0], signal.SIGKILL)
                deadline = time.monotonic() + 30
                while server.client.status()["zygote_restarts"] < 1:
                    self.assertLess(time.monotonic(), deadline)
                    await asyncio.sleep(0.05)
                await asyncio.sleep(M.STATUS_EVERY)
                h = await client.start_workflow(W.Counter.run, id="metrics-after-"
                                                + uuid.uuid4().hex, task_queue=queue)
                await h.execute_update(W.Counter.finish)
                self.assertEqual(await h.result(), 0)

        asyncio.run(go())
        self.assertEqual(ep.value(M.ZYGOTE_RESTARTS, policy="temporal-python"), 1)
        self.assertEqual(ep.value(M.SESSIONS_BUSY, workflow_type="Counter"), 0)


if __name__ == "__main__":
    unittest.main()
