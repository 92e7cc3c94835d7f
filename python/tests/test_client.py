"""wfjail.client, the worker side of `wfjail serve`: the worker_vectors of
docs/protocol-vectors.json, the sync and asyncio clients against a fake server in a thread,
and one end-to-end run through the real binary when it is built."""

import asyncio
import gc
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import traceback
import unittest
import warnings
from unittest import mock

HERE = os.path.dirname(os.path.abspath(__file__))
PYDIR = os.path.normpath(os.path.join(HERE, ".."))
REPO = os.path.normpath(os.path.join(PYDIR, ".."))
sys.path.insert(0, PYDIR)

import wfjail  # noqa: E402
from wfjail import ProtocolError, Violation, wire  # noqa: E402
from wfjail import client as C  # noqa: E402
from wfjail.conversation import open_doc  # noqa: E402
from wfjail.wire_worker import SERVER_SENDS  # noqa: E402
from wfjail.client import AsyncClient, Client, GuestError, SessionFailed  # noqa: E402

VECTORS_PATH = os.path.join(REPO, "docs", "protocol-vectors.json")
ERROR_CODES = {"truncated", "oversized", "empty", "unknown-kind"}
WORKER_KINDS = (C.OPEN, C.CALL, C.CLOSE, C.STATUS, C.REPLY, C.INTERRUPT)  # worker -> wfjail; the client's reader refuses them
_HEADER = struct.Struct("<IB")  # length, kind
PATIENCE = 5  # seconds: a hung client or server fails the test instead of hanging it


def load_vectors():
    with open(VECTORS_PATH, encoding="utf-8") as f:
        return json.load(f)


def expected(vector):
    return [(f["kind"], bytes.fromhex(f["payload_hex"])) for f in vector["frames"]]


def check_header(length, kind, worker_kinds=True):
    """The client's own header checks; the vectors hold both directions, so the worker's kinds
    are admitted too unless ``worker_kinds`` is false (what the client itself reads)."""
    try:
        wire.check_length(length, C.CAP)
        wire.check_kind(kind, SERVER_SENDS)
    except ProtocolError as e:
        if not (worker_kinds and e.code == "unknown-kind" and kind in WORKER_KINDS):
            raise


def read_frames(data, worker_kinds=True):
    """Decode a whole stream in the documented order (length, kind, then the payload):
    (frames before the stop, error code or None for a clean end between frames)."""
    frames, pos = [], 0
    try:
        while pos < len(data):
            head = data[pos:pos + _HEADER.size]
            if len(head) < _HEADER.size:
                if len(head) >= 4:  # the length alone is already checkable
                    wire.check_length(struct.unpack("<I", head[:4])[0], C.CAP)
                raise ProtocolError("truncated", "end of stream inside a header")
            length, kind = _HEADER.unpack(head)
            check_header(length, kind, worker_kinds)
            end = pos + 4 + length
            if end > len(data):
                raise ProtocolError("truncated", "end of stream inside a payload")
            frames.append((kind, data[pos + _HEADER.size:end]))
            pos = end
    except ProtocolError as e:
        return frames, e.code
    return frames, None


def client_reads(data):
    """What Session._read_frame makes of ``data`` sent by wfjail, then end-of-file (_read
    also hands LOG frames to the session's on_log; see LogTests)."""
    a, b = socket.socketpair()
    try:
        a.sendall(data)  # every vector fits in a socket buffer
        a.shutdown(socket.SHUT_WR)
        s = C.Session("unused", "{}")
        s._sock = b
        frames = []
        try:
            while True:
                frames.append(s._read_frame())
        except ProtocolError as e:
            return frames, e.code
    finally:
        a.close()
        b.close()


def async_client_reads(data):
    """What AsyncSession._read_frame makes of ``data`` sent by wfjail, then end-of-file."""
    async def go():
        s = C.AsyncSession("unused", "{}")
        s._reader = asyncio.StreamReader()
        s._reader.feed_data(data)
        s._reader.feed_eof()
        frames = []
        try:
            while True:
                frames.append(await s._read_frame())
        except ProtocolError as e:
            return frames, e.code
    return asyncio.run(go())


def client_view(data):
    """What a correct client reader yields: wfjail's kinds only, and end-of-file is always a
    truncation (wfjail ends every session with CLOSED or FAILED, after which nothing is read)."""
    frames, code = read_frames(data, worker_kinds=False)
    return frames, code or "truncated"


class _CountingSocket:
    """A socket whose ``recv`` calls are counted."""

    def __init__(self, sock):
        self.sock, self.reads = sock, 0

    def recv(self, n):
        self.reads += 1
        return self.sock.recv(n)


class ReadAheadTests(unittest.TestCase):
    """The blocking client reads what the socket has (``READ_AHEAD``), not a frame's pieces:
    frames that came together are one read, and each is still checked in order."""

    def reads_of(self, data, max_frame=None, frames=None):
        a, b = socket.socketpair()
        sender = threading.Thread(target=lambda: (a.sendall(data), a.shutdown(socket.SHUT_WR)))
        sender.start()  # more than a socket buffer may be sent
        try:
            s = C.Session("unused", "{}", max_frame=max_frame)
            s._sock = counting = _CountingSocket(b)
            got = []
            try:
                while frames is None or len(got) < frames:
                    got.append(s._read_frame())
            except ProtocolError as e:
                return got, e.code, counting.reads, s
            return got, None, counting.reads, s
        finally:
            b.close()  # a sender left blocked fails
            sender.join()
            a.close()

    def test_frames_that_came_together_are_one_read(self):
        sent = [(C.LOG, b"\x14hello"), (C.VIOLATIONS, b"[]"), (C.RESULT, b"r" * 1000)]
        got, code, reads, _ = self.reads_of(b"".join(C._frame(k, p) for k, p in sent),
                                            frames=3)
        self.assertEqual(got, sent)
        self.assertEqual((code, reads), (None, 1))

    def test_a_frame_larger_than_a_read_ahead_comes_whole(self):
        big = bytes(range(256)) * 1024  # 256 KiB, more than READ_AHEAD
        got, code, reads, _ = self.reads_of(C._frame(C.RESULT, big) + C._frame(C.CLOSED, b"{}"))
        self.assertEqual(got, [(C.RESULT, big), (C.CLOSED, b"{}")])
        self.assertEqual(code, "truncated")

    def test_a_frame_read_ahead_is_checked_when_its_turn_comes(self):
        # The second frame, over max_frame, came in the same read as the first: the first is
        # handed over, then the second's header refuses it (unread beyond it).
        data = C._frame(C.RESULT, b"ok") + C._frame(C.RESULT, b"x" * 100) + C._frame(C.LOG)
        got, code, reads, s = self.reads_of(data, max_frame=8)
        self.assertEqual(got, [(C.RESULT, b"ok")])
        self.assertEqual((code, reads), ("oversized", 1))
        self.assertTrue(s._conversation.ended)


