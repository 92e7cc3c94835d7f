"""The zygote's loop (python -m wfjail.zygote), run unconfined against a fake supervisor: its
control channel packet by packet (READY, FORK -> FORKED, a child's exit -> EXITED), the
spare's hand-over (the FORK's JSON and descriptors forwarded as received) and the inline
fork, and what it does with packets it does not take. No timing is asserted: a missing
answer fails after a generous bound (a hung test, not a slow one)."""

import array
import json
import os
import select
import socket
import subprocess
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from wfjail import protocol as P  # noqa: E402
from wfjail.wire_control import ControlKind, pack_control, parse_control  # noqa: E402

BOUND = 60.0  # seconds: only a hang reaches it


def recv_control(sock):
    ready, _, _ = select.select([sock], [], [], BOUND)
    if not ready:
        raise AssertionError("the zygote sent nothing for %.0f s" % BOUND)
    packet = sock.recv(65536)
    if not packet:
        raise AssertionError("the zygote closed its control channel")
    return parse_control(packet)


class ZygoteLoopTests(unittest.TestCase):
    def setUp(self):
        self.ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        env = dict(os.environ, WFJAIL_ZYGOTE_FD=str(theirs.fileno()),
                   PYTHONPATH=os.pathsep.join((os.path.dirname(HERE), HERE)),
                   WFJAIL_HUGEPAGES="0")
        env.pop("WFJAIL_CPU_LIMIT", None)
        self.proc = subprocess.Popen([sys.executable, "-m", "wfjail.zygote"], env=env,
                                     pass_fds=[theirs.fileno()], stdout=subprocess.DEVNULL)
        theirs.close()
        self.sessions, self.outputs = [], []
        kind, self.ready = recv_control(self.ours)
        self.assertEqual(kind, ControlKind.READY)
        self.exited = {}

    def tearDown(self):
        for s in self.sessions:
            s.close()
        for fd in self.outputs:
            os.close(fd)
        self.ours.close()  # the zygote's loop ends when its supervisor is gone
        try:
            self.proc.wait(timeout=BOUND)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise

    def fork(self, doc):
        """Sends FORK with a session socket and an output pipe; returns FORKED's document and
        our end of the session socket."""
        mine, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        r, w = os.pipe()
        try:
            fds = array.array("i", [child.fileno(), w])
            self.ours.sendmsg([pack_control(ControlKind.FORK, doc)],
                              [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
        finally:
            child.close()
            os.close(w)
        self.outputs.append(r)
        self.sessions.append(mine)
        while True:
            kind, answer = recv_control(self.ours)
            if kind == ControlKind.FORKED:
                return answer, mine
            self.assertEqual(kind, ControlKind.EXITED)
            self.exited[answer["pid"]] = answer

    def first_frame(self, sock):
        """The child's answer to our HELLO (wfjail speaks first)."""
        try:
            P.write_frame(sock.fileno(), P.HELLO, P.hello_payload(P.VERSION))
        except OSError:
            pass  # a child without its own Landlock domain answered ERROR and left
        ready, _, _ = select.select([sock], [], [], BOUND)
        self.assertTrue(ready, "the session child said nothing")
        return P.read_frame(sock.fileno())

    def wait_exited(self, pid):
        while pid not in self.exited:
            kind, doc = recv_control(self.ours)
            self.assertEqual(kind, ControlKind.EXITED)
            self.exited[doc["pid"]] = doc
        return self.exited[pid]

    def test_every_fork_is_answered_and_every_child_reaped(self):
        # Back to back (the next FORK finds no spare: an inline fork) and after an answer
        # was read (a spare may be ready): both paths, twelve sessions.
        pids = []
        for n in range(12):
            forked, sock = self.fork({"session": 100 + n, "handler": "json:dumps"})
            self.assertEqual(forked["session"], 100 + n)
            self.assertNotIn("error", forked)
            pids.append(forked["pid"])
            frame = self.first_frame(sock)
            self.assertIn(frame[0], (P.HELLO, P.ERROR))  # ERROR: no Landlock domain here
            sock.close()
            self.sessions.remove(sock)
            if n % 2:
                exited = self.wait_exited(forked["pid"])
                self.assertEqual(set(exited), {"pid", "status", "cpu_ms", "max_rss_kb"})
                self.assertIsInstance(exited["cpu_ms"], float)
        self.assertEqual(len(set(pids)), 12)
        for pid in pids:
            self.wait_exited(pid)

    def test_the_init_value_reaches_the_handler_factory(self):
        # Twice: the first FORK finds the spare (its JSON forwarded as received), the second,
        # sent at once, is forked inline.
        for session in (5, 6):
            forked, sock = self.fork({"session": session, "handler": "operator:methodcaller",
                                      "init": "upper"})
            self.assertEqual(forked["session"], session)
            frame = self.first_frame(sock)
            if frame[0] == P.ERROR:  # no Landlock domain of its own here: refused first
                self.assertIn(b"Landlock", frame[1])
                continue
            self.assertEqual(frame[0], P.HELLO)
            # methodcaller("upper") is what handles the calls: the factory got the init.
            P.write_frame(sock.fileno(), P.REQUEST, b"hi")
            self.assertEqual(P.read_frame(sock.fileno()), (P.RESULT, b"HI"))

    def test_the_spare_is_handed_its_handler_and_init_not_the_session_number(self):
        # The first FORK finds the spare the loop forked before its first wait.
        forked, sock = self.fork({"session": 4242, "handler": "zygote_probe:factory",
                                  "init": [1, "two"]})
        frame = self.first_frame(sock)
        if frame[0] == P.ERROR:  # no Landlock domain of its own here: refused first
            self.assertIn(b"Landlock", frame[1])
            return
        P.write_frame(sock.fileno(), P.REQUEST, b"")
        kind, seen = P.read_frame(sock.fileno())
        self.assertEqual(kind, P.RESULT)
        self.assertIn(b"zygote_probe:factory", seen)
        self.assertIn(b"two", seen)
        self.assertNotIn(b"session", seen)
        self.assertNotIn(b"4242", seen)

    def test_packets_it_does_not_take_are_dropped_with_their_descriptors(self):
        a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        fds = array.array("i", [a.fileno(), a.fileno()])
        # Not a FORK; a FORK with one descriptor: each dropped, its descriptors closed.
        self.ours.sendmsg([pack_control(ControlKind.EXITED, {"pid": 1})],
                          [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
        self.ours.sendmsg([pack_control(ControlKind.FORK, {"session": 1, "handler": "x:y"})],
                          [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds[:1])])
        a.close()
        # The zygote kept no copy of `a`: b sees its peer gone once the packets are read,
        # which the next FORK's answer proves.
        forked, _ = self.fork({"session": 2, "handler": "json:dumps"})
        self.assertEqual(forked["session"], 2)
        ready, _, _ = select.select([b], [], [], BOUND)
        self.assertTrue(ready)
        self.assertEqual(b.recv(1), b"")
        b.close()


if __name__ == "__main__":
    unittest.main()
