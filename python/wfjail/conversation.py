"""The worker side of one ``wfjail serve`` session, without I/O (docs/protocol.md, "The worker
wire").

``Conversation`` is fed what the server sent and says what to do: it returns the bytes of each
request (``open``, ``call``, ``close``, ``status``), tells a reader how many bytes to read next
(``wanted``: never past a frame, so the length is checked before the kind byte is awaited),
turns bytes into frames (``frame_from``) and frames into steps (``handle``): keep reading
(``None``), send these bytes and read on (``Send``: the REPLY to an UPCALL), or the answer
(``Answer``); an ERROR, a BUSY, a FAILED or a frame out of place raises. When ``ended`` is set
the server closes the connection: the driver closes its end too. ``wfjail.client`` drives it
with blocking sockets (``Session``) and with asyncio streams (``AsyncSession``).
"""

import json
from typing import Any, NamedTuple  # (the worker's side: asyncio loads typing anyway)

from . import wire
from .errors import ProtocolError, Violation
from .wire_worker import (BUSY, CALL, CLOSE, CLOSED, ERROR, FAILED, LOG, OPEN, OPENED, REPLY,
                          RESULT, SERVER, SERVER_SENDS, STATUS, TIME, UPCALL, VIOLATIONS,
                          WorkerKind, pack_time)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, Dict, Iterator, List, NoReturn, Optional, Tuple, Union

    OnLog = Callable[[int, str], None]
    OnUpcall = Callable[[bytes], bytes]
    Step = Union["Send", "Answer", None]


class Send(NamedTuple):
    """Send ``data`` (a REPLY), then read on."""

    data: bytes


class Answer(NamedTuple):
    """The answer the request awaited."""

    value: Any


CAP = wire.MAX_CAP
# A reader's largest single read: a frame's payload comes in pieces of at most this much.
READ_CHUNK = 1 << 20
# A buffered reader's read when the frame in progress wants less (a header, a small payload):
# what comes after it in the same read (the next frames, or their start) is kept for the
# next frame, so that a small frame is one read, not three (length, kind, payload).
READ_AHEAD = 1 << 16
# The frames whose payload is the guest's (their size is its choice): a session may read
# less of them than the protocol's cap.
GUEST_SIZED = frozenset((RESULT, ERROR, LOG, UPCALL))


class GuestError(Exception):
    """A call raised in the guest: its type, message, traceback and the violations wfjail
    recorded during that call."""

    __module__ = "wfjail"

    def __init__(self, doc: "Dict[str, Any]") -> None:
        super().__init__("%s: %s" % (doc.get("type", "?"), doc.get("message", "")))
        self.type = doc.get("type", "")
        self.message = doc.get("message", "")
        self.traceback = doc.get("traceback", "")
        self.violations = doc.get("violations", [])


class Busy(Exception):
    """The server runs as many sessions as it may (``--max-executions``); nothing was
    started. ``capacity`` and ``open`` say how many."""

    __module__ = "wfjail"

    def __init__(self, doc: "Dict[str, Any]") -> None:
        self.capacity = doc.get("capacity")
        self.open = doc.get("open")
        super().__init__("wfjail serve is full: %s of %s sessions open (raise --max-executions)"
                         % (self.open, self.capacity))


class SessionFailed(Exception):
    """The session ended without CLOSE: ``report`` is its report (status, violations...)."""

    __module__ = "wfjail"

    def __init__(self, report: "Dict[str, Any]") -> None:
        status = report.get("status", "?")
        why = report.get("error") or ", ".join(
            "%s %s" % (v.get("category"), v.get("syscall")) for v in report.get("violations", []))
        super().__init__("session %s%s" % (status, ": " + why if why else ""))
        self.report = report
        self.status = status


def frame(kind: WorkerKind, payload: "Union[bytes, str]" = b"") -> bytes:
    """One frame of the worker wire (a str payload is sent as UTF-8)."""
    if isinstance(payload, str):
        payload = payload.encode("utf-8")
    return wire.pack(kind, payload, CAP)


