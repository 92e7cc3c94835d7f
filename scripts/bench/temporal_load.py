"""A real worker under load (scripts/bench-temporal --sections load), run inside a venv.

``driver``: starts the dev server on loopback (stopped by its pid), then for each workload and,
in turns, each runner, a worker in a process of its own (``worker`` below: the SDK's default
concurrency, ``max_cached_workflows=1000``), and:

* samples the CPU time of the worker's whole process tree (the worker, ``wfjail serve`` and
  its threads, the zygotes, the run children; utime + stime of every live process and
  cutime + cstime of every one, so that reaped children count) before the workload and after
  its last result (and a settle time for the closes);
* starts the workload's workflows at once and times each from its start to its result;
* fetches every history and counts ``WorkflowTaskFailed`` events.

Workloads: ``greeting-N`` (N of the example's ``Greeting``: an activity and a timer each) and
``signals-N`` (N of ``Counter``, each taking 20 signals, then its ``finish`` update).

Prints one JSON line: the rows, each with per-process (and per-thread name) CPU deltas.
"""

import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import time
import uuid

HZ = os.sysconf("SC_CLK_TCK")
SIGNALS = 20
BATCH = 100  # history fetches at once


def stat(path):
    """(comm, utime + stime, cutime + cstime) in ms of a /proc stat file, or None."""
    try:
        with open(path) as f:
            raw = f.read()
    except OSError:
        return None
    comm = raw[raw.index("(") + 1:raw.rindex(")")]
    v = raw.rsplit(")", 1)[1].split()
    return (comm, (int(v[11]) + int(v[12])) * 1000 / HZ,
            (int(v[13]) + int(v[14])) * 1000 / HZ)


def kids(pid):
    out = []
    try:
        tasks = os.listdir("/proc/%d/task" % pid)
    except OSError:
        return out
    for t in tasks:
        try:
            with open("/proc/%d/task/%s/children" % (pid, t)) as f:
                out += [int(c) for c in f.read().split()]
        except OSError:
            pass
    return out


def threads(pid):
    """{thread name: utime + stime ms} summed over the live threads of pid."""
    out = {}
    try:
        tasks = os.listdir("/proc/%d/task" % pid)
    except OSError:
        return out
    for t in tasks:
        s = stat("/proc/%d/task/%s/stat" % (pid, t))
        if s:
            out[s[0]] = out.get(s[0], 0.0) + s[1]
    return out


def tree(root):
    """{pid: {depth, comm, cpu, reaped, threads}} of root and its descendants."""
    out, todo = {}, [(root, 0)]
    while todo:
        pid, depth = todo.pop()
        s = stat("/proc/%d/stat" % pid)
        if s is None:
            continue
        out[pid] = {"depth": depth, "comm": s[0], "cpu": s[1], "reaped": s[2],
                    "threads": threads(pid) if depth <= 2 else {}}
        todo += [(c, depth + 1) for c in kids(pid)]
    return out


ROLE = {0: "worker", 1: "serve", 2: "zygotes", 3: "children"}


def delta(before, after):
    """The tree's CPU between two samples, by role and by (role, thread name)."""
    roles, names = {}, {}
    total = 0.0
    for pid, a in after.items():
        b = before.get(pid, {"cpu": 0.0, "reaped": 0.0, "threads": {}})
        role = ROLE.get(a["depth"], "children")
        d_cpu, d_reaped = a["cpu"] - b["cpu"], a["reaped"] - b["reaped"]
        roles[role] = roles.get(role, 0.0) + d_cpu
        # Reaped descendants count with the role one level down (a zygote reaps the runs).
        down = ROLE.get(a["depth"] + 1, "children")
        roles[down] = roles.get(down, 0.0) + d_reaped
        total += d_cpu + d_reaped
        if a["threads"]:
            live = 0.0
            for name, v in a["threads"].items():
                d = v - b["threads"].get(name, 0.0)
                live += d
                key = "%s/%s" % (role, name)
                names[key] = names.get(key, 0.0) + d
            if d_cpu - live > 0.5:
                key = "%s/(threads that ended)" % role
                names[key] = names.get(key, 0.0) + d_cpu - live
    # A process of the first sample gone by the second: its time is in its parent's reaped.
    for pid, b in before.items():
        if pid not in after:
            role = ROLE.get(b["depth"], "children")
            roles[role] = roles.get(role, 0.0) - b["cpu"]
            total -= b["cpu"] + b["reaped"]
    return total, roles, names


# -- the worker process ---------------------------------------------------------------------

async def worker_main(runner, queue, target):
    from temporalio.client import Client
    from temporalio.worker import UnsandboxedWorkflowRunner, Worker
    from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner
    sys.path.insert(0, os.environ["EXAMPLES"])
    import workflows as W
    if runner == "jailed":
        from wfjail.temporal import JailedWorkflowRunner
        r = JailedWorkflowRunner(policy=os.environ.get("POLICY", "temporal-python"))
    elif runner == "sandboxed":
        r = SandboxedWorkflowRunner()
    else:
        r = UnsandboxedWorkflowRunner()
    client = await Client.connect(target)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    loop.add_reader(sys.stdin.fileno(), stop.set)
    async with Worker(client, task_queue=queue, workflows=[W.Greeting, W.Counter],
                      activities=[W.greet], workflow_runner=r, max_cached_workflows=1000):
        print("ready", flush=True)
        await stop.wait()
    if runner == "jailed":
        r.close()


