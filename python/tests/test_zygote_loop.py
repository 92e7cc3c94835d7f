"""The zygote's loop (python -m wfjail.zygote), run unconfined against a fake supervisor: its
control channel packet by packet (READY, SETTLED, FORK -> FORKED, a child's exit -> EXITED), the
spare's hand-over (the FORK's JSON and descriptors forwarded as received) and the inline
fork, what it does with packets it does not take, and its heap settled after READY between
forks (SETTLED, then a spare of the settled heap). No timing is asserted: a missing
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
    ARGS: "list[str]" = []
    # Nothing to settle after READY (SETTLED follows it at once), unless a test says so.
    SETTLE_ENV = {"WFJAIL_HUGEPAGES": "0", "WFJAIL_IMMORTAL": "0"}

    def setUp(self):
        self.ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        env = dict(os.environ, WFJAIL_ZYGOTE_FD=str(theirs.fileno()),
                   PYTHONPATH=os.pathsep.join((os.path.dirname(HERE), HERE)),
                   **self.SETTLE_ENV)
        env.pop("WFJAIL_CPU_LIMIT", None)
        self.proc = subprocess.Popen([sys.executable, "-m", "wfjail.zygote", *self.ARGS],
                                     env=env, pass_fds=[theirs.fileno()],
                                     stdout=subprocess.DEVNULL)
        theirs.close()
        self.sessions, self.outputs = [], []
        kind, self.ready = recv_control(self.ours)
        self.assertEqual(kind, ControlKind.READY)
        self.exited = {}
        self.settled = None
        if not set(self.SETTLE_ENV.values()) - {"0"}:
            kind, self.settled = recv_control(self.ours)
            self.assertEqual(kind, ControlKind.SETTLED)

    def note(self, kind, doc):
        """An EXITED or a SETTLED that came while we waited for something else."""
        if kind == ControlKind.SETTLED:
            self.assertIsNone(self.settled, "SETTLED comes once")
            self.settled = doc
            return
        self.assertEqual(kind, ControlKind.EXITED)
        self.exited[doc["pid"]] = doc

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
            self.note(kind, answer)

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
            self.note(*recv_control(self.ours))
        return self.exited[pid]

    def wait_settled(self):
        while self.settled is None:
            self.note(*recv_control(self.ours))
        return self.settled

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

    def forked(self, session):
        """zygote_probe:forking's report from a session child, or None without a Landlock
        domain (the child refused its session)."""
        forked, sock = self.fork({"session": session, "handler": "zygote_probe:forking",
                                  "init": 0})
        frame = self.first_frame(sock)
        if frame[0] == P.ERROR:
            self.assertIn(b"Landlock", frame[1])
            return None
        P.write_frame(sock.fileno(), P.REQUEST, b"")
        kind, seen = P.read_frame(sock.fileno())
        self.assertEqual(kind, P.RESULT, seen)
        return json.loads(seen)

    def test_a_single_threaded_zygote_forks_through_the_c_library_and_reseeds_random(self):
        # The spare (its fork before the loop's first wait), then one forked inline.
        seen = [self.forked(1), self.forked(2)]
        if None in seen:
            return
        for child in seen:
            self.assertEqual(child["fork_path"], "libc")
            self.assertTrue(child["main_thread"])
            self.assertTrue(child["ident"])
            self.assertEqual(child["threads"], 1)
            self.assertTrue(child["logging_lock"])
        # Each child reseeded random from the kernel (unconfined here): not the zygote's
        # state, which both would share.
        self.assertNotEqual(seen[0]["random"], seen[1]["random"])


class ZygoteWithAThreadTests(ZygoteLoopTests):
    """A preload left a thread running: CPython's at-fork work is needed, os.fork() does it."""
    ARGS = ["--preload", "zygote_probe:start_thread"]

    def test_a_single_threaded_zygote_forks_through_the_c_library_and_reseeds_random(self):
        seen = self.forked(1)
        if seen is not None:
            self.assertTrue(seen["fork_path"].startswith("os.fork: "), seen)
            self.assertEqual(seen["threads"], 1)
            self.assertTrue(seen["main_thread"])


class ZygoteWithAnAtForkCallbackTests(ZygoteLoopTests):
    """A preload registered an at-fork callback of its own: os.fork() runs it."""
    ARGS = ["--preload", "zygote_probe:register_at_fork"]

    def test_a_single_threaded_zygote_forks_through_the_c_library_and_reseeds_random(self):
        seen = self.forked(1)
        if seen is not None:
            self.assertIn("at-fork callback", seen["fork_path"])



class SettlingZygoteLoopTests(ZygoteLoopTests):
    """The same loop with its work after READY on (the heap marked immortal on 3.12+, its
    ranges collapsed into huge pages where the kernel does): a session forked before SETTLED
    and one after both answer, and the spare forked before it is replaced."""

    SETTLE_ENV = {"WFJAIL_HUGEPAGES": "1", "WFJAIL_IMMORTAL": "1"}

    def session(self, n):
        forked, sock = self.fork({"session": n, "handler": "operator:methodcaller",
                                  "init": "upper"})
        self.assertNotIn("error", forked)
        frame = self.first_frame(sock)
        self.assertIn(frame[0], (P.HELLO, P.ERROR))  # ERROR: no Landlock domain here
        if frame[0] == P.HELLO:
            P.write_frame(sock.fileno(), P.REQUEST, b"hi")
            self.assertEqual(P.read_frame(sock.fileno()), (P.RESULT, b"HI"))
        return forked["pid"]

    def test_a_session_before_and_one_after_it_settles(self):
        self.assertEqual(self.ready["immortal"] if sys.version_info >= (3, 12) else "after READY",
                         "after READY")
        before = self.session(1)
        settled = self.wait_settled()
        self.assertEqual(set(settled), {"immortal", "hugepages"})
        if sys.version_info >= (3, 12):
            self.assertIsInstance(settled["immortal"], int, settled)
            self.assertGreater(settled["immortal"], 1000, settled)
        after = self.session(2)
        self.assertNotEqual(before, after)