class VectorTests(unittest.TestCase):
    def setUp(self):
        self.doc = load_vectors()
        self.vectors = self.doc["worker_vectors"]

    def test_constants_match_the_file(self):
        self.assertEqual(self.doc["cap"], C.CAP)
        self.assertEqual(_HEADER.size, 5)
        self.assertEqual(SERVER_SENDS, {C.OPENED, C.RESULT, C.ERROR, C.FAILED, C.CLOSED,
                                           C.BUSY, C.SERVER, C.VIOLATIONS, C.LOG, C.UPCALL})
        self.assertEqual((C.OPEN, C.CALL, C.CLOSE, C.STATUS, C.REPLY, C.INTERRUPT),
                         (0x11, 0x12, 0x13, 0x14, 0x15, 0x16))
        self.assertEqual((C.OPENED, C.RESULT, C.ERROR, C.FAILED, C.CLOSED),
                         (0x21, 0x22, 0x23, 0x24, 0x25))
        self.assertEqual((C.BUSY, C.SERVER, C.VIOLATIONS, C.LOG, C.UPCALL),
                         (0x26, 0x27, 0x28, 0x29, 0x2A))
        kinds = {k for v in self.vectors for k, _ in expected(v)}
        self.assertEqual(kinds, set(WORKER_KINDS) | SERVER_SENDS, "every kind has a vector")

    def test_every_worker_vector(self):
        self.assertGreaterEqual(len(self.vectors), 10)
        for v in self.vectors:
            with self.subTest(v["name"]):
                self.assertEqual(v["cap"], C.CAP)
                self.assertIn(v["error"], ERROR_CODES | {None})
                self.assertEqual(read_frames(bytes.fromhex(v["hex"])), (expected(v), v["error"]))

    def test_every_error_code_has_a_vector(self):
        codes = {v["error"] for v in self.vectors} - {None}
        self.assertEqual(codes, {"truncated", "oversized", "unknown-kind"})
        # "empty" has none of its own in worker_vectors: it is checked here and below.
        self.assertEqual(read_frames(bytes(4)), ([], "empty"))

    def test_what_the_worker_writes_is_byte_exact(self):
        """Frames the client sends re-encode with its own _frame; OPEN payloads are what
        _open_doc builds (as JSON: the separators may differ)."""
        sent = [v for v in self.vectors if v["error"] is None
                and all(k in WORKER_KINDS for k, _ in expected(v))]
        self.assertEqual({v["name"] for v in sent},
                         {"open-zygote", "open-exec", "call", "close", "session", "status",
                          "reply", "interrupt"})
        for v in sent:
            with self.subTest(v["name"]):
                frames = expected(v)
                self.assertEqual(b"".join(C._frame(k, p) for k, p in frames).hex(), v["hex"])
                for kind, payload in frames:
                    if kind == C.OPEN:
                        doc = json.loads(payload.decode("utf-8"))
                        mine = open_doc(doc.get("handler"), doc.get("argv"),
                                        doc.get("timeout"))
                        self.assertEqual(json.loads(mine), doc)
                        self.assertEqual(C._frame(C.OPEN, mine),
                                         C._frame(C.OPEN, mine.encode("utf-8")))

    def test_the_clients_readers_agree(self):
        """Session._read and AsyncSession._read stop where the decoder does (with the
        worker's own kinds refused, as they must be coming from wfjail)."""
        for v in self.vectors:
            data = bytes.fromhex(v["hex"])
            with self.subTest(v["name"]):
                want = client_view(data)
                self.assertEqual(client_reads(data), want)
                self.assertEqual(async_client_reads(data), want)
                if v["error"] is None and all(k in SERVER_SENDS for k, _ in expected(v)):
                    self.assertEqual(want, (expected(v), "truncated"))

    def test_length_is_checked_before_the_kind_byte_is_awaited(self):
        """docs/protocol.md: length (0, over the cap), then the kind, then the payload."""
        cases = [
            ("", [], "truncated"),
            ("04", [], "truncated"),
            ("00000000", [], "empty"),
            ("ffffffff", [], "oversized"),
            ("0200000122", [], "oversized"),
            ("0100000022" + "00000000", [(C.RESULT, b"")], "empty"),
            ("0500000009", [], "unknown-kind"),
            ("050000000961", [], "unknown-kind"),
            ("0500000002", [], "unknown-kind"),  # a guest-protocol kind
            ("0500000012", [], "unknown-kind"),  # CALL: a worker kind, never from wfjail
            ("050000002261", [], "truncated"),
        ]
        for hexed, frames, code in cases:
            data = bytes.fromhex(hexed)
            with self.subTest(hexed):
                self.assertEqual(client_view(data), (frames, code))
                self.assertEqual(client_reads(data), (frames, code))
                self.assertEqual(async_client_reads(data), (frames, code))

    def test_frame_refuses_an_oversized_payload(self):
        self.assertEqual(len(C._frame(C.CALL, b"x" * 10)), 15)
        with self.assertRaises(ProtocolError) as cm:
            C._frame(C.CALL, bytearray(C.CAP + 1))
        self.assertEqual(cm.exception.code, "oversized")


