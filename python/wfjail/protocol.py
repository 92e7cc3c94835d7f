"""The guest protocol's codec (docs/protocol.md, version 1), on the framing of ``wfjail.wire``.

A frame is ``length:u32 LE | kind:u8 | payload`` where ``length`` counts the kind
byte. This module only encodes and decodes; what a guest sends when is
``wfjail.guest``'s business. The cap is checked as soon as the four length bytes
are known, so a hostile length never turns into an allocation.
"""

import os

from . import wire
from .errors import ProtocolError
from .wire import MAGIC, MAX_CAP, VERSION, GuestKind

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict, List, Optional, Tuple

__all__ = ["CAP", "MAGIC", "MAX_CAP", "NAMES", "VERSION", "Decoder", "GuestKind", "decode",
           "encode_frame", "frame_cap", "hello_payload", "parse_hello", "read_frame",
           "write_frame", "HELLO", "REQUEST", "RESULT", "ERROR", "LOG", "QUERY", "VIOLATIONS",
           "UPCALL", "REPLY"]

HELLO = GuestKind.HELLO
REQUEST = GuestKind.REQUEST
RESULT = GuestKind.RESULT
ERROR = GuestKind.ERROR
LOG = GuestKind.LOG
QUERY = GuestKind.QUERY
VIOLATIONS = GuestKind.VIOLATIONS
UPCALL = GuestKind.UPCALL
REPLY = GuestKind.REPLY

NAMES: "Dict[int, str]" = {kind: kind.name for kind in GuestKind}

_READ_CHUNK = 64 * 1024  # bounds each os.read() buffer, whatever the announced length
_cap = 0  # frame_cap()'s answer, once asked


def frame_cap() -> int:
    """The largest payload this guest sends or accepts: ``WFJAIL_FRAME_CAP`` (the supervisor
    may lower it to the policy's limits.output), read on first use, else the protocol's."""
    global _cap
    if not _cap:
        try:
            value = int(os.environ.get("WFJAIL_FRAME_CAP", MAX_CAP))
        except ValueError:
            value = MAX_CAP
        _cap = value if 0 < value <= MAX_CAP else MAX_CAP
    return _cap


def __getattr__(name: str) -> int:
    # ``CAP``, the module attribute it always was, without reading the environment at import.
    if name == "CAP":
        return frame_cap()
    raise AttributeError("module %r has no attribute %r" % (__name__, name))


def encode_frame(kind: int, payload: bytes = b"", cap: "Optional[int]" = None) -> bytes:
    """Return the bytes of one frame; refuses what a reader would reject."""
    if kind not in NAMES:
        raise ValueError("unknown frame kind %r" % (kind,))
    return wire.pack(kind, payload, frame_cap() if cap is None else cap)


def hello_payload(version: int = VERSION) -> bytes:
    return wire.pack_hello(version)


parse_hello = wire.parse_hello


class Decoder(wire.Decoder):
    """``wire.Decoder`` for the guest protocol's kinds."""

    def __init__(self, cap: "Optional[int]" = None) -> None:
        super().__init__(frame_cap() if cap is None else cap, NAMES)


def decode(data: bytes, cap: "Optional[int]" = None) -> "List[Tuple[int, bytes]]":
    """Decode a whole stream; return its frames or raise the first ProtocolError."""
    return wire.parse(data, frame_cap() if cap is None else cap, NAMES)


def _read_exact(fd: int, n: int, started: bool) -> bytes:
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


def read_frame(fd: int, cap: "Optional[int]" = None) -> "Optional[Tuple[int, bytes]]":
    """Read one frame from a raw fd: ``(kind, payload)``, or None at a clean EOF.

    Reads exactly one frame's bytes, never more, so frames that follow stay in the
    pipe for the next call (no hidden buffer to lose).
    """
    head = _read_exact(fd, 4, started=False)
    if not head:
        return None
    length = wire.LENGTH.unpack(head)[0]
    wire.check_length(length, frame_cap() if cap is None else cap)
    kind = _read_exact(fd, 1, started=True)[0]
    wire.check_kind(kind, NAMES)
    return kind, _read_exact(fd, length - 1, started=True)


def write_frame(fd: int, kind: int, payload: bytes = b"", cap: "Optional[int]" = None) -> None:
    """Write one frame to a raw fd, looping over short writes and EINTR."""
    view = memoryview(encode_frame(kind, payload, cap))
    while view:
        try:
            n = os.write(fd, view)
        except InterruptedError:
            continue
        view = view[n:]
