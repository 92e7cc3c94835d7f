"""The framing every wire of wfjail's Python side shares, and the guest's vocabulary
(docs/protocol.md).

Four vocabularies share one framing, ``length:u32 LE | kind:u8 | payload`` where ``length``
counts the kind byte:

* ``GuestKind`` (here): the guest protocol (a guest and its supervisor, ``wfjail.guest``);
* ``ReplyStatus`` (here): the status byte that opens a REPLY payload (an UPCALL's answer);
* ``wfjail.wire_worker.WorkerKind``: the worker wire of ``wfjail serve`` (``wfjail.client``);
* ``wfjail.wire_control.ControlKind``: the zygote's control channel, JSON payloads.

``pack`` and ``Decoder`` are the framing; the cap is checked on the length alone, before a
payload is copied or awaited, so a hostile length never turns into an allocation. A guest
imports this module at every start, so it holds only what a guest needs: each IntEnum costs
microseconds per member to build (``int_enum``), and the worker's and the zygote's
vocabularies are no guest's business (they are modules beside this one, not a subpackage:
the integration tests hand a guest the package's files, flat). For the same reason it
imports nothing a guest would not load anyway (``enum`` and ``struct`` are loaded by then;
``typing`` is not, hence the quoted annotations).
"""

import enum
import struct

from .errors import ProtocolError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Container, Iterator, List, Optional, Tuple, TypeVar

    Frame = Tuple[int, bytes]
    _Body = TypeVar("_Body")
    IntEnumBody = enum.IntEnum
else:
    IntEnumBody = object  # at run time a vocabulary's class is a plain body: int_enum builds it

VERSION = 1
MAGIC = b"wfjail"
MAX_CAP = 16 * 1024 * 1024  # the protocol's largest payload, in bytes

LENGTH = struct.Struct("<I")
HEADER = struct.Struct("<IB")  # length, kind
_HELLO_VERSION = struct.Struct("<H")


def int_enum(body: "_Body") -> "_Body":
    """The ``enum.IntEnum`` of a class body of int constants (``class K(IntEnumBody)``), built
    by the standard library's fast path where it has one (``enum._simple_enum``, Python 3.11+,
    which ``re`` and ``http`` use for the same reason): built the usual way, an IntEnum costs
    tens of microseconds per member, and a guest pays for its own at every start (a third of
    that this way). The same enum either way."""
    simple = getattr(enum, "_simple_enum", None)
    made: "Any"
    if simple is not None:
        made = simple(enum.IntEnum)(body)
    else:
        # (Python 3.8-3.10: the functional API, which mypy wants a literal name for.)
        names = [(k, v) for k, v in vars(body).items() if not k.startswith("_")]
        made = enum.IntEnum(body.__name__, names,  # type: ignore[misc, no-redef]
                            module=body.__module__)
        made.__doc__ = body.__doc__
    return made  # type: ignore[no-any-return]


@int_enum
class GuestKind(IntEnumBody):
    """Frame kinds between a guest and its supervisor."""

    HELLO = 1
    REQUEST = 2
    RESULT = 3
    ERROR = 4
    LOG = 5
    QUERY = 6
    VIOLATIONS = 7
    UPCALL = 8
    REPLY = 9


@int_enum
class ReplyStatus(IntEnumBody):
    """The first byte of a REPLY payload: the worker's answer follows, or why there is none."""

    ANSWER = 0
    REFUSED = 1


# A set of plain ints (IntEnum members hash as their values), for the per-frame kind check.
GUEST_KINDS = frozenset(GuestKind)


def check_length(length: int, cap: int) -> None:
    """A frame's length field: not 0 (it counts the kind byte), its payload within ``cap``."""
    if length == 0:
        raise ProtocolError("empty", "frame length 0: the length must count the kind byte")
    if length - 1 > cap:
        raise ProtocolError(
            "oversized", "frame of %d bytes exceeds the %d-byte cap" % (length - 1, cap))


def check_kind(kind: int, known: "Container[int]",
               message: str = "unknown frame kind 0x%02x") -> None:
    """A frame's kind byte, one of ``known`` (``message`` takes the kind)."""
    if kind not in known:
        raise ProtocolError("unknown-kind", message % kind)


def pack(kind: int, payload: bytes = b"", cap: int = MAX_CAP) -> bytes:
    """One frame (any vocabulary); refuses a payload over ``cap`` before copying it."""
    size = len(payload)
    if size > cap:
        raise ProtocolError(
            "oversized", "frame of %d bytes exceeds the %d-byte cap" % (size, cap))
    return HEADER.pack(size + 1, kind) + payload