# --- a fake `wfjail serve` -------------------------------------------------------------------

OPENED_ZYGOTE = {"session": 7, "mode": "zygote"}
OK_REPORT = {"status": "ok", "violations": [], "duration_ms": 3, "calls": 2}
CONNECT = {"category": "network", "syscall": "connect", "args": "AF_INET 127.0.0.1:9",
           "action": "denied", "rule": "network.mode = \"none\"",
           "hint": "network is denied in workflow code; do it in an activity", "count": 1}
CLONE = {"category": "subprocess", "syscall": "clone", "args": "SIGCHLD",
         "action": "denied", "rule": "process.subprocess = \"deny\"",
         "hint": "subprocesses are denied in workflow code; run the program from an activity",
         "count": 2}
VIOLATION_ERROR = {"type": "wfjail.Violation",
                   "message": "subprocess: clone(SIGCHLD) denied",
                   "traceback": "Traceback (most recent call last):\n  ...\n"
                                "wfjail.Violation: subprocess: clone(SIGCHLD) denied\n",
                   "violations": [CONNECT, CLONE]}
VALUE_ERROR = {"type": "ValueError", "message": "bad input: b'x'",
               "traceback": "Traceback (most recent call last):\nValueError: bad input: b'x'\n",
               "violations": [CONNECT]}
TIMEOUT_REPORT = {"status": "timeout", "error": "the call took longer than 500ms",
                  "signal": "SIGKILL", "violations": []}
KILLED_REPORT = {"status": "violation", "signal": "SIGKILL",
                 "violations": [dict(CONNECT, action="killed")]}
LAUNCH_REPORT = {"status": "launch_error", "error": "no such handler: wf:nope",
                 "violations": []}


def frame(kind, payload=b""):
    """The server's encoder (independent of the client's)."""
    if isinstance(payload, (dict, list)):
        payload = json.dumps(payload).encode("utf-8")
    return struct.pack("<IB", len(payload) + 1, kind) + payload


class Peer:
    """The server's end of one connection."""

    def __init__(self, conn):
        self.conn = conn
        self.frames = []  # what the worker sent

    def _exact(self, n):
        data = b""
        while len(data) < n:
            chunk = self.conn.recv(n - len(data))
            if not chunk:
                if data:
                    raise AssertionError("the worker sent a truncated frame: %r" % data)
                return None
            data += chunk
        return data

    def read(self):
        """The worker's next frame, or None at a clean end of its stream."""
        head = self._exact(5)
        if head is None:
            return None
        length, kind = struct.unpack("<IB", head)
        if kind not in WORKER_KINDS or not 1 <= length <= C.CAP + 1:
            raise AssertionError("bad frame from the worker: %r" % head)
        payload = self._exact(length - 1)
        if payload is None:
            raise AssertionError("the worker sent a truncated frame")
        self.frames.append((kind, payload))
        return kind, payload

    def expect(self, kind):
        f = self.read()
        if f is None or f[0] != kind:
            raise AssertionError("expected kind 0x%02x from the worker, got %r" % (kind, f))
        return f[1]

    def send(self, kind, payload=b""):
        self.conn.sendall(frame(kind, payload))

    def send_raw(self, data):
        self.conn.sendall(data)

    def drain(self):
        """Read until the worker sends CLOSE or closes its end."""
        while True:
            f = self.read()
            if f is None or f[0] == C.CLOSE:
                return


END, DRAIN = "end", "drain"


def session_script(answers=None, opened=OPENED_ZYGOTE, report=OK_REPORT):
    """A session: OPENED, then each CALL answered by ``answers[request]``, a list of
    (kind, payload) frames, raw bytes, END (close the connection now) or DRAIN (close it once
    the worker sent CLOSE or closed its end); by default RESULT b"echo:" + request.
    CLOSE gets CLOSED; a FAILED answer ends the connection, as wfjail does."""
    answers = answers or {}

    def script(peer):
        peer.expect(C.OPEN)
        peer.send(C.OPENED, opened)
        while True:
            f = peer.read()
            if f is None:
                return
            kind, request = f
            if kind == C.CLOSE:
                peer.send(C.CLOSED, report)
                return
            if kind != C.CALL:
                raise AssertionError("unexpected kind 0x%02x" % kind)
            for answer in answers.get(request, [(C.RESULT, b"echo:" + request)]):
                if answer is END:
                    return
                if answer is DRAIN:
                    peer.drain()
                    return
                if isinstance(answer, bytes):
                    peer.send_raw(answer)
                    continue
                peer.send(*answer)
                if answer[0] == C.FAILED:
                    return
    return script


class FakeServer:
    """A stand-in for `wfjail serve`: a listening Unix socket in a temp dir. Connection i
    runs ``scripts[i](peer)`` in its own thread and is closed when the script returns."""

    def __init__(self, *scripts):
        self.dir = tempfile.mkdtemp(prefix="wfjail-client-test-")
        self.path = os.path.join(self.dir, "serve.sock")
        self.scripts = list(scripts)
        self.peers, self.errors, self.threads = [], [], []
        self._stopping = False
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.settimeout(None)
        self.listener.bind(self.path)
        self.listener.listen(16)
        self.acceptor = threading.Thread(target=self._accept, daemon=True)
        self.acceptor.start()

    def _accept(self):
        for script in self.scripts:
            conn, _ = self.listener.accept()
            if self._stopping:
                conn.close()
                return
            conn.settimeout(PATIENCE)
            peer = Peer(conn)
            self.peers.append(peer)
            t = threading.Thread(target=self._serve, args=(script, peer), daemon=True)
            self.threads.append(t)
            t.start()

    def _serve(self, script, peer):
        try:
            script(peer)
        except BaseException:
            self.errors.append(traceback.format_exc())
        finally:
            peer.conn.close()

    def received(self, i=0):
        """The kinds and payloads the worker sent on connection i (after the script ended)."""
        self.threads[i].join(PATIENCE)
        return self.peers[i].frames

    def close(self):
        if self.acceptor.is_alive():  # fewer connections than scripts: wake accept()
            self._stopping = True
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.connect(self.path)
        self.acceptor.join(PATIENCE)
        for t in self.threads:
            t.join(PATIENCE)
        self.listener.close()
        shutil.rmtree(self.dir, ignore_errors=True)
        hung = [t for t in [self.acceptor] + self.threads if t.is_alive()]
        if hung or self.errors:
            raise AssertionError("fake server: %d hung thread(s)\n%s"
                                 % (len(hung), "\n".join(self.errors)))
        if len(self.peers) != len(self.scripts):
            raise AssertionError("fake server: %d of %d expected connections"
                                 % (len(self.peers), len(self.scripts)))


