"""Client of ``wfjail serve``: open confined sessions from the (unconfined) worker.

    from wfjail.client import Client

    with Client().session(handler="my_workflows:activate") as s:   # zygote mode
        reply = s.call(b"first activation")
        reply = s.call(b"second activation")                         # same process, same state
    print(s.report["status"])                                        # "ok"

    async with AsyncClient().session(argv=["/usr/bin/python3", "guest.py"]) as s:  # exec mode
        reply = await s.call(b"...")

The socket comes from ``WFJAIL_SOCKET`` (set by ``wfjail serve``) unless given. A call that
fails in the guest raises ``GuestError`` (``wfjail.Violation`` when the guest hit a denied
call); a call that succeeded leaves what was denied during it in ``session.violations``
(code may have swallowed the error); a session that ends abnormally (killed for a
violation, crashed, timed out) raises ``SessionFailed`` with the session's report; an open
on a server whose every slot is taken raises ``Busy`` at once. ``Client.status()`` says the
server's capacity. Standard library only; the wire is in docs/protocol.md ("The worker
wire").
"""

import asyncio
import json
import os
import socket

from . import wire
from .errors import ProtocolError, Violation
from .wire import WorkerKind

OPEN, CALL, CLOSE, STATUS = WorkerKind.OPEN, WorkerKind.CALL, WorkerKind.CLOSE, WorkerKind.STATUS
REPLY, INTERRUPT, TIME = WorkerKind.REPLY, WorkerKind.INTERRUPT, WorkerKind.TIME
OPENED, RESULT, ERROR = WorkerKind.OPENED, WorkerKind.RESULT, WorkerKind.ERROR
FAILED, CLOSED, BUSY = WorkerKind.FAILED, WorkerKind.CLOSED, WorkerKind.BUSY
SERVER, VIOLATIONS = WorkerKind.SERVER, WorkerKind.VIOLATIONS
LOG, UPCALL = WorkerKind.LOG, WorkerKind.UPCALL
_NAMES = {kind: kind.name for kind in wire.SERVER_SENDS}  # tests/serve.rs names frames by it
_SERVER_KINDS = wire.SERVER_SENDS
CAP = wire.MAX_CAP


class GuestError(Exception):
    """A call raised in the guest: its type, message, traceback and the violations wfjail
    recorded during that call."""

    __module__ = "wfjail"

    def __init__(self, doc):
        super().__init__("%s: %s" % (doc.get("type", "?"), doc.get("message", "")))
        self.type = doc.get("type", "")
        self.message = doc.get("message", "")
        self.traceback = doc.get("traceback", "")
        self.violations = doc.get("violations", [])


class Busy(Exception):
    """The server runs as many sessions as it may (``--max-executions``); nothing was
    started. ``capacity`` and ``open`` say how many."""

    __module__ = "wfjail"

    def __init__(self, doc):
        self.capacity = doc.get("capacity")
        self.open = doc.get("open")
        super().__init__("wfjail serve is full: %s of %s sessions open (raise --max-executions)"
                         % (self.open, self.capacity))


class SessionFailed(Exception):
    """The session ended without CLOSE: ``report`` is its report (status, violations...)."""

    __module__ = "wfjail"

    def __init__(self, report):
        status = report.get("status", "?")
        why = report.get("error") or ", ".join(
            "%s %s" % (v.get("category"), v.get("syscall")) for v in report.get("violations", []))
        super().__init__("session %s%s" % (status, ": " + why if why else ""))
        self.report = report
        self.status = status


def _frame(kind, payload=b""):
    if isinstance(payload, str):
        payload = payload.encode("utf-8")
    return wire.pack(kind, payload, CAP)


def _check_length(length):
    wire.check_length(length, CAP)


def _check_kind(kind):
    wire.check_kind(kind, _SERVER_KINDS, "unexpected frame kind 0x%02x from wfjail")


def _check_header(length, kind):
    _check_length(length)
    _check_kind(kind)


def _expect(kind, payload, want):
    """The payload of a reply of kind ``want``; a call's ERROR raises the guest's error, BUSY
    answering OPEN raises ``Busy``, any other kind is a protocol error. (FAILED is the
    session's to handle: it ends it.)"""
    if kind == want:
        return payload
    if kind == ERROR and want == RESULT:
        _raise_call_error(json.loads(payload))
    if kind == BUSY and want == OPENED:
        raise Busy(json.loads(payload))
    raise ProtocolError("unexpected", "expected %s, got kind 0x%02x" % (_NAMES[want], kind))