class Decoder:
    """Incremental decoder: feed it bytes as they arrive, get whole frames back.

    It holds at most the current frame's header and the payload bytes received so far, never
    more than ``cap + 5`` bytes, and allocates nothing on the word of a length field. It checks
    in the documented order: the length, the kind byte (``known``; then ``check_header``, a
    hook for a reader's own limits), then it waits for the payload. After an error it stays
    failed: later calls raise the same error. ``wanted()`` says how many bytes complete the
    piece in progress, for readers that must not read past a frame.
    """

    def __init__(self, cap: int, known: "Container[int]",
                 unknown: str = "unknown frame kind 0x%02x") -> None:
        self.cap = cap
        self._known = known
        self._unknown = unknown
        self._head = bytearray()  # up to 5 bytes: length and kind
        self._length = 0          # set (non-zero) once the 4 length bytes are in and checked
        self._payload = bytearray()
        self._error: "Optional[ProtocolError]" = None

    @property
    def buffered(self) -> int:
        """Bytes held for the frame in progress (for tests and diagnostics)."""
        return len(self._head) + len(self._payload)

    def wanted(self) -> int:
        """The bytes that complete the piece in progress: the length, the kind, the payload."""
        if self._error is not None:
            raise self._error
        if len(self._head) < 4:
            return 4 - len(self._head)
        if len(self._head) < 5:
            return 1
        return self._length - 1 - len(self._payload)

    def check_header(self, length: int, kind: int) -> None:
        """Called once a frame's length and kind are in and checked; raise to refuse it."""

    def feed(self, data: bytes) -> "Iterator[Frame]":
        """Generator of the ``(kind, payload)`` frames completed by ``data``.

        A generator so that the frames before a bad one come out before the error is
        raised. Iterate it to the end: unread input is not kept.
        """
        if self._error is not None:
            raise self._error
        view = memoryview(data).cast("B")
        pos, end = 0, len(view)
        try:
            while pos < end:
                pos, frame = self._take(data, view, pos, end)
                if frame is not None:
                    yield frame
        except ProtocolError as e:
            self._error = e
            self._reset()
            raise
        finally:
            view.release()  # a paused generator must not pin the caller's bytearray

    def feed_piece(self, data: bytes) -> "Optional[Frame]":
        """``feed`` for a reader that reads at most ``wanted()`` bytes at a time: the frame
        ``data`` completes, or None."""
        if self._error is not None:
            raise self._error
        if len(data) > self.wanted():
            raise ValueError("%d bytes, more than the %d wanted" % (len(data), self.wanted()))
        with memoryview(data) as view:
            try:
                return self._take(data, view.cast("B"), 0, len(data))[1]
            except ProtocolError as e:
                self._error = e
                self._reset()
                raise

    def _take(self, data: bytes, view: memoryview, pos: int,
              end: int) -> "Tuple[int, Optional[Frame]]":
        """Consume what of ``view[pos:end]`` the frame in progress takes: the new position
        and the frame, when it completes."""
        head = self._head
        if len(head) < 5:
            take = min(5 - len(head), end - pos)
            head += view[pos:pos + take]
            pos += take
            if self._length == 0 and len(head) >= 4:
                self._length = LENGTH.unpack_from(head)[0]
                check_length(self._length, self.cap)
            if len(head) < 5:
                return pos, None
            check_kind(head[4], self._known, self._unknown)
            self.check_header(self._length, head[4])
        need = self._length - 1 - len(self._payload)
        if not self._payload and end - pos >= need:
            # The whole payload at once (the usual case): no staging copy.
            if pos == 0 and need == len(data) and type(data) is bytes:
                payload = data
            else:
                payload = bytes(view[pos:pos + need])
            pos += need
        else:
            take = min(need, end - pos)
            self._payload += view[pos:pos + take]
            pos += take
            if take < need:
                return pos, None
            payload = bytes(self._payload)
        frame = (head[4], payload)
        self._reset()
        return pos, frame

    def finish(self) -> None:
        """Signal end-of-file: raises ProtocolError('truncated') inside a frame."""
        if self._error is not None:
            raise self._error
        if self._head:
            self._error = ProtocolError(
                "truncated", "end of file inside a frame (%d header bytes, %d of %d payload "
                "bytes)" % (len(self._head), len(self._payload), max(self._length, 1) - 1))
            self._reset()
            raise self._error

    def _reset(self) -> None:
        self._head = bytearray()
        self._length = 0
        self._payload = bytearray()


def parse(data: bytes, cap: int, known: "Container[int]") -> "List[Frame]":
    """Decode a whole stream; return its frames or raise the first ProtocolError."""
    dec = Decoder(cap, known)
    frames = list(dec.feed(data))
    dec.finish()
    return frames


# -- payloads ---------------------------------------------------------------------------------

def pack_hello(version: int = VERSION) -> bytes:
    """HELLO's payload: the magic, then the version (u16 LE)."""
    return MAGIC + _HELLO_VERSION.pack(version)


def parse_hello(payload: bytes) -> int:
    """The version of a HELLO payload, or ProtocolError('handshake')."""
    if len(payload) != len(MAGIC) + 2 or payload[:len(MAGIC)] != MAGIC:
        raise ProtocolError("handshake", "bad HELLO payload %r (want b'wfjail' + u16 version)"
                            % (bytes(payload[:32]),))
    return int(_HELLO_VERSION.unpack(payload[len(MAGIC):])[0])


def pack_reply(status: ReplyStatus, body: bytes) -> bytes:
    """A REPLY payload: the status byte, then the answer (or why there is none)."""
    return bytes((status,)) + body


def parse_reply(payload: bytes) -> "Tuple[bool, bytes]":
    """A (non-empty) REPLY payload: (answered, the answer or why there is none)."""
    return payload[0] == ReplyStatus.ANSWER, payload[1:]
