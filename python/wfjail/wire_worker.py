"""The worker wire of ``wfjail serve`` (docs/protocol.md, "The worker wire"): its kinds and
TIME's payload, on the framing of ``wfjail.wire``."""

import struct

from .wire import IntEnumBody, int_enum

_TIME = struct.Struct("<q")


@int_enum
class WorkerKind(IntEnumBody):
    """Frame kinds between a worker and ``wfjail serve`` (0x1_: the worker's, 0x2_: wfjail's)."""

    OPEN = 0x11
    CALL = 0x12
    CLOSE = 0x13
    STATUS = 0x14
    REPLY = 0x15
    INTERRUPT = 0x16
    TIME = 0x17
    OPENED = 0x21
    RESULT = 0x22
    ERROR = 0x23
    FAILED = 0x24
    CLOSED = 0x25
    BUSY = 0x26
    SERVER = 0x27
    VIOLATIONS = 0x28
    LOG = 0x29
    UPCALL = 0x2A


# The kinds by their names alone, as the worker wire's modules and tests name them.
OPEN, CALL, CLOSE, STATUS = WorkerKind.OPEN, WorkerKind.CALL, WorkerKind.CLOSE, WorkerKind.STATUS
REPLY, INTERRUPT, TIME = WorkerKind.REPLY, WorkerKind.INTERRUPT, WorkerKind.TIME
OPENED, RESULT, ERROR = WorkerKind.OPENED, WorkerKind.RESULT, WorkerKind.ERROR
FAILED, CLOSED, BUSY = WorkerKind.FAILED, WorkerKind.CLOSED, WorkerKind.BUSY
SERVER, VIOLATIONS = WorkerKind.SERVER, WorkerKind.VIOLATIONS
LOG, UPCALL = WorkerKind.LOG, WorkerKind.UPCALL

WORKER_KINDS = frozenset(WorkerKind)
WORKER_SENDS = frozenset(k for k in WorkerKind if k < 0x20)
SERVER_SENDS = frozenset(k for k in WorkerKind if k > 0x20)


def pack_time(time_ns: int) -> bytes:
    """TIME's payload: nanoseconds since the epoch, i64 LE."""
    return _TIME.pack(int(time_ns))
