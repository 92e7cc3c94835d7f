"""wfjail.wire, the one wire module: pack and parse against every vector of
docs/protocol-vectors.json (the guest's and the worker wire's, as tests/protocol.rs does), the
exact-read path (wanted, feed_piece), and the payload helpers of each vocabulary."""

import enum
import json
import os
import sys
import unittest
from unittest import mock

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))

from wfjail import ProtocolError, wire  # noqa: E402
from wfjail import wire_control as control  # noqa: E402
from wfjail import wire_worker as worker  # noqa: E402
from wfjail.wire import GuestKind, ReplyStatus  # noqa: E402
from wfjail.wire_control import ControlKind  # noqa: E402
from wfjail.wire_worker import WorkerKind  # noqa: E402

VECTORS_PATH = os.path.join(HERE, "..", "..", "docs", "protocol-vectors.json")


def load_vectors():
    with open(VECTORS_PATH, encoding="utf-8") as f:
        return json.load(f)


def expected(vector):
    return [(f["kind"], bytes.fromhex(f["payload_hex"])) for f in vector["frames"]]


def lists():
    """(list name, the kinds of its vocabulary, its vectors)."""
    doc = load_vectors()
    return [("vectors", wire.GUEST_KINDS, doc["vectors"]),
            ("worker_vectors", worker.WORKER_KINDS, doc["worker_vectors"])]


def parse_outcome(data, cap, known):
    dec = wire.Decoder(cap, known)
    frames = []
    try:
        for frame in dec.feed(data):
            frames.append(frame)
        dec.finish()
    except ProtocolError as e:
        return frames, e.code
    return frames, None


def exact_read_outcome(data, cap, known):
    """What a reader gets that reads ``wanted()`` bytes at a time (never past a frame)."""
    dec = wire.Decoder(cap, known)
    frames, pos = [], 0
    try:
        while pos < len(data):
            piece = data[pos:pos + dec.wanted()]
            pos += len(piece)
            frame = dec.feed_piece(piece)
            if frame is not None:
                frames.append(frame)
        dec.finish()
    except ProtocolError as e:
        return frames, e.code
    return frames, None


class VectorTests(unittest.TestCase):
    def test_the_cap_and_version_are_the_files(self):
        doc = load_vectors()
        self.assertEqual((doc["cap"], doc["version"]), (wire.MAX_CAP, wire.VERSION))

    def test_parse_gives_every_vectors_frames_and_error(self):
        for name, known, vectors in lists():
            for v in vectors:
                with self.subTest(list=name, vector=v["name"]):
                    data = bytes.fromhex(v["hex"])
                    want = (expected(v), v["error"])
                    self.assertEqual(parse_outcome(data, v["cap"], known), want)
                    if v["error"] is None:
                        self.assertEqual(wire.parse(data, v["cap"], known), expected(v))
                    else:
                        with self.assertRaises(ProtocolError) as cm:
                            wire.parse(data, v["cap"], known)
                        self.assertEqual(cm.exception.code, v["error"])

    def test_parse_byte_by_byte_and_by_exact_reads_agree(self):
        for name, known, vectors in lists():
            for v in vectors:
                with self.subTest(list=name, vector=v["name"]):
                    data = bytes.fromhex(v["hex"])
                    want = (expected(v), v["error"])
                    dec = wire.Decoder(v["cap"], known)
                    frames, code = [], None
                    try:
                        for i in range(len(data)):
                            frames.extend(dec.feed(data[i:i + 1]))
                        dec.finish()
                    except ProtocolError as e:
                        code = e.code
                    self.assertEqual((frames, code), want)
                    self.assertEqual(exact_read_outcome(data, v["cap"], known), want)

    def test_pack_reencodes_every_valid_vector_byte_for_byte(self):
        for name, _, vectors in lists():
            for v in vectors:
                if v["error"] is None:
                    with self.subTest(list=name, vector=v["name"]):
                        out = b"".join(wire.pack(k, p, v["cap"]) for k, p in expected(v))
                        self.assertEqual(out.hex(), v["hex"])

    def test_every_kind_of_each_vocabulary_has_a_vector_and_no_other_kind_does(self):
        for name, known, vectors in lists():
            with self.subTest(list=name):
                kinds = {k for v in vectors for k, _ in expected(v)}
                self.assertLessEqual(kinds, set(known))
                # TIME has no worker vector (docs/protocol.md describes its 8 bytes).
                self.assertEqual(set(known) - kinds, set() if name == "vectors"
                                 else {WorkerKind.TIME})


