"""The codec against docs/protocol-vectors.json, round trips, and a seeded fuzz."""

import json
import os
import random
import sys
import tracemalloc
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))

from wfjail import ProtocolError  # noqa: E402
from wfjail import protocol as P  # noqa: E402

VECTORS_PATH = os.path.join(HERE, "..", "..", "docs", "protocol-vectors.json")
ERROR_CODES = {"truncated", "oversized", "empty", "unknown-kind"}


def load_vectors():
    with open(VECTORS_PATH, encoding="utf-8") as f:
        doc = json.load(f)
    return doc


def decode_stream(data, cap, chunk_sizes=None):
    """Feed data (in chunks) to a Decoder: (frames, error code or None, peak buffered)."""
    dec = P.Decoder(cap)
    frames, peak, pos = [], 0, 0
    try:
        while pos < len(data):
            n = next(chunk_sizes) if chunk_sizes else len(data)
            for frame in dec.feed(data[pos:pos + n]):
                frames.append(frame)
                peak = max(peak, dec.buffered)
            pos += n
            peak = max(peak, dec.buffered)
        dec.finish()
    except ProtocolError as e:
        return frames, e.code, peak
    return frames, None, peak


def expected(vector):
    return [(f["kind"], bytes.fromhex(f["payload_hex"])) for f in vector["frames"]]


class VectorTests(unittest.TestCase):
    def setUp(self):
        self.doc = load_vectors()

    def test_constants_match_the_file(self):
        self.assertEqual(self.doc["cap"], P.CAP)
        self.assertEqual(self.doc["version"], P.VERSION)

    def test_every_vector_whole(self):
        self.assertGreater(len(self.doc["vectors"]), 10)
        for v in self.doc["vectors"]:
            with self.subTest(v["name"]):
                frames, code, _ = decode_stream(bytes.fromhex(v["hex"]), v["cap"])
                self.assertEqual(frames, expected(v))
                self.assertEqual(code, v["error"])

    def test_every_vector_byte_by_byte(self):
        for v in self.doc["vectors"]:
            with self.subTest(v["name"]):
                ones = iter(lambda: 1, None)
                frames, code, _ = decode_stream(bytes.fromhex(v["hex"]), v["cap"], ones)
                self.assertEqual(frames, expected(v))
                self.assertEqual(code, v["error"])

    def test_every_vector_through_a_pipe(self):
        """read_frame() on a real fd agrees with the Decoder."""
        for v in self.doc["vectors"]:
            with self.subTest(v["name"]):
                r, w = os.pipe()
                try:
                    os.write(w, bytes.fromhex(v["hex"]))  # all vectors fit in a pipe buffer
                    os.close(w)
                    frames, code = [], None
                    try:
                        while True:
                            frame = P.read_frame(r, v["cap"])
                            if frame is None:
                                break
                            frames.append(frame)
                    except ProtocolError as e:
                        code = e.code
                    self.assertEqual(frames, expected(v))
                    self.assertEqual(code, v["error"])
                finally:
                    os.close(r)

    def test_valid_vectors_reencode_byte_exact(self):
        for v in self.doc["vectors"]:
            if v["error"] is None:
                with self.subTest(v["name"]):
                    out = b"".join(P.encode_frame(k, p) for k, p in expected(v))
                    self.assertEqual(out.hex(), v["hex"])

    def test_error_codes_are_the_vector_names(self):
        self.assertEqual({v["error"] for v in self.doc["vectors"]} - {None}, ERROR_CODES)