class SameReadsTests(unittest.TestCase):
    """Every session child of every zygote reads the same of the interpreter, whatever the
    zygote did before its fork (issue 27: a replay reads what its run read): children forked
    while the zygote settles (the spare forked before READY, an inline fork when no spare is
    ready, a spare forked mid-settle) and after SETTLED, of a zygote with spares and of one
    without, and of a second zygote started after the first one settled (as ``serve``
    starts zygote 1). Each answers ``zygote_probe:reads``: the collector's counts after a
    walk of its stack, the stack, a preloaded object's reference count (3.11: on 3.12 the
    marking makes it immortal, a value that differs before and after SETTLED)."""

    ENV = {"WFJAIL_HUGEPAGES": "1", "WFJAIL_IMMORTAL": "1"}

    def setUp(self):
        self.closing = []
        self.procs = []

    def tearDown(self):
        for c in self.closing:
            if isinstance(c, socket.socket) and c.type == socket.SOCK_SEQPACKET:
                # What the zygote said that we did not read (EXITED): read, so that our
                # close is its end of input, not a reset.
                c.setblocking(False)
                try:
                    while c.recv(65536):
                        pass
                except BlockingIOError:
                    pass
            c.close()
        for proc in self.procs:
            try:
                proc.wait(timeout=BOUND)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                raise

    def zygote(self, *args):
        """A zygote (its control socket and READY), and whether SETTLED came with READY."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        env = dict(os.environ, WFJAIL_ZYGOTE_FD=str(theirs.fileno()),
                   PYTHONPATH=os.pathsep.join((os.path.dirname(HERE), HERE)), **self.ENV)
        env.pop("WFJAIL_CPU_LIMIT", None)
        self.procs.append(subprocess.Popen([sys.executable, "-m", "wfjail.zygote", *args],
                                           env=env, pass_fds=[theirs.fileno()],
                                           stdout=subprocess.DEVNULL))
        theirs.close()
        self.closing.append(ours)
        kind, _ = recv_control(ours)
        self.assertEqual(kind, ControlKind.READY)
        return ours

    def read(self, ctl, n, wait_settled=False):
        """FORK a session of ``zygote_probe:reads``, call it once: its answer (None when
        the child has no Landlock domain of its own here). With ``wait_settled``, first
        the zygote's SETTLED."""
        settled = not wait_settled
        mine, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        r, w = os.pipe()
        self.closing.append(mine)
        self.closing.append(os.fdopen(r, "rb"))
        while not settled:
            kind, _ = recv_control(ctl)
            settled = kind == ControlKind.SETTLED
        fds = array.array("i", [child.fileno(), w])
        ctl.sendmsg([pack_control(ControlKind.FORK, {"session": n,
                                                     "handler": "zygote_probe:reads"})],
                    [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
        child.close()
        os.close(w)
        while True:
            kind, doc = recv_control(ctl)
            if kind == ControlKind.FORKED:
                break
        self.assertNotIn("error", doc)
        P.write_frame(mine.fileno(), P.HELLO, P.hello_payload(P.VERSION))
        kind, payload = P.read_frame(mine.fileno())
        if kind == P.ERROR:
            return None
        self.assertEqual(kind, P.HELLO)
        P.write_frame(mine.fileno(), P.REQUEST, b"")
        kind, payload = P.read_frame(mine.fileno())
        self.assertEqual(kind, P.RESULT, payload)
        answer = json.loads(payload)
        if sys.version_info >= (3, 12):
            del answer["sys.getrefcount(json._default_decoder)"]
        return answer

    def test_every_child_of_every_zygote_reads_the_same(self):
        first = self.zygote()
        answers = {
            "the spare forked before READY": self.read(first, 1),
            "the next (inline, or a spare of the heap settling)": self.read(first, 2),
        }
        answers["a spare of the settled heap"] = self.read(first, 3, wait_settled=True)
        answers["the next after SETTLED"] = self.read(first, 4)
        second = self.zygote()
        answers["zygote 1, started after zygote 0 settled"] = self.read(second, 5)
        answers["zygote 1, after it settled"] = self.read(second, 6, wait_settled=True)
        inline = self.zygote("--no-spare")
        answers["an inline fork (no spare), settling"] = self.read(inline, 7)
        answers["an inline fork, settled"] = self.read(inline, 8, wait_settled=True)
        if None in answers.values():
            self.skipTest("no Landlock domain for the sessions here: they do not run")
        expected = answers["the spare forked before READY"]
        for point, answer in answers.items():
            self.assertEqual(answer, expected, "%s read otherwise" % point)


if __name__ == "__main__":
    unittest.main()