class ServerTestCase(unittest.TestCase):
    """Per test: fake servers cleaned up, a socket timeout instead of a hang, and no socket
    or transport left unclosed (ResourceWarning)."""

    def setUp(self):
        old = socket.getdefaulttimeout()
        socket.setdefaulttimeout(PATIENCE)
        self.addCleanup(socket.setdefaulttimeout, old)
        catcher = warnings.catch_warnings(record=True)
        caught = catcher.__enter__()
        warnings.simplefilter("always", ResourceWarning)
        self.addCleanup(self._no_leaks, catcher, caught)

    def _no_leaks(self, catcher, caught):
        gc.collect()
        catcher.__exit__(None, None, None)
        leaks = [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]
        self.assertEqual(leaks, [], "the client left something open")

    def serve(self, *scripts):
        server = FakeServer(*scripts)
        self.addCleanup(server.close)
        return server

    def arun(self, coro):
        return asyncio.run(asyncio.wait_for(coro, PATIENCE))

    def assertCode(self, cm, code):
        self.assertIsInstance(cm.exception, ProtocolError)
        self.assertEqual(cm.exception.code, code, str(cm.exception))

    def assertViolation(self, v):
        self.assertIsInstance(v, Violation)
        self.assertIsInstance(v, PermissionError)
        self.assertEqual(v.errno, 1)
        # the last violation of the list: the most recent
        self.assertEqual((v.category, v.syscall, v.hint), ("subprocess", "clone", CLONE["hint"]))
        self.assertEqual((v.args, v.rule, v.action, v.count),
                         ("SIGCHLD", CLONE["rule"], "denied", 2))
        self.assertEqual(v.traceback, VIOLATION_ERROR["traceback"])
        self.assertEqual(v.to_dict(), CLONE)

    def assertGuestError(self, e):
        self.assertIsInstance(e, GuestError)
        self.assertNotIsInstance(e, Violation)
        self.assertEqual((e.type, e.message), ("ValueError", "bad input: b'x'"))
        self.assertEqual(e.traceback, VALUE_ERROR["traceback"])
        self.assertEqual(e.violations, [CONNECT])
        self.assertEqual(str(e), "ValueError: bad input: b'x'")
        self.assertIs(wfjail.Violation, Violation)
        self.assertEqual((GuestError.__module__, SessionFailed.__module__), ("wfjail", "wfjail"))

    def protocol_error_of_a_call(self, data, then, asynchronous=False):
        """The code of the ProtocolError a call raises when wfjail answers it with the bytes
        ``data``, then ``then`` (END: it closes the connection; DRAIN: it waits for the worker
        to leave); the session has no report."""
        server = self.serve(session_script({b"x": [data, then]}))
        sessions = []

        async def call_async():
            async with AsyncClient(server.path).session(handler="wf:run") as s:
                sessions.append(s)
                await s.call(b"x")

        with self.assertRaises(ProtocolError) as cm:
            if asynchronous:
                self.arun(call_async())
            else:
                with Client(server.path).session(handler="wf:run") as s:
                    sessions.append(s)
                    s.call(b"x")
        self.assertIsNone(sessions[0].report)
        server.close()
        return cm.exception.code

    def assertSocketPath(self, client_class):
        """The socket is the one given, else WFJAIL_SOCKET; with neither, say how to get one."""
        with mock.patch.dict(os.environ, {"WFJAIL_SOCKET": "/run/wfjail.sock"}):
            self.assertEqual(client_class().path, "/run/wfjail.sock")
            self.assertEqual(client_class("/elsewhere.sock").path, "/elsewhere.sock")
        with mock.patch.dict(os.environ):
            os.environ.pop("WFJAIL_SOCKET", None)
            with self.assertRaises(RuntimeError) as cm:
                client_class()
            self.assertIn("WFJAIL_SOCKET", str(cm.exception))
            self.assertIn("wfjail serve", str(cm.exception))
            self.assertIn("path", str(cm.exception))

    def assertOpenDoc(self, server, doc, i=0):
        sent = server.received(i)
        self.assertEqual(sent[0][0], C.OPEN)
        self.assertEqual(json.loads(sent[0][1].decode("utf-8")), doc)
        return sent


ANSWERS = {
    b"violate": [(C.ERROR, VIOLATION_ERROR)],
    b"raise": [(C.ERROR, VALUE_ERROR)],
    b"hang": [(C.FAILED, TIMEOUT_REPORT)],
    b"net": [(C.FAILED, KILLED_REPORT)],
    b"big": [(C.RESULT, bytes(range(256)) * 4096)],  # 1 MiB: many recv() calls
    b"": [(C.RESULT, b"")],
}


