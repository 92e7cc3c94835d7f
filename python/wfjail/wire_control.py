"""The zygote's control channel (docs/protocol.md, "The zygote's control channel"): one frame
per SOCK_SEQPACKET packet, JSON payloads, on the framing of ``wfjail.wire``."""

import json

from .wire import HEADER, IntEnumBody, int_enum

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Tuple

# The channel's version, said in READY: wfjail refuses a zygote of another version (a package
# installed from another wfjail). 2: FORK carries the session's output pipe.
CONTROL_VERSION = 2


@int_enum
class ControlKind(IntEnumBody):
    """Packet kinds of the zygote's control channel."""

    FORK = 0x31
    READY = 0x32
    FORKED = 0x33
    EXITED = 0x34
    SETTLED = 0x35


def pack_control(kind: ControlKind, doc: "Any") -> bytes:
    """One control packet: a frame with a JSON payload."""
    payload = json.dumps(doc).encode("utf-8")
    return HEADER.pack(len(payload) + 1, kind) + payload


def pack_exited(pid: int, status: int, cpu_ms: float, max_rss_kb: int) -> bytes:
    """``pack_control(EXITED, {...})`` of a reaped child, formatted directly: whatever the
    zygote's loop touches after a fork is copied (the json encoder's objects are many
    pages). ``cpu_ms`` as ``json.dumps`` writes a float (its ``repr``)."""
    payload = b'{"pid": %d, "status": %d, "cpu_ms": %a, "max_rss_kb": %d}' % (
        pid, status, float(cpu_ms), max_rss_kb)
    return HEADER.pack(len(payload) + 1, ControlKind.EXITED) + payload


def parse_control(packet: bytes) -> "Tuple[int, Any]":
    """A control packet's kind and JSON document; ValueError if it is not one whole frame."""
    if len(packet) < HEADER.size:
        raise ValueError("short control packet")
    length, kind = HEADER.unpack_from(packet)
    if length != len(packet) - 4:
        raise ValueError("control packet length mismatch")
    return kind, json.loads(packet[HEADER.size:].decode("utf-8"))
