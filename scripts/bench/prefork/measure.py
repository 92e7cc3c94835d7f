"""Measurement: /proc readers (children, command lines, CPU time and faults, private memory)
and percentiles, for the driver and the worker."""

import os
import statistics

from common import CLK_TCK, children


def children_of(pid, missing_ok=False):
    """Direct children of every thread of pid: common.children (it scans again when a thread
    ends during the scan; the process gone: FileNotFoundError, or [] with missing_ok)."""
    return children(pid, missing_ok)


def cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode("utf-8", "replace")
    except OSError:
        return ""


def descendants(pid):
    out, todo = [], [pid]
    while todo:
        kids = children_of(todo.pop(), missing_ok=True)  # a descendant may exit meanwhile
        out += kids
        todo += kids
    return out


def proc_stat(pid):
    """CPU seconds (own, and of reaped children) and minor faults of a process (all threads)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    n = [int(x) for x in fields[7:15]]  # minflt cminflt majflt cmajflt utime stime cutime cstime
    return {"cpu": (n[4] + n[5]) / CLK_TCK, "ccpu": (n[6] + n[7]) / CLK_TCK,
            "minflt": n[0], "cminflt": n[1]}


def kb_fields(path, wanted=None):
    out = {}
    try:
        with open(path) as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 3 and parts[-1] == "kB" and parts[0].endswith(":"):
                    key = parts[0][:-1]
                    if wanted is None or key in wanted:
                        out[key] = int(parts[1])
    except OSError as e:
        return {"error": f"{path}: {e.strerror}"}
    return out


def rollup(pid):
    r = kb_fields(f"/proc/{pid}/smaps_rollup")
    if "error" not in r:
        r["USS"] = r.get("Private_Clean", 0) + r.get("Private_Dirty", 0)
        r.update(kb_fields(f"/proc/{pid}/status", {"VmPTE"}))
    return r


def smaps_breakdown(pid):
    """Private kB per mapping name ([heap], [anon], [stack], file basenames)."""
    out, name = {}, None
    try:
        with open(f"/proc/{pid}/smaps") as f:
            for line in f:
                parts = line.split()
                if not parts:
                    continue
                if "-" in parts[0] and not parts[0].endswith(":"):
                    name = os.path.basename(parts[5]) if len(parts) > 5 else "[anon]"
                    if len(parts) > 5 and parts[5].startswith("["):
                        name = parts[5]
                elif parts[0] in ("Private_Clean:", "Private_Dirty:") and name:
                    out[name] = out.get(name, 0) + int(parts[1])
    except OSError:
        return {}
    return {k: v for k, v in out.items() if v}


def meminfo(key):
    return kb_fields("/proc/meminfo", {key}).get(key)


def pct(values, q):
    """The q-th percentile (0-100), by linear interpolation."""
    v = sorted(values)
    if not v:
        return None
    k = (len(v) - 1) * q / 100.0
    lo = int(k)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


def summary(values, scale=1.0):
    """median, p10, p90, mean, n of values * scale."""
    v = [x * scale for x in values]
    if not v:
        return None
    return {"median": pct(v, 50), "p10": pct(v, 10), "p90": pct(v, 90),
            "mean": statistics.fmean(v), "n": len(v)}
