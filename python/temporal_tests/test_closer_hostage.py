"""Issue 20 review: the sessions of evicted runs are closed off the activation's path
(worker._Closer). A child that never exits when its session closes, or a server that never
answers a CLOSE, must not hold the other runs' closes, and so their slots and every new
open, hostage: each close runs on a thread of its own and waits at most CLOSE_WAIT.

    WFJAIL_BIN=$PWD/target/x86_64-unknown-linux-musl/debug/wfjail \\
        target/test-venv/bin/python -m unittest discover -s python/temporal_tests -k closer_hostage
"""

import asyncio
import json
import os
import socket
import tempfile
import threading
import time
import unittest

from temporalio.worker import Replayer

from test_jailed_runner import DevServerTestCase, _Capture  # (puts the examples on the path)
from test_worker_trust import _det

import hostage_workflows as HW  # noqa: E402
import workflows as W  # noqa: E402
from wfjail.client import Session
from wfjail.conversation import frame
from wfjail.wire import HEADER
from wfjail.wire_worker import CLOSE, CLOSED, OPEN, OPENED
from wfjail.temporal import JailedWorkflowRunner  # noqa: E402
from wfjail.temporal import worker as jailed_worker  # noqa: E402


async def _histories(*pairs):
    for history, n in pairs:
        for _ in range(n):
            yield history


class HostileChildTests(DevServerTestCase):
    def test_a_child_that_never_exits_holds_neither_the_next_close_nor_the_next_open(self):
        """Two slots. The first run's child never exits when closed (the server kills it
        after its 2 s grace); each honest run after it is evicted and another opened at
        once: its close must not wait behind the hostile one, or the next open finds both
        slots taken (BUSY, "no room") for the whole grace."""

        async def scenario():
            _, hostile = await self.run_jailed([HW.NeverExits], HW.NeverExits.run, "hostage")
            _, honest = await self.run_jailed([W.Greeting], W.Greeting.run, "hostage", "x")
            runner = JailedWorkflowRunner(max_sessions=2)
            try:
                with _Capture("wfjail.temporal") as records:
                    started = time.monotonic()
                    results = await Replayer(
                        workflows=[HW.NeverExits, W.Greeting], workflow_runner=runner,
                    ).replay_workflows(_histories((hostile, 1), (honest, 4)),
                                       raise_on_replay_failure=False)
                    took = time.monotonic() - started
                    await asyncio.to_thread(runner.close)  # waits for the closes in flight
            finally:
                runner.close()
            return results, records, took

        results, records, took = asyncio.run(scenario())
        texts = [r.getMessage() for r in records]
        self.assertEqual(results.replay_failures, {}, texts)
        self.assertEqual([t for t in texts if "no room" in t], [])
        # The honest runs ended ok (only the hostile one may have a bad end to tell).
        self.assertEqual([t for t in texts if "ended" in t and "Greeting" in t], [])
        self.assertFalse(jailed_worker._CLOSER.wait_for_closes(0.0))  # none in flight
        print("five replays with a hostile child first: %.2f s" % took)


def _read_frame(conn):
    head = b""
    while len(head) < HEADER.size:
        got = conn.recv(HEADER.size - len(head))
        if not got:
            return None
        head += got
    length, kind = HEADER.unpack(head)
    payload = b""
    while len(payload) < length - 1:
        got = conn.recv(length - 1 - len(payload))
        if not got:
            return None
        payload += got
    return kind, payload


class _Server:
    """A server of the worker wire on a Unix socket, one thread per connection: it opens
    every session; it answers CLOSE (CLOSED, status ok) only when ``answers_close``. When
    the worker leaves a connection, the time goes to ``left``."""

    def __init__(self, answers_close):
        self.answers_close = answers_close
        self.left = []
        self._dir = tempfile.TemporaryDirectory()
        self.path = os.path.join(self._dir.name, "s.sock")
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind(self.path)
        self._sock.listen(8)
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn):
        with conn:
            n = 0
            while True:
                got = _read_frame(conn)
                if got is None:
                    self.left.append(time.monotonic())
                    return
                kind, _ = got
                if kind == OPEN:
                    n += 1
                    conn.sendall(frame(OPENED, json.dumps({"session": n, "mode": "zygote"})))
                elif kind == CLOSE and self.answers_close:
                    conn.sendall(frame(CLOSED, json.dumps({"status": "ok"})))

    def stop(self):
        self._sock.close()
        self._dir.cleanup()


class SilentServerTests(unittest.TestCase):
    def test_a_close_the_server_never_answers_is_abandoned_and_holds_no_other(self):
        silent, honest = _Server(answers_close=False), _Server(answers_close=True)
        try:
            stuck = jailed_worker._JailedInstance(Session(silent.path, "{}").open(), _det())
            fine = jailed_worker._JailedInstance(Session(honest.path, "{}").open(), _det())
            closer = jailed_worker._CLOSER
            with _Capture("wfjail.temporal") as records:
                began = time.monotonic()
                ended = closer.closes_ended()
                closer.close(stuck)
                closer.close(fine)
                # The honest close is answered while the silent one waits.
                self.assertTrue(closer.wait_for_a_close(ended, 2.0))
                self.assertEqual(fine._session.report, {"status": "ok"})
                self.assertLess(time.monotonic() - began, 1.0)
                # The silent one is abandoned after CLOSE_WAIT: its connection shut down,
                # its session over without a report.
                self.assertTrue(closer.wait_for_closes(jailed_worker.CLOSE_WAIT + 2.0))
            waited = time.monotonic() - began
            self.assertGreaterEqual(waited, jailed_worker.CLOSE_WAIT - 0.1)
            self.assertLess(waited, jailed_worker.CLOSE_WAIT + 1.0)
            self.assertIsNone(stuck._session.report)
            self.assertTrue(stuck._session_over)
            for _ in range(100):
                if silent.left:
                    break
                time.sleep(0.01)
            self.assertEqual(len(silent.left), 1)  # the server saw the worker leave
            self.assertTrue(any("was not closed within" in r.getMessage() for r in records))
        finally:
            silent.stop()
            honest.stop()


if __name__ == "__main__":
    unittest.main()