class FramingTests(unittest.TestCase):
    def test_pack_checks_the_cap_before_copying(self):
        self.assertEqual(len(wire.pack(GuestKind.RESULT, b"x" * 10, 10)), 15)
        with self.assertRaises(ProtocolError) as cm:
            wire.pack(GuestKind.RESULT, bytearray(11), 10)
        self.assertEqual(cm.exception.code, "oversized")
        self.assertEqual(wire.pack(WorkerKind.CALL, memoryview(b"ab")), b"\x03\x00\x00\x00\x12ab")

    def test_length_is_checked_before_the_kind_is_awaited(self):
        for head, code in (("00000000", "empty"), ("02000001", "oversized")):
            with self.subTest(head):
                dec = wire.Decoder(wire.MAX_CAP, wire.GUEST_KINDS)
                with self.assertRaises(ProtocolError) as cm:
                    dec.feed_piece(bytes.fromhex(head))
                self.assertEqual(cm.exception.code, code)

    def test_wanted_is_the_length_then_the_kind_then_the_payload(self):
        dec = wire.Decoder(wire.MAX_CAP, wire.GUEST_KINDS)
        self.assertEqual(dec.wanted(), 4)
        self.assertIsNone(dec.feed_piece(b"\x04\x00"))
        self.assertEqual(dec.wanted(), 2)
        self.assertIsNone(dec.feed_piece(b"\x00\x00"))
        self.assertEqual(dec.wanted(), 1)
        self.assertIsNone(dec.feed_piece(b"\x02"))
        self.assertEqual(dec.wanted(), 3)
        self.assertIsNone(dec.feed_piece(b"a"))
        self.assertEqual(dec.feed_piece(b"bc"), (GuestKind.REQUEST, b"abc"))
        self.assertEqual(dec.wanted(), 4)
        with self.assertRaises(ValueError):
            dec.feed_piece(b"12345")

    def test_a_whole_payload_in_one_piece_is_not_copied(self):
        dec = wire.Decoder(wire.MAX_CAP, wire.GUEST_KINDS)
        dec.feed_piece(b"\x07\x00\x00\x00")
        dec.feed_piece(b"\x03")
        payload = b"result" * 1
        self.assertIs(dec.feed_piece(payload)[1], payload)

    def test_check_header_refuses_before_the_payload(self):
        class Small(wire.Decoder):
            def check_header(self, length, kind):
                if length - 1 > 2:
                    raise ProtocolError("oversized", "too big for this reader")

        dec = Small(wire.MAX_CAP, wire.GUEST_KINDS)
        with self.assertRaises(ProtocolError) as cm:
            list(dec.feed(b"\x04\x00\x00\x00\x03"))
        self.assertEqual(cm.exception.code, "oversized")
        with self.assertRaises(ProtocolError):
            dec.finish()  # failed stays failed
        with self.assertRaises(ProtocolError):
            dec.wanted()

    def test_the_vocabularies_do_not_overlap(self):
        self.assertEqual(worker.WORKER_SENDS | worker.SERVER_SENDS, worker.WORKER_KINDS)
        self.assertFalse(worker.WORKER_SENDS & worker.SERVER_SENDS)
        self.assertFalse(wire.GUEST_KINDS & worker.WORKER_KINDS)
        self.assertFalse(set(ControlKind) & (wire.GUEST_KINDS | worker.WORKER_KINDS))


class IntEnumTests(unittest.TestCase):
    def test_int_enum_builds_the_same_enum_with_or_without_the_fast_path(self):
        def build():
            @wire.int_enum
            class Kind(wire.IntEnumBody):
                """Two kinds."""

                ONE = 1
                TWO = 2
            return Kind

        built = [build()]
        with mock.patch.object(enum, "_simple_enum", None):
            built.append(build())
        for kind in built:
            with self.subTest(kind):
                self.assertTrue(issubclass(kind, enum.IntEnum))
                self.assertEqual([(k.name, k.value) for k in kind], [("ONE", 1), ("TWO", 2)])
                self.assertIs(kind(2), kind.TWO)
                self.assertEqual((kind.TWO, repr(kind.TWO), kind.__doc__),
                                 (2, "<Kind.TWO: 2>", "Two kinds."))

    def test_the_vocabularies_are_int_enums(self):
        for kind in (GuestKind, ReplyStatus, WorkerKind, ControlKind):
            self.assertTrue(issubclass(kind, enum.IntEnum), kind)


class PayloadTests(unittest.TestCase):
    def test_hello_round_trips(self):
        self.assertEqual(wire.pack_hello().hex(), "77666a61696c0100")
        self.assertEqual(wire.parse_hello(wire.pack_hello(7)), 7)
        for bad in (b"", b"wfjail", b"WFJAIL\x01\x00"):
            with self.assertRaises(ProtocolError) as cm:
                wire.parse_hello(bad)
            self.assertEqual(cm.exception.code, "handshake")

    def test_reply_status_byte_says_answered_or_refused(self):
        doc = {v["name"]: expected(v)[0][1] for v in load_vectors()["vectors"]
               if v["name"].startswith("reply-")}
        self.assertEqual(wire.parse_reply(doc["reply-ok"])[0], True)
        self.assertEqual(wire.parse_reply(doc["reply-refused"])[0], False)
        for status in ReplyStatus:
            body = b"why" if status else b"answer"
            self.assertEqual(wire.parse_reply(wire.pack_reply(status, body)),
                             (status == ReplyStatus.ANSWER, body))
        self.assertEqual(wire.parse_reply(b"\x07x"), (False, b"x"), "any other status refuses")

    def test_time_is_eight_bytes_signed(self):
        self.assertEqual(worker.pack_time(-1), b"\xff" * 8)
        self.assertEqual(worker.pack_time(1), b"\x01" + bytes(7))

    def test_control_packets_round_trip_and_refuse_partial_frames(self):
        packet = control.pack_control(ControlKind.FORKED, {"session": 3, "pid": 9})
        self.assertEqual(control.parse_control(packet),
                         (ControlKind.FORKED, {"session": 3, "pid": 9}))
        for bad in (packet[:4], packet[:-1], packet + b" "):
            with self.assertRaises(ValueError):
                control.parse_control(bad)
        self.assertEqual(control.CONTROL_VERSION, 2)

    def test_exited_formatted_directly_is_what_pack_control_writes(self):
        for cpu_ms in (0.0, 1.5, 2.3456789012345, 1e-07, 12345678.9):
            doc = {"pid": 7, "status": 256, "cpu_ms": cpu_ms, "max_rss_kb": 40960}
            packet = control.pack_exited(7, 256, cpu_ms, 40960)
            self.assertEqual(packet, control.pack_control(ControlKind.EXITED, doc))
            self.assertEqual(control.parse_control(packet), (ControlKind.EXITED, doc))


if __name__ == "__main__":
    unittest.main()
