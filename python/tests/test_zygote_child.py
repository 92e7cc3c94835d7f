"""The session child's side of wfjail.zygote, in a plain forked process (no supervisor)."""

import importlib
import json
import os
import random
import resource
import signal
import socket
import sys
import unittest
from unittest import mock

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.normpath(os.path.join(HERE, "..")))

from wfjail import zygote  # noqa: E402


def in_child(body):
    """Run ``body()`` in a forked child; return what it returned (JSON) or raise its error."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            out = {"ok": body()}
        except BaseException as exc:
            out = {"error": "%s: %s" % (type(exc).__name__, exc)}
        os.write(w, json.dumps(out).encode())
        os._exit(0)
    os.close(w)
    data = b""
    while True:
        chunk = os.read(r, 65536)
        if not chunk:
            break
        data += chunk
    os.close(r)
    os.waitpid(pid, 0)
    doc = json.loads(data.decode())
    if "error" in doc:
        raise AssertionError("in the child: " + doc["error"])
    return doc["ok"]


class ResolveTests(unittest.TestCase):
    def test_a_preloaded_module_is_taken_from_sys_modules_without_importlib(self):
        with mock.patch.object(importlib, "import_module", side_effect=AssertionError("imported")):
            self.assertIs(zygote._resolve("json:dumps"), json.dumps)
            self.assertIs(zygote._resolve("os.path:join"), os.path.join)

    def test_a_module_not_loaded_yet_is_imported(self):
        sys.modules.pop("colorsys", None)
        fn = zygote._resolve("colorsys:rgb_to_hsv")
        self.assertIs(fn, sys.modules["colorsys"].rgb_to_hsv)

    def test_what_is_not_a_callable_is_refused(self):
        with self.assertRaises(ValueError):
            zygote._resolve("json")
        with self.assertRaises(TypeError):
            zygote._resolve("json:__name__")
        with self.assertRaises(AttributeError):
            zygote._resolve("json:no_such_function")


class LeaveZygoteTests(unittest.TestCase):
    def test_the_child_gets_default_signals_closes_the_zygotes_fds_and_takes_the_cpu_limit(self):
        ctl, other = socket.socketpair()
        wake = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        before = {s: signal.getsignal(s) for s in
                  (signal.SIGCHLD, signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}

        def child():
            # As the zygote has them (main): ignored, a SIGCHLD handler, a wake-up fd.
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                signal.signal(sig, signal.SIG_IGN)
            signal.signal(signal.SIGCHLD, lambda *_: None)
            signal.set_wakeup_fd(wake[1])
            with mock.patch.object(zygote, "_CPU_LIMIT", "7"):
                refused = zygote._leave_zygote(ctl, wake)
            closed = []
            for fd in (ctl.fileno(), wake[0], wake[1]):
                try:
                    os.fstat(fd)
                except OSError:
                    closed.append(fd)
            return {
                "refused": refused,
                "signals": [str(signal.getsignal(s)) for s in
                            (signal.SIGCHLD, signal.SIGINT, signal.SIGTERM, signal.SIGHUP)],
                "default_int": signal.getsignal(signal.SIGINT) is signal.default_int_handler,
                "wakeup": signal.set_wakeup_fd(-1),
                "closed": len(closed),
                "cpu": list(resource.getrlimit(resource.RLIMIT_CPU)),
            }

        try:
            got = in_child(child)
        finally:
            ctl.close()
            other.close()
            os.close(wake[0])
            os.close(wake[1])
        dfl = str(signal.Handlers.SIG_DFL)
        self.assertEqual(got["signals"][0], dfl)
        self.assertTrue(got["default_int"])
        self.assertEqual(got["signals"][2:], [dfl, dfl])
        self.assertEqual(got["wakeup"], -1)
        self.assertEqual(got["closed"], 3)
        self.assertEqual(got["cpu"], [7, 7])
        # No Landlock ruleset was prepared in this process: the child says why it has no
        # domain of its own (and then never runs its session).
        self.assertIsInstance(got["refused"], str)
        # The parent's own handlers are untouched.
        self.assertEqual(before, {s: signal.getsignal(s) for s in before})


class ReseedTests(unittest.TestCase):
    def test_random_is_reseeded_only_where_the_policy_gives_randomness(self):
        def child(policy):
            def body():
                random.seed(1)
                with mock.patch.object(zygote, "_GETRANDOM", policy):
                    zygote._reseed()
                return random.random()
            return body

        random.seed(1)
        fixed = random.random()
        self.assertEqual(in_child(child("deny")), fixed)
        self.assertEqual(in_child(child(None)), fixed)
        self.assertNotEqual(in_child(child("allow")), fixed)
        self.assertNotEqual(in_child(child("seeded")), fixed)


if __name__ == "__main__":
    unittest.main()
