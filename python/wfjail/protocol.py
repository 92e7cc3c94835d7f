"""The framed pipe protocol's codec (docs/protocol.md, version 1).

A frame is ``length:u32 LE | kind:u8 | payload`` where ``length`` counts the kind
byte. This module only encodes and decodes; what a guest sends when is
``wfjail.guest``'s business. The cap is checked as soon as the four length bytes
are known, so a hostile length never turns into an allocation.
"""

import os
import struct

from .errors import ProtocolError

VERSION = 1
MAGIC = b"wfjail"
MAX_CAP = 16 * 1024 * 1024  # the protocol's largest payload, in bytes


def _cap_from_env():
    """The supervisor may lower the cap (to the policy's limits.output): WFJAIL_FRAME_CAP."""
    try:
        value = int(os.environ.get("WFJAIL_FRAME_CAP", MAX_CAP))
    except ValueError:
        return MAX_CAP
    return value if 0 < value <= MAX_CAP else MAX_CAP


CAP = _cap_from_env()  # largest payload this guest sends or accepts

HELLO = 1
REQUEST = 2
RESULT = 3
ERROR = 4
LOG = 5
QUERY = 6
VIOLATIONS = 7
UPCALL = 8
REPLY = 9

NAMES = {HELLO: "HELLO", REQUEST: "REQUEST", RESULT: "RESULT", ERROR: "ERROR",
         LOG: "LOG", QUERY: "QUERY", VIOLATIONS: "VIOLATIONS", UPCALL: "UPCALL",
         REPLY: "REPLY"}

_LEN = struct.Struct("<I")
_READ_CHUNK = 64 * 1024  # bounds each os.read() buffer, whatever the announced length


def _check_length(length, cap):
    if length == 0:
        raise ProtocolError("empty", "frame length 0: the length must count the kind byte")
    if length - 1 > cap:
        raise ProtocolError(
            "oversized", "frame of %d bytes exceeds the %d-byte cap" % (length - 1, cap))


def _check_kind(kind):
    if kind not in NAMES:
        raise ProtocolError("unknown-kind", "unknown frame kind 0x%02x" % kind)


def encode_frame(kind, payload=b"", cap=CAP):
    """Return the bytes of one frame; refuses what a reader would reject."""
    if kind not in NAMES:
        raise ValueError("unknown frame kind %r" % (kind,))
    return _pack(kind, payload, cap)


def _pack(kind, payload, cap):
    """One frame of any wire that shares this framing (the worker wire too)."""
    payload = bytes(payload)
    if len(payload) > cap:
        raise ProtocolError(
            "oversized", "frame of %d bytes exceeds the %d-byte cap" % (len(payload), cap))
    return _LEN.pack(len(payload) + 1) + bytes((kind,)) + payload


def hello_payload(version=VERSION):
    return MAGIC + struct.pack("<H", version)


def parse_hello(payload):
    """Return the version of a HELLO payload, or raise ProtocolError('handshake')."""
    if len(payload) != len(MAGIC) + 2 or payload[:len(MAGIC)] != MAGIC:
        raise ProtocolError("handshake", "bad HELLO payload %r (want b'wfjail' + u16 version)"
                            % (bytes(payload[:32]),))
    return struct.unpack("<H", payload[len(MAGIC):])[0]


class Decoder:
    """Incremental decoder: feed it bytes as they arrive, get whole frames back.

    It holds at most the current frame's header and the payload bytes received so
    far, never more than ``cap + 5`` bytes, and allocates nothing on the word of a
    length field. After an error it stays failed: later calls raise the same error.
    """

    def __init__(self, cap=CAP):
        self.cap = cap
        self._head = bytearray()  # up to 5 bytes: length and kind
        self._length = None       # set once the 4 length bytes are in and checked
        self._payload = bytearray()
        self._error = None

    @property
    def buffered(self):
        """Bytes held for the frame in progress (for tests and diagnostics)."""
        return len(self._head) + len(self._payload)

    def feed(self, data):
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
                if len(self._head) < 5:
                    take = min(5 - len(self._head), end - pos)
                    self._head += view[pos:pos + take]
                    pos += take
                    if self._length is None and len(self._head) >= 4:
                        self._length = _LEN.unpack_from(self._head)[0]
                        _check_length(self._length, self.cap)
                    if len(self._head) == 5:
                        _check_kind(self._head[4])
                    if len(self._head) < 5:
                        continue
                take = min(self._length - 1 - len(self._payload), end - pos)
                self._payload += view[pos:pos + take]
                pos += take
                if len(self._payload) == self._length - 1:
                    frame = (self._head[4], bytes(self._payload))
                    self._reset()
                    yield frame
        except ProtocolError as e:
            self._error = e
            self._reset()
            raise
        finally:
            view.release()  # a paused generator must not pin the caller's bytearray

    def finish(self):
        """Signal end-of-file: raises ProtocolError('truncated') inside a frame."""
        if self._error is not None:
            raise self._error
        if self._head:
            self._error = ProtocolError(
                "truncated", "end of file inside a frame (%d header bytes, %d of %d payload "
                "bytes)" % (len(self._head), len(self._payload),
                            (self._length or 1) - 1))
            self._reset()
            raise self._error

    def _reset(self):
        self._head = bytearray()
        self._length = None
        self._payload = bytearray()


def decode(data, cap=CAP):
    """Decode a whole stream; return its frames or raise the first ProtocolError."""
    dec = Decoder(cap)
    frames = list(dec.feed(data))
    dec.finish()
    return frames


def _read_exact(fd, n, started):
    """Read exactly n bytes, or b'' on EOF before the first byte of a frame."""
    chunks, got = [], 0
    while got < n:
        try:
            chunk = os.read(fd, min(n - got, _READ_CHUNK))
        except InterruptedError:
            continue
        if not chunk:
            if got == 0 and not started:
                return b""
            raise ProtocolError("truncated", "end of file inside a frame")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def read_frame(fd, cap=CAP):
    """Read one frame from a raw fd: ``(kind, payload)``, or None at a clean EOF.

    Reads exactly one frame's bytes, never more, so frames that follow stay in the
    pipe for the next call (no hidden buffer to lose).
    """
    head = _read_exact(fd, 4, started=False)
    if not head:
        return None
    length = _LEN.unpack(head)[0]
    _check_length(length, cap)
    kind = _read_exact(fd, 1, started=True)[0]
    _check_kind(kind)
    return kind, _read_exact(fd, length - 1, started=True)


def write_frame(fd, kind, payload=b"", cap=CAP):
    """Write one frame to a raw fd, looping over short writes and EINTR."""
    view = memoryview(encode_frame(kind, payload, cap))
    while view:
        try:
            n = os.write(fd, view)
        except InterruptedError:
            continue
        view = view[n:]
