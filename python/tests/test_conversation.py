"""wfjail.conversation: the worker side of a session without sockets, one test per rule."""

import json
import os
import struct
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))

from wfjail import ProtocolError, Violation, wire  # noqa: E402
from wfjail.conversation import (READ_CHUNK, Answer, Busy, Conversation, GuestError,  # noqa: E402
                                 Send, SessionFailed)
from wfjail.wire_worker import WorkerKind as K  # noqa: E402

REPORT = {"status": "ok", "violations": []}
CONNECT = {"category": "network", "syscall": "connect", "args": "AF_INET 127.0.0.1:9",
           "action": "denied", "rule": "network.mode = \"none\"", "hint": "no network",
           "count": 1}


def frame(kind, payload=b""):
    if not isinstance(payload, bytes):
        payload = json.dumps(payload).encode("utf-8")
    return struct.pack("<IB", len(payload) + 1, kind) + payload


def run(conv, data):
    """Feed ``data`` as a reader would (``wanted()`` bytes at a time): the steps, in order."""
    steps, pos = [], 0
    while pos < len(data):
        piece = data[pos:pos + conv.wanted()]
        pos += len(piece)
        got = conv.frame_from(piece)
        if got is not None:
            step = conv.handle(*got)
            if step is not None:
                steps.append(step)
    return steps


def opened(**kw):
    conv = Conversation('{"handler": "wf:run"}', **kw)
    conv.open()
    run(conv, frame(K.OPENED, {"session": 7, "mode": "zygote"}))
    return conv


class RequestTests(unittest.TestCase):
    def test_open_sends_the_open_doc_and_opened_gives_id_and_mode(self):
        conv = Conversation('{"handler": "wf:run"}')
        self.assertEqual(conv.open(), frame(K.OPEN, b'{"handler": "wf:run"}'))
        steps = run(conv, frame(K.OPENED, {"session": 7, "mode": "zygote"}))
        self.assertEqual(steps, [Answer({"session": 7, "mode": "zygote"})])
        self.assertEqual((conv.id, conv.mode, conv.ended), (7, "zygote", False))

    def test_a_call_sends_time_before_call_only_when_given(self):
        conv = opened()
        self.assertEqual(conv.call(b"a"), frame(K.CALL, b"a"))
        self.assertEqual(conv.call("\u00e9", time_ns=5),
                         frame(K.TIME, struct.pack("<q", 5)) + frame(K.CALL, "\u00e9".encode()))

    def test_the_result_answers_a_call(self):
        conv = opened()
        conv.call(b"a")
        self.assertEqual(run(conv, frame(K.RESULT, b"echo")), [Answer(b"echo")])

    def test_close_and_status_frames_are_empty(self):
        self.assertEqual(Conversation().close(), frame(K.CLOSE))
        self.assertEqual(Conversation().status(), frame(K.STATUS))


class LogTests(unittest.TestCase):
    def test_log_frames_go_to_on_log_whenever_they_come(self):
        got = []
        conv = Conversation("{}", on_log=lambda level, text: got.append((level, text)))
        conv.open()
        log = frame(K.LOG, {"level": 20, "text": "hi"})
        run(conv, log + frame(K.OPENED, {"session": 1}))
        conv.call(b"x")
        self.assertEqual(run(conv, log + frame(K.RESULT, b"r")), [Answer(b"r")])
        conv.close()
        self.assertEqual(run(conv, log + frame(K.CLOSED, REPORT)), [Answer(REPORT)])
        self.assertEqual(got, [(20, "hi")] * 3)

    def test_a_bad_log_record_is_dropped(self):
        got = []
        conv = opened(on_log=lambda *r: got.append(r))
        conv.call(b"x")
        bad = frame(K.LOG, b"not json") + frame(K.LOG, {"level": "x", "text": 1})
        self.assertEqual(run(conv, bad + frame(K.RESULT, b"r")), [Answer(b"r")])
        self.assertEqual(got, [])

    def test_without_on_log_log_frames_are_skipped(self):
        conv = opened()
        conv.call(b"x")
        self.assertEqual(run(conv, frame(K.LOG, {"level": 20, "text": "hi"}) +
                             frame(K.RESULT, b"r")), [Answer(b"r")])


