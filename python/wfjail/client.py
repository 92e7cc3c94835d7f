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
import logging
import os
import socket

from .conversation import (CAP, NO_INIT, Busy, Conversation, GuestError, Send, SessionFailed,
                           frame, open_doc)
from .errors import ProtocolError
from .wire_worker import (BUSY, CALL, CLOSE, CLOSED, ERROR, FAILED, INTERRUPT, LOG, OPEN,
                          OPENED, REPLY, RESULT, SERVER, SERVER_SENDS, STATUS, TIME, UPCALL,
                          VIOLATIONS)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Dict, Iterable, Iterator, List, Literal, Optional, Tuple, Union

    from .conversation import OnLog, OnUpcall

__all__ = ["AsyncClient", "AsyncSession", "Busy", "Client", "GuestError", "Session",
           "SessionFailed", "OPEN", "CALL", "CLOSE", "STATUS", "REPLY", "INTERRUPT", "TIME",
           "OPENED", "RESULT", "ERROR", "FAILED", "CLOSED", "BUSY", "SERVER", "VIOLATIONS", "LOG",
           "UPCALL"]

# The names tests/serve.rs's workers use to build and name raw frames.
_frame = frame
_NAMES = {kind: kind.name for kind in SERVER_SENDS}


class Client:
    """Opens sessions on a ``wfjail serve`` socket (blocking sockets)."""

    def __init__(self, path: "Optional[str]" = None) -> None:
        found = path or os.environ.get("WFJAIL_SOCKET")
        if not found:
            raise RuntimeError("no socket: run under `wfjail serve` (it sets WFJAIL_SOCKET) "
                               "or pass the path")
        self.path: str = found

    def session(self, handler: "Optional[str]" = None, argv: "Optional[Iterable[str]]" = None,
                timeout: "Optional[str]" = None, init: "Any" = NO_INIT,
                on_log: "Optional[OnLog]" = None, on_upcall: "Optional[OnUpcall]" = None,
                seed: "Optional[int]" = None, time_ns: "Optional[int]" = None,
                max_frame: "Optional[int]" = None) -> "Session":
        """A session (use it as a context manager). ``handler`` in zygote mode,
        ``argv`` in exec mode; ``timeout`` per call, e.g. ``"5s"``; ``init``, any JSON
        value (at most 32 KiB encoded): the session's arguments \u2014 in zygote mode the handler
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
        return Session(self.path, open_doc(handler, _listed(argv), timeout, init,
                                           on_log is not None, seed, time_ns),
                       on_log, on_upcall, max_frame)

    def status(self) -> "Dict[str, Any]":
        """The server's capacity: ``{"capacity", "open", "lingering", "mode", "policy"}``
        (``lingering``: closed guests not exited yet, which hold no slot)."""
        s = Session(self.path, "")
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.connect(self.path)
            sock.sendall(s._conversation.status())
            s._sock = sock
            doc: "Dict[str, Any]" = s._answer()
            s._sock = None
        return doc


def _listed(argv: "Optional[Iterable[str]]") -> "Optional[List[str]]":
    return None if argv is None else list(argv)


# How many times an OPEN is sent again after wfjail dropped its connection unanswered.
OPEN_RETRIES = 2

_log = logging.getLogger("wfjail.client")


def _retrying(path: str, exc: BaseException, attempt: int) -> None:
    """Logs an OPEN sent again (a server that drops connections is worth knowing of)."""
    _log.warning("wfjail at %s dropped the connection of an OPEN without answering (%s: %s); "
                 "sending it again (%d of %d)", path, type(exc).__name__, exc, attempt,
                 OPEN_RETRIES)


def _dropped(exc: BaseException, received: int) -> bool:
    """Whether ``exc`` ended an OPEN's connection before wfjail answered a single byte (the
    server's end closed unanswered, or went away with the connection still in its listener's
    backlog: reset, end of file, or a broken pipe while sending). The server then holds no
    session of it (a guest it started ends when it sees the worker gone): the OPEN can be
    sent again. A refused or missing socket is not retried (no server there)."""
    if received:
        return False
    if isinstance(exc, (ConnectionResetError, BrokenPipeError)):
        return True
    return isinstance(exc, ProtocolError) and exc.code == "truncated"


class _Conversing:
    """The conversation's state, as a session's own attributes."""

    _conversation: Conversation

    @property
    def id(self) -> "Any":
        """The session's number (OPENED's ``session``)."""
        return self._conversation.id

    @property
    def pid(self) -> "Optional[int]":
        """The guest's pid as wfjail sees it (OPENED's ``pid``), if it said."""
        return self._conversation.pid

    @property
    def mode(self) -> "Any":
        """``"zygote"`` or ``"exec"`` (OPENED's ``mode``)."""
        return self._conversation.mode

    @property
    def report(self) -> "Optional[Dict[str, Any]]":
        """The session's report once it ended (CLOSED or FAILED), else None."""
        return self._conversation.report

    @property
    def violations(self) -> "List[Dict[str, Any]]":
        """What wfjail denied during the last call that returned a result (dicts, the
        report's violation entries); empty when nothing was."""
        return self._conversation.violations


class Session(_Conversing):
    """One session over a blocking socket: the I/O of a ``Conversation``."""

    def __init__(self, path: str, open_doc: str, on_log: "Optional[OnLog]" = None,
                 on_upcall: "Optional[OnUpcall]" = None, max_frame: "Optional[int]" = None):
        self._path = path
        self._conversation = Conversation(open_doc, on_log, on_upcall, max_frame)
        self._sock: "Optional[socket.socket]" = None
        self._received = 0  # bytes read on the current connection
        self._close_sent = False
        # The frames of the last read not taken yet (``_read_frame``): a read takes what
        # the socket has, up to READ_AHEAD, not one frame's pieces.
        self._pending: "Optional[Iterator[Tuple[int, bytes]]]" = None

    @property
    def _max_frame(self) -> int:
        return self._conversation.max_frame

    @_max_frame.setter
    def _max_frame(self, value: int) -> None:
        self._conversation.max_frame = value

    def open(self) -> "Session":
        """Connects and sends OPEN; returns once OPENED came. An OPEN whose connection ended
        before wfjail answered a single byte (``_dropped``) is sent again on a new
        connection, up to ``OPEN_RETRIES`` times: no session the worker knows of began."""
        attempt = 0
        while True:
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self._received = 0
            try:
                self._sock.connect(self._path)
                self._sock.sendall(self._conversation.open())
                self._answer()
            except BaseException as e:
                self._drop()
                if attempt < OPEN_RETRIES and _dropped(e, self._received):
                    attempt += 1
                    _retrying(self._path, e, attempt)
                    continue
                raise
            return self

    def call(self, request: "Union[bytes, str]", time_ns: "Optional[int]" = None) -> bytes:
        """Send one call; return the guest's result bytes. ``time_ns``: the workflow time
        of this call and after (``[time] clock = "virtual"``)."""
        if self._sock is None:
            raise RuntimeError("the session is not open")
        data = self._conversation.call(request, time_ns)
        try:
            self._sock.sendall(data)
        except OSError:
            # The session may have ended already (its guest died between calls): wfjail sent
            # FAILED with the report before closing; read it rather than lose it.
            pass
        result: bytes = self._answer()
        return result

    def send_close(self) -> None:
        """Sends CLOSE without waiting for its answer (``close`` reads it): wfjail frees the
        session's slot once it takes the CLOSE, whether or not the guest exits at once."""
        if self._sock is None or self._close_sent:
            return
        self._close_sent = True
        try:
            self._sock.sendall(self._conversation.close())
        except OSError:
            pass  # the session ended already: ``close`` reads its report

    def close(self) -> "Optional[Dict[str, Any]]":
        """End the session; return its report (a dict, the shape of `wfjail run --report`)."""
        if self._sock is None:
            return self.report
        try:
            self.send_close()
            self._answer()
        except (OSError, ProtocolError):
            self._drop()
        return self.report

    def interrupt(self) -> None:
        """Interrupts the call in progress (from any thread): the guest raises
        ``wfjail.Interrupted`` in the code it runs, and the call answers as that code lets
        it (usually ERROR with where it was). Nothing happens outside a call."""
        sock = self._sock
        if sock is not None:
            try:
                sock.sendall(frame(INTERRUPT))
            except OSError:
                pass

    def abort(self) -> None:
        """Ends the session from any thread without waiting: a call blocked in another
        thread fails at once (wfjail sees the worker leave and kills the guest)."""
        sock = self._sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _answer(self) -> "Any":
        """Read until the conversation has the answer (sending what it says to on the way)."""
        conversation = self._conversation
        try:
            while True:
                step = conversation.handle(*self._read_frame())
                if isinstance(step, Send):
                    self._socket().sendall(step.data)
                elif step is not None:
                    return step.value
        finally:
            if conversation.ended:
                self._drop()

    def _read_frame(self) -> "Tuple[int, bytes]":
        """The next frame: from what the last read brought past the frame before it, else
        from new reads (``Conversation.read_size``: a small frame and the frames after it in
        one read). The bounds are the decoder's: it holds one frame, within ``max_frame``."""
        conversation = self._conversation
        while True:
            pending = self._pending
            if pending is not None:
                got = next(pending, None)
                if got is not None:
                    return got
                self._pending = None
            data = self._socket().recv(conversation.read_size())
            self._received += len(data)
            self._pending = conversation.frames_from(data)

    def _socket(self) -> socket.socket:
        if self._sock is None:
            raise RuntimeError("the session is not open")
        return self._sock

    def _drop(self) -> None:
        self._pending = None
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def __enter__(self) -> "Session":
        return self.open()

    def __exit__(self, *exc: object) -> "Literal[False]":
        self.close()
        return False


class AsyncClient(Client):
    """The asyncio flavour of ``Client``."""

    def session(self, handler: "Optional[str]" = None,  # type: ignore[override]
                argv: "Optional[Iterable[str]]" = None, timeout: "Optional[str]" = None,
                init: "Any" = NO_INIT, on_log: "Optional[OnLog]" = None,
                on_upcall: "Optional[OnUpcall]" = None, seed: "Optional[int]" = None,
                time_ns: "Optional[int]" = None) -> "AsyncSession":
        return AsyncSession(self.path, open_doc(handler, _listed(argv), timeout, init,
                                                on_log is not None, seed, time_ns),
                            on_log, on_upcall)


class AsyncSession(_Conversing):
    """One session over asyncio streams: the I/O of a ``Conversation``."""

    def __init__(self, path: str, open_doc: str, on_log: "Optional[OnLog]" = None,
                 on_upcall: "Optional[OnUpcall]" = None) -> None:
        self._path = path
        self._conversation = Conversation(open_doc, on_log, on_upcall)
        self._reader: "Optional[asyncio.StreamReader]" = None
        self._writer: "Optional[asyncio.StreamWriter]" = None
        self._received = 0  # bytes read on the current connection

    async def open(self) -> "AsyncSession":
        """As ``Session.open``: an OPEN dropped unanswered is sent again (``OPEN_RETRIES``)."""
        attempt = 0
        while True:
            self._reader, self._writer = await asyncio.open_unix_connection(self._path)
            self._received = 0
            try:
                await self._send(self._conversation.open())
                await self._answer()
            except BaseException as e:
                if self._writer is not None:
                    self._writer.close()
                    self._writer = None
                if attempt < OPEN_RETRIES and _dropped(e, self._received):
                    attempt += 1
                    _retrying(self._path, e, attempt)
                    continue
                raise
            return self

    async def call(self, request: "Union[bytes, str]", time_ns: "Optional[int]" = None) -> bytes:
        if self._writer is None:
            raise RuntimeError("the session is not open")
        try:
            await self._send(self._conversation.call(request, time_ns))
        except OSError:
            pass  # the session ended already: its FAILED report is waiting to be read
        result: bytes = await self._answer()
        return result

    async def close(self) -> "Optional[Dict[str, Any]]":
        if self._writer is None:
            return self.report
        try:
            await self._send(self._conversation.close())
            await self._answer()
        except (OSError, ProtocolError):
            if self._writer is not None:
                self._writer.close()
                self._writer = None
        return self.report

    async def _send(self, data: bytes) -> None:
        writer = self._writer
        if writer is None:
            raise RuntimeError("the session is not open")
        writer.write(data)
        await writer.drain()

    async def _answer(self) -> "Any":
        conversation = self._conversation
        try:
            while True:
                step = conversation.handle(*await self._read_frame())
                if isinstance(step, Send):
                    await self._send(step.data)
                elif step is not None:
                    return step.value
        finally:
            if conversation.ended:
                await self._drop()

    async def _read_frame(self) -> "Tuple[int, bytes]":
        conversation, reader = self._conversation, self._reader
        if reader is None:
            raise RuntimeError("the session is not open")
        while True:
            data = await reader.read(conversation.wanted())
            self._received += len(data)
            got = conversation.frame_from(data)
            if got is not None:
                return got

    async def _drop(self) -> None:
        writer, self._writer = self._writer, None
        if writer is not None:
            writer.close()
            try:
                await writer.wait_closed()
            except OSError:
                pass

    async def __aenter__(self) -> "AsyncSession":
        return await self.open()

    async def __aexit__(self, *exc: object) -> "Literal[False]":
        await self.close()
        return False
