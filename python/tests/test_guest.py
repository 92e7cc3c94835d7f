"""wfjail.guest.run against a fake supervisor: real pipes, a real guest subprocess."""

import json
import os
import select
import subprocess
import sys
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
PYDIR = os.path.normpath(os.path.join(HERE, ".."))
REPO = os.path.normpath(os.path.join(PYDIR, ".."))
sys.path.insert(0, PYDIR)

from wfjail import protocol as P  # noqa: E402

CASES = os.path.join(HERE, "guest_cases.py")
HELLO_V1 = (P.HELLO, P.hello_payload(1))
CONNECT = {"category": "network", "syscall": "connect", "args": "AF_INET 127.0.0.1:9",
           "action": "denied", "rule": "network.mode = \"none\"",
           "hint": "network is denied in workflow code; do it in an activity", "count": 1}
CLONE = {"category": "thread", "syscall": "clone", "args": "CLONE_VM|CLONE_THREAD|...",
         "action": "denied", "rule": "process.threads = \"deny\"",
         "hint": "threads are denied in workflow code; use asyncio", "count": 1}


class Outcome:
    def __init__(self, frames, returncode, stdout, stderr):
        self.frames, self.returncode = frames, returncode
        self.stdout, self.stderr = stdout.decode(), stderr.decode()

    def error(self):
        """The ERROR frame's JSON, checking it is the last frame and well formed."""
        kind, payload = self.frames[-1]
        assert kind == P.ERROR, self.frames
        doc = json.loads(payload.decode("utf-8"))
        assert sorted(doc) == ["message", "traceback", "type"], doc
        assert all(isinstance(v, str) for v in doc.values()), doc
        return doc