class UpcallTests(unittest.TestCase):
    def test_each_upcall_is_answered_before_the_result(self):
        conv = opened(on_upcall=lambda q: b"A:" + q)
        conv.call(b"x")
        steps = run(conv, frame(K.UPCALL, b"1") + frame(K.UPCALL, b"2") + frame(K.RESULT, b"r"))
        self.assertEqual(steps, [Send(frame(K.REPLY, b"\x00A:1")),
                                 Send(frame(K.REPLY, b"\x00A:2")), Answer(b"r")])

    def test_an_upcall_without_a_handler_is_refused_with_why(self):
        conv = opened()
        conv.call(b"x")
        (step,) = run(conv, frame(K.UPCALL, b"q"))
        self.assertEqual(step.data, frame(K.REPLY, b"\x01this session has no upcall handler "
                                          b"(Client.session(on_upcall=...))"))

    def test_an_upcall_handler_that_raises_is_refused_with_its_error(self):
        def fail(q):
            raise ValueError("nope")
        conv = opened(on_upcall=fail)
        conv.call(b"x")
        self.assertEqual(run(conv, frame(K.UPCALL, b"q")),
                         [Send(frame(K.REPLY, b"\x01ValueError: nope"))])

    def test_an_upcall_outside_a_call_is_out_of_place(self):
        conv = Conversation("{}", on_upcall=lambda q: q)
        conv.open()
        with self.assertRaises(ProtocolError) as cm:
            run(conv, frame(K.UPCALL, b"q"))
        self.assertEqual(cm.exception.code, "unexpected")

    def test_an_upcall_after_violations_is_out_of_place(self):
        conv = opened(on_upcall=lambda q: q)
        conv.call(b"x")
        with self.assertRaises(ProtocolError) as cm:
            run(conv, frame(K.VIOLATIONS, [CONNECT]) + frame(K.UPCALL, b"q"))
        self.assertEqual(cm.exception.code, "unexpected")


class ViolationsTests(unittest.TestCase):
    def test_violations_precede_the_result_and_last_until_the_next_answer(self):
        conv = opened()
        conv.call(b"x")
        self.assertEqual(run(conv, frame(K.VIOLATIONS, [CONNECT]) + frame(K.RESULT, b"r")),
                         [Answer(b"r")])
        self.assertEqual(conv.violations, [CONNECT])
        conv.call(b"y")
        self.assertEqual(conv.violations, [CONNECT], "until an answer comes")
        run(conv, frame(K.RESULT, b"r"))
        self.assertEqual(conv.violations, [])

    def test_a_second_violations_frame_is_out_of_place(self):
        conv = opened()
        conv.call(b"x")
        with self.assertRaises(ProtocolError) as cm:
            run(conv, frame(K.VIOLATIONS, []) + frame(K.VIOLATIONS, []))
        self.assertEqual(cm.exception.code, "unexpected")


