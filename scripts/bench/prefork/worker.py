"""The worker: runs under `wfjail serve` (with the venv's Python) and measures each phase
against the servers the driver started, and against the bare-fork baseline helper."""

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from common import cpu_busy_seconds, last_line

from . import WORK
from .guests import BARE, EXPECTED, REQUEST
from .measure import children_of, cmdline, descendants, meminfo, pct, proc_stat, rollup, smaps_breakdown, summary


class Target:
    """One `wfjail serve`: its socket (None: the worker's own), its pid and its zygotes."""

    def __init__(self, name, socket_path, serve_pid):
        from wfjail.client import AsyncClient, Client  # the venv's copy, kept equal to ./python

        self.name = name
        self.client = Client(socket_path)
        self.aclient = AsyncClient(socket_path)
        self.serve_pid = serve_pid
        # Every zygote started and settled (serve starts zygotes 1.. once zygote 0 has marked
        # its heap after READY, SETTLED): no cell measures a zygote's start or marking.
        while True:
            doc = self.client.status()
            if doc.get("zygotes_settled", 0) >= doc.get("zygotes", 0):
                break
            time.sleep(0.05)
        self.zygotes = [p for p in children_of(serve_pid) if "wfjail.zygote" in cmdline(p)]

    def snapshot(self):
        t = os.times()
        return {"wall": time.monotonic(), "busy": cpu_busy_seconds(), "worker": t.user + t.system,
                "serve": proc_stat(self.serve_pid), "zygotes": [proc_stat(z) for z in self.zygotes]}

    @staticmethod
    def cpu_delta(a, b, n):
        """CPU ms per execution, by process, between two snapshots, over n executions."""
        if not n:
            return None
        d = {"worker": (b["worker"] - a["worker"]) * 1000 / n}
        if a["serve"] and b["serve"]:
            d["wfjail"] = (b["serve"]["cpu"] - a["serve"]["cpu"]) * 1000 / n
            if not a["zygotes"]:  # exec mode: the guests are wfjail's children
                d["guests"] = (b["serve"]["ccpu"] - a["serve"]["ccpu"]) * 1000 / n
        zs = [(x, y) for x, y in zip(a["zygotes"], b["zygotes"]) if x and y]
        if zs:
            d["zygote"] = sum(y["cpu"] - x["cpu"] for x, y in zs) * 1000 / n
            d["children"] = sum(y["ccpu"] - x["ccpu"] for x, y in zs) * 1000 / n
            d["children_minflt"] = sum(y["cminflt"] - x["cminflt"] for x, y in zs) / n
            d["zygote_minflt"] = sum(y["minflt"] - x["minflt"] for x, y in zs) / n
        if a["busy"] is not None and b["busy"] is not None:
            d["machine"] = (b["busy"] - a["busy"]) * 1000 / n
            d["busy_pct"] = 100 * (b["busy"] - a["busy"]) / ((b["wall"] - a["wall"]) * (os.cpu_count() or 1))
        d["total"] = sum(d.get(k, 0.0) for k in ("worker", "wfjail", "guests", "zygote", "children"))
        if d.get("machine"):  # the share of all CPUs that went to other programs
            d["other_pct"] = d["busy_pct"] * max(0.0, d["machine"] - d["total"]) / d["machine"]
        return d


BARE_KINDS = ("bare-exit", "bare-request")