def supervise(argv, hello=P.hello_payload(1), request=b"abc", answers=(), env=None,
              fds="env", preamble=None, close=False, timeout=30, more=()):
    """Play the supervisor: HELLO + REQUEST in, frames out; answer each QUERY in turn.

    After each RESULT or ERROR, send the next request of ``more`` (a session) or close
    the guest's read pipe, as wfjail does. ``preamble`` replaces the HELLO + REQUEST
    bytes; ``close`` closes the guest's read pipe right after them.
    """
    more = list(more)
    to_r, to_w = os.pipe()
    from_r, from_w = os.pipe()
    spec = "%d,%d" % (to_r, from_w)
    child_env = dict(os.environ, WFJAIL_PROTOCOL="1")
    child_env.pop("WFJAIL_FDS", None)
    child_env.update({"env": {"WFJAIL_FDS": spec}, "move": {"MOVE_FDS": spec},
                      "explicit": {"EXPLICIT_FDS": spec}, "none": {}}[fds])
    child_env.update(env or {})
    proc = subprocess.Popen(argv, pass_fds=(to_r, from_w), env=child_env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    os.close(to_r)
    os.close(from_w)
    answers = list(answers)
    frames, dec = [], P.Decoder()
    deadline = time.monotonic() + timeout
    try:
        if preamble is None:
            preamble = P.encode_frame(P.HELLO, hello) + P.encode_frame(P.REQUEST, request)
        os.write(to_w, preamble)
        if close:
            os.close(to_w)
            to_w = None
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([from_r], [], [], left)[0]:
                raise AssertionError("the guest hung; frames so far: %r" % frames)
            data = os.read(from_r, 65536)
            if not data:
                dec.finish()
                break
            for kind, payload in dec.feed(data):
                frames.append((kind, payload))
                if kind == P.QUERY:
                    answer = answers.pop(0) if answers else []
                    os.write(to_w, P.encode_frame(P.VIOLATIONS, json.dumps(answer).encode()))
                if kind in (P.RESULT, P.ERROR) and to_w is not None:
                    if more:
                        os.write(to_w, P.encode_frame(P.REQUEST, more.pop(0)))
                    else:
                        os.close(to_w)
                        to_w = None
        stdout, stderr = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        if to_w is not None:
            os.close(to_w)
        os.close(from_r)
    return Outcome(frames, proc.returncode, stdout, stderr)


def guest(case, **kw):
    return supervise([sys.executable, CASES, case], **kw)


class ConversationTests(unittest.TestCase):
    def assertClean(self, out):
        self.assertEqual(out.returncode, 0, out.stderr)

    def test_bytes_result(self):
        out = guest("echo")
        self.assertClean(out)
        self.assertEqual(out.frames, [HELLO_V1, (P.RESULT, b"echo:abc")])

    def test_str_result_is_utf8(self):
        out = guest("text")
        self.assertClean(out)
        self.assertEqual(out.frames, [HELLO_V1, (P.RESULT, "h\u00e9llo abc".encode("utf-8"))])

    def test_binary_and_empty_requests(self):
        for request in (b"", bytes(range(256)) * 300):
            out = guest("echo", request=request)
            self.assertClean(out)
            self.assertEqual(out.frames, [HELLO_V1, (P.RESULT, b"echo:" + request)])

    def test_handler_exception(self):
        out = guest("fail")
        self.assertClean(out)
        self.assertEqual(out.frames[0], HELLO_V1)
        self.assertEqual(len(out.frames), 2)
        err = out.error()
        self.assertEqual(err["type"], "ValueError")
        self.assertEqual(err["message"], "bad input: b'abc'")
        self.assertIn("Traceback (most recent call last)", err["traceback"])
        self.assertIn("in fail", err["traceback"])
        self.assertTrue(err["traceback"].endswith("ValueError: bad input: b'abc'\n"))

    def test_sigusr2_during_a_call_interrupts_it(self):
        out = guest("interrupted")
        self.assertClean(out)
        err = out.error()
        self.assertEqual(err["type"], "wfjail.Interrupted")
        self.assertIn("in interrupted", err["traceback"])

    def test_result_of_the_wrong_type(self):
        out = guest("wrong_type")
        self.assertClean(out)
        err = out.error()
        self.assertEqual(err["type"], "TypeError")
        self.assertIn("returned int; return bytes or str", err["message"])

    def test_system_exit_still_ends_with_error(self):
        out = guest("exits")
        self.assertClean(out)
        self.assertEqual(out.error()["type"], "SystemExit")

    def test_version_mismatch(self):
        out = guest("echo", hello=P.hello_payload(0))
        self.assertClean(out)
        self.assertEqual(len(out.frames), 1, "no HELLO, no RESULT: only the ERROR")
        err = out.error()
        self.assertEqual(err["type"], "wfjail.ProtocolError")
        self.assertIn("version 0", err["message"])

    def test_bad_magic(self):
        for hello in (b"wfjall\x01\x00", b"wfjail\x01", b""):
            out = guest("echo", hello=hello)
            self.assertClean(out)
            self.assertEqual(len(out.frames), 1)
            self.assertEqual(out.error()["type"], "wfjail.ProtocolError")

    def test_newer_supervisor_gets_version_1(self):
        out = guest("echo", hello=P.hello_payload(2))
        self.assertClean(out)
        self.assertEqual(out.frames, [HELLO_V1, (P.RESULT, b"echo:abc")])

    def test_session_of_several_calls_keeps_process_state(self):
        out = guest("counter", more=[b"b", b"c"])
        self.assertClean(out)
        self.assertEqual(out.frames, [HELLO_V1, (P.RESULT, b"1:abc"), (P.RESULT, b"2:b"),
                                      (P.RESULT, b"3:c")])

    def test_end_of_file_instead_of_a_request_ends_the_session(self):
        hello = P.encode_frame(P.HELLO, P.hello_payload(1))
        out = guest("echo", preamble=hello, close=True)
        self.assertClean(out)
        self.assertEqual(out.frames, [HELLO_V1])

    def test_wrong_frame_instead_of_request(self):
        hello = P.encode_frame(P.HELLO, P.hello_payload(1))
        for preamble, close, said in ((hello + P.encode_frame(P.QUERY), False, "got QUERY"),
                                      (hello + b"\x05\x00", True, "end of file inside")):
            out = guest("echo", preamble=preamble, close=close)
            self.assertClean(out)
            self.assertEqual(out.frames[0], HELLO_V1)
            self.assertEqual(len(out.frames), 2)
            self.assertEqual(out.error()["type"], "wfjail.ProtocolError")
            self.assertIn(said, out.error()["message"])

    def test_oversized_result_is_an_error_not_a_broken_frame(self):
        out = guest("huge")
        self.assertClean(out)
        err = out.error()
        self.assertEqual(err["type"], "wfjail.ProtocolError")
        self.assertIn("exceeds the 16777216-byte frame cap", err["message"])

    def test_logs_and_stdio(self):
        out = guest("logs")
        self.assertClean(out)
        self.assertEqual(out.frames, [HELLO_V1, (P.LOG, b"\x14first"), (P.LOG, b"\x1ecareful"),
                                      (P.RESULT, b"done")])
        self.assertEqual(out.stdout, "to stdout\n")
        self.assertEqual(out.stderr, "to stderr\n")

    def test_fds_moved_to_3_and_4(self):
        out = guest("echo", fds="move")
        self.assertClean(out)
        self.assertEqual(out.frames, [HELLO_V1, (P.RESULT, b"echo:abc")])

    def test_explicit_fds(self):
        out = guest("echo", fds="explicit")
        self.assertClean(out)
        self.assertEqual(out.frames, [HELLO_V1, (P.RESULT, b"echo:abc")])

    def test_without_fds_says_how_to_run_it(self):
        out = guest("echo", fds="none")
        self.assertEqual(out.returncode, 2)
        self.assertEqual(out.frames, [])
        self.assertIn("wfjail run", out.stderr)


class ViolationTests(unittest.TestCase):
    def test_denial_becomes_a_violation(self):
        out = guest("denied", answers=[[CLONE, CONNECT]])
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertEqual([k for k, _ in out.frames], [P.HELLO, P.QUERY, P.ERROR])
        self.assertEqual(out.frames[1], (P.QUERY, b""))
        err = out.error()
        self.assertEqual(err["type"], "wfjail.Violation")
        self.assertEqual(err["message"], "network: connect(AF_INET 127.0.0.1:9) denied \u2014 "
                                         "network is denied in workflow code; do it in an activity")
        tb = err["traceback"]
        self.assertIn("PermissionError: [Errno 1] Operation not permitted", tb)
        self.assertIn("direct cause", tb)
        self.assertTrue(tb.endswith("wfjail.Violation: " + err["message"] + "\n"), tb)

    def test_denial_behind_a_library_exception(self):
        out = guest("wrapped_denial", answers=[[CONNECT]])
        self.assertEqual([k for k, _ in out.frames], [P.HELLO, P.QUERY, P.ERROR])
        self.assertEqual(out.error()["type"], "wfjail.Violation")
        self.assertIn("ConnectionError: could not reach the service", out.error()["traceback"])

    def test_unrecorded_denial_is_left_alone(self):
        out = guest("denied", answers=[[]])
        self.assertEqual([k for k, _ in out.frames], [P.HELLO, P.QUERY, P.ERROR])
        err = out.error()
        self.assertEqual(err["type"], "PermissionError")
        self.assertEqual(err["message"], "[Errno 1] Operation not permitted")

    def test_thread_that_cannot_start(self):
        out = guest("no_thread", answers=[[CLONE]])
        err = out.error()
        self.assertEqual(err["type"], "wfjail.Violation")
        self.assertIn("thread: clone(CLONE_VM|CLONE_THREAD|...) denied", err["message"])
        self.assertIn("can't start new thread", err["traceback"])

    def test_urandom_without_a_source(self):
        getrandom = dict(CONNECT, category="random", syscall="getrandom", args="16 bytes",
                         rule="random.getrandom = \"deny\"", hint="use workflow.random()")
        out = guest("no_random", answers=[[getrandom]])
        self.assertEqual([k for k, _ in out.frames], [P.HELLO, P.QUERY, P.ERROR])
        self.assertEqual(out.error()["message"],
                         "random: getrandom(16 bytes) denied \u2014 use workflow.random()")

    def test_other_errors_cost_no_query(self):
        out = guest("fail", answers=[[CONNECT]])
        self.assertEqual([k for k, _ in out.frames], [P.HELLO, P.ERROR])

    def test_violations_as_exceptions(self):
        out = guest("catch", answers=[[CONNECT]])
        self.assertEqual([k for k, _ in out.frames], [P.HELLO, P.QUERY, P.RESULT])
        doc = json.loads(out.frames[-1][1])
        expected = dict(CONNECT, errno=1, cause="PermissionError", is_permission_error=True,
                        str="network: connect(AF_INET 127.0.0.1:9) denied \u2014 network is "
                            "denied in workflow code; do it in an activity")
        self.assertEqual(doc, expected)

    def test_query_round_trip(self):
        out = guest("query", answers=[[CONNECT, CLONE]])
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertEqual([k for k, _ in out.frames], [P.HELLO, P.QUERY, P.RESULT])
        self.assertEqual(json.loads(out.frames[-1][1]), [CONNECT, CLONE])


class ExampleTests(unittest.TestCase):
    def example(self, name, request):
        return supervise([sys.executable, os.path.join(REPO, "examples", name)], request=request)

    def test_workflow_guest_is_deterministic(self):
        with open(os.path.join(REPO, "examples", "request.json"), "rb") as f:
            request = f.read()
        first = self.example("workflow_guest.py", request)
        self.assertEqual(first.returncode, 0, first.stderr)
        self.assertEqual([k for k, _ in first.frames], [P.HELLO, P.LOG, P.RESULT])
        self.assertTrue(first.frames[1][1].startswith(b"\x14priced order A-17"))
        result = json.loads(first.frames[-1][1])
        self.assertEqual(result["order_id"], "A-17")
        self.assertEqual(result["total"], "20.03")
        self.assertEqual(len(result["request_sha256"]), 64)
        again = self.example("workflow_guest.py", request)
        self.assertEqual(again.frames, first.frames)

    def test_misbehaving_guest_unconfined(self):
        out = self.example("misbehaving_guest.py", b'{"try": "sleep"}')
        self.assertEqual(out.frames[-1][0], P.RESULT, out.frames)
        out = self.example("misbehaving_guest.py", b'{"try": "nonsense"}')
        err = out.error()
        self.assertEqual(err["type"], "ValueError")
        self.assertIn("network, thread, fork, exec, urandom, sleep", err["message"])


if __name__ == "__main__":
    unittest.main()
