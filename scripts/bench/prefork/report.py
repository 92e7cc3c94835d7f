"""The report: tables on stdout, the markdown region of docs/benchmarks.md, and the
targets a run is checked against."""

import statistics

import common

from .guests import GUEST_MIN, GUEST_TEMPORAL, MODULE
from .measure import pct, summary
from .perf import CATEGORIES
from .worker import BARE_KINDS

BEGIN = "<!-- bench-prefork:begin -->"
END = "<!-- bench-prefork:end -->"
# Issue 8's targets: latency against a bare fork that answers one request (the same minimal
# work as a session), executions per second on 2 cores, private memory per live session.
TARGETS = {"ratio": 1.2, "throughput": 1000.0, "uss_kib": 2048.0}
# Issue 28's: at 8 lanes, sessions per second and the slowest session against the median one.
LANES_TARGET = {"lanes": 8, "per_s": 800.0, "max_over_median": 5.0}
CLIENTS = ("sync", "async")
CLIENT_LABELS = {"sync": "sync, a thread per lane", "async": "async, a task per lane"}



def f2(x, nd=2):
    return "–" if x is None else f"{x:.{nd}f}"


def med(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


LABELS = {"bare-exit": "bare fork: fork + _exit + waitpid",
          "bare-request": "bare fork + one request over a socketpair",
          "exec-min": "wfjail exec session, minimal guest",
          "exec-temporalio": "wfjail exec session, guest imports temporalio"}


def label(kind):
    if kind.startswith("zygote-"):
        return f"wfjail zygote session, --zygotes {kind.split('-')[1]}"
    return LABELS.get(kind, kind)


class Report:
    def __init__(self, result, meta, args):
        self.r = result or {}
        self.meta = meta
        self.args = args
        self.zk = [f"zygote-{n}" for n in meta["zygote_counts"]]
        self.ek = [] if args.no_exec else ["exec-min", "exec-temporalio"]
        self.lanes = meta["lanes"]

    # -- the numbers ------------------------------------------------------------------------

    def samples(self, kind):
        return ((self.r.get("latency") or {}).get("samples") or {}).get(kind) or []

    def lat(self, kind, part="total"):
        s = self.samples(kind)
        return summary([x[part] for x in s], 1e-6) if s else None

    def raw(self, kind, key):
        return [x.get(key) for x in self.samples(kind)]

    def cpu1(self, kind):
        return ((self.r.get("latency") or {}).get("cpu") or {}).get(kind) or {}

    def cell(self, kind, client, lanes):
        """A lanes cell: its repeats merged (their sessions and wall times summed, their
        latencies pooled; per_s_range over the repeats)."""
        reps = (self.r.get("lanes") or {}).get(f"{kind}/{client}/{lanes}") or []
        if not reps:
            return None
        lat = sorted(x for r in reps for x in r.get("latencies_ms") or [])
        ok, wall = sum(r["ok"] for r in reps), sum(r["wall_s"] for r in reps)
        mid = sorted(reps, key=lambda r: r.get("per_s") or 0)[len(reps) // 2]
        return {"sessions": sum(r["sessions"] for r in reps), "ok": ok,
                "failed": sum(r["failed"] for r in reps), "per_s": ok / wall if wall else None,
                "per_s_range": (min(r["per_s"] or 0 for r in reps), max(r["per_s"] or 0 for r in reps)),
                "repeats": len(reps), "over_500ms": sum(r.get("over_500ms", 0) for r in reps),
                "over_500ms_by_part": ({p: sum((r.get("over_500ms_by_part") or {}).get(p, 0) for r in reps)
                                        for p in ("open", "call", "close")}
                                       if all("over_500ms_by_part" in r for r in reps) else None),
                "latency": ({"median": pct(lat, 50), "p99": pct(lat, 99), "max": lat[-1]} if lat else None),
                "slowest_ms": max((r for r in reps if r.get("slowest_ms")),
                                  key=lambda r: sum(r["slowest_ms"]), default={}).get("slowest_ms"),
                "cpu": mid.get("cpu")}

    def lane_cells(self, kinds=None):
        """(kind, client, lanes, cell) of every measured cell, in the tables' order."""
        out = []
        for kind in kinds if kinds is not None else self.zk + self.ek:
            for client in CLIENTS:
                for n in self.lanes:
                    c = self.cell(kind, client, n)
                    if c:
                        out.append((kind, client, n, c))
        return out

    def mem(self, kind):
        return (self.r.get("memory") or {}).get(kind)

    def bare_cpu(self):
        """CPU ms of one bare fork + request: the parent's (fork, socketpair, exchange) and the child's."""
        pc, cc = med(self.raw("bare-request", "parent_cpu")), med(self.raw("bare-request", "child_cpu"))
        return pc / 1e6 + cc * 1000 if pc is not None and cc is not None else None

    def verdicts(self):
        out = []
        bare = self.lat("bare-request")
        z = self.lat(self.zk[0])
        if bare and z:
            ratio = z["median"] / bare["median"]
            out.append((f"per-execution latency (open + call + close, 1 client) ≤ {TARGETS['ratio']} × bare fork + request",
                        f"{ratio:.2f} × ({z['median']:.2f} ms against {bare['median']:.2f} ms, "
                        f"`--zygotes {self.zk[0].split('-')[1]}`)", ratio <= TARGETS["ratio"]))
        n8 = LANES_TARGET["lanes"]
        for k, client, n, c in self.lane_cells(self.zk):
            if n != n8 or not c["latency"]:
                continue
            ratio = c["latency"]["max"] / c["latency"]["median"]
            out.append((f"≥ {LANES_TARGET['per_s']:.0f} sessions/s at {n8} lanes with max ≤ "
                        f"{LANES_TARGET['max_over_median']:g} × median, none failed (`--zygotes "
                        f"{k.split('-')[1]}`, {client} client)",
                        f"{c['per_s']:.0f}/s, max {c['latency']['max']:.1f} ms = {ratio:.1f} × median "
                        f"{c['latency']['median']:.1f} ms, {c['failed']} failed",
                        c["per_s"] >= LANES_TARGET["per_s"] and ratio <= LANES_TARGET["max_over_median"]
                        and not c["failed"]))
        cells = self.lane_cells(self.zk)
        if cells:
            k, client, n, c = max(cells, key=lambda x: x[3]["per_s"] or 0)
            ncpu = self.meta["machine"]["nproc"]
            out.append((f"≥ {TARGETS['throughput']:.0f} executions/s on 2 cores (this machine: {ncpu} CPUs)",
                        f"{c['per_s']:.0f}/s (best cell: `--zygotes {k.split('-')[1]}`, {client} client, "
                        f"{n} lane{'s' if n != 1 else ''})",
                        c["per_s"] >= TARGETS["throughput"]))
        m = self.mem(self.zk[0])
        if m and m.get("USS"):
            uss = m["USS"]["median"]
            out.append((f"≤ 2 MiB private memory (USS) per live session, {m['sessions']} open",
                        f"{uss / 1024:.2f} MiB median ({uss:.0f} KiB; mean {m['USS']['mean']:.0f} KiB)",
                        uss <= TARGETS["uss_kib"]))
        return out

    def problems(self):
        out = []
        if self.meta.get("error"):
            out.append(self.meta["error"])
        for name, m in self.meta.get("servers", {}).items():
            if m["exit"] != 0:
                out.append(f"wfjail serve `{name}` exited {m['exit']} (log: target/bench/prefork/{name}-serve.log)")
        if self.r.get("failed"):
            out.append(f"{self.r['failed']} execution(s) failed, e.g. " + "; ".join(
                f"`{x}`" for x in self.r.get("failures", [])[:3]))
        if self.meta.get("survivors"):
            out.append(f"{len(self.meta['survivors'])} process(es) outlived wfjail serve and were killed: "
                       + "; ".join(f"`{c[:100]}`" for c in self.meta["survivors"][:3]))
        return out

    # -- text ---------------------------------------------------------------------------------

    def text(self):
        L = [f"PROBLEM: {p}" for p in self.problems()]
        if self.r.get("latency"):
            L.append("latency, concurrency 1 (ms): median p10 p90")
        for kind in ["bare-exit", "bare-request", *self.zk, *self.ek]:
            s = self.lat(kind)
            if s:
                L.append(f"  {label(kind):<46} {s['median']:7.2f} {s['p10']:7.2f} {s['p90']:7.2f}")
        cells = self.lane_cells()
        if cells:
            L.append("lanes: sessions/s (wall), latency per session median / p99 / max (ms), failed")
            for kind, client, n, c in cells:
                lat = c["latency"] or {}
                L.append(f"  {label(kind):<46} {client:<5} {n:>3} lane{'s' if n != 1 else ' '} "
                         f"{c['per_s'] or 0:7.0f}/s  {f2(lat.get('median')):>8} {f2(lat.get('p99')):>8} "
                         f"{f2(lat.get('max')):>8}  failed {c['failed']} of {c['sessions']}")
        if self.r.get("memory"):
            L.append("memory per live session (KiB): USS median / mean, PSS median / mean")
        for kind in [*self.zk, "bare-request", *self.ek]:
            m = self.mem(kind)
            if m and m.get("USS"):
                L.append(f"  {label(kind):<46} {m['USS']['median']:7.0f} {m['USS']['mean']:7.0f} "
                         f"{m['Pss']['median']:7.0f} {m['Pss']['mean']:7.0f}  ({m['readable']} of {m['sessions']})")
            elif m:
                L.append(f"  {label(kind):<46} not measured: {m.get('error')}")
        L.append("targets")
        for what, got, ok in self.verdicts():
            L.append(f"  {'met   ' if ok else 'MISSED'} {what}: {got}")
        return "\n".join(L)

    # -- markdown -----------------------------------------------------------------------------

    def markdown(self):
        meta, m = self.meta, self.meta["machine"]
        L = [
            BEGIN,
            "<!-- Written by scripts/bench-prefork: everything between these two markers is replaced on each run. -->",
            "",
            "## Prefork: `wfjail serve --zygote` sessions against a bare fork",
            "",
            f"Produced by `{meta['command']}` on {meta['date']}; the run took {meta['duration']}.",
            "",
            "| machine | |",
            "|---|---|",
            f"| CPUs (nproc) | {m['nproc']} |",
            f"| CPU model | {m['model']} |",
            f"| memory | {m['memory_gib']:.1f} GiB |",
            f"| kernel | {m['kernel']} |",
            f"| system | {m['distro']} |",
            f"| load average (1 min) | {meta['load_start']} at the start, {meta['load_end']} at the end"
            + (f"; all CPUs {meta['busy_pct']:.0f} % busy over the run, the benchmark included"
               if meta.get("busy_pct") is not None else "") + " |",
            f"| wfjail | {meta['wfjail']} |",
            f"| interpreter | Python {meta['venv']['python']} (a venv of `/usr/bin/python3`), temporalio "
            f"{meta['venv']['temporalio']}, the `wfjail` package from `./python` |",
            "",
        ]
        L += self.md_method()
        L += self.md_targets()
        L += self.md_latency()
        L += self.md_lanes()
        L += self.md_memory()
        L += self.md_where()
        L += self.md_perf()
        probs = self.problems()
        if probs:
            L += ["### Problems in this run", ""] + [f"- {p}" for p in probs] + [""]
        L += [END]
        return "\n".join(L) + "\n"

    def md_method(self):
        a, meta = self.args, self.meta
        servers = meta.get("servers", {})
        cmds = [f"    {servers[n]['command']}" for n in servers]
        z0 = self.zk[0].split("-")[1]
        return [
            "### Method",
            "",
            "One **execution** is what a worker does per workflow task: open a session, make one call and "
            "close it, timed by `wfjail.client.Client` in the worker (`with client.session(handler=...) as s: "
            "s.call(request)`; its report must say `ok`). The zygote preloads `temporalio` and a workflow "
            f"module (`{MODULE}`, written to `target/bench/prefork/`: a `@workflow.defn` class and a "
            "handler that increments a module-level counter and returns a small result; every "
            "session must answer `Checkout:1:…`, i.e. start from fresh state). The servers, all running "
            f"for the whole benchmark (VENV is the virtualenv, WORKER this script; the `--zygotes {z0}` one "
            "runs the worker, which reaches the others by their `--socket`s, so that their measurements "
            "interleave):",
            "",
            *cmds,
            "",
            "with this policy (`policy.toml`; `temporal-python` grants the venv as `${exe_dir}/..` and the "
            "working directory, which is the scratch directory):",
            "",
            "```toml",
            meta["policy"].rstrip("\n"),
            "```",
            "",
            "* **Bare fork** is the simplest baseline: a plain, unconfined process with the same "
            "interpreter that imported what the zygote imports (`wfjail.zygote`'s own modules, "
            f"`{meta['preload']}`, `wfjail.guest`), ran `gc.collect()` and `gc.freeze()`, and times "
            "`os.fork()` + child `os._exit(0)` + `os.wait4()`. **Bare fork + request** is fairer: the child "
            "answers one request over a `socketpair` (with the same handler) before it exits, and the time "
            "includes making the socketpair; it is the baseline issue 8 names, and the targets' ratio uses it. "
            "The baselines run in a "
            "helper process the worker started.",
            f"* **Latency**: {a.rounds} rounds at concurrency 1; each round runs every zygote-mode "
            "configuration and both baselines once, in a random order (seed "
            f"{meta['seed']}), so that they share the machine's moments; exec mode has its own "
            f"{a.exec_rounds} rounds. Warm-up executions come first. CPU time per execution comes from a "
            "separate block of sequential executions per configuration (`/proc/PID/stat`: the worker, "
            "`wfjail serve` with all its threads, the zygotes and their reaped children, in 10 ms ticks).",
            f"* **Lanes** (throughput): a cell is {a.lane_sessions} executions (exec mode: "
            f"{a.exec_lane_sessions}) run by N lanes at once, N in {', '.join(map(str, self.lanes))} "
            "(exec mode: up to 8); a lane starts the next execution when its last one closed, until the "
            "cell's are all started. Each cell runs once with the sync client (`Client`, one thread per "
            "lane) and once with the async one (`AsyncClient`, one asyncio task per lane, in one event "
            "loop; exec mode: the sync client only)"
            + (f", {a.lane_rounds} times each" if a.lane_rounds > 1 else "")
            + "; all cells in one random order. *sessions/s* is the executions that succeeded over the "
            "cell's wall time (first start to last close); the latency of an execution is its open + call "
            "+ close as its lane saw it.",
            f"* **Memory**: {a.sessions} sessions opened one after the other (one call each) and held open; "
            "then `/proc/PID/smaps_rollup` of every session child (the zygote's children): **USS** = "
            "`Private_Clean + Private_Dirty`, **PSS** = `Pss`; page tables (`VmPTE` of `/proc/PID/status`) "
            "are in neither; and the growth of `wfjail serve`'s own USS, per session. The same for as many "
            "bare-fork children, each of which answered one request and waits on its socket.",
            f"* **Exec mode**: `wfjail serve` without `--zygote`; each session execs `VENV/bin/python GUEST` "
            f"under the same policy: `{GUEST_MIN}` (the guest library only) or `{GUEST_TEMPORAL}` (imports "
            f"`temporalio` and the workflow module, like the zygote); {a.exec_sessions} sessions held for "
            "memory.",
            "",
        ]

    def md_targets(self):
        L = ["### Targets", "", "| target | measured | |", "|---|---|---|"]
        for what, got, ok in self.verdicts():
            L.append(f"| {what} | {got} | {'met' if ok else '**missed**'} |")
        return L + [""]

    def md_latency(self):
        bare, fair = self.lat("bare-exit"), self.lat("bare-request")
        L = ["### Latency of one execution, concurrency 1", "",
             "| | median ms | p10 ms | p90 ms | × bare fork | × bare fork + request |",
             "|---|---:|---:|---:|---:|---:|"]
        for kind in ["bare-exit", "bare-request", *self.zk, *self.ek]:
            s = self.lat(kind)
            if not s:
                L.append(f"| {label(kind)} | not measured | | | | |")
                continue
            r1 = f"{s['median'] / bare['median']:.2f}" if bare else "–"
            r2 = f"{s['median'] / fair['median']:.2f}" if fair else "–"
            b = "**" if kind.startswith("zygote") else ""
            L.append(f"| {b}{label(kind)}{b} | {b}{s['median']:.2f}{b} | {s['p10']:.2f} | {s['p90']:.2f} | "
                     f"{b}{r1}{b} | {r2} |")
        L += ["", "Where an execution's time goes as the worker sees it (medians, ms): **open** = connect, "
              "`OPEN`, the zygote's fork (or the exec), the guest's start-up until its `HELLO` reaches the "
              "worker as `OPENED`; **call** = `CALL` to `RESULT`; **close** = `CLOSE` to `CLOSED` (the guest "
              "exits on end-of-file; wfjail answers once the zygote has reaped it). For the bare fork: "
              "`fork()` returning in the parent, then the rest until `wait4` returns. Child: its user + "
              "system CPU time (a session's report `cpu_ms`, from the zygote's `wait4`; the bare child's "
              "from `wait4`) and its minor page faults (wfjail's: the zygotes' `cminflt` over the CPU block, "
              "per session). Parent: the zygotes' own CPU time and minor faults per session (the fork, the "
              "control loop, the copy-on-write faults they take after each fork); the bare parent's around "
              "`fork()` (with a request: and the socketpair and the exchange), without `wait4`.", "",
              "| | open / fork() | call | close / rest | total | child CPU ms | child minor faults | parent CPU ms | parent minor faults |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for kind in BARE_KINDS:
            s, fork = self.lat(kind), self.lat(kind, "fork")
            if not s:
                continue
            cc = med(self.raw(kind, "child_cpu"))
            pc = med(self.raw(kind, "parent_cpu"))
            L.append(f"| {label(kind)} | {fork['median']:.2f} | | {s['median'] - fork['median']:.2f} | "
                     f"{s['median']:.2f} | {f2(cc * 1000 if cc is not None else None)} | "
                     f"{f2(med(self.raw(kind, 'child_minflt')), 0)} | {f2(pc / 1e6 if pc is not None else None)} | "
                     f"{f2(med(self.raw(kind, 'parent_minflt')), 0)} |")
        for kind in self.zk + self.ek:
            z = {p: self.lat(kind, p) for p in ("open", "call", "close", "total")}
            if not z["total"]:
                continue
            cpu = self.cpu1(kind)
            L.append(f"| {label(kind)} | {z['open']['median']:.2f} | {z['call']['median']:.2f} | "
                     f"{z['close']['median']:.2f} | {z['total']['median']:.2f} | "
                     f"{f2(med(self.raw(kind, 'child_cpu_ms')))} | {f2(cpu.get('children_minflt'), 0)} | "
                     f"{f2(cpu.get('zygote'))} | {f2(cpu.get('zygote_minflt'), 0)} |")
        rows = [(k, self.cpu1(k)) for k in self.zk + self.ek if self.cpu1(k)]
        if rows:
            L += ["", "CPU time per execution at concurrency 1, by process (ms):", "",
                  "| | worker (client) | wfjail serve | zygote | session children | exec'd guests | all | machine busy |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|"]
            for k, d in rows:
                L.append(f"| {label(k)} | {f2(d.get('worker'))} | {f2(d.get('wfjail'))} | {f2(d.get('zygote'))} | "
                         f"{f2(d.get('children'))} | {f2(d.get('guests'))} | {f2(d.get('total'))} | "
                         f"{f2(d.get('machine'))} |")
            L += ["", "*machine busy*: all the CPU time the machine spent, per execution (`/proc/stat`), other "
                  "programs and kernel threads included."]
        return L + [""]

    def md_lanes(self):
        cells = self.lane_cells()
        if not cells:
            return []
        L = ["### Throughput by lanes", "",
             "Executions (open + one call + close) per second of wall time, and the latency of one "
             "execution (ms) over the cell's executions; *≥ 0.5 s*: how many took that long or longer (in "
             "parentheses: of those, how many spent longest in the open / the call / the close); "
             "*slowest*: that execution's open / call / close (ms); *other programs*: the share of all "
             "CPUs busy during the cell beyond the benchmark's own processes (`/proc/stat`), the load "
             "other programs put on the machine meanwhile.", "",
             "| | client | lanes | sessions | sessions/s | median | p99 | max | max ÷ median | ≥ 0.5 s "
             "| failed | slowest | other programs |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|"]
        for kind, client, n, c in cells:
            lat = c["latency"] or {}
            b = "**" if kind.startswith("zygote") else ""
            rate = f"{b}{c['per_s']:.0f}{b}" if c["per_s"] and c["per_s"] >= 10 else f2(c["per_s"], 1)
            if c["repeats"] > 1:
                rate += f" ({c['per_s_range'][0]:.0f}–{c['per_s_range'][1]:.0f})"
            ratio = lat["max"] / lat["median"] if lat else None
            slow = " / ".join(f"{x:.1f}" for x in c["slowest_ms"]) if c.get("slowest_ms") else "–"
            parts = c["over_500ms_by_part"]
            over = (f"{c['over_500ms']} ({parts['open']} / {parts['call']} / {parts['close']})"
                    if c["over_500ms"] and parts else str(c["over_500ms"]))
            L.append(f"| {label(kind)} | {client} | {n} | {c['sessions']} | {rate} | {f2(lat.get('median'))} | "
                     f"{f2(lat.get('p99'))} | {f2(lat.get('max'))} | {f2(ratio, 1)} | {over} | "
                     f"{c['failed']} | {slow} | {f2((c.get('cpu') or {}).get('other_pct'), 0)} % |")
        n8 = LANES_TARGET["lanes"] if LANES_TARGET["lanes"] in self.lanes else max(self.lanes)
        L += ["", f"CPU time per execution at {n8} lanes, by process (ms), and how busy the machine was:", "",
              "| | client | worker (client) | wfjail serve | zygotes | session children / exec'd guests | all | machine busy | other programs | ceiling |",
              "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        ncpu = self.meta["machine"]["nproc"] or 1
        for kind, client, n, c in cells:
            d = c.get("cpu")
            if n != n8 or not d:
                continue
            kids = d.get("children") if "children" in d else d.get("guests")
            ceiling = 1000 * ncpu / d["total"] if d.get("total") else None
            L.append(f"| {label(kind)} | {client} | {f2(d.get('worker'))} | {f2(d.get('wfjail'))} | "
                     f"{f2(d.get('zygote'))} | {f2(kids)} | {f2(d.get('total'))} | "
                     f"{f2(d.get('busy_pct'), 0)} % | {f2(d.get('other_pct'), 0)} % | {f2(ceiling, 0)}/s |")
        L += ["", "*machine busy*: the share of all CPUs busy during the cell (`/proc/stat`, other programs "
              "included); *other programs*: the part of it not spent by the benchmark's processes (kernel "
              "threads freeing what the sessions left behind count here too). *ceiling*: the CPUs divided by *all* (the CPU time of the worker, wfjail serve, the "
              "zygotes and the guests per execution), the rate at which this work alone would keep every "
              "CPU busy.", ""]
        return L

    def md_memory(self):
        L = ["### Memory per live session", "",
             "| processes (all open at once) | USS median KiB | USS mean KiB | PSS median KiB | PSS mean KiB | "
             "RSS median KiB | page tables median KiB | wfjail serve's USS growth per session KiB |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
        parents = []
        for kind in [*self.zk, "bare-request", *self.ek]:
            m = self.mem(kind)
            if not m:
                continue
            who = ({"bare-request": "bare-fork children", "exec-min": "exec-mode guests, minimal",
                    "exec-temporalio": "exec-mode guests, importing temporalio"}.get(kind)
                   or f"zygote session children, --zygotes {kind.split('-')[1]}")
            n = f"{who} ({m.get('readable', 0)} of {m.get('sessions', 0)})"
            if not m.get("USS"):
                L.append(f"| {n} | not measured: {m.get('error', '?')} | | | | | | |")
                continue
            b = "**" if kind.startswith("zygote") else ""
            L.append(f"| {n} | {b}{m['USS']['median']:.0f}{b} | {m['USS']['mean']:.0f} | {m['Pss']['median']:.0f} | "
                     f"{m['Pss']['mean']:.0f} | {m['Rss']['median']:.0f} | {m['VmPTE']['median']:.0f} | "
                     f"{f2(m.get('wfjail_private_kib'), 0)} |")
            for i, z in enumerate(m.get("zygotes") or []):
                if "error" not in z:
                    parents.append((f"zygote #{i} of `--zygotes {kind.split('-')[1]}`", z))
            if m.get("helper") and "error" not in m["helper"]:
                parents.append(("the bare-fork parent", m["helper"]))
        if parents:
            L += ["", "The parents, with those children alive (KiB):", "",
                  "| | RSS | PSS | USS | page tables |", "|---|---:|---:|---:|---:|"]
            for who, z in parents:
                L.append(f"| {who} | {z.get('Rss', 0)} | {z.get('Pss', 0)} | {z.get('USS', 0)} | {z.get('VmPTE', 0)} |")
        rows = [(label(k) if k != "bare-request" else "bare-fork child", (self.mem(k) or {}).get("median_child_breakdown"))
                for k in (self.zk[0], "bare-request")]
        rows = [(who, b) for who, b in rows if b]
        if rows:
            names = set()
            for _w, b in rows:
                names |= {k for k, _v in sorted(b.items(), key=lambda kv: -kv[1])[:6]}
            names = sorted(names, key=lambda k: -max(b.get(k, 0) for _w, b in rows))
            L += ["", "Private memory of the median child by mapping (KiB; `/proc/PID/smaps`, "
                  "`Private_Clean + Private_Dirty`; `[anon]` is the anonymous mappings: Python's object "
                  "arenas, and malloc's beyond `[heap]`; `python3.11` is the interpreter's data and BSS):", "",
                  "| mapping | " + " | ".join(w for w, _b in rows) + " |", "|---|" + "---:|" * len(rows)]
            for k in names:
                L.append(f"| `{k}` | " + " | ".join(str(b.get(k, 0)) for _w, b in rows) + " |")
            L.append("| **all** | " + " | ".join(str(sum(b.values())) for _w, b in rows) + " |")
        return L + [""]

    def md_perf(self):
        pr = self.r.get("perf")
        if not pr:
            return []
        L = ["### Where the CPU time and the latency go (`--perf`)", ""]
        prof = pr.get("profile_by_role") or {}
        if prof.get("error"):
            L += [f"Profile: not available ({prof['error']}).", ""]
        elif prof:
            per = prof.get("machine_ms_per_execution")
            roles = ["session children", "zygote", "wfjail serve", "worker (client)", "other programs"]
            roles += [r for r in prof["pct"] if r not in roles]
            L += [f"`perf record -a -g` over one window of {prof['clients']} clients on `--zygotes "
                  f"{self.zk[0].split('-')[1]}` ({prof['per_s']:.0f} executions/s under the profiler, "
                  f"{prof['samples']} busy samples, {prof.get('idle_samples', 0)} idle ones left out; the "
                  f"machine spent {f2(per)} ms of CPU per execution). Each "
                  "sample is put in the first matching class of its kernel stack: a page fault "
                  "(copy-on-write if it went through `do_wp_page`), `fork` (`kernel_clone`), `exit` "
                  "(`do_exit`), another system call, or else user space. Per cent of all samples; the last "
                  "column in ms per execution:", "",
                  "| | " + " | ".join(CATEGORIES) + " | all | ms per execution |",
                  "|---|" + "---:|" * (len(CATEGORIES) + 2)]
            for r in roles:
                row = prof["pct"].get(r)
                if not row:
                    continue
                tot = sum(row.values())
                L.append(f"| {r} | " + " | ".join(f"{row.get(c, 0):.1f}" for c in CATEGORIES)
                         + f" | **{tot:.1f}** | {f2(tot * per / 100 if per else None)} |")
            col = {c: sum(row.get(c, 0) for row in prof["pct"].values()) for c in CATEGORIES}
            L.append("| **all** | " + " | ".join(f"**{col[c]:.1f}**" for c in CATEGORIES)
                     + f" | 100 | {f2(per)} |")
            L.append("")
        cp = pr.get("critical_path") or {}
        if cp.get("error"):
            L += [f"Critical path: not available ({cp['error']}).", ""]
        elif cp:
            med_us = cp["median_us"]
            names = [
                ("fork_sent", "wfjail serve sends `FORK` to the zygote (it accepted the connection, started a "
                              "session thread, read `OPEN`, made the session's socketpair)"),
                ("clone_in", "the zygote enters `clone` (it woke, read `FORK`; its `clone` passes through a "
                             "seccomp notification that wfjail answers)"),
                ("clone_out", "`clone` returns in the zygote"),
                ("zygote_forked", "the zygote sends `FORKED` (meanwhile, in parallel with the child)"),
                ("child_runs", "the child runs for the first time"
                               + (f" (it had been queued on the zygote's CPU in {cp['child_on_zygote_cpu_pct']:.0f} % "
                                  "of the executions)" if cp.get("child_on_zygote_cpu_pct") is not None else "")),
                ("child_hello", "the child writes `HELLO` (Python's after-fork work and at-fork hooks, "
                                "`wfjail.zygote._child`, the guest handshake)"),
                ("opened", "`OPENED` reaches the worker"),
                ("result", "`RESULT` reaches the worker (the call)"),
                ("child_exit", "the child calls `exit_group` (the worker sent `CLOSE`; end-of-file)"),
                ("zygote_woken", "`SIGCHLD` wakes the zygote (the child's address space is torn down)"),
                ("zygote_exited", "the zygote sends `EXITED` (it reaped the child)"),
                ("closed", "`CLOSED` reaches the worker"),
            ]
            rows = sorted(((med_us[k], k, text) for k, text in names if k in med_us))
            L += [f"A trace (`perf record -k mono` of the syscalls of the benchmark's processes, forks and "
                  f"context switches) of {cp['executions']} sequential executions on `--zygotes {self.zk[0].split('-')[1]}`, "
                  f"{cp['followed']} of them followed through: when each step happened, as the median time "
                  "since the worker started the execution (the tracing itself adds a little to each "
                  "system call):", "",
                  "| µs | + µs | step |", "|---:|---:|---|"]
            prev = 0.0
            for t, k, text in rows:
                L.append(f"| {t:.0f} | {t - prev:+.0f} | {text} |")
                prev = t
            L.append("")
        return L

    def md_where(self):
        """Observations computed from this run's numbers."""
        L = []
        bare, fair, z0 = self.lat("bare-exit"), self.lat("bare-request"), self.zk[0]
        z = self.lat(z0)
        if bare and z:
            parts = {p: self.lat(z0, p)["median"] for p in ("open", "call", "close")}
            fork = self.lat("bare-exit", "fork")["median"]
            ccpu = med(self.raw(z0, "child_cpu_ms"))
            bcc = med(self.raw("bare-exit", "child_cpu"))
            fcc = med(self.raw("bare-request", "child_cpu"))
            cpu = self.cpu1(z0)
            over_fair = (f" and {z['median'] - fair['median']:+.2f} ms over the fork that answers a request "
                         f"({fair['median']:.2f} ms)" if fair else "")
            L.append(
                f"* **Latency.** An execution takes {z['median']:.2f} ms, {z['median'] - bare['median']:+.2f} ms "
                f"over the bare fork ({bare['median']:.2f} ms){over_fair}. Open is {parts['open']:.2f} ms (the "
                f"bare `fork()` returns after {fork:.2f} ms), the call {parts['call']:.2f} ms, close "
                f"{parts['close']:.2f} ms."
                + (f" The session child used {ccpu:.2f} ms of CPU, a bare child {bcc * 1000:.2f} ms to call "
                   f"`os._exit(0)`" + (f" and {fcc * 1000:.2f} ms to answer a request" if fcc is not None else "")
                   + "." if ccpu is not None and bcc is not None else "")
                + (f" Per execution, wfjail serve spent {cpu['wfjail']:.2f} ms of CPU, the worker's client "
                   f"{cpu['worker']:.2f} ms and the zygote {cpu['zygote']:.2f} ms."
                   if cpu.get("wfjail") is not None and cpu.get("zygote") is not None else ""))
        cells = self.lane_cells(self.zk)
        if cells:
            k, client, n, t = max(cells, key=lambda x: x[3]["per_s"] or 0)
            d = t.get("cpu") or {}
            if d.get("total") and d.get("busy_pct") is not None:
                ncpu = self.meta["machine"]["nproc"] or 1
                L.append(
                    f"* **Throughput.** In the best cell ({t['per_s']:.0f}/s, `--zygotes {k.split('-')[1]}`, "
                    f"{client} client, {n} lane{'s' if n != 1 else ''}) the machine was {d['busy_pct']:.0f} % "
                    f"busy and the benchmark's processes spent {d['total']:.2f} ms of CPU per execution: worker "
                    f"{d['worker']:.2f}, wfjail serve {f2(d.get('wfjail'))}, zygotes {f2(d.get('zygote'))}, session "
                    f"children {f2(d.get('children'))}. At that cost {ncpu} CPUs cannot exceed "
                    f"{1000 * ncpu / d['total']:.0f} executions/s; 800/s on 2 CPUs needs at most 2.50 ms per "
                    f"execution."
                    + (f" The bare fork that answers a request costs {bare_cpu:.2f} ms of CPU (parent and "
                       f"child, at concurrency 1), i.e. at most {2000 / bare_cpu:.0f}/s on 2 CPUs."
                       if (bare_cpu := self.bare_cpu()) else ""))
            slow = [(k, client, n, c) for k, client, n, c in cells
                    if c["latency"] and c["latency"]["max"] > LANES_TARGET["max_over_median"] * c["latency"]["median"]]
            if slow:
                L.append(
                    f"* **Stalls.** {len(slow)} of {len(cells)} zygote-mode cells have a slowest execution over "
                    f"{LANES_TARGET['max_over_median']:g} × their median: "
                    + "; ".join(f"`--zygotes {k.split('-')[1]}` {client} {n} lane{'s' if n != 1 else ''}: max {c['latency']['max']:.0f} ms "
                                f"against a median of {c['latency']['median']:.1f} ms, {c['over_500ms']} of "
                                f"{c['ok']} ≥ 0.5 s" for k, client, n, c in slow) + ".")
        m, bm = self.mem(z0), self.mem("bare-request")
        if m and m.get("USS"):
            top = sorted((m.get("median_child_breakdown") or {}).items(), key=lambda kv: -kv[1])[:3]
            L.append(
                f"* **Memory.** A held session child has {m['USS']['median']:.0f} KiB of private memory"
                + (f", a held bare-fork child {bm['USS']['median']:.0f} KiB" if bm and bm.get("USS") else "")
                + "; the median child's largest private mappings: "
                + ", ".join(f"`{k}` {v} KiB" for k, v in top)
                + f". Beside it, each live session costs {m['VmPTE']['median']:.0f} KiB of page tables"
                + (f" and {m['wfjail_private_kib']:.0f} KiB in wfjail serve (its session thread)"
                   if m.get("wfjail_private_kib") is not None else "") + ".")
        return (["### What this run's numbers say", ""] + L + [""]) if L else []


def write_doc(path, region):
    """Rewrites the bench-prefork region of path (without the markers, the region goes at the end)."""
    common.write_doc(
        path, region, BEGIN, END,
        new_head="# Benchmarks\n\nThe region below is regenerated by `scripts/bench-prefork` (it rewrites "
        "only the region between its `bench-prefork` markers).\n\n",
    )