class BrokenAnswerTests:
    """What both clients make of a call's broken answer (``asynchronous``: which client)."""

    asynchronous = False

    def test_truncated_mid_frame(self):
        for cut in ("0b00000022616263", "0b00", "0b000000"):
            with self.subTest(cut):
                self.assertEqual(self.protocol_error_of_a_call(bytes.fromhex(cut), END,
                                                               self.asynchronous), "truncated")

    def test_bad_frames_from_the_server(self):
        cases = [("0200000122", "oversized"), ("ffffffff", "oversized"),
                 ("00000000", "empty"), ("020000000278", "unknown-kind"),
                 ("0500000009", "unknown-kind"), ("0100000012", "unknown-kind")]
        for bad, code in cases:
            with self.subTest(bad):
                # the server keeps the connection open: the client must not wait for more
                self.assertEqual(self.protocol_error_of_a_call(bytes.fromhex(bad), DRAIN,
                                                               self.asynchronous), code)


class SyncClientTests(BrokenAnswerTests, ServerTestCase):
    def raised_by_a_call(self, answers, expected, goes_on=False):
        """The exception ``expected`` that a call of b"x" raises when wfjail answers it with
        ``answers``; with ``goes_on``, the next call answers (and the session's report is OK)."""
        server = self.serve(session_script({**ANSWERS, b"x": answers}))
        with Client(server.path).session(handler="wf:run") as s:
            with self.assertRaises(expected) as cm:
                s.call(b"x")
            if goes_on:
                self.assertEqual(s.call(b"again"), b"echo:again", "the session goes on")
        if goes_on:
            self.assertEqual(s.report, OK_REPORT)
        return cm.exception

    def test_socket_path(self):
        self.assertSocketPath(Client)

    def test_open_zygote_session(self):
        server = self.serve(session_script())
        with Client(server.path).session(handler="wf:run", timeout="5s") as s:
            self.assertEqual((s.id, s.mode), (7, "zygote"))
        self.assertOpenDoc(server, {"handler": "wf:run", "timeout": "5s"})

    def test_open_exec_session(self):
        server = self.serve(session_script(opened={"session": 8, "mode": "exec"}))
        with mock.patch.dict(os.environ, {"WFJAIL_SOCKET": server.path}):
            with Client().session(argv=("/usr/bin/python3", "guest.py")) as s:
                self.assertEqual((s.id, s.mode), (8, "exec"))
        self.assertOpenDoc(server, {"argv": ["/usr/bin/python3", "guest.py"]})

    def test_calls_and_close(self):
        server = self.serve(session_script(ANSWERS))
        with Client(server.path).session(handler="wf:run") as s:
            self.assertEqual(s.call(b"activation-1"), b"echo:activation-1")
            self.assertEqual(s.call("h\u00e9llo"), "echo:h\u00e9llo".encode("utf-8"))
            self.assertEqual(s.call(bytearray(b"\x00\xff")), b"echo:\x00\xff")
            self.assertEqual(s.call(b""), b"")
            self.assertEqual(s.call(b"big"), bytes(range(256)) * 4096)
            self.assertIsNone(s.report)
        self.assertEqual(s.report, OK_REPORT)
        self.assertEqual(s.close(), OK_REPORT, "a second close() sends nothing")
        sent = self.assertOpenDoc(server, {"handler": "wf:run"})
        self.assertEqual(sent[1:], [(C.CALL, b"activation-1"),
                                    (C.CALL, "h\u00e9llo".encode("utf-8")),
                                    (C.CALL, b"\x00\xff"), (C.CALL, b""), (C.CALL, b"big"),
                                    (C.CLOSE, b"")])

    def test_close_returns_the_report(self):
        server = self.serve(session_script())
        s = Client(server.path).session(handler="wf:run").open()
        self.assertEqual(s.call(b"a"), b"echo:a")
        self.assertEqual(s.close(), OK_REPORT)
        self.assertEqual(s.report, OK_REPORT)
        with self.assertRaises(RuntimeError):
            s.call(b"after close")
        self.assertEqual([k for k, _ in server.received()], [C.OPEN, C.CALL, C.CLOSE])

    def test_violation(self):
        self.assertViolation(self.raised_by_a_call(ANSWERS[b"violate"], Violation, goes_on=True))

    def test_guest_error(self):
        self.assertGuestError(self.raised_by_a_call(ANSWERS[b"raise"], GuestError, goes_on=True))

    def test_violation_type_without_violations_is_a_guest_error(self):
        doc = dict(VIOLATION_ERROR, violations=[])
        e = self.raised_by_a_call([(C.ERROR, doc)], GuestError)
        self.assertNotIsInstance(e, Violation)
        self.assertEqual((e.type, e.violations), ("wfjail.Violation", []))

    def test_a_violation_the_call_did_not_record_is_a_guest_error(self):
        # A guest raising wfjail.Violation itself: its message names no violation of the
        # call (an earlier call's, or none at all) -> GuestError, never a Violation.
        forged = dict(VIOLATION_ERROR, message="network: socket(AF_INET) denied",
                      violations=[CONNECT, CLONE])
        e = self.raised_by_a_call([(C.ERROR, forged)], GuestError)
        self.assertNotIsInstance(e, Violation)
        self.assertEqual(e.type, "wfjail.Violation")

    def test_a_violation_names_the_recorded_one_it_matches(self):
        doc = dict(VIOLATION_ERROR, message="network: connect(AF_INET 127.0.0.1:9) denied",
                   violations=[CLONE, CONNECT])
        e = self.raised_by_a_call([(C.ERROR, doc)], Violation)
        self.assertEqual((e.category, e.syscall), ("network", "connect"))

    def test_failed_on_open(self):
        def script(peer):
            peer.expect(C.OPEN)
            peer.send(C.FAILED, LAUNCH_REPORT)
        server = self.serve(script)
        s = Client(server.path).session(handler="wf:nope")
        with self.assertRaises(SessionFailed) as cm:
            with s:
                self.fail("the body does not run")
        e = cm.exception
        self.assertEqual((e.status, e.report), ("launch_error", LAUNCH_REPORT))
        self.assertEqual(str(e), "session launch_error: no such handler: wf:nope")
        self.assertEqual(s.report, LAUNCH_REPORT)
        self.assertIsNone(s.id)
        self.assertEqual(s.close(), LAUNCH_REPORT)

    def test_failed_on_call(self):
        server = self.serve(session_script(ANSWERS))
        with Client(server.path).session(handler="wf:run", timeout="500ms") as s:
            self.assertEqual(s.call(b"a"), b"echo:a")
            with self.assertRaises(SessionFailed) as cm:
                s.call(b"hang")
            self.assertEqual((cm.exception.status, cm.exception.report),
                             ("timeout", TIMEOUT_REPORT))
            self.assertIn("the call took longer than 500ms", str(cm.exception))
            self.assertEqual(s.report, TIMEOUT_REPORT)
            with self.assertRaises(RuntimeError):
                s.call(b"after the end")
        self.assertEqual(s.close(), TIMEOUT_REPORT)
        self.assertEqual([k for k, _ in server.received()], [C.OPEN, C.CALL, C.CALL],
                         "no CLOSE after FAILED")

    def test_failed_for_a_violation_names_it(self):
        server = self.serve(session_script(ANSWERS))
        with self.assertRaises(SessionFailed) as cm:
            with Client(server.path).session(handler="wf:run") as s:
                s.call(b"net")
        self.assertEqual(cm.exception.status, "violation")
        self.assertEqual(str(cm.exception), "session violation: network connect")
        self.assertEqual(s.report, KILLED_REPORT)

    def test_truncated_opened(self):
        def script(peer):
            peer.expect(C.OPEN)
            peer.send_raw(frame(C.OPENED, OPENED_ZYGOTE)[:-3])
        server = self.serve(script)
        with self.assertRaises(ProtocolError) as cm:
            with Client(server.path).session(handler="wf:run"):
                self.fail("the body does not run")
        self.assertCode(cm, "truncated")

    def test_closed_without_answering_close(self):
        def script(peer):
            peer.expect(C.OPEN)
            peer.send(C.OPENED, OPENED_ZYGOTE)
            peer.expect(C.CLOSE)
        server = self.serve(script)
        with Client(server.path).session(handler="wf:run") as s:
            pass
        self.assertIsNone(s.report)
        self.assertIsNone(s.close())

    def test_unexpected_kinds(self):
        def opened_twice(peer):
            peer.expect(C.OPEN)
            peer.send(C.RESULT, b"not yet")
        server = self.serve(opened_twice,
                            session_script({b"x": [(C.OPENED, OPENED_ZYGOTE)]}))
        with self.assertRaises(ProtocolError) as cm:
            Client(server.path).session(handler="wf:run").open()
        self.assertCode(cm, "unexpected")
        with self.assertRaises(ProtocolError) as cm:
            with Client(server.path).session(handler="wf:run") as s:
                s.call(b"x")
        self.assertCode(cm, "unexpected")

    def test_no_server(self):
        with tempfile.TemporaryDirectory(prefix="wfjail-client-test-") as d:
            with self.assertRaises(OSError):
                Client(os.path.join(d, "nobody.sock")).session(handler="wf:run").open()

    def test_call_before_open(self):
        with self.assertRaises(RuntimeError):
            Client("/nonexistent.sock").session(handler="wf:run").call(b"x")

    def test_vectors_as_the_server_sends_them(self):
        """Replay the byte-exact server vectors: opened, result, error, closed, failed."""
        v = {x["name"]: bytes.fromhex(x["hex"]) for x in load_vectors()["worker_vectors"]}

        def first(peer):
            peer.expect(C.OPEN)
            peer.send_raw(v["opened"])
            peer.expect(C.CALL)
            peer.send_raw(v["result"])
            peer.expect(C.CALL)
            peer.send_raw(v["error"])
            peer.expect(C.CLOSE)
            peer.send_raw(v["closed"])

        def second(peer):
            peer.expect(C.OPEN)
            peer.send_raw(v["opened"])
            peer.expect(C.CALL)
            peer.send_raw(v["failed"])
        server = self.serve(first, second)
        c = Client(server.path)
        with c.session(handler="my_workflows:activate", timeout="5s") as s:
            self.assertEqual((s.id, s.mode), (7, "zygote"))
            self.assertEqual(s.call(b"a"), b"\x00\x01reply")
            with self.assertRaises(GuestError) as cm:  # no violation object to build one from
                s.call(b"b")
            self.assertEqual(cm.exception.type, "wfjail.Violation")
        self.assertEqual(s.report, {"status": "ok", "violations": []})
        session = expected(
            next(x for x in load_vectors()["worker_vectors"] if x["name"] == "session"))
        sent = server.received(0)
        self.assertEqual(sent[1:], session[1:], "what the worker wrote: the 'session' vector")
        self.assertEqual(json.loads(sent[0][1].decode()), json.loads(session[0][1].decode()))
        with self.assertRaises(SessionFailed) as cm:
            with c.session(handler="my_workflows:activate") as s:
                s.call(b"a")
        self.assertEqual(cm.exception.status, "timeout")


