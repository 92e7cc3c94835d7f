"""wfjail.merging: the zygote opting itself (and what it forks) into same-page merging; on
this kernel, for real, in forked children (the test process stays as it was). A kernel before
6.4 fails the merge-any case: the zygote then falls back to its heap."""

import gc
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


class Merging(unittest.TestCase):
    def test_only_any_and_heap_are_asked_for(self):
        self.assertEqual(merging.wanted({}), "")
        self.assertEqual(merging.wanted({merging.ENV: "0"}), "")
        self.assertEqual(merging.wanted({merging.ENV: "any"}), "any")
        self.assertTrue(merging.opt_in("some", []).startswith("off: "))

    def test_any_opts_the_process_and_its_forks_in(self):
        def run():
            took = merging.opt_in("any", [])
            # A fork inherits it.
            child = _in_child(lambda: _ksm_stat()["ksm_merge_any"])
            return {"took": took, "self": _ksm_stat()["ksm_merge_any"], "child": child}
        self.assertEqual(_in_child(run), {"took": "any", "self": "yes", "child": "yes"})

    def test_heap_marks_the_heaps_mappings_only(self):
        def run():
            took = merging.opt_in("heap", (id(o) for o in gc.get_objects()))
            s = _ksm_stat()
            return {"took": took, "any": s["ksm_merge_any"], "mergeable": s["ksm_mergeable"]}
        self.assertEqual(_in_child(run), {"took": "heap", "any": "no", "mergeable": "yes"})


if __name__ == "__main__":
    unittest.main()
