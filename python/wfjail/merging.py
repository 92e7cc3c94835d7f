"""What the zygote says of its same-page merging (KSM) when ``wfjail serve --merge-pages``
asks (``WFJAIL_MERGE_PAGES`` in the zygote's environment).

Most of a cached run's private pages are alike in every run of a worker (the copies its
interpreter makes of the zygote's pages: inline caches, type caches, pools). Once the host's
``ksmd`` runs (``/sys/kernel/mm/ksm/run`` = 1, a host setting only root changes), it folds
identical anonymous pages of the processes that opted in back into one, copied again on write.

The opt-in is not the zygote's: ``wfjail serve`` calls ``prctl(PR_SET_MEMORY_MERGE, 1)``
(Linux 6.4+) in the zygote's process before its exec and before its seccomp filter, the
exec keeps it and every session child the zygote forks inherits it. The filter of every
policy refuses that call, and ``madvise(MADV_MERGEABLE)``, to the guest itself: a guest
that could opt itself in could time copy-on-write faults on merged pages against every other
opted-in process on the host. What is left here is asking the kernel
(``PR_GET_MEMORY_MERGE``, which the filter lets through) and saying it in READY
(``"merging"``): ``"any"``, or ``"off: why"``. The server checks it against
``/proc/PID/ksm_stat`` and says in its log whether the host merges."""

import ctypes
import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Mapping

# The environment variable that asks for the zygote's word: "any"; unset, empty or "0": not
# asked.
ENV = "WFJAIL_MERGE_PAGES"
PR_GET_MEMORY_MERGE = 68  # include/uapi/linux/prctl.h (Linux 6.4)


def wanted(env: "Mapping[str, str]") -> str:
    """The mode asked for ("any"), or "" when none is."""
    mode = env.get(ENV, "")
    return "" if mode in ("", "0") else mode


def status(mode: str) -> str:
    """``"any"`` when the kernel says this process is opted in as a whole, else
    ``"off: why"``."""
    if mode != "any":
        return ("off: %s=%r: only \"any\" is a mode (the server opts the zygote in; the "
                "\"heap\" mode, an madvise by the zygote, is gone)" % (ENV, mode))
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong,
                               ctypes.c_ulong]
        libc.prctl.restype = ctypes.c_int
    except (OSError, AttributeError) as exc:
        return "off: no prctl here: %s" % exc
    got = libc.prctl(PR_GET_MEMORY_MERGE, 0, 0, 0, 0)
    if got == 1:
        return "any"
    if got == 0:
        # The server's prctl before the exec took (it would have said otherwise): a kernel
        # whose exec drops the flag, or preloaded code that opted out.
        return ("off: PR_GET_MEMORY_MERGE answered 0 (a kernel whose exec drops the opt-in, "
                "before \"mm/ksm: support fork/exec for prctl\", or preloaded code opted out)")
    return "off: PR_GET_MEMORY_MERGE: %s" % os.strerror(ctypes.get_errno())
