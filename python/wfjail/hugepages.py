"""Back the zygote's heap with transparent huge pages before it forks sessions (Linux 6.1+,
``MADV_COLLAPSE``).

Every fork copies the parent's page tables for its private memory: one entry per 4 KiB page
of the zygote's ~30 MiB heap, each page's reference count raised, and the child's exit undoes
it all. A heap range collapsed into 2 MiB pages is one entry each, so forking, exiting and
reaping a session child costs less CPU. A child that writes such a page first splits the
mapping (in its own page table), then copies only the 4 KiB it writes, as before: its private
memory is the same (docs/benchmarks.md, "Issue 20").

Only ``MADV_COLLAPSE`` is asked, once, of each 2 MiB-aligned range among the zygote's
objects (found from their addresses, ``id()``, and the spans between them:
``/proc/self/maps`` is not readable under a policy) that is mostly in memory (``mincore``);
the kernel refuses any that is not wholly inside one private, anonymous mapping. Not
``MADV_HUGEPAGE``, which would make a child's fault in an untouched part of those mappings
allocate a whole 2 MiB page. The zygote itself grows by the holes filled in
(a few hundred KiB). Best effort: a kernel without it (before 6.1), THP set to ``never``, or
a refusal leaves the heap as it was and says why. The policy turns it off with
``WFJAIL_HUGEPAGES=0`` in its ``[env]``; ``python -m wfjail.zygote --no-hugepages`` too."""

import ctypes
import errno
import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import (Callable, Dict, Generator, Iterable, List, Mapping, Optional,
                        Union)

# The environment variable that turns the collapse off ("0"); anything else leaves it on.
ENV = "WFJAIL_HUGEPAGES"
MADV_COLLAPSE = 25  # include/uapi/asm-generic/mman-common.h
HUGE = 2 << 20  # x86_64's PMD size
THP_ENABLED = "/sys/kernel/mm/transparent_hugepage/enabled"
# Ranges of a cluster further apart than this are two clusters (the brk heap and the mmap
# area are far apart).
MAX_GAP = 64 << 20
# The most ranges looked at (8 GiB), and the widest a cluster grows: bounds on the work.
MAX_RANGES = 4096
MAX_SPAN = 4 << 30
# A cluster stops growing at this many unmapped ranges in a row.
MAX_MISSES = 8
# A range is collapsed when at least this many of its 512 pages are in memory.
MIN_RESIDENT = 384


def wanted(env: "Mapping[str, str]") -> bool:
    return env.get(ENV, "1") != "0"


def huge_ranges(addresses: "Iterable[int]") -> "List[int]":
    """The starts of the 2 MiB-aligned ranges that hold ``addresses``, in order."""
    return sorted({a // HUGE * HUGE for a in addresses})


def spans(starts: "List[int]", mapped: "Callable[[int], bool]") -> "List[int]":
    """Every range between the first and last of each cluster of ``starts`` (sorted; a gap
    of more than ``MAX_GAP`` starts a new cluster), and beyond them on both sides until
    ``MAX_MISSES`` ranges in a row are not ``mapped``: the objects the collector tracks are
    scattered among those it does not (strings, numbers, dicts of atoms), whose memory is the
    same heap, and newer arenas lie beyond them. At most ``MAX_RANGES``."""
    out: "List[int]" = []
    i = 0
    while i < len(starts) and len(out) < MAX_RANGES:
        j = i
        while j + 1 < len(starts) and starts[j + 1] - starts[j] <= MAX_GAP:
            j += 1
        low, high = starts[i], starts[j]
        for step in (-HUGE, HUGE):
            at, misses = (low if step < 0 else high) + step, 0
            while misses < MAX_MISSES and HUGE <= at < 1 << 47 and high - low < MAX_SPAN:
                if mapped(at):
                    low, high, misses = min(low, at), max(high, at), 0
                else:
                    misses += 1
                at += step
        out.extend(range(low, high + HUGE, HUGE))
        i = j + 1
    return sorted(set(out))[:MAX_RANGES]


def collapse(addresses: "Iterable[int]") -> "Union[int, str]":
    """Collapses into a huge page each range of ``spans(huge_ranges(addresses))`` that is
    mapped and mostly in memory (``mincore``: at least ``MIN_RESIDENT`` of its 512 pages,
    so that the holes the collapse fills cost little): how many KiB were, or why none."""
    steps = collapsing(addresses)
    while True:
        try:
            next(steps)
        except StopIteration as done:
            result: "Union[int, str]" = done.value
            return result


def collapsing(addresses: "Iterable[int]") -> "Generator[None, None, Union[int, str]]":
    """``collapse``, a range at a time: a generator that yields after each ``madvise`` and
    returns what ``collapse`` does. What it needs is taken here, at once (the zygote calls
    it before READY and steps it after, between forks): the THP setting and the libc calls
    (ctypes' function pointers and array type: made here, not between forks, where the
    children forked before would lack what those after have). ``addresses`` is walked at
    the first step: the zygote passes an array of integers, unless its marking holds the
    objects anyway (no reference to them may be held after READY only for the collapse:
    alive in the children forked before it ends, freed in those after, a difference their
    code could read). Its steps then only compute on integers and call ``mincore`` and
    ``madvise``."""
    try:
        with open(THP_ENABLED) as f:
            never = "[never]" in f.read()
    except OSError:
        never = False  # not readable here: madvise says
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        libc.madvise.restype = ctypes.c_int
        libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
        libc.mincore.restype = ctypes.c_int
    except (OSError, AttributeError) as exc:
        return _refused("no madvise: %s" % exc)
    return _collapsing(addresses, never, libc, (ctypes.c_ubyte * (HUGE // 4096))())


def _refused(why: str) -> "Generator[None, None, Union[int, str]]":
    return why
    yield  # a generator


def _collapsing(addresses: "Iterable[int]", never: bool, libc: "ctypes.CDLL",
                vec: "ctypes.Array[ctypes.c_ubyte]",
                ) -> "Generator[None, None, Union[int, str]]":
    # The ranges are found at the first step (after READY): a walk of the addresses (~20 ms
    # on 3.12).
    starts = huge_ranges(addresses)
    yield
    if never:
        return "transparent huge pages are off here (%s: never)" % THP_ENABLED
    # Pages in memory of each range looked at (None: not mapped), asked of mincore once.
    resident: "Dict[int, Optional[int]]" = {}

    def in_memory(at: int) -> "Optional[int]":
        if at not in resident:
            ok = libc.mincore(at, HUGE, vec) == 0
            resident[at] = sum(b & 1 for b in vec) if ok else None
        return resident[at]

    done, why = 0, ""
    for at in spans(starts, lambda at: in_memory(at) is not None):
        # Not mapped (ENOMEM), or too sparse: left alone.
        if (in_memory(at) or 0) < MIN_RESIDENT:
            continue
        ok = libc.madvise(at, HUGE, MADV_COLLAPSE) == 0
        err = ctypes.get_errno()
        yield
        if ok:
            done += HUGE // 1024
            continue
        # EINVAL: not this kernel's (before 6.1), or not all one anonymous mapping (a
        # library's); EPERM: a seccomp profile's refusal; EAGAIN, ENOMEM: it stays small.
        why = why or "MADV_COLLAPSE: %s" % os.strerror(err)
        if err == errno.EPERM and not done:
            return "refused (%s)" % why
    if not done:
        return "nothing collapsed (%s)" % (why or "no range of 2 MiB mostly in memory")
    return done
