"""A workflow of test_merging.py that tries to opt its own process into same-page merging:
every policy's filter refuses both calls (the opt-in is ``merge_pages=True``'s, made by the
server before the zygote's exec)."""

import ctypes

from temporalio import workflow


@workflow.defn
class OptsIn:
    """``prctl(PR_SET_MEMORY_MERGE, 1)`` and ``madvise(MADV_MERGEABLE)`` on a page of its own;
    returns what each returned (it does not get to: the task fails on the violation)."""

    @workflow.run
    async def run(self) -> str:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl.argtypes = [ctypes.c_int] + [ctypes.c_ulong] * 4
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        buf = ctypes.create_string_buffer(3 * 4096)
        page = (ctypes.addressof(buf) + 4095) & ~4095
        return "prctl %d, madvise %d" % (libc.prctl(67, 1, 0, 0, 0),
                                         libc.madvise(page, 4096, 12))