class AsyncClientTests(BrokenAnswerTests, ServerTestCase):
    asynchronous = True

    def test_socket_path(self):
        self.assertSocketPath(AsyncClient)

    def test_open_zygote_session(self):
        server = self.serve(session_script())

        async def go():
            async with AsyncClient(server.path).session(handler="wf:run", timeout="5s") as s:
                self.assertEqual((s.id, s.mode), (7, "zygote"))
            return s
        self.assertEqual(self.arun(go()).report, OK_REPORT)
        self.assertOpenDoc(server, {"handler": "wf:run", "timeout": "5s"})

    def test_open_exec_session(self):
        server = self.serve(session_script(opened={"session": 8, "mode": "exec"}))

        async def go():
            with mock.patch.dict(os.environ, {"WFJAIL_SOCKET": server.path}):
                c = AsyncClient()
            async with c.session(argv=["/usr/bin/python3", "guest.py"]) as s:
                self.assertEqual((s.id, s.mode), (8, "exec"))
        self.arun(go())
        self.assertOpenDoc(server, {"argv": ["/usr/bin/python3", "guest.py"]})

    def test_calls_and_close(self):
        server = self.serve(session_script(ANSWERS))

        async def go():
            async with AsyncClient(server.path).session(handler="wf:run") as s:
                self.assertEqual(await s.call(b"activation-1"), b"echo:activation-1")
                self.assertEqual(await s.call("h\u00e9llo"), "echo:h\u00e9llo".encode("utf-8"))
                self.assertEqual(await s.call(b""), b"")
                self.assertEqual(await s.call(b"big"), bytes(range(256)) * 4096)
                self.assertIsNone(s.report)
            self.assertEqual(s.report, OK_REPORT)
            self.assertEqual(await s.close(), OK_REPORT, "a second close() sends nothing")
        self.arun(go())
        sent = self.assertOpenDoc(server, {"handler": "wf:run"})
        self.assertEqual(sent[1:], [(C.CALL, b"activation-1"),
                                    (C.CALL, "h\u00e9llo".encode("utf-8")),
                                    (C.CALL, b""), (C.CALL, b"big"), (C.CLOSE, b"")])

    def test_close_returns_the_report(self):
        server = self.serve(session_script())

        async def go():
            s = await AsyncClient(server.path).session(handler="wf:run").open()
            self.assertEqual(await s.call(b"a"), b"echo:a")
            self.assertEqual(await s.close(), OK_REPORT)
            self.assertEqual(s.report, OK_REPORT)
            with self.assertRaises(RuntimeError):
                await s.call(b"after close")
        self.arun(go())
        self.assertEqual([k for k, _ in server.received()], [C.OPEN, C.CALL, C.CLOSE])

    def test_concurrent_sessions(self):
        server = self.serve(*[session_script(opened={"session": i, "mode": "zygote"})
                              for i in range(3)])

        async def one(c, i):
            async with c.session(handler="wf:run") as s:
                a = await s.call(b"a%d" % i)
                await asyncio.sleep(0)
                b = await s.call(b"b%d" % i)
            return a, b, s.id

        async def go():
            c = AsyncClient(server.path)
            return await asyncio.gather(*[one(c, i) for i in range(3)])
        out = self.arun(go())
        self.assertEqual([(a, b) for a, b, _ in out],
                         [(b"echo:a%d" % i, b"echo:b%d" % i) for i in range(3)])
        self.assertEqual(sorted(i for _, _, i in out), [0, 1, 2])

    def raised_by_a_call_then_the_session_goes_on(self, request, expected):
        """The exception ``expected`` that a call of ``request`` raises; the next call answers."""
        server = self.serve(session_script(ANSWERS))

        async def go():
            async with AsyncClient(server.path).session(handler="wf:run") as s:
                with self.assertRaises(expected) as cm:
                    await s.call(request)
                self.assertEqual(await s.call(b"again"), b"echo:again", "the session goes on")
            return cm.exception
        return self.arun(go())

    def test_violation(self):
        self.assertViolation(self.raised_by_a_call_then_the_session_goes_on(b"violate", Violation))

    def test_guest_error(self):
        self.assertGuestError(self.raised_by_a_call_then_the_session_goes_on(b"raise", GuestError))

    def test_failed_on_open(self):
        def script(peer):
            peer.expect(C.OPEN)
            peer.send(C.FAILED, LAUNCH_REPORT)
        server = self.serve(script)

        async def go():
            s = AsyncClient(server.path).session(handler="wf:nope")
            with self.assertRaises(SessionFailed) as cm:
                async with s:
                    self.fail("the body does not run")
            self.assertEqual((cm.exception.status, cm.exception.report),
                             ("launch_error", LAUNCH_REPORT))
            self.assertEqual(s.report, LAUNCH_REPORT)
            self.assertEqual(await s.close(), LAUNCH_REPORT)
        self.arun(go())

    def test_failed_on_call(self):
        server = self.serve(session_script(ANSWERS))

        async def go():
            async with AsyncClient(server.path).session(handler="wf:run") as s:
                self.assertEqual(await s.call(b"a"), b"echo:a")
                with self.assertRaises(SessionFailed) as cm:
                    await s.call(b"hang")
                self.assertEqual((cm.exception.status, cm.exception.report),
                                 ("timeout", TIMEOUT_REPORT))
                self.assertEqual(s.report, TIMEOUT_REPORT)
                with self.assertRaises(RuntimeError):
                    await s.call(b"after the end")
            self.assertEqual(await s.close(), TIMEOUT_REPORT)
        self.arun(go())
        self.assertEqual([k for k, _ in server.received()], [C.OPEN, C.CALL, C.CALL])

    def test_truncated_opened(self):
        def script(peer):
            peer.expect(C.OPEN)
            peer.send_raw(frame(C.OPENED, OPENED_ZYGOTE)[:-3])
        server = self.serve(script)

        async def go():
            with self.assertRaises(ProtocolError) as cm:
                async with AsyncClient(server.path).session(handler="wf:run"):
                    self.fail("the body does not run")
            self.assertCode(cm, "truncated")
        self.arun(go())

    def test_unexpected_kinds(self):
        def result_first(peer):
            peer.expect(C.OPEN)
            peer.send(C.RESULT, b"not yet")
        server = self.serve(result_first, session_script({b"x": [(C.OPENED, OPENED_ZYGOTE)]}))

        async def go():
            with self.assertRaises(ProtocolError) as cm:
                await AsyncClient(server.path).session(handler="wf:run").open()
            self.assertCode(cm, "unexpected")
            with self.assertRaises(ProtocolError) as cm:
                async with AsyncClient(server.path).session(handler="wf:run") as s:
                    await s.call(b"x")
            self.assertCode(cm, "unexpected")
        self.arun(go())

    def test_no_server(self):
        with tempfile.TemporaryDirectory(prefix="wfjail-client-test-") as d:
            with self.assertRaises(OSError):
                self.arun(AsyncClient(os.path.join(d, "nobody.sock"))
                          .session(handler="wf:run").open())

    def test_call_before_open(self):
        with self.assertRaises(RuntimeError):
            self.arun(AsyncClient("/nonexistent.sock").session(handler="wf:run").call(b"x"))