def expect(kind: int, payload: bytes, want: WorkerKind) -> bytes:
    """The payload of a reply of kind ``want``; a call's ERROR raises the guest's error, BUSY
    answering OPEN raises ``Busy``, any other kind is a protocol error. (FAILED is the
    session's to handle: it ends it.)"""
    if kind == want:
        return payload
    if kind == ERROR and want == RESULT:
        raise_call_error(json.loads(payload))
    if kind == BUSY and want == OPENED:
        raise Busy(json.loads(payload))
    raise ProtocolError("unexpected", "expected %s, got kind 0x%02x" % (want.name, kind))


def upcall_reply(on_upcall: "Optional[OnUpcall]", payload: bytes) -> bytes:
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


def deliver_log(on_log: "Optional[OnLog]", payload: bytes) -> None:
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


def raise_call_error(doc: "Dict[str, Any]") -> "NoReturn":
    """Raise the guest's error: ``wfjail.Violation`` only when the guest's message names a
    violation wfjail recorded during this call (the ERROR's ``violations`` are that call's);
    anything else, including a guest that raised a Violation of its own making, is a
    ``GuestError``."""
    found = doc.get("violations") or []
    if doc.get("type") == "wfjail.Violation" and isinstance(found, list):
        message = doc.get("message", "")
        candidates = [Violation.from_dict(v) for v in found if isinstance(v, dict)]
        v = next((c for c in candidates if message.startswith(c.head())), None)
        if v is not None:
            v.traceback = doc.get("traceback", "")
            raise v
    raise GuestError(doc)


NO_INIT = object()  # OPEN without "init" (None is a JSON value a session may be given)


def open_doc(handler: "Optional[str]", argv: "Optional[List[str]]", timeout: "Optional[str]",
             init: "Any" = NO_INIT, logs: bool = False, seed: "Optional[int]" = None,
             time_ns: "Optional[int]" = None) -> str:
    """OPEN's JSON: only the fields given."""
    doc: "Dict[str, Any]" = {}
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
    if init is not NO_INIT:
        doc["init"] = init
    return json.dumps(doc)


class _Frames(wire.Decoder):
    """What wfjail sends, read up to the session's ``max_frame`` for the guest's payloads."""

    def __init__(self, conversation: "Conversation") -> None:
        super().__init__(CAP, SERVER_SENDS, "unexpected frame kind 0x%02x from wfjail")
        self._conversation = conversation

    def check_header(self, length: int, kind: int) -> None:
        limit = self._conversation.max_frame
        if kind in GUEST_SIZED and length - 1 > limit:
            # Not read: the session ends here (the rest of the frame would be read as
            # frames), and wfjail ends the guest when the worker leaves.
            self._conversation.ended = True
            raise ProtocolError("oversized", "a %s frame of %d bytes from the guest, over the "
                                "%d this session reads" % (WorkerKind(kind).name, length - 1,
                                                            limit))