# -- the driver -----------------------------------------------------------------------------

async def connect(target):
    from temporalio.client import Client
    for _ in range(600):
        try:
            return await Client.connect(target)
        except Exception:
            await asyncio.sleep(0.2)
    raise RuntimeError("the dev server did not answer")


async def greeting(client, q, n):
    import workflows as W

    async def one():
        t = time.perf_counter()
        h = await client.start_workflow(W.Greeting.run, "load", id="load-%s" % uuid.uuid4().hex,
                                        task_queue=q)
        await h.result()
        return h.id, (time.perf_counter() - t) * 1000
    return await asyncio.gather(*(one() for _ in range(n)))


async def signals(client, q, n):
    import workflows as W

    async def one():
        t = time.perf_counter()
        h = await client.start_workflow(W.Counter.run, id="load-%s" % uuid.uuid4().hex,
                                        task_queue=q)
        for _ in range(SIGNALS):
            await h.signal(W.Counter.add, 1)
        await h.execute_update(W.Counter.finish)
        got = await h.result()
        assert got == SIGNALS, got
        return h.id, (time.perf_counter() - t) * 1000
    return await asyncio.gather(*(one() for _ in range(n)))


async def failed_tasks(client, ids):
    from temporalio.api.enums.v1 import EventType
    bad = EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED
    count = 0
    for i in range(0, len(ids), BATCH):
        hs = await asyncio.gather(*(client.get_workflow_handle(w).fetch_history()
                                    for w in ids[i:i + BATCH]))
        count += sum(1 for h in hs for e in h.events if e.event_type == bad)
    return count


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


async def row(client, target, runner, workload, settle):
    kind, n = workload.rsplit("-", 1)
    n = int(n)
    q = "load-%s-%s" % (runner, uuid.uuid4().hex)
    env = dict(os.environ)
    w = subprocess.Popen([sys.executable, __file__, "worker", runner, q, target],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
    try:
        line = await asyncio.get_running_loop().run_in_executor(None, w.stdout.readline)
        if line.strip() != b"ready":
            raise RuntimeError("the %s worker did not start" % runner)
        # Warm-up: imports, the jailed server's zygotes, the first tasks.
        await greeting(client, q, 3)
        await asyncio.sleep(settle)
        before = tree(w.pid)
        load0 = os.getloadavg()
        t0 = time.perf_counter()
        got = await (greeting if kind == "greeting" else signals)(client, q, n)
        wall = time.perf_counter() - t0
        await asyncio.sleep(settle)  # the last closes and reaps
        after = tree(w.pid)
        total, roles, names = delta(before, after)
        ids = [i for i, _ in got]
        lat = [ms for _, ms in got]
        failed = await failed_tasks(client, ids)
        return {"runner": runner, "workload": workload, "n": n, "wall_s": wall,
                "per_s": n / wall, "p50_ms": pct(lat, 50), "p99_ms": pct(lat, 99),
                "cpu_ms_per_wf": total / n,
                "roles_ms_per_wf": {k: v / n for k, v in roles.items()},
                "threads_ms_per_wf": {k: v / n for k, v in sorted(names.items()) if v / n >= 0.05},
                "processes_after": len(after), "workflow_task_failed": failed,
                "load": [load0, os.getloadavg()]}
    finally:
        try:
            w.stdin.close()
            w.wait(30)
        except subprocess.TimeoutExpired:
            w.kill()
            w.wait()


async def driver(args):
    sys.path.insert(0, os.environ["EXAMPLES"])
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([os.path.join(os.path.dirname(sys.executable), "temporal"),
        "server", "start-dev", "--headless", "--ip", "127.0.0.1", "--port", str(port),
        "--log-level", "error"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    target = "127.0.0.1:%d" % port
    rows = []
    try:
        client = await connect(target)
        for rnd in range(args["rounds"]):
            for workload in args["workloads"]:
                for runner in args["runners"]:
                    r = await row(client, target, runner, workload, args["settle"])
                    r["round"] = rnd
                    rows.append(r)
                    print("  %s %s %s: %.1f/s, p99 %.0f ms, %.1f ms CPU/wf, %d failed" % (
                        sys.version.split()[0], workload, runner, r["per_s"], r["p99_ms"],
                        r["cpu_ms_per_wf"], r["workflow_task_failed"]),
                        file=sys.stderr, flush=True)
    finally:
        server.terminate()
        try:
            server.wait(15)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
    print(json.dumps({"python": sys.version.split()[0], "rows": rows}))


if __name__ == "__main__":
    if sys.argv[1] == "worker":
        asyncio.run(worker_main(*sys.argv[2:5]))
    else:
        asyncio.run(driver(json.loads(os.environ["ARGS"])))
