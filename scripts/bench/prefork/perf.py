"""--perf: where the CPU time and the latency go, from perf's profile of one throughput
window and its trace of sequential executions."""

import statistics
import subprocess

CATEGORIES = ["fork", "exit", "copy-on-write fault", "other page fault", "other syscalls", "user space"]


def perf_script(perf, data, fields, extra=()):
    """perf script's text, or None."""
    try:
        p = subprocess.run([perf, "script", "-i", str(data), "-F", fields, *extra], stdin=subprocess.DEVNULL,
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, timeout=600)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return p.stdout if p.returncode == 0 else None


def classify(stack):
    st = set(stack)
    if "asm_exc_page_fault" in st or "exc_page_fault" in st:
        return "copy-on-write fault" if ("do_wp_page" in st or "wp_page_copy" in st) else "other page fault"
    if "kernel_clone" in st or "copy_process" in st:
        return "fork"
    if "do_exit" in st or "exit_mmap" in st:
        return "exit"
    if "do_syscall_64" in st or "entry_SYSCALL_64_after_hwframe" in st:
        return "other syscalls"
    return "user space"


def analyse_profile(perf, pr):
    """Samples of the profiled window by process role and by what the kernel stack shows."""
    import re

    prof = pr.get("profile") or {}
    if prof.get("exit") != 0:
        return {"error": f"perf record failed: {prof.get('error') or prof.get('exit')}"}
    text = perf_script(perf, prof["data"], "comm,pid,tid,ip,sym")
    if text is None:
        return {"error": "perf script failed"}
    pids = pr["pids"]
    known = {pids["worker"]: "worker (client)", pids["serve"]: "wfjail serve"}
    known.update({z: "zygote" for z in pids["zygotes"]})
    counts, total, idle = {}, 0, 0
    sample = None  # [comm, pid, stack]

    def flush():
        nonlocal total, idle
        if sample is None:
            return
        comm, pid, stack = sample
        if pid == 0:  # the idle task: not CPU time anyone spent
            idle += 1
            return
        role = known.get(pid) or ("session children" if comm == "python" else "other programs")
        cat = classify(stack)
        counts.setdefault(role, {}).setdefault(cat, 0)
        counts[role][cat] += 1
        total += 1

    for line in text.splitlines():
        if not line.strip():
            flush()
            sample = None
        elif not line[0].isspace():
            flush()
            m = re.match(r"(.*?)\s+(\d+)/\d+\s*$", line)
            sample = [m.group(1).strip(), int(m.group(2)), []] if m else None
        elif sample is not None:
            f = line.split(None, 1)  # address, symbol
            sample[2].append(f[1].strip() if len(f) > 1 else "?")
    flush()
    if not total:
        return {"error": "no samples"}
    w = prof.get("window") or {}
    return {"samples": total, "idle_samples": idle, "pct": {r: {c: 100.0 * n / total for c, n in cs.items()} for r, cs in counts.items()},
            "machine_ms_per_execution": (w.get("cpu") or {}).get("machine"), "per_s": w.get("per_s"),
            "clients": prof.get("clients")}


def analyse_trace(perf, pr):
    """The critical path of sequential executions, from the trace: the median time of each
    event (worker, wfjail, the zygote, the session child) after the execution started."""
    import bisect
    import re

    tr = pr.get("trace") or {}
    if not tr.get("marks"):
        return {"error": f"perf record (tracepoints) failed: {tr.get('error') or tr.get('exit')}"}
    text = perf_script(perf, tr["data"], "comm,pid,tid,cpu,time,event,trace", ["--ns"])
    if not text:
        return {"error": "perf script failed"}
    pat = re.compile(r"\s*(.+?)\s+(\d+)/(\d+)\s+\[(\d+)\]\s+([\d.]+):\s+(\S+):\s*(.*)")
    ev = []  # (ns, comm, pid, tid, cpu, event, details)
    for line in text.splitlines():
        m = pat.match(line)
        if not m:
            continue
        comm, pid, tid, cpu, ts, name, rest = m.groups()
        sec, _, frac = ts.partition(".")
        ev.append((int(sec) * 10**9 + int(frac.ljust(9, "0")[:9]), comm, int(pid), int(tid), int(cpu),
                   name.rstrip(":").split(":")[-1], rest))
    ev.sort()
    times = [e[0] for e in ev]
    zyg = set(pr["pids"]["zygotes"])

    def nr(e, *nums):
        return e[6].startswith(tuple(f"NR {n} " for n in nums))

    def field(e, key):
        m = re.search(key + r"=(\d+)", e[6])
        return int(m.group(1)) if m else None

    rows, same_cpu, placed = [], 0, 0
    for t0, t1, t2, t3 in tr["marks"]:
        w = ev[bisect.bisect_left(times, t0):bisect.bisect_right(times, t3 + 10**6)]

        def first(pred, after):
            return next((e for e in w if e[0] >= after and pred(e)), None)

        fork_sent = first(lambda e: e[1] == "session" and e[5] == "sys_enter" and nr(e, 46), t0)
        clone_in = fork_sent and first(lambda e: e[2] in zyg and e[5] == "sys_enter" and nr(e, 56, 435),
                                       fork_sent[0])
        if not clone_in:
            continue
        z = clone_in[2]
        clone_out = first(lambda e: e[2] == z and e[5] == "sys_exit" and nr(e, 56, 435), clone_in[0])
        forked = first(lambda e: e[2] == z and e[5] == "sched_process_fork", clone_in[0])
        if not clone_out or not forked:
            continue
        child = field(forked, "child_pid")
        woken = first(lambda e: e[5] == "sched_wakeup_new" and field(e, " pid") == child, clone_in[0])
        if woken:
            placed += 1
            same_cpu += field(woken, "target_cpu") == clone_out[4]
        c_runs = first(lambda e: e[5] == "sched_switch" and field(e, "next_pid") == child, clone_in[0])
        c_first = first(lambda e: e[3] == child and e[5] == "sys_enter", clone_in[0])
        if c_first and (not c_runs or c_runs[0] > c_first[0]):
            c_runs = c_first  # a switch-in the trace missed: it ran by its first system call
        c_hello = first(lambda e: e[3] == child and e[5] == "sys_enter" and nr(e, 1), clone_in[0])
        z_forked = first(lambda e: e[2] == z and e[5] == "sys_enter" and nr(e, 44), clone_out[0])
        c_exit = first(lambda e: e[3] == child and e[5] == "sys_enter" and nr(e, 231, 60), t2)
        z_wake = c_exit and first(lambda e: e[2] == z and e[5] == "sys_exit" and nr(e, 270, 7, 23), c_exit[0])
        z_exited = z_wake and first(lambda e: e[2] == z and e[5] == "sys_enter" and nr(e, 44), z_wake[0])
        row = {"fork_sent": fork_sent, "clone_in": clone_in, "clone_out": clone_out, "child_runs": c_runs,
               "child_first": c_first, "child_hello": c_hello, "zygote_forked": z_forked, "opened": t1,
               "result": t2, "child_exit": c_exit, "zygote_woken": z_wake, "zygote_exited": z_exited,
               "closed": t3}
        if all(row.values()):  # only executions followed through every step
            rows.append({k: ((v if isinstance(v, int) else v[0]) - t0) / 1000.0 for k, v in row.items()})
    if not rows:
        return {"error": "no execution could be followed through in the trace"}
    return {"executions": len(tr["marks"]), "followed": len(rows),
            "median_us": {k: statistics.median(r[k] for r in rows) for k in rows[0]},
            "child_on_zygote_cpu_pct": 100.0 * same_cpu / placed if placed else None}
