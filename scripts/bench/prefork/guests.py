"""The workload: the workflow module the zygote preloads, the exec-mode guests, the bare-fork
baseline helper and the policy, written to the scratch directory (WORK)."""

import json

from common import Unavailable, last_line

from . import WORK, clean_env, run_quiet

MODULE = "bench_prefork_wf"  # the workflow module the zygote preloads
HANDLER = MODULE + ":handle"
REQUEST = b'{"order_id": "A-1001", "items": 3}'
EXPECTED = b"Checkout:1:%d" % len(REQUEST)  # "1": every session starts from fresh state
GUEST_MIN = "bench_prefork_guest_min.py"
GUEST_TEMPORAL = "bench_prefork_guest_temporal.py"
BARE = "bench_prefork_bare.py"

WORKFLOW_SRC = '''\
"""The workflow module the zygote preloads (written by scripts/bench-prefork)."""

from datetime import timedelta

from temporalio import workflow


@workflow.defn
class Checkout:
    @workflow.run
    async def run(self, order: str) -> str:
        return await workflow.execute_activity(
            "price_order", order, start_to_close_timeout=timedelta(seconds=10))


STATE = {"executions": 0}


def handle(request: bytes) -> bytes:
    """A session's call: touch module state, return a small result."""
    STATE["executions"] += 1
    return b"%s:%d:%d" % (Checkout.__name__.encode(), STATE["executions"], len(request))
'''

GUEST_MIN_SRC = '''\
"""Exec-mode guest without the SDK: the guest library only (written by scripts/bench-prefork)."""

import wfjail.guest

STATE = {"executions": 0}


def handle(request):
    STATE["executions"] += 1
    return b"Checkout:%d:%d" % (STATE["executions"], len(request))


wfjail.guest.run(handle)
'''

GUEST_TEMPORAL_SRC = '''\
"""Exec-mode guest that imports what the zygote preloads (written by scripts/bench-prefork)."""

import temporalio  # noqa: F401
import wfjail.guest

import bench_prefork_wf

wfjail.guest.run(bench_prefork_wf.handle)
'''

# The baselines: a plain process that imports what the zygote imports (wfjail.zygote's own
# imports, the preload list, wfjail.guest and .protocol), collects and freezes the GC like it,
# then forks on command. Commands on stdin, one JSON line per answer on stdout.
BARE_SRC = '''\
"""Bare-fork baseline of scripts/bench-prefork (unconfined; same interpreter and preloads)."""

import argparse, gc, importlib, json, os, select, signal, socket, struct, sys, time  # noqa: E401,F401
import resource  # (the zygote imports it too, at its first os.wait4)

for name in filter(None, sys.argv[1].split(",")):
    importlib.import_module(name)
from wfjail import guest, protocol  # noqa: E402,F401  (as the zygote does)

handler = importlib.import_module("bench_prefork_wf").handle
gc.collect()
gc.freeze()
ns = time.perf_counter_ns
cpu = time.process_time_ns
REQ = sys.argv[2].encode()
held = []


def minflt():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def fork_exit():
    f0 = minflt()
    c0 = cpu()
    t0 = ns()
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    t1 = ns()
    c1 = cpu()
    _, status, ru = os.wait4(pid, 0)
    t2 = ns()
    return {"total": t2 - t0, "fork": t1 - t0, "parent_cpu": c1 - c0, "parent_minflt": minflt() - f0,
            "child_cpu": ru.ru_utime + ru.ru_stime, "child_minflt": ru.ru_minflt, "ok": status == 0}


def fork_request():
    f0 = minflt()
    c0 = cpu()
    t0 = ns()
    a, b = socket.socketpair()
    pid = os.fork()
    if pid == 0:
        a.close()
        os.write(b.fileno(), handler(os.read(b.fileno(), 65536)))
        os._exit(0)
    t1 = ns()
    b.close()
    a.sendall(REQ)
    reply = a.recv(65536)
    a.close()
    c1 = cpu()
    _, status, ru = os.wait4(pid, 0)
    t2 = ns()
    return {"total": t2 - t0, "fork": t1 - t0, "parent_cpu": c1 - c0, "parent_minflt": minflt() - f0,
            "child_cpu": ru.ru_utime + ru.ru_stime, "child_minflt": ru.ru_minflt,
            "ok": status == 0 and reply == sys.argv[3].encode()}


def hold(n):
    """n children that each answer one request, then wait for end-of-file (like a session
    waiting for its next call)."""
    for _ in range(n):
        a, b = socket.socketpair()
        pid = os.fork()
        if pid == 0:
            a.close()
            for s, _p in held:
                s.close()
            os.write(b.fileno(), handler(os.read(b.fileno(), 65536)))
            os.read(b.fileno(), 1)
            os._exit(0)
        b.close()
        a.sendall(REQ)
        a.recv(65536)
        held.append((a, pid))
    return {"pids": [p for _s, p in held]}


def release():
    for s, _p in held:
        s.close()
    for _s, p in held:
        os.waitpid(p, 0)
    held.clear()
    return {}


print(json.dumps({"ready": os.getpid()}), flush=True)
for line in sys.stdin:
    cmd, _, arg = line.strip().partition(" ")
    if cmd == "exit":
        out = fork_exit()
    elif cmd == "request":
        out = fork_request()
    elif cmd == "hold":
        out = hold(int(arg))
    elif cmd == "release":
        out = release()
    else:
        out = {"error": "unknown command %r" % cmd}
    print(json.dumps(out), flush=True)
release()
'''


def policy_text():
    work = json.dumps(str(WORK))
    return (
        "# Written by scripts/bench-prefork: temporal-python (the venv, read-only, as ${exe_dir}/..;\n"
        "# the working directory) plus the scratch directory, where the workflow module is.\n"
        'extends = "temporal-python"\n\n'
        "[filesystem]\n"
        f"read = [{work}]\n\n"
        "[env]\n"
        f"set = {{ PYTHONPATH = {work} }}\n"
    )


def write_scratch(venv_py):
    WORK.mkdir(parents=True, exist_ok=True)
    for name, text in ((MODULE + ".py", WORKFLOW_SRC), (GUEST_MIN, GUEST_MIN_SRC),
                       (GUEST_TEMPORAL, GUEST_TEMPORAL_SRC), (BARE, BARE_SRC),
                       ("policy.toml", policy_text())):
        path = WORK / name
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
    # Compile the module now: a confined guest cannot write its __pycache__.
    ok, out = run_quiet([venv_py, "-m", "py_compile", str(WORK / (MODULE + ".py"))], env=clean_env())
    if not ok:
        raise Unavailable(f"the workflow module does not compile: {last_line(out)}")
