"""Workflow code that reads time and entropy every way a Linux process can short of the
SDK's own API (issue 16): the values it reads become an activity id, which a replay
compares, so a value that differs between a run and its replay fails the replay with the
SDK's nondeterminism error."""

import ctypes
import gc
import hashlib
import json
import os
import posix
import resource
import shutil
import socket
import time
from datetime import timedelta

from temporalio import workflow

# Evaluated where the module is imported: in the zygote that preloads it (the jailed runner).
IMPORTED = time.time_ns()
IMPORTED_MONOTONIC = time.monotonic_ns()


def facts():
    """Each probe's value, by name."""
    r, w = os.pipe()
    os.write(w, b"x")
    usage = resource.getrusage(resource.RUSAGE_SELF)
    libc = ctypes.CDLL(None)
    libc.getauxval.restype = ctypes.c_ulong
    out = {
        "time at import": IMPORTED,
        "monotonic at import": IMPORTED_MONOTONIC,
        "time.monotonic_ns()": time.monotonic_ns(),
        "time.perf_counter_ns()": time.perf_counter_ns(),
        "os.times()": list(os.times()),
        "os.getpid()": os.getpid(),
        "posix.getpid()": posix.getpid(),
        "resource.getrusage()": [usage.ru_utime, usage.ru_stime, usage.ru_maxrss,
                                 usage.ru_minflt, usage.ru_nvcsw],
        "fstat of a pipe it wrote to": os.fstat(w).st_mtime_ns,
        "fstat of its stdout": os.fstat(1).st_mtime_ns,
        "AT_RANDOM": ctypes.string_at(libc.getauxval(25), 16).hex(),
    }
    # Issue 27: a pipe's and a socket's inode number (a host-wide counter), the free space
    # others change, the collector's counts (the zygote's history).
    a, b = socket.socketpair()
    out["st_ino of a pipe and a socket pair"] = [os.fstat(r).st_ino, os.fstat(a.fileno()).st_ino,
                                                 os.fstat(b.fileno()).st_ino]
    out["shutil.disk_usage('/')"] = list(shutil.disk_usage("/"))
    out["gc.get_count()"] = list(gc.get_count())
    a.close()
    b.close()
    os.close(r)
    os.close(w)
    return out


@workflow.defn
class Probes:
    @workflow.run
    async def run(self) -> dict:
        seen = facts()
        key = hashlib.sha256(json.dumps(seen, sort_keys=True).encode()).hexdigest()[:24]
        await workflow.execute_activity("greet", "probes", activity_id="probes-" + key,
                                        start_to_close_timeout=timedelta(seconds=30))
        return seen
