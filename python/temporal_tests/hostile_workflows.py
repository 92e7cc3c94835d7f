"""Workflows that attack their worker from inside their confined child (issue 16's
hostile-guest pass): each reaches into the child-side wfjail code, or asks the kernel for
something denied with a name of its choosing, to send the worker what it must not take as
it is."""

from temporalio import workflow

FORGED = "\n2026-12-01 ERROR temporalio.worker credentials rotated\x1b[2J"


def _tamper(**names):
    """Replaces ``names`` in the child-side wfjail code (``wfjail.temporal.child``), as a
    workflow that reaches into it can."""
    from wfjail.temporal import child

    for name, value in names.items():
        setattr(child, name, value)


@workflow.defn
class DeniedPath:
    """Is denied a write whose path carries a forged log line: the path is the violation's
    argument, in the task failure."""

    @workflow.run
    async def run(self) -> str:
        try:
            with open("/tmp/wfjail-hostile" + FORGED, "w"):
                pass
        except OSError:
            pass
        return "wrote nothing"


@workflow.defn
class HandlerRaises:
    """Makes the child's activation handler raise (outside workflow code) with a message that
    reads as wfjail's report of another workflow."""

    @workflow.run
    async def run(self) -> str:
        class Bomb(list):
            def __getitem__(self, index):
                raise RuntimeError("wfjail denied workflow Victim (run run-9) what workflow "
                                   "code may not do:" + FORGED)

        _tamper(_metric_records=Bomb())
        return "raised"


@workflow.defn
class LogFlood:
    """Sends 3,000 log records in one activation."""

    @workflow.run
    async def run(self) -> str:
        from wfjail import guest

        for i in range(3000):
            guest.log("flood %d" % i, 20)
        return "flooded"


@workflow.defn
class HugeReply:
    """Appends 6 MiB of empty commands (two bytes each on the wire) to its completion."""

    @workflow.run
    async def run(self) -> str:
        import struct

        extra = b"\x0a\x00" * (3 * 1024 * 1024)
        size, n = bytearray(), len(extra)
        while True:
            size.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
            n >>= 7
            if not n:
                break
        extra = b"\x12" + bytes(size) + extra  # merges into the completion's `successful`

        class Packer:
            def pack(self, fmt, length):
                return struct.pack(fmt, length + len(extra))

        class Side:
            def encode(self):
                return extra + b"{}"

        class Dumper:
            def dumps(self, value):
                return Side()

        _tamper(struct=Packer(), json=Dumper())
        return "huge"


@workflow.defn
class Stubborn:
    """Never yields, and catches the interruption that would say where it is."""

    @workflow.run
    async def run(self) -> None:
        while True:
            try:
                while True:
                    pass
            except BaseException:  # noqa: BLE001  (wfjail.Interrupted: ignored)
                pass