# --- the real binary -------------------------------------------------------------------------

def wfjail_binary():
    found = [p for p in (os.path.join(REPO, "target", "x86_64-unknown-linux-musl", build, "wfjail")
                         for build in ("debug", "release")) if os.access(p, os.X_OK)]
    return max(found, key=os.path.getmtime) if found else None


WORKFLOWS = '''
import os
state = []
def mutate(req):
    state.append(req.decode())
    return ("%d:%s" % (len(state), ",".join(state))).encode()
def fork(req):
    os.fork()
    return b"forked"
'''

WORKER = '''
import asyncio, json, sys
sys.path.insert(0, {pydir!r})
from wfjail import Violation
from wfjail.client import AsyncClient, Client
MOD = {module!r}
out = {{}}
with Client().session(handler=MOD + ":mutate", timeout="5s") as s:
    out["sync"] = [s.call(b"a").decode(), s.call("b").decode(), s.id, s.mode]
out["sync_status"] = s.report["status"]

async def two():
    async with AsyncClient().session(handler=MOD + ":mutate") as s:
        calls = [(await s.call(b"c")).decode(), (await s.call(b"d")).decode(), s.id]
    return calls + [s.report["status"]]
out["async"] = asyncio.run(two())

try:
    with Client().session(handler=MOD + ":fork") as s:
        out["fork"] = s.call(b"x").decode()
except Violation as v:
    out["fork"] = [v.category, v.syscall, v.hint, s.report["status"],
                   [x["syscall"] for x in s.report["violations"]]]
print(json.dumps(out))
'''