class Worker:
    def __init__(self, cfg):
        self.cfg = cfg
        self.targets = {}
        for name, t in cfg["targets"].items():
            self.targets[name] = Target(name, t.get("socket"), t.get("serve_pid") or os.getppid())
        self.kinds = cfg["kinds"]  # name -> {"target", "open", "expected"}
        self.failures = []  # the first few failure messages
        self.failed = 0
        self.fail_lock = threading.Lock()  # lanes fail from several threads
        self.bare = None

    def target(self, kind):
        return self.targets[self.kinds[kind]["target"]]

    def fail(self, msg):
        with self.fail_lock:
            self.failed += 1
            if len(self.failures) < 5:
                self.failures.append(msg)

    # -- one execution --------------------------------------------------------------------

    def execution(self, kind):
        """open + one call + close; returns (open, call, close, total ns, report) or None."""
        k = self.kinds[kind]
        client = self.target(kind).client
        expected = k["expected"].encode()
        t0 = time.perf_counter_ns()
        try:
            s = client.session(**k["open"]).open()
            t1 = time.perf_counter_ns()
            reply = s.call(REQUEST)
            t2 = time.perf_counter_ns()
            report = s.close()
            t3 = time.perf_counter_ns()
        except Exception as e:  # noqa: BLE001  (counted and reported, never hidden)
            self.fail(f"{kind}: {type(e).__name__}: {e}")
            return None
        if reply != expected or report is None or report.get("status") != "ok":
            self.fail(f"{kind}: reply {reply!r} (expected {expected!r}), report status "
                      f"{(report or {}).get('status')}: {(report or {}).get('error', '')} "
                      f"(report: {report!r})")
            return None
        return t1 - t0, t2 - t1, t3 - t2, t3 - t0, report

    async def aexecution(self, kind):
        """execution() through the async client (wfjail.client.AsyncClient); a session that
        fails is closed (its slot freed) before the failure is counted."""
        k = self.kinds[kind]
        client = self.target(kind).aclient
        expected = k["expected"].encode()
        s = client.session(**k["open"])
        t0 = time.perf_counter_ns()
        try:
            await s.open()
            t1 = time.perf_counter_ns()
            reply = await s.call(REQUEST)
            t2 = time.perf_counter_ns()
            report = await s.close()
            t3 = time.perf_counter_ns()
        except BaseException as e:  # noqa: BLE001  (a timeout's CancelledError too)
            try:
                await s.close()
            except BaseException:  # noqa: BLE001
                pass
            if not isinstance(e, Exception):
                raise
            self.fail(f"{kind} (async): {type(e).__name__}: {e}")
            return None
        if reply != expected or report is None or report.get("status") != "ok":
            self.fail(f"{kind} (async): reply {reply!r} (expected {expected!r}), report status "
                      f"{(report or {}).get('status')}: {(report or {}).get('error', '')} "
                      f"(report: {report!r})")
            return None
        return t1 - t0, t2 - t1, t3 - t2, t3 - t0, report

    def one(self, kind):
        """One timed sample of any kind, as a dict."""
        if kind in BARE_KINDS:
            out = self.bare_cmd("exit" if kind == "bare-exit" else "request")
            if not out.get("ok"):
                self.fail(f"{kind}: {out}")
                return None
            return out
        t = self.execution(kind)
        if t is None:
            return None
        o, c, cl, tot, report = t
        return {"open": o, "call": c, "close": cl, "total": tot, "report_ms": report.get("duration_ms"),
                "child_cpu_ms": report.get("cpu_ms"), "max_rss_kb": report.get("max_rss_kb")}

    # -- the baseline helper ----------------------------------------------------------------

    def start_bare(self):
        argv = [sys.executable, str(WORK / BARE), self.cfg["preload"], REQUEST.decode(), EXPECTED.decode()]
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "WFJAIL_SOCKET")}
        self.bare = subprocess.Popen(argv, cwd=WORK, env=env, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        hello = json.loads(self.bare.stdout.readline() or "{}")
        if "ready" not in hello:
            raise RuntimeError("the bare-fork helper did not start")

    def bare_cmd(self, cmd):
        self.bare.stdin.write(cmd + "\n")
        self.bare.stdin.flush()
        return json.loads(self.bare.stdout.readline())

    def stop_bare(self):
        if self.bare is None:
            return
        try:
            self.bare.stdin.close()
            self.bare.wait(timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            self.bare.kill()  # by its pid
            self.bare.wait()
        self.bare = None

    # -- phases -----------------------------------------------------------------------------

    def latency_phase(self):
        """Interleaved rounds per group of kinds (each kind once per round, in a random order),
        then a block of sequential executions per wfjail kind for CPU accounting."""
        out = {"samples": {}, "cpu": {}}
        rng = random.Random(self.cfg["seed"])
        for group in self.cfg["latency"]:
            kinds = group["kinds"]
            for k in kinds:
                for _ in range(group["warmup"]):
                    self.one(k)
            samples = {k: [] for k in kinds}
            for _ in range(group["rounds"]):
                for k in rng.sample(kinds, len(kinds)):
                    s = self.one(k)
                    if s is not None:
                        samples[k].append(s)
            out["samples"].update(samples)
            for k in kinds:
                if k in BARE_KINDS:
                    continue
                tgt = self.target(k)
                a = tgt.snapshot()
                done = sum(1 for _ in range(group["cpu_block"]) if self.execution(k) is not None)
                out["cpu"][k] = Target.cpu_delta(a, tgt.snapshot(), done)
        return out

    def lanes_phase(self):
        """Cells of (kind, client, lanes), each a fixed number of sessions (open + one call +
        close) run by `lanes` lanes that each take the next session until none is left: the
        sync client on one thread per lane, or the async client on one asyncio task per lane.
        Every cell (and its repeats) in one random order, so that they share the machine's
        moments."""
        cells = []
        for g in self.cfg["lanes"]:
            cells += [(k, c, n, g["sessions"]) for k in g["kinds"] for c in g["clients"] for n in g["lanes"]
                      for _ in range(g["rounds"])]
        rng = random.Random(self.cfg["seed"] + 1)
        results = {}
        for k, c, n, sessions in rng.sample(cells, len(cells)):
            cell = self.lane_cell_async if c == "async" else self.lane_cell_sync
            results.setdefault(f"{k}/{c}/{n}", []).append(cell(k, n, sessions))
        return results

    @staticmethod
    def lane_result(a, b, wall_ns, sessions, done, failed):
        """A cell's figures: done is [(open, call, close, total ns)] of the sessions that
        succeeded; latencies in ms (open + call + close, as the lane saw it)."""
        lat = sorted(d[3] / 1e6 for d in done)
        slow = max(done, key=lambda d: d[3]) if done else None
        return {"sessions": sessions, "ok": len(done), "failed": failed, "wall_s": wall_ns / 1e9,
                "per_s": len(done) / (wall_ns / 1e9) if wall_ns else None,
                "latency_ms": ({"median": pct(lat, 50), "p90": pct(lat, 90), "p99": pct(lat, 99),
                                "max": lat[-1], "min": lat[0], "n": len(lat)} if lat else None),
                "over_500ms": sum(1 for x in lat if x >= 500),
                # where they waited: the executions of ≥ 0.5 s by their longest part
                "over_500ms_by_part": {part: sum(1 for d in done if d[3] >= 500e6 and max(d[:3]) == d[i])
                                       for i, part in enumerate(("open", "call", "close"))},
                "slowest_ms": [x / 1e6 for x in slow[:3]] if slow else None,  # its open, call, close
                "latencies_ms": [round(x, 3) for x in lat],
                "cpu": Target.cpu_delta(a, b, len(done))}

    def lane_cell_sync(self, kind, lanes, sessions):
        tgt = self.target(kind)
        lock = threading.Lock()
        left = [sessions]
        done, failed = [], [0]
        go = threading.Barrier(lanes + 1)

        def lane():
            go.wait()
            while True:
                with lock:
                    if left[0] <= 0:
                        return
                    left[0] -= 1
                t = self.execution(kind)
                with lock:
                    if t is None:
                        failed[0] += 1
                    else:
                        done.append(t[:4])

        threads = [threading.Thread(target=lane, daemon=True) for _ in range(lanes)]
        for t in threads:
            t.start()
        a = tgt.snapshot()
        t0 = time.perf_counter_ns()
        go.wait()
        for t in threads:
            t.join()
        wall = time.perf_counter_ns() - t0
        return self.lane_result(a, tgt.snapshot(), wall, sessions, done, failed[0])

    def lane_cell_async(self, kind, lanes, sessions):
        import asyncio

        tgt = self.target(kind)

        async def cell():
            left = [sessions]
            done, failed = [], [0]

            async def lane():
                while left[0] > 0:
                    left[0] -= 1
                    try:
                        t = await asyncio.wait_for(self.aexecution(kind), 120)
                    except asyncio.TimeoutError:
                        self.fail(f"{kind} (async): no answer in 120 s")
                        t = None
                    if t is None:
                        failed[0] += 1
                    else:
                        done.append(t[:4])

            a = tgt.snapshot()
            t0 = time.perf_counter_ns()
            await asyncio.gather(*(lane() for _ in range(lanes)))
            wall = time.perf_counter_ns() - t0
            return self.lane_result(a, tgt.snapshot(), wall, sessions, done, failed[0])

        return asyncio.run(cell())

    def window(self, kind, clients, duration, warm):
        """Executions back to back on `clients` threads for a window of time (the profile's)."""
        tgt = self.target(kind)
        t_start = time.perf_counter_ns() + int(0.05e9)
        w0 = t_start + int(warm * 1e9)
        w1 = w0 + int(duration * 1e9)
        done = []  # (end ns, latency ns)
        lock = threading.Lock()

        def loop():
            while time.perf_counter_ns() < t_start:
                time.sleep(0.001)
            while True:
                t0 = time.perf_counter_ns()
                if t0 >= w1:
                    return
                ok = self.execution(kind) is not None
                t1 = time.perf_counter_ns()
                if ok:
                    with lock:
                        done.append((t1, t1 - t0))

        threads = [threading.Thread(target=loop, daemon=True) for _ in range(clients)]
        for t in threads:
            t.start()
        time.sleep(max(0.0, (w0 - time.perf_counter_ns()) / 1e9))
        a = tgt.snapshot()
        time.sleep(max(0.0, (w1 - time.perf_counter_ns()) / 1e9))
        b = tgt.snapshot()
        for t in threads:
            t.join()
        inside = [lat for end, lat in done if w0 <= end <= w1]
        return {"executions": len(inside), "per_s": len(inside) / duration,
                "latency_ms": summary(inside, 1e-6), "cpu": Target.cpu_delta(a, b, len(inside))}

    def perf_phase(self):
        """With --perf: a CPU profile of the whole machine during one throughput window, and a
        trace of sequential executions (syscalls of our processes, forks) for the critical path."""
        cfg = self.cfg["perf"]
        kind, tgt = cfg["kind"], self.target(cfg["kind"])
        out = {"pids": {"worker": os.getpid(), "serve": tgt.serve_pid, "zygotes": tgt.zygotes,
                        "bare": self.bare.pid if self.bare else None}}
        data = WORK / "perf-profile.data"
        p = subprocess.Popen([cfg["perf"], "record", "-a", "-g", "-q", "-o", str(data), "--", "sleep",
                              str(cfg["duration"] + 1.0)], stdin=subprocess.DEVNULL,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        time.sleep(0.5)
        w = self.window(kind, cfg["clients"], cfg["duration"], 0.1)
        err = p.communicate(timeout=120)[1]
        out["profile"] = {"data": str(data), "exit": p.returncode, "error": last_line(err), "window": w,
                          "clients": cfg["clients"]}
        data = WORK / "perf-trace.data"
        comms = ["python", "session", "wfjail"] + [f"zygote{i}-{t}" for i in range(len(tgt.zygotes))
                                                   for t in ("ctl", "notify")]
        flt = " || ".join(f'comm == "{c}"' for c in comms)
        argv = [cfg["perf"], "record", "-q", "-a", "-k", "mono", "-o", str(data),
                "-e", "raw_syscalls:sys_enter", "--filter", flt, "-e", "raw_syscalls:sys_exit", "--filter", flt,
                "-e", "sched:sched_process_fork", "-e", "sched:sched_wakeup_new", "-e", "sched:sched_switch",
                "--", "sleep", str(int(cfg["executions"] * 0.05) + 20)]
        p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True)
        time.sleep(0.5)
        marks = []
        if p.poll() is None:
            for _ in range(cfg["executions"]):
                t0 = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
                t = self.execution(kind)
                if t is not None:
                    o, c, cl, tot, _r = t
                    marks.append((t0, t0 + o, t0 + o + c, t0 + tot))
            p.send_signal(signal.SIGINT)  # perf record writes its file and exits
        try:
            err = p.communicate(timeout=120)[1]
        except subprocess.TimeoutExpired:
            p.kill()
            err = p.communicate()[1]
        out["trace"] = {"data": str(data), "exit": p.returncode, "error": last_line(err), "marks": marks,
                        "comms": comms}
        return out

    def memory_phase(self):
        out = {}
        for kind, n in self.cfg["memory"].items():
            out[kind] = self.hold_bare(n) if kind in BARE_KINDS else self.hold_sessions(kind, n)
        return out

    def hold_sessions(self, kind, n):
        tgt = self.target(kind)
        res = {}
        before_pids = set(descendants(tgt.serve_pid))
        serve0 = rollup(tgt.serve_pid)
        avail0 = meminfo("MemAvailable")
        sessions = []
        t0 = time.monotonic()
        expected = self.kinds[kind]["expected"].encode()
        try:
            for _ in range(n):
                try:
                    s = tgt.client.session(**self.kinds[kind]["open"]).open()
                    sessions.append(s)
                    if s.call(REQUEST) != expected:
                        self.fail(f"{kind}: wrong reply while holding sessions")
                except Exception as e:  # noqa: BLE001
                    self.fail(f"{kind}: holding {len(sessions)} sessions: {type(e).__name__}: {e}")
                    break
            res["open_s"] = time.monotonic() - t0
            time.sleep(0.2)  # let wfjail's threads settle
            avail1 = meminfo("MemAvailable")
            serve1 = rollup(tgt.serve_pid)
            if tgt.zygotes:
                pids = [c for z in tgt.zygotes for c in children_of(z, missing_ok=True)]
            else:
                name = self.kinds[kind]["open"]["argv"][-1]
                pids = [p for p in set(descendants(tgt.serve_pid)) - before_pids if name in cmdline(p)]
            res.update(self.memory_of(pids, len(sessions)))
            res["zygotes"] = [rollup(z) for z in tgt.zygotes]
            if avail0 and avail1 and sessions:
                res["memavailable_drop_kib"] = (avail0 - avail1) / len(sessions)  # raw only: noisy
            if "error" not in serve0 and "error" not in serve1 and sessions:
                res["wfjail_private_kib"] = (serve1["USS"] - serve0["USS"]) / len(sessions)
                res["wfjail_threads"] = len(os.listdir(f"/proc/{tgt.serve_pid}/task"))
        finally:
            t1 = time.monotonic()
            for s in sessions:
                try:
                    s.close()
                except Exception as e:  # noqa: BLE001
                    self.fail(f"{kind}: closing a held session: {type(e).__name__}: {e}")
            res["close_s"] = time.monotonic() - t1
        return res

    def memory_of(self, pids, sessions):
        rolls = {p: rollup(p) for p in pids}
        good = {p: r for p, r in rolls.items() if "error" not in r}
        res = {"sessions": sessions, "processes": len(pids), "readable": len(good)}
        if not good:
            res["error"] = next((r["error"] for r in rolls.values()), "no session processes found")
            return res
        for key in ("USS", "Pss", "Rss", "Private_Dirty", "Private_Clean", "Pss_Anon", "Pss_File", "VmPTE"):
            res[key] = summary([r.get(key, 0) for r in good.values()])
        med = sorted(good, key=lambda p: good[p]["USS"])[len(good) // 2]
        res["median_child_breakdown"] = smaps_breakdown(med)
        return res

    def hold_bare(self, n):
        avail0 = meminfo("MemAvailable")
        out = self.bare_cmd(f"hold {n}")
        time.sleep(0.2)
        avail1 = meminfo("MemAvailable")
        res = self.memory_of(out["pids"], len(out["pids"]))
        res["helper"] = rollup(self.bare.pid)
        if avail0 and avail1 and out["pids"]:
            res["memavailable_drop_kib"] = (avail0 - avail1) / len(out["pids"])
        self.bare_cmd("release")
        return res


def worker_main(cfg_path):
    import socket

    # A session that never answers becomes a counted failure, not a benchmark that hangs.
    socket.setdefaulttimeout(120)
    cfg = json.loads(Path(cfg_path).read_text())
    w = Worker(cfg)
    result = {"targets": {n: {"serve_pid": t.serve_pid, "zygotes": t.zygotes} for n, t in w.targets.items()},
              "python": sys.version.split()[0]}
    try:
        w.start_bare()
        for k in w.kinds:  # warm up: the first sessions load what the zygote did not
            for _ in range(cfg["warmup"].get(k, 0)):
                w.one(k)
        for phase in cfg["phases"]:
            t0 = time.monotonic()
            result[phase] = getattr(w, phase + "_phase")()
            result[phase + "_s"] = time.monotonic() - t0
    finally:
        w.stop_bare()
        result["failed"] = w.failed
        result["failures"] = w.failures
        Path(cfg["out"]).write_text(json.dumps(result) + "\n")
    return 0


def idle_main(ready_path):
    """The worker of a side server: say so, then wait until the driver closes our stdin."""
    Path(ready_path).write_text(json.dumps({"serve_pid": os.getppid(), "socket": os.environ.get("WFJAIL_SOCKET")}))
    sys.stdin.read()
    return 0