class AnswerTests(unittest.TestCase):
    def test_error_answering_a_call_raises_the_guests_error_and_the_session_goes_on(self):
        conv = opened()
        conv.call(b"x")
        doc = {"type": "ValueError", "message": "bad", "traceback": "", "violations": []}
        with self.assertRaises(GuestError) as cm:
            run(conv, frame(K.ERROR, doc))
        self.assertEqual(cm.exception.type, "ValueError")
        self.assertFalse(conv.ended)
        conv.call(b"y")
        self.assertEqual(run(conv, frame(K.RESULT, b"r")), [Answer(b"r")])

    def test_an_error_naming_a_recorded_violation_raises_it(self):
        conv = opened()
        conv.call(b"x")
        doc = {"type": "wfjail.Violation", "traceback": "tb", "violations": [CONNECT],
               "message": "network: connect(AF_INET 127.0.0.1:9) denied"}
        with self.assertRaises(Violation) as cm:
            run(conv, frame(K.ERROR, doc))
        self.assertEqual((cm.exception.syscall, cm.exception.traceback), ("connect", "tb"))

    def test_failed_answering_open_or_a_call_ends_the_session(self):
        for conv in (Conversation("{}"), opened()):
            if conv.id is None:
                conv.open()
            else:
                conv.call(b"x")
            report = {"status": "timeout", "violations": []}
            with self.assertRaises(SessionFailed) as cm:
                run(conv, frame(K.FAILED, report))
            self.assertEqual((cm.exception.report, conv.report, conv.ended),
                             (report, report, True))

    def test_busy_answering_open_raises_busy(self):
        conv = Conversation("{}")
        conv.open()
        with self.assertRaises(Busy) as cm:
            run(conv, frame(K.BUSY, {"capacity": 2, "open": 2}))
        self.assertEqual((cm.exception.capacity, cm.exception.open), (2, 2))

    def test_another_kind_than_the_awaited_one_is_unexpected(self):
        conv = Conversation("{}")
        conv.open()
        with self.assertRaises(ProtocolError) as cm:
            run(conv, frame(K.RESULT, b"not yet"))
        self.assertEqual(cm.exception.code, "unexpected")

    def test_close_is_answered_by_closed_or_failed(self):
        for kind in (K.CLOSED, K.FAILED):
            conv = opened()
            conv.close()
            self.assertEqual(run(conv, frame(kind, REPORT)), [Answer(REPORT)])
            self.assertEqual((conv.report, conv.ended), (REPORT, True))

    def test_anything_else_answering_close_leaves_the_session_as_it_was(self):
        conv = opened()
        conv.close()
        self.assertEqual(run(conv, frame(K.RESULT, b"late")), [Answer(None)])
        self.assertEqual((conv.report, conv.ended), (None, False))

    def test_status_is_answered_by_server_and_nothing_else(self):
        conv = Conversation()
        conv.status()
        self.assertEqual(run(conv, frame(K.SERVER, {"capacity": 4})), [Answer({"capacity": 4})])
        for kind in (K.FAILED, K.BUSY):
            conv = Conversation()
            conv.status()
            with self.assertRaises(ProtocolError) as cm:
                run(conv, frame(kind, REPORT))
            self.assertEqual(cm.exception.code, "unexpected")


class ReadingTests(unittest.TestCase):
    def test_wanted_never_reads_past_a_frame(self):
        conv = opened()
        conv.call(b"x")
        self.assertEqual(conv.wanted(), 4)
        conv.frame_from(struct.pack("<I", 4))
        self.assertEqual(conv.wanted(), 1)
        conv.frame_from(bytes((K.RESULT,)))
        self.assertEqual(conv.wanted(), 3)
        self.assertEqual(conv.frame_from(b"abc"), (K.RESULT, b"abc"))
        self.assertEqual(conv.wanted(), 4)

    def test_a_large_payload_is_read_in_pieces_of_at_most_read_chunk(self):
        conv = opened()
        conv.call(b"x")
        conv.frame_from(struct.pack("<I", 3 * READ_CHUNK + 1))
        conv.frame_from(bytes((K.RESULT,)))
        self.assertEqual(conv.wanted(), READ_CHUNK)

    def test_a_worker_kind_or_a_guest_kind_from_wfjail_is_unknown(self):
        for kind in (K.CALL, wire.GuestKind.RESULT, 0x30):
            conv = opened()
            with self.assertRaises(ProtocolError) as cm:
                run(conv, frame(kind, b""))
            self.assertEqual(cm.exception.code, "unknown-kind")

    def test_a_failed_stream_stays_failed(self):
        conv = opened()
        with self.assertRaises(ProtocolError):
            run(conv, bytes(4))
        with self.assertRaises(ProtocolError) as cm:
            conv.wanted()
        self.assertEqual(cm.exception.code, "empty")

    def test_end_of_file_is_a_truncation(self):
        conv = opened()
        with self.assertRaises(ProtocolError) as cm:
            conv.frame_from(b"")
        self.assertEqual(cm.exception.code, "truncated")

    def test_a_guest_frame_over_max_frame_ends_the_session_unread(self):
        for kind in (K.RESULT, K.ERROR, K.LOG, K.UPCALL):
            conv = opened(max_frame=10)
            conv.call(b"x")
            conv.frame_from(struct.pack("<I", 12))
            with self.assertRaises(ProtocolError) as cm:
                conv.frame_from(bytes((kind,)))  # refused on the header: no payload read
            self.assertEqual((cm.exception.code, conv.ended), ("oversized", True))

    def test_max_frame_bounds_only_the_guests_payloads(self):
        conv = Conversation("{}", max_frame=2)
        conv.open()
        self.assertEqual(run(conv, frame(K.OPENED, {"session": 1})), [Answer({"session": 1})])
        conv.call(b"x")
        self.assertEqual(run(conv, frame(K.RESULT, b"ok")), [Answer(b"ok")])


if __name__ == "__main__":
    unittest.main()