class EndToEndTests(unittest.TestCase):
    def test_real_serve_zygote_session(self):
        binary = wfjail_binary()
        if binary is None:
            self.skipTest("no wfjail binary in target/x86_64-unknown-linux-musl/{debug,release}: "
                          "run `cargo build` first")
        scratch = tempfile.mkdtemp(prefix="wfjail-client-e2e-")
        self.addCleanup(shutil.rmtree, scratch, True)
        module = "wf_client_e2e_%d" % os.getpid()
        pydir = os.path.join(REPO, "python")
        with open(os.path.join(scratch, module + ".py"), "w", encoding="utf-8") as f:
            f.write(WORKFLOWS)
        with open(os.path.join(scratch, "worker.py"), "w", encoding="utf-8") as f:
            f.write(WORKER.format(pydir=pydir, module=module))
        with open(os.path.join(scratch, "policy.toml"), "w", encoding="utf-8") as f:
            f.write('extends = "temporal-python"\n'
                    '[filesystem]\nread = [%s, %s]\n'
                    '[env]\nset = { PYTHONPATH = %s }\n'
                    % (json.dumps(pydir), json.dumps(scratch),
                       json.dumps(pydir + ":" + scratch)))
        argv = [binary, "serve", "-p", os.path.join(scratch, "policy.toml"),
                "--zygote", "--zygotes", "1", "--python", "/usr/bin/python3",
                "--preload", module, "--", "/usr/bin/python3",
                os.path.join(scratch, "worker.py")]
        proc = subprocess.run(argv, cwd=scratch, stdin=subprocess.DEVNULL,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60)
        stdout, stderr = proc.stdout.decode(), proc.stderr.decode()
        self.assertEqual(proc.returncode, 0, "stdout: %s\nstderr: %s" % (stdout, stderr))
        out = json.loads(stdout)
        self.assertEqual(out["sync"][:2], ["1:a", "2:a,b"], "module state lives for the session")
        self.assertEqual(out["sync"][3], "zygote")
        self.assertEqual(out["sync_status"], "ok")
        self.assertEqual(out["async"][:2], ["1:c", "2:c,d"], "a new session starts afresh")
        self.assertEqual(out["async"][3], "ok")
        self.assertNotEqual(out["sync"][2], out["async"][2], "distinct session ids")
        category, syscall, hint, status, recorded = out["fork"]
        self.assertEqual((category, syscall, status), ("subprocess", "clone", "violation"), out)
        self.assertIn("subprocess", hint)
        self.assertIn("clone", recorded)


if __name__ == "__main__":
    unittest.main()


class LogTests(unittest.TestCase):
    """LOG frames go to the session's on_log, in order, and never reach the caller."""

    result = b"\x00\x01reply"  # the "result" vector's payload

    def frames(self):
        v = {x["name"]: bytes.fromhex(x["hex"]) for x in load_vectors()["worker_vectors"]}
        return v["log"] + v["log"] + v["result"]

    def test_sync(self):
        got = []
        s = C.Session("/nonexistent", "", on_log=lambda level, text: got.append((level, text)))
        a, b = socket.socketpair()
        s._sock = a
        s._conversation.call(b"x")
        b.sendall(self.frames())
        b.close()
        self.assertEqual(s._answer(), self.result)
        self.assertEqual(len(got), 2)
        self.assertEqual(got[0][0], 20)
        self.assertTrue(got[0][1].startswith("greeting wfjail"))
        a.close()

    def test_async_and_a_bad_record_is_dropped(self):
        got = []

        async def go():
            s = C.AsyncSession("/nonexistent", "", on_log=lambda *r: got.append(r))
            s._reader = asyncio.StreamReader()
            s._reader.feed_data(C._frame(C.LOG, b"not json") + self.frames())
            s._reader.feed_eof()
            s._conversation.call(b"x")
            return await s._answer()

        self.assertEqual(asyncio.run(go()), self.result)
        self.assertEqual([level for level, _ in got], [20, 20])