def _upcall_reply(on_upcall, payload):
    """The REPLY payload for an UPCALL: status 0 and the handler's bytes, or status 1 and
    why there is none."""
    if on_upcall is None:
        return wire.pack_reply(wire.ReplyStatus.REFUSED, b"this session has no upcall handler "
                               b"(Client.session(on_upcall=...))")
    try:
        answer = on_upcall(payload)
        return wire.pack_reply(wire.ReplyStatus.ANSWER, bytes(answer))
    except Exception as e:  # noqa: BLE001  (the guest hears why; the worker goes on)
        return wire.pack_reply(wire.ReplyStatus.REFUSED,
                               ("%s: %s" % (type(e).__name__, e)).encode("utf-8", "replace"))


def _deliver_log(on_log, payload):
    """Hand a LOG frame to the session's ``on_log(level, text)`` (a bad one is dropped: the
    guest's words never break the worker)."""
    if on_log is None:
        return
    try:
        doc = json.loads(payload)
        level, text = int(doc["level"]), str(doc["text"])
    except (ValueError, KeyError, TypeError):
        return
    on_log(level, text)


def _raise_call_error(doc):
    """Raise the guest's error: ``wfjail.Violation`` only when the guest's message names a
    violation wfjail recorded during this call (the ERROR's ``violations`` are that call's);
    anything else, including a guest that raised a Violation of its own making, is a
    ``GuestError``."""
    found = doc.get("violations") or []
    if doc.get("type") == "wfjail.Violation" and isinstance(found, list):
        message = doc.get("message", "")
        candidates = [Violation.from_dict(v) for v in found if isinstance(v, dict)]
        v = next((c for c in candidates if message.startswith(c._head())), None)
        if v is not None:
            v.traceback = doc.get("traceback", "")
            raise v
    raise GuestError(doc)


_NO_INIT = object()


def _time_frame(time_ns):
    """A TIME frame for the next CALL (nothing when ``time_ns`` is None)."""
    if time_ns is None:
        return b""
    return _frame(TIME, wire.pack_time(time_ns))


def _open_doc(handler, argv, timeout, init=_NO_INIT, logs=False, seed=None, time_ns=None):
    doc = {}
    if seed is not None:
        doc["seed"] = int(seed)
    if time_ns is not None:
        doc["time_ns"] = int(time_ns)
    if logs:
        doc["logs"] = True
    if handler is not None:
        doc["handler"] = handler
    if argv is not None:
        doc["argv"] = list(argv)
    if timeout is not None:
        doc["timeout"] = timeout
    if init is not _NO_INIT:
        doc["init"] = init
    return json.dumps(doc)


