"""wfjail.hugepages: the zygote's heap collapsed into 2 MiB pages before it forks, found from
its objects' addresses; on this kernel, for real (a kernel without MADV_COLLAPSE, or THP set
to never, fails these unless WFJAIL_ALLOW_NO_THP=1 says that is expected here)."""

import ctypes
import mmap
import os
import sys
import unittest

sys.path.insert(0, os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                 "..")))
from wfjail import hugepages  # noqa: E402

MiB = 1 << 20


def _anon_huge_kib(start, end):
    """AnonHugePages of this process's mappings that overlap [start, end), in KiB."""
    total, inside = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo < end and start < hi
            elif inside and head == "AnonHugePages:":
                total += int(line.split()[1])
    return total


def _thp_missing():
    try:
        with open(hugepages.THP_ENABLED) as f:
            return "[never]" in f.read()
    except OSError:
        return True


class RangeTests(unittest.TestCase):
    def test_addresses_map_to_their_aligned_2_mib_ranges_once_each(self):
        h = hugepages.HUGE
        self.assertEqual(hugepages.huge_ranges([5 * h + 17, 5 * h, 3 * h - 1, 5 * h + h - 1]),
                         [2 * h, 5 * h])
        self.assertEqual(hugepages.huge_ranges([]), [])

    def test_a_cluster_spans_the_gaps_between_its_objects_and_grows_while_mapped(self):
        h = hugepages.HUGE
        mapped = set(range(8 * h, 20 * h, h)) | {100 * h, 101 * h}
        # Objects in ranges 10 and 12 (one cluster: ranges 8-19 are mapped around them) and
        # in 100 (another: far apart); 11 lies between and is looked at too.
        got = hugepages.spans([10 * h, 12 * h, 100 * h], lambda at: at in mapped)
        self.assertEqual(got, list(range(8 * h, 20 * h, h)) + [100 * h, 101 * h])
        self.assertEqual(hugepages.spans([], lambda at: True), [])

    def test_the_switch_is_on_unless_set_to_0(self):
        self.assertTrue(hugepages.wanted({}))
        self.assertTrue(hugepages.wanted({hugepages.ENV: "1"}))
        self.assertFalse(hugepages.wanted({hugepages.ENV: "0"}))


class CollapseTests(unittest.TestCase):
    def setUp(self):
        if _thp_missing() and os.environ.get("WFJAIL_ALLOW_NO_THP") == "1":
            self.skipTest("transparent huge pages are off here (WFJAIL_ALLOW_NO_THP=1)")

    def test_a_written_anonymous_mapping_becomes_huge_pages_and_keeps_its_bytes(self):
        m = mmap.mmap(-1, 8 * MiB, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        try:
            for i in range(0, 8 * MiB, 4096):
                m[i] = (i // 4096) % 251
            start = ctypes.addressof(ctypes.c_char.from_buffer(m))
            end = start + 8 * MiB
            self.assertEqual(_anon_huge_kib(start, end), 0)
            # Addresses inside: each 2 MiB range wholly inside the mapping is collapsed.
            done = hugepages.collapse(range(start, end, 4096))
            whole = (end // hugepages.HUGE - (start + hugepages.HUGE - 1) // hugepages.HUGE)
            # (Its neighbours in this process may be collapsed too.)
            self.assertIsInstance(done, int, done)
            self.assertGreaterEqual(done, whole * 2048)
            self.assertEqual(_anon_huge_kib(start, end), whole * 2048)
            self.assertTrue(all(m[i] == (i // 4096) % 251 for i in range(0, 8 * MiB, 4096)))
        finally:
            m.close()

    def test_ranges_outside_any_mapping_are_refused_and_said(self):
        # The first 2 MiB of the address space are never mapped (vm.mmap_min_addr).
        done = hugepages.collapse([0])
        self.assertIsInstance(done, str)
        self.assertIn("nothing collapsed", done)


if __name__ == "__main__":
    unittest.main()
