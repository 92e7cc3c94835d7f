"""An OPEN whose connection wfjail dropped before answering a byte is sent again on a new
connection (``wfjail.client.OPEN_RETRIES``), by both clients; one that got any answer (a
frame, part of one) or no connection at all is not. A stand-in server (real Unix sockets,
test_client's FakeServer) drops the first connections as `wfjail serve` was once seen to do
under back-to-back replays: the worker's recv then fails with ECONNRESET (the server's end
closed with the OPEN unread) or reads end-of-file (closed after reading it)."""

import os
import select
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from test_client import (C, LAUNCH_REPORT, OPENED_ZYGOTE, PATIENCE, FakeServer,  # noqa: E402
                         ServerTestCase, frame, session_script)

from wfjail import ProtocolError  # noqa: E402
from wfjail import client  # noqa: E402
from wfjail.client import AsyncClient, Client, SessionFailed  # noqa: E402

OPEN_RETRIES = getattr(client, "OPEN_RETRIES", 2)


def drop_unread(peer):
    """Closes the connection once the worker's OPEN is in it, unread: ECONNRESET for the
    worker's recv (the kernel's answer to a peer that closed with data unread)."""
    ready, _, _ = select.select([peer.conn], [], [], PATIENCE)
    assert ready, "the worker sent nothing"


def drop_after_open(peer):
    """Reads OPEN, then closes the connection without a frame: end-of-file for the worker."""
    peer.expect(C.OPEN)


def partial_opened(peer):
    peer.expect(C.OPEN)
    peer.send_raw(frame(C.OPENED, OPENED_ZYGOTE)[:3])


def failed(peer):
    peer.expect(C.OPEN)
    peer.send(C.FAILED, LAUNCH_REPORT)


class OpenRetryTests(ServerTestCase):

    def open_and_close(self, server, asynchronous):
        """Opens a session on ``server``, calls it once and closes it; its report."""
        if asynchronous:
            async def run():
                async with AsyncClient(server.path).session(handler="wf:run") as s:
                    self.assertEqual(await s.call(b"x"), b"echo:x")
                return s.report
            return self.arun(run())
        with Client(server.path).session(handler="wf:run") as s:
            self.assertEqual(s.call(b"x"), b"echo:x")
        return s.report

    def open_fails(self, server, asynchronous):
        if asynchronous:
            async def run():
                await AsyncClient(server.path).session(handler="wf:run").open()
            self.arun(run())
        else:
            Client(server.path).session(handler="wf:run").open()

    def test_an_open_dropped_unanswered_is_sent_again(self):
        for asynchronous in (False, True):
            for drop in (drop_unread, drop_after_open):
                with self.subTest(asynchronous=asynchronous, drop=drop.__name__):
                    server = FakeServer(drop, drop, session_script())
                    with self.assertLogs("wfjail.client", "WARNING") as logs:
                        report = self.open_and_close(server, asynchronous)
                    self.assertEqual(len(logs.records), 2)
                    self.assertIn("dropped the connection of an OPEN without answering",
                                  logs.output[0])
                    self.assertIn("(1 of 2)", logs.output[0])
                    self.assertEqual(report["status"], "ok")
                    server.close()  # three connections: two dropped, the third served
                    if drop is drop_after_open:  # the same OPEN each time
                        self.assertEqual(server.received(0)[0], server.received(2)[0])

    def test_retries_are_bounded(self):
        self.assertEqual(client.OPEN_RETRIES, 2)
        for asynchronous in (False, True):
            with self.subTest(asynchronous=asynchronous):
                server = FakeServer(*[drop_unread] * (OPEN_RETRIES + 1))
                with self.assertRaises(ConnectionResetError), \
                        self.assertLogs("wfjail.client", "WARNING"):
                    self.open_fails(server, asynchronous)
                server.close()  # exactly OPEN_RETRIES + 1 connections, none left waiting
                server = FakeServer(*[drop_after_open] * (OPEN_RETRIES + 1))
                with self.assertRaises(ProtocolError) as cm, \
                        self.assertLogs("wfjail.client", "WARNING"):
                    self.open_fails(server, asynchronous)
                self.assertEqual(cm.exception.code, "truncated")
                server.close()

    def test_an_answer_or_part_of_one_is_not_retried(self):
        for asynchronous in (False, True):
            with self.subTest(asynchronous=asynchronous):
                server = FakeServer(partial_opened)
                with self.assertRaises(ProtocolError) as cm:
                    self.open_fails(server, asynchronous)
                self.assertEqual(cm.exception.code, "truncated")
                server.close()  # one connection only
                server = FakeServer(failed)
                with self.assertRaises(SessionFailed) as cm2:
                    self.open_fails(server, asynchronous)
                self.assertEqual(cm2.exception.report, LAUNCH_REPORT)
                server.close()

    def test_no_server_is_not_retried(self):
        server = FakeServer()
        server.close()  # the socket file is gone
        for asynchronous in (False, True):
            with self.subTest(asynchronous=asynchronous):
                with self.assertRaises(OSError) as cm:
                    self.open_fails(server, asynchronous)
                self.assertNotIsInstance(cm.exception, ConnectionResetError)


if __name__ == "__main__":
    unittest.main()