class Client:
    """Opens sessions on a ``wfjail serve`` socket (blocking sockets)."""

    def __init__(self, path=None):
        self.path = path or os.environ.get("WFJAIL_SOCKET")
        if not self.path:
            raise RuntimeError("no socket: run under `wfjail serve` (it sets WFJAIL_SOCKET) "
                               "or pass the path")

    def session(self, handler=None, argv=None, timeout=None, init=_NO_INIT, on_log=None,
                on_upcall=None, seed=None, time_ns=None, max_frame=None):
        """A session (use it as a context manager). ``handler`` in zygote mode,
        ``argv`` in exec mode; ``timeout`` per call, e.g. ``"5s"``; ``init``, any JSON
        value (at most 32 KiB encoded): the session's arguments — in zygote mode the handler
        is then called once with it and returns the session's handler; an exec'd guest
        reads it with ``wfjail.guest.init_value()``. ``on_log(level, text)``: receives the
        guest's log records (``wfjail.guest.log``) instead of wfjail's stderr.
        ``on_upcall(bytes) -> bytes``: answers the guest's ``wfjail.guest.upcall`` during a
        call (it runs unconfined: never unpickle or eval what it receives); an exception
        becomes the guest's ``UpcallError``. ``seed``: under ``[random] getrandom =
        "seeded"``, the session's randomness (``os.urandom``, ``random``, ``uuid4``) is drawn
        from this seed (default 0). ``time_ns``: under ``[time] clock = "virtual"``, what the
        guest's wall clock reads (nanoseconds since the epoch; default: now), until a call
        passes another. ``max_frame``: the largest RESULT, ERROR, LOG or UPCALL payload (the
        guest's words) this session reads (default: the protocol's 16 MiB); a larger one
        ends the session unread (``ProtocolError('oversized')``)."""
        return Session(self.path, _open_doc(handler, argv, timeout, init, on_log is not None,
                                            seed, time_ns),
                       on_log, on_upcall, max_frame)

    def status(self):
        """The server's capacity: ``{"capacity", "open", "mode", "policy"}``."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.connect(self.path)
            sock.sendall(_frame(STATUS))
            s = Session(self.path, "")
            s._sock = sock
            kind, payload = s._read()
            s._sock = None
        return json.loads(_expect(kind, payload, SERVER))


# The frames whose payload is the guest's (their size is its choice): a session may read
# less of them than the protocol's cap.
_GUEST_SIZED = frozenset((RESULT, ERROR, LOG, UPCALL))


class Session:
    def __init__(self, path, open_doc, on_log=None, on_upcall=None, max_frame=None):
        self._path, self._open_doc = path, open_doc
        self._max_frame = CAP if max_frame is None else int(max_frame)
        self._on_log = on_log
        self._on_upcall = on_upcall
        self._sock = None
        self.id = None
        self.mode = None
        self.report = None
        # What wfjail denied during the last call that returned a result (dicts, the report's
        # violation entries); empty when nothing was.
        self.violations = []

    def open(self):
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._sock.connect(self._path)
            self._sock.sendall(_frame(OPEN, self._open_doc))
            doc = json.loads(self._answer(OPENED))
        except BaseException:
            if self._sock is not None:
                self._sock.close()
                self._sock = None
            raise
        self.id, self.mode = doc.get("session"), doc.get("mode")
        return self

    def call(self, request, time_ns=None):
        """Send one call; return the guest's result bytes. ``time_ns``: the workflow time
        of this call and after (``[time] clock = "virtual"``)."""
        if self._sock is None:
            raise RuntimeError("the session is not open")
        try:
            self._sock.sendall(_time_frame(time_ns) + _frame(CALL, request))
        except OSError:
            # The session may have ended already (its guest died between calls): wfjail sent
            # FAILED with the report before closing; read it rather than lose it.
            pass
        return self._answer(RESULT)

    def close(self):
        """End the session; return its report (a dict, the shape of `wfjail run --report`)."""
        if self._sock is None:
            return self.report
        try:
            self._sock.sendall(_frame(CLOSE))
            kind, payload = self._read()
            if kind in (CLOSED, FAILED):
                self._finish(payload)
        except (OSError, ProtocolError):
            self._sock.close()
            self._sock = None
        return self.report

    def interrupt(self):
        """Interrupts the call in progress (from any thread): the guest raises
        ``wfjail.Interrupted`` in the code it runs, and the call answers as that code lets
        it (usually ERROR with where it was). Nothing happens outside a call."""
        sock = self._sock
        if sock is not None:
            try:
                sock.sendall(_frame(INTERRUPT))
            except OSError:
                pass

    def abort(self):
        """Ends the session from any thread without waiting: a call blocked in another
        thread fails at once (wfjail sees the worker leave and kills the guest)."""
        sock = self._sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _answer(self, want):
        kind, payload = self._read()
        while kind == UPCALL and want == RESULT:
            self._sock.sendall(_frame(REPLY, _upcall_reply(self._on_upcall, payload)))
            kind, payload = self._read()
        self.violations = []
        if kind == VIOLATIONS and want == RESULT:
            self.violations = json.loads(payload)
            kind, payload = self._read()
        if kind == FAILED:
            self._finish(payload)
            raise SessionFailed(self.report)
        return _expect(kind, payload, want)

    def _finish(self, payload):
        self.report = json.loads(payload)
        self._sock.close()
        self._sock = None

    def _read_exact(self, n):
        chunks, left = [], n
        while left:
            chunk = self._sock.recv(min(left, 1 << 20))
            if not chunk:
                raise ProtocolError("truncated", "wfjail closed the session connection")
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)

    def _read(self):
        while True:
            kind, payload = self._read_frame()
            if kind != LOG:
                return kind, payload
            _deliver_log(self._on_log, payload)

    def _read_frame(self):
        # The length is checked before the kind byte is awaited (docs/protocol.md).
        (length,) = wire.LENGTH.unpack(self._read_exact(4))
        _check_length(length)
        kind = self._read_exact(1)[0]
        _check_kind(kind)
        if kind in _GUEST_SIZED and length - 1 > self._max_frame:
            # Not read: the session ends here (the rest of the frame would be read as
            # frames), and wfjail ends the guest when the worker leaves.
            self._sock.close()
            self._sock = None
            raise ProtocolError("oversized", "a %s frame of %d bytes from the guest, over the "
                                "%d this session reads" % (_NAMES[kind], length - 1,
                                                            self._max_frame))
        return kind, self._read_exact(length - 1)

    def __enter__(self):
        return self.open()

    def __exit__(self, *exc):
        self.close()
        return False


class AsyncClient(Client):
    """The asyncio flavour of ``Client``."""

    def session(self, handler=None, argv=None, timeout=None, init=_NO_INIT, on_log=None,
                on_upcall=None, seed=None, time_ns=None):
        return AsyncSession(self.path, _open_doc(handler, argv, timeout, init,
                                                 on_log is not None, seed, time_ns),
                            on_log, on_upcall)


class AsyncSession:
    def __init__(self, path, open_doc, on_log=None, on_upcall=None):
        self._path, self._open_doc = path, open_doc
        self._on_log = on_log
        self._on_upcall = on_upcall
        self._reader = self._writer = None
        self.id = self.mode = self.report = None
        self.violations = []

    async def open(self):
        self._reader, self._writer = await asyncio.open_unix_connection(self._path)
        try:
            self._writer.write(_frame(OPEN, self._open_doc))
            await self._writer.drain()
            doc = json.loads(await self._answer(OPENED))
        except BaseException:
            if self._writer is not None:
                self._writer.close()
                self._writer = None
            raise
        self.id, self.mode = doc.get("session"), doc.get("mode")
        return self

    async def call(self, request, time_ns=None):
        if self._writer is None:
            raise RuntimeError("the session is not open")
        try:
            self._writer.write(_time_frame(time_ns) + _frame(CALL, request))
            await self._writer.drain()
        except OSError:
            pass  # the session ended already: its FAILED report is waiting to be read
        return await self._answer(RESULT)

    async def close(self):
        if self._writer is None:
            return self.report
        try:
            self._writer.write(_frame(CLOSE))
            await self._writer.drain()
            kind, payload = await self._read()
            if kind in (CLOSED, FAILED):
                await self._finish(payload)
        except (OSError, ProtocolError, asyncio.IncompleteReadError):
            self._writer.close()
            self._writer = None
        return self.report

    async def _answer(self, want):
        kind, payload = await self._read()
        while kind == UPCALL and want == RESULT:
            self._writer.write(_frame(REPLY, _upcall_reply(self._on_upcall, payload)))
            await self._writer.drain()
            kind, payload = await self._read()
        self.violations = []
        if kind == VIOLATIONS and want == RESULT:
            self.violations = json.loads(payload)
            kind, payload = await self._read()
        if kind == FAILED:
            await self._finish(payload)
            raise SessionFailed(self.report)
        return _expect(kind, payload, want)

    async def _finish(self, payload):
        self.report = json.loads(payload)
        self._writer.close()
        try:
            await self._writer.wait_closed()
        except OSError:
            pass
        self._writer = None

    async def _read(self):
        while True:
            kind, payload = await self._read_frame()
            if kind != LOG:
                return kind, payload
            _deliver_log(self._on_log, payload)

    async def _read_frame(self):
        try:
            (length,) = wire.LENGTH.unpack(await self._reader.readexactly(4))
            _check_length(length)
            kind = (await self._reader.readexactly(1))[0]
            _check_kind(kind)
            return kind, await self._reader.readexactly(length - 1)
        except asyncio.IncompleteReadError:
            raise ProtocolError("truncated", "wfjail closed the session connection") from None

    async def __aenter__(self):
        return await self.open()

    async def __aexit__(self, *exc):
        await self.close()
        return False
