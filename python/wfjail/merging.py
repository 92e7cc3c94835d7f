"""Opts the zygote and every session child it forks into the kernel's same-page merging (KSM),
when ``wfjail serve --merge-pages`` asks (``WFJAIL_MERGE_PAGES`` in the zygote's environment).

Most of a cached run's private pages are alike in every run of a worker (the copies its
interpreter makes of the zygote's pages: inline caches, type caches, pools). Once the host's
``ksmd`` runs (``/sys/kernel/mm/ksm/run`` = 1, a host setting only root changes), it folds
identical anonymous pages of the processes that opted in back into one, copied again on write.

``any`` (what ``--merge-pages`` asks): ``prctl(PR_SET_MEMORY_MERGE, 1)`` (Linux 6.4+), after
the preload: every mapping of the zygote is mergeable, and so is every mapping it or a child
makes later; a fork inherits it (a session child's own arenas too). No capability is needed.
The server itself is not opted in: only the zygote family is.

``heap``: ``madvise(MADV_MERGEABLE)`` on the ranges of the zygote's heap (found from its
objects' addresses, as ``wfjail.hugepages`` finds them), inherited by the children on those
mappings only; what a child maps later (its own arenas) is not merged. Used where the prctl
is refused (a kernel before 6.4), and said so, or when the policy's ``[env]`` sets
``WFJAIL_MERGE_PAGES = "heap"``.

Either way the result goes into READY (``"merging"``): the mode that took, or why none did.
The server checks it in ``/proc/PID/ksm_stat`` and says in its log whether the host merges."""

import ctypes
import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Iterable, Mapping

# The environment variable that asks for it: "any" or "heap"; unset, empty or "0": not asked.
ENV = "WFJAIL_MERGE_PAGES"
PR_SET_MEMORY_MERGE = 67  # include/uapi/linux/prctl.h (Linux 6.4)
MADV_MERGEABLE = 12  # include/uapi/asm-generic/mman-common.h


def wanted(env: "Mapping[str, str]") -> str:
    """The mode asked for ("any", "heap"), or "" when none is."""
    mode = env.get(ENV, "")
    return "" if mode in ("", "0") else mode


def opt_in(mode: str, addresses: "Iterable[int]") -> str:
    """Opts this process (and what it forks) in: ``"any"`` or ``"heap"`` (the mode that took,
    with why ``any`` did not when it fell back), or ``None`` and the reason, as
    ``"off: ..."``."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong,
                               ctypes.c_ulong]
        libc.prctl.restype = ctypes.c_int
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        libc.madvise.restype = ctypes.c_int
    except (OSError, AttributeError) as exc:
        return "off: no prctl or madvise here: %s" % exc
    why_not_any = ""
    if mode == "any":
        if libc.prctl(PR_SET_MEMORY_MERGE, 1, 0, 0, 0) == 0:
            return "any"
        err = ctypes.get_errno()
        # EINVAL: a kernel before 6.4 (or without CONFIG_KSM); EPERM: a seccomp profile.
        why_not_any = "prctl(PR_SET_MEMORY_MERGE): %s" % os.strerror(err)
    elif mode != "heap":
        return "off: %s=%r is neither \"any\" nor \"heap\"" % (ENV, mode)
    from . import hugepages
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    libc.mincore.restype = ctypes.c_int
    vec = (ctypes.c_ubyte * (hugepages.HUGE // 4096))()

    def mapped(at: int) -> bool:
        return bool(libc.mincore(at, hugepages.HUGE, vec) == 0)

    done, why = 0, ""
    for at in hugepages.spans(hugepages.huge_ranges(addresses), mapped):
        # Each 2 MiB range alone. ENOMEM: part of it is not mapped (the rest was marked).
        if libc.madvise(at, hugepages.HUGE, MADV_MERGEABLE) == 0 or ctypes.get_errno() == 12:
            done += 1
            continue
        why = why or "madvise(MADV_MERGEABLE): %s" % os.strerror(ctypes.get_errno())
    if not done:
        return "off: %s" % "; ".join(filter(None, (why_not_any, why or "no heap range mapped")))
    return "heap" + (" (%s)" % why_not_any if why_not_any else "")
