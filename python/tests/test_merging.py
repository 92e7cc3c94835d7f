"""wfjail.merging: what the zygote says of its opt-in to same-page merging, on this kernel, for
real, in forked children (the test process stays as it was). The opt-in is the server's
(``prctl(PR_SET_MEMORY_MERGE, 1)`` before the zygote's exec): here a child makes it the same
way and the exec keeps it. A kernel before 6.4 fails the cases that opt in."""

import ctypes
import subprocess
import json
import os
import sys
import unittest

sys.path.insert(0, os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                 "..")))
from wfjail import merging  # noqa: E402


def _ksm_stat():
    out = {}
    with open("/proc/self/ksm_stat") as f:
        for line in f:
            key, _, value = line.partition(" ")
            out[key.rstrip(":")] = value.strip()
    return out


def _in_child(fn):
    """fn()'s JSON-able result, computed in a forked child."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            doc = json.dumps(fn()).encode()
        except BaseException as exc:  # noqa: BLE001 (reported to the parent)
            doc = json.dumps({"raised": repr(exc)}).encode()
        os.write(w, doc)
        os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        doc = f.read()
    os.waitpid(pid, 0)
    return json.loads(doc)


def _opt_in():
    """What the server does before the zygote's exec."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(67, ctypes.c_ulong(1), ctypes.c_ulong(0), ctypes.c_ulong(0),
                  ctypes.c_ulong(0)) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_MEMORY_MERGE, 1)")


class Merging(unittest.TestCase):
    def test_only_any_is_asked_for(self):
        self.assertEqual(merging.wanted({}), "")
        self.assertEqual(merging.wanted({merging.ENV: "0"}), "")
        self.assertEqual(merging.wanted({merging.ENV: "any"}), "any")
        self.assertTrue(merging.status("some").startswith("off: "))
        self.assertIn("gone", merging.status("heap"))

    def test_a_process_not_opted_in_says_off(self):
        self.assertEqual(_in_child(lambda: merging.status("any")),
                         merging.status("any"))
        self.assertTrue(_in_child(lambda: merging.status("any")).startswith(
            "off: PR_GET_MEMORY_MERGE answered 0"))

    def test_an_opt_in_before_exec_is_kept_by_the_exec_and_inherited_by_forks(self):
        def run():
            _opt_in()
            probe = ("import json, os, sys; sys.path.insert(0, %r); "
                     "from wfjail import merging; "
                     "r, w = os.pipe(); pid = os.fork()\n"
                     "if pid == 0: os.write(w, merging.status('any').encode()); os._exit(0)\n"
                     "os.close(w); child = os.read(r, 4096).decode(); os.waitpid(pid, 0); "
                     "stat = dict(l.split(None, 1) for l in open('/proc/self/ksm_stat')); "
                     "print(json.dumps({'self': merging.status('any'), 'child': child, "
                     "'ksm': stat['ksm_merge_any:'].strip()}))"
                     % os.path.dirname(os.path.dirname(os.path.abspath(merging.__file__))))
            out = subprocess.run([sys.executable, "-c", probe], capture_output=True,
                                 check=True).stdout
            return json.loads(out)
        self.assertEqual(_in_child(run), {"self": "any", "child": "any", "ksm": "yes"})


if __name__ == "__main__":
    unittest.main()