class CodecTests(unittest.TestCase):
    def test_round_trip_every_kind(self):
        rng = random.Random(1)
        stream, frames = b"", []
        for kind in sorted(P.NAMES):
            for size in (0, 1, 255, 4096, 70000):
                payload = bytes(rng.getrandbits(8) for _ in range(size))
                frames.append((kind, payload))
                stream += P.encode_frame(kind, payload)
        self.assertEqual(P.decode(stream), frames)

    def test_hello(self):
        self.assertEqual(P.encode_frame(P.HELLO, P.hello_payload()).hex(),
                         "090000000177666a61696c0100")
        self.assertEqual(P.parse_hello(P.hello_payload(7)), 7)
        for bad in (b"", b"wfjail", b"wfjailx\x01\x00", b"WFJAIL\x01\x00"):
            with self.assertRaises(ProtocolError) as cm:
                P.parse_hello(bad)
            self.assertEqual(cm.exception.code, "handshake")

    def test_encode_refuses_what_a_reader_rejects(self):
        with self.assertRaises(ValueError):
            P.encode_frame(0, b"")
        with self.assertRaises(ValueError):
            P.encode_frame(10, b"")
        with self.assertRaises(ProtocolError) as cm:
            P.encode_frame(P.RESULT, b"x" * 11, cap=10)
        self.assertEqual(cm.exception.code, "oversized")
        self.assertEqual(len(P.encode_frame(P.RESULT, b"x" * 10, cap=10)), 15)

    def test_payload_of_exactly_the_cap(self):
        frame = P.encode_frame(P.RESULT, b"y" * 64, cap=64)
        self.assertEqual(P.decode(frame, cap=64), [(P.RESULT, b"y" * 64)])
        with self.assertRaises(ProtocolError) as cm:
            P.decode(frame, cap=63)
        self.assertEqual(cm.exception.code, "oversized")

    def test_errors_are_sticky(self):
        dec = P.Decoder()
        with self.assertRaises(ProtocolError):
            list(dec.feed(b"\x00\x00\x00\x00"))
        with self.assertRaises(ProtocolError) as cm:
            list(dec.feed(P.encode_frame(P.QUERY)))
        self.assertEqual(cm.exception.code, "empty")
        with self.assertRaises(ProtocolError):
            dec.finish()

    def test_frames_before_an_error_come_out(self):
        stream = P.encode_frame(P.LOG, b"\x14ok") + b"\x01\x00\x00\x00\x0a"
        frames, code, _ = decode_stream(stream, P.CAP)
        self.assertEqual((frames, code), ([(P.LOG, b"\x14ok")], "unknown-kind"))

    def test_no_allocation_on_the_word_of_a_length(self):
        """A 5-byte header announcing a huge frame costs nothing like the announced size."""
        for head in ("ffffffff", "0100000103", "ffffff0003"):
            with self.subTest(head):
                data = bytes.fromhex(head) + b"abc"
                tracemalloc.start()
                try:
                    decode_stream(data, P.CAP)
                    r, w = os.pipe()
                    os.write(w, data)
                    os.close(w)
                    try:
                        P.read_frame(r)
                    except ProtocolError:
                        pass
                    finally:
                        os.close(r)
                    _, peak = tracemalloc.get_traced_memory()
                finally:
                    tracemalloc.stop()
                self.assertLess(peak, 256 * 1024)


def mutate(rng, seeds):
    """One random or mutated stream: bit flips, truncation, length edits, junk."""
    data = bytearray(rng.choice(seeds))
    op = rng.randrange(7)
    if op == 0 and data:  # bit flips
        for _ in range(rng.randint(1, 4)):
            i = rng.randrange(len(data))
            data[i] ^= 1 << rng.randrange(8)
    elif op == 1 and data:  # truncation
        del data[rng.randrange(len(data)):]
    elif op == 2 and len(data) >= 4:  # length field edits
        at = rng.choice([0, 0, rng.randrange(len(data) - 3)])
        value = rng.choice([0, 1, 2, 5, 0x01000000, 0x01000001, 0x01000002, 0xFFFFFFFF,
                            rng.getrandbits(32), rng.getrandbits(12)])
        data[at:at + 4] = value.to_bytes(4, "little")
    elif op == 3:  # random bytes
        data = bytearray(rng.getrandbits(8) for _ in range(rng.randrange(40)))
    elif op == 4:  # concatenation of two streams
        data += rng.choice(seeds)
    elif op == 5 and data:  # insert or delete a byte
        i = rng.randrange(len(data))
        if rng.random() < 0.5:
            del data[i]
        else:
            data.insert(i, rng.getrandbits(8))
    elif op == 6 and len(data) >= 5:  # change the kind byte
        data[4] = rng.getrandbits(8)
    return bytes(data)


class FuzzTests(unittest.TestCase):
    ITERATIONS = 12000

    def test_decoder_only_yields_frames_or_protocol_errors(self):
        rng = random.Random(0x5F_1A11)
        seeds = [bytes.fromhex(v["hex"]) for v in load_vectors()["vectors"]]
        seeds += [P.encode_frame(k, bytes(rng.getrandbits(8) for _ in range(n)))
                  for k in P.NAMES for n in (0, 3, 40)]
        outcomes = {}
        for _ in range(self.ITERATIONS):
            data = mutate(rng, seeds)
            cap = rng.choice([P.CAP, P.CAP, 0, 1, 8, 64, rng.randrange(1, 300)])
            sizes = iter(lambda: rng.choice([1, 2, 3, 7, 64, 1 << 20]), None)
            try:
                frames, code, peak = decode_stream(data, cap, sizes)
            except Exception as e:  # anything but ProtocolError is a bug
                self.fail("%s on %s (cap %d)" % (type(e).__name__, data.hex(), cap))
            self.assertLessEqual(peak, cap + 5, data.hex())
            for kind, payload in frames:
                self.assertIn(kind, P.NAMES)
                self.assertLessEqual(len(payload), cap)
            self.assertIn(code, ERROR_CODES | {None})
            # Whatever decoded cleanly re-encodes to the very same bytes.
            if code is None:
                self.assertEqual(b"".join(P.encode_frame(k, p, cap) for k, p in frames), data)
            outcomes[code] = outcomes.get(code, 0) + 1
        # The mutations reach every outcome, or the fuzz is not testing much.
        self.assertEqual(set(outcomes), ERROR_CODES | {None}, outcomes)


if __name__ == "__main__":
    unittest.main()