class Conversation:
    """One session's worker side: requests out, the server's frames in, no I/O.

    The rules, one request at a time: a frame of the worker's own kinds, or of no kind, is a
    protocol error; LOG frames go to ``on_log`` whenever they come; while a call awaits its
    answer, each UPCALL is answered (``Send``) until another frame comes; then one VIOLATIONS
    may precede the RESULT (``violations``, reset by every OPEN and CALL answer); FAILED
    answering OPEN or CALL ends the session (``SessionFailed``); CLOSED or FAILED answers
    CLOSE, and any other frame leaves the session as it was.
    """

    def __init__(self, open_doc: str = "", on_log: "Optional[OnLog]" = None,
                 on_upcall: "Optional[OnUpcall]" = None, max_frame: "Optional[int]" = None):
        self.open_doc = open_doc
        self.on_log = on_log
        self.on_upcall = on_upcall
        self.max_frame = CAP if max_frame is None else int(max_frame)
        self.id: "Any" = None
        self.pid: "Optional[int]" = None
        self.mode: "Any" = None
        self.report: "Optional[Dict[str, Any]]" = None
        # What wfjail denied during the last call that returned a result (dicts, the report's
        # violation entries); empty when nothing was.
        self.violations: "List[Dict[str, Any]]" = []
        self.ended = False  # the server closes the connection: so does the driver
        self._frames = _Frames(self)
        self._want = OPENED
        self._first = True  # no frame but LOG and UPCALL has answered the request yet

    # -- requests ------------------------------------------------------------------------------

    def open(self) -> bytes:
        self._await(OPENED)
        return frame(OPEN, self.open_doc)

    def call(self, request: "Union[bytes, str]", time_ns: "Optional[int]" = None) -> bytes:
        """The call's frames: TIME first when ``time_ns`` is given, then CALL."""
        self._await(RESULT)
        data = frame(CALL, request)
        if time_ns is None:
            return data
        return frame(TIME, pack_time(time_ns)) + data

    def close(self) -> bytes:
        self._await(CLOSED)
        return frame(CLOSE)

    def status(self) -> bytes:
        self._await(SERVER)
        return frame(STATUS)

    def _await(self, want: WorkerKind) -> None:
        self._want = want
        self._first = True

    # -- what the server sends -----------------------------------------------------------------

    def wanted(self) -> int:
        """How many bytes to read next (at most ``READ_CHUNK``, never past the frame)."""
        return min(self._frames.wanted(), READ_CHUNK)

    def frame_from(self, data: bytes) -> "Optional[Tuple[int, bytes]]":
        """The frame ``data`` (at most ``wanted()`` bytes; empty at end-of-file) completes."""
        if not data:
            raise ProtocolError("truncated", "wfjail closed the session connection")
        return self._frames.feed_piece(data)

    def read_size(self) -> int:
        """How many bytes a buffered reader (``frames_from``) reads next: READ_AHEAD, or
        more when the frame in progress wants more (at most ``READ_CHUNK``)."""
        return max(self.wanted(), READ_AHEAD)

    def frames_from(self, data: bytes) -> "Iterator[Tuple[int, bytes]]":
        """The frames ``data`` (any size; empty at end-of-file) completes, one at a time, for
        a reader that keeps what it read past a frame: iterate it to the end before the next
        read. Each frame's header is checked (``max_frame``) when the iteration reaches it,
        after the frames before it were handled, as ``frame_from`` would."""
        if not data:
            raise ProtocolError("truncated", "wfjail closed the session connection")
        return self._frames.feed(data)

    def handle(self, kind: int, payload: bytes) -> "Step":
        """What a frame means for the request in progress (see the class's rules)."""
        if kind == LOG:
            deliver_log(self.on_log, payload)
            return None
        want = self._want
        if want == CLOSED:
            if kind in (CLOSED, FAILED):
                self._end(payload)
            return Answer(self.report)
        if want == SERVER:
            return Answer(json.loads(expect(kind, payload, want)))
        first, self._first = self._first, False
        if first:
            if kind == UPCALL and want == RESULT:
                self._first = True
                return Send(frame(REPLY, upcall_reply(self.on_upcall, payload)))
            self.violations = []
            if kind == VIOLATIONS and want == RESULT:
                self.violations = json.loads(payload)
                return None
        if kind == FAILED:
            report = self._end(payload)
            raise SessionFailed(report)
        answer = expect(kind, payload, want)
        if want == RESULT:
            return Answer(answer)
        doc = json.loads(answer)
        self.id, self.mode = doc.get("session"), doc.get("mode")
        pid = doc.get("pid")
        self.pid = pid if isinstance(pid, int) and not isinstance(pid, bool) else None
        return Answer(doc)

    def _end(self, payload: bytes) -> "Dict[str, Any]":
        report: "Dict[str, Any]" = json.loads(payload)
        self.report = report
        self.ended = True
        return report
