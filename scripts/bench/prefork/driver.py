"""The driver: the command line, the virtualenv, the `wfjail serve` processes (one per
configuration, the first running the worker), the run and its results."""

import argparse
import datetime
import json
import os
import random
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import common
from common import REPO, Unavailable, cpu_busy_seconds, fmt_dur, last_line, loadavg, rel, wfjail_version

from . import BENCH_DIR, PROG, SCRIPT, WORK, clean_env, log, run_quiet
from .guests import EXPECTED, GUEST_MIN, GUEST_TEMPORAL, HANDLER, MODULE, policy_text, write_scratch
from .measure import cmdline, meminfo
from .perf import analyse_profile, analyse_trace
from .report import Report, write_doc
from .worker import BARE_KINDS, idle_main, worker_main

PHASES = ("latency", "lanes", "memory", "perf")  # what --only picks from, in the order they run

# --------------------------------------------------------------------------------------
# The driver: setup
# --------------------------------------------------------------------------------------


PROBE = ("import sys, os, importlib.metadata as m, wfjail, temporalio; "
         "print(sys.version.split()[0]); print(m.version('temporalio')); "
         "print(os.path.dirname(wfjail.__file__))")


def probe_venv(py):
    ok, out = run_quiet([str(py), "-c", PROBE], timeout=120, env=clean_env())
    lines = out.strip().splitlines()
    if not ok or len(lines) < 3:
        return None
    return {"python": lines[-3], "temporalio": lines[-2], "wfjail_dir": lines[-1]}


def package_in_sync(installed_dir):
    """Whether the venv's wfjail package has the same .py files as ./python/wfjail."""
    src = REPO / "python" / "wfjail"
    for f in src.glob("*.py"):
        other = Path(installed_dir) / f.name
        if not other.exists() or other.read_bytes() != f.read_bytes():
            return False
    return True


def pip_install_wfjail(py):
    """pip install ./python, from a copy (so that no build/ or *.egg-info lands in python/)."""
    src = BENCH_DIR / "prefork-pkg"
    shutil.rmtree(src, ignore_errors=True)
    shutil.copytree(REPO / "python", src, ignore=shutil.ignore_patterns(
        "build", "*.egg-info", "__pycache__", "tests", ".pytest_cache"))
    try:
        ok, out = run_quiet([str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                             "--force-reinstall", "--no-deps", str(src)])
    finally:
        shutil.rmtree(src, ignore_errors=True)
    if not ok:
        raise Unavailable(f"pip install ./python failed: {last_line(out)}")


def setup_venv(args):
    venv = Path(args.venv)
    py = venv / "bin" / "python"
    info = probe_venv(py) if py.exists() else None
    if info is None:
        if args.no_install:
            raise Unavailable(f"no usable venv at {venv} (temporalio and wfjail importable) and --no-install")
        log(f"creating {rel(venv)}: python3 -m venv, pip install temporalio ./python")
        ok, out = run_quiet(["/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else sys.executable,
                             "-m", "venv", str(venv)])
        if not ok:
            raise Unavailable(f"python3 -m venv failed: {last_line(out)} (Debian: apt-get install python3-venv)")
        ok, out = run_quiet([str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check", "temporalio"])
        if not ok:
            raise Unavailable(f"pip install temporalio failed: {last_line(out)}")
        pip_install_wfjail(py)
        info = probe_venv(py)
        if info is None:
            raise Unavailable(f"the venv at {venv} still cannot import temporalio and wfjail")
    if not package_in_sync(info["wfjail_dir"]):
        if args.no_install:
            raise Unavailable(f"the wfjail package in {venv} differs from ./python (--no-install)")
        log(f"reinstalling ./python into {rel(venv)} (it differed)")
        pip_install_wfjail(py)
        info = probe_venv(py)
        if info is None or not package_in_sync(info["wfjail_dir"]):
            raise Unavailable(f"the wfjail package in {venv} still differs from ./python")
    info["venv"] = str(venv)
    info["py"] = str(py)
    return info



# --------------------------------------------------------------------------------------
# The driver: runs
# --------------------------------------------------------------------------------------


def our_processes():
    """Processes that belong to this checkout's benchmark: working in its scratch directory
    (the servers, zygotes and sessions run there), naming it (a path in it: not a venv beside
    it such as target/bench/prefork-venv), or this checkout's script as a worker. Never by the workflow module's name alone: another checkout's benchmark, or any
    program that preloads the same module, is not ours to kill."""
    found = []
    me = os.getpid()
    work, script = str(WORK), str(SCRIPT)
    for e in os.listdir("/proc"):
        if not e.isdigit() or int(e) == me:
            continue
        c = cmdline(int(e))
        try:
            cwd = os.readlink(f"/proc/{e}/cwd")
        except OSError:
            cwd = ""
        names_work = any(a == work or a.startswith(work + "/") for a in c.split(" "))
        if cwd == work or names_work or (script in c and ("--_worker" in c or "--_idle" in c)):
            found.append((int(e), c))
    return found


class Serve:
    """One `wfjail serve` started by the driver, with this script as its worker."""

    def __init__(self, ctx, name, serve_args, worker_args, stdin):
        self.name = name
        self.log_path = WORK / f"{name}-serve.log"
        self.argv = [ctx.wfjail, "serve", "-q", "-p", str(WORK / "policy.toml"),
                     "--max-executions", str(ctx.max_executions), *serve_args,
                     "--", ctx.venv["py"], str(SCRIPT), *worker_args]
        shown = [a for a in serve_args]
        if "--socket" in shown:
            i = shown.index("--socket")
            del shown[i:i + 2]
        self.shown = " ".join(["wfjail", "serve", "-q", "-p", "policy.toml", "--max-executions",
                               str(ctx.max_executions), *[a.replace(ctx.venv["venv"], "VENV") for a in shown],
                               "--", "VENV/bin/python", "WORKER"])
        self.t0 = time.monotonic()
        with open(self.log_path, "w") as logf:
            self.p = subprocess.Popen(self.argv, cwd=WORK, env=clean_env(), stdin=stdin,
                                      stdout=logf, stderr=subprocess.STDOUT)
        self.exit = None
        self.seconds = None

    def finish(self, timeout):
        """Waits for the server to end (by itself, or by the end of its idle worker's stdin);
        past the timeout, SIGTERM (wfjail passes it to the worker), then SIGKILL, by its pid."""
        if self.p.stdin:
            try:
                self.p.stdin.close()
            except OSError:
                pass
        try:
            self.exit = self.p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            log(f"{self.name}: wfjail serve (pid {self.p.pid}) did not end within {timeout:.0f} s: SIGTERM")
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()
        self.seconds = time.monotonic() - self.t0

    def meta(self):
        return {"command": self.shown, "argv": self.argv, "exit": self.exit, "seconds": self.seconds,
                "log_tail": self.log_path.read_text()[-2000:] if self.log_path.exists() else ""}


def wait_ready(srv, path, timeout=180):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().strip():
            return json.loads(path.read_text())
        if srv.p.poll() is not None:
            break
        time.sleep(0.05)
    raise Unavailable(f"{srv.name}: wfjail serve did not get ready (exit {srv.p.poll()}): "
                      f"{last_line(srv.log_path.read_text() if srv.log_path.exists() else '')}")


def zygote_args(py, preload, n):
    return ["--zygote", "--zygotes", str(n), "--python", py, "--preload", preload]


def run_all(ctx, args, lanes, zygote_counts):
    """Starts the servers (the first zygote count runs the worker; the others and exec mode are
    side servers it reaches by their sockets), runs the worker, ends every server."""
    q = args.quick
    py = ctx.venv["py"]
    sockdir = Path(tempfile.mkdtemp(prefix="bench-prefork-"))  # socket paths must stay short
    main_name = f"zygotes-{zygote_counts[0]}"
    side = [(f"zygotes-{n}", zygote_args(py, ctx.preload, n)) for n in zygote_counts[1:]]
    if not args.no_exec:
        side.append(("exec", []))
    servers, targets, result, error = [], {}, None, None
    out_path = WORK / "worker-out.json"
    out_path.unlink(missing_ok=True)
    try:
        for name, sargs in side:
            ready = WORK / f"{name}.ready"
            ready.unlink(missing_ok=True)
            sock = sockdir / f"{name}.sock"
            log(f"starting {name} (wfjail serve with an idle worker)")
            srv = Serve(ctx, name, [*sargs, "--socket", str(sock)], ["--_idle", str(ready)], subprocess.PIPE)
            servers.append(srv)
            info = wait_ready(srv, ready)
            targets[name] = {"socket": str(sock), "serve_pid": info["serve_pid"]}
        targets[main_name] = {"socket": None, "serve_pid": None}

        zk = [f"zygote-{n}" for n in zygote_counts]
        ek = [] if args.no_exec else ["exec-min", "exec-temporalio"]
        kinds = {f"zygote-{n}": {"target": f"zygotes-{n}", "open": {"handler": HANDLER},
                                 "expected": EXPECTED.decode()} for n in zygote_counts}
        if ek:
            kinds["exec-min"] = {"target": "exec", "open": {"argv": [py, str(WORK / GUEST_MIN)]},
                                 "expected": EXPECTED.decode()}
            kinds["exec-temporalio"] = {"target": "exec", "open": {"argv": [py, str(WORK / GUEST_TEMPORAL)]},
                                        "expected": EXPECTED.decode()}
        cfg = {
            "out": str(out_path), "preload": ctx.preload, "seed": args.seed,
            "targets": targets, "kinds": kinds,
            "warmup": {**{k: 10 if q else 50 for k in zk}, **{k: 1 if q else 3 for k in ek},
                       "bare-exit": 5 if q else 20, "bare-request": 5 if q else 20},
            "phases": [p for p in PHASES if p in args.only and p != "perf"],
            "latency": [{"kinds": zk + list(BARE_KINDS), "rounds": args.rounds, "warmup": 0,
                         "cpu_block": 50 if q else 300}]
            + ([{"kinds": ek, "rounds": args.exec_rounds, "warmup": 0, "cpu_block": 3 if q else 20}] if ek else []),
            "lanes": [{"kinds": zk, "clients": ["sync", "async"], "lanes": lanes, "sessions": args.lane_sessions,
                       "rounds": args.lane_rounds}]
            # An exec'd temporalio guest takes ~0.15 s: fewer sessions, up to 8 lanes, the sync client.
            + ([{"kinds": ek, "clients": ["sync"], "lanes": [n for n in lanes if n <= 8] or [min(lanes)],
                 "sessions": args.exec_lane_sessions, "rounds": 1}] if ek else []),
            "memory": {**{k: args.sessions for k in zk}, "bare-request": args.sessions,
                       **{k: args.exec_sessions for k in ek}},
        }
        if ctx.perf:
            cfg["phases"].append("perf")
            cfg["perf"] = {"perf": ctx.perf, "kind": zk[0], "clients": 8 if 8 in lanes else max(lanes),
                           "duration": 1.0 if q else 3.0, "executions": 50 if q else 300}
        cfg_path = WORK / "worker-cfg.json"
        cfg_path.write_text(json.dumps(cfg, indent=1))
        log(f"running the worker under {main_name}: " + ", ".join(
            {"latency": f"latency ({args.rounds} rounds)",
             "lanes": f"lanes {','.join(map(str, lanes))} ({args.lane_sessions} sessions per cell, sync and async)",
             "memory": f"{args.sessions} held sessions", "perf": "perf"}[p] for p in cfg["phases"])
            + ("" if args.no_exec else ", exec mode beside"))
        srv = Serve(ctx, main_name, zygote_args(py, ctx.preload, zygote_counts[0]),
                    ["--_worker", str(cfg_path)], subprocess.DEVNULL)
        servers.insert(0, srv)
        srv.finish(timeout=1800)
    except Unavailable as e:
        error = str(e)
    finally:
        for srv in servers:
            if srv.exit is None:
                srv.finish(timeout=30)
        time.sleep(0.3)  # the zygotes die with wfjail serve
        survivors = our_processes()
        for pid, c in survivors:
            log(f"process {pid} outlived its wfjail serve ({c[:120]}): killing it by its pid")
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        shutil.rmtree(sockdir, ignore_errors=True)
    if out_path.exists():
        result = json.loads(out_path.read_text())
    return result, {"servers": {s.name: s.meta() for s in servers}, "survivors": [c for _p, c in survivors],
                    "error": error}


class Ctx:
    pass


def main():
    ap = argparse.ArgumentParser(
        description="Benchmark of wfjail serve's prefork sessions (temporalio preloaded) against a bare "
        "fork of the same process, with throughput, memory per live session and exec mode.")
    ap.add_argument("--quick", action="store_true",
                    help="smoke run (~1 min): few rounds, 80 sessions per lanes cell, 50 held sessions; prints only "
                    "unless --output is given")
    ap.add_argument("--rounds", type=int, help="latency rounds at concurrency 1 (default 1000; 60 with --quick)")
    ap.add_argument("--lanes", default="1,2,8,32",
                    help="lanes (concurrent sessions, each lane opening the next when its last closed) per "
                    "throughput cell (default 1,2,8,32)")
    ap.add_argument("--lane-sessions", type=int,
                    help="sessions per lanes cell, zygote mode (default 400; 80 with --quick)")
    ap.add_argument("--lane-rounds", type=int, help="repeats of each zygote-mode lanes cell (default 1)")
    ap.add_argument("--exec-lane-sessions", type=int,
                    help="sessions per exec-mode lanes cell (default 40; 8 with --quick)")
    ap.add_argument("--zygotes", default="1,2", help="--zygotes values to compare (default 1,2)")
    ap.add_argument("--sessions", type=int, help="sessions held open for the memory figures (default 200; 50 with --quick)")
    ap.add_argument("--exec-rounds", type=int, help="exec-mode latency rounds (default 30; 4 with --quick)")
    ap.add_argument("--exec-sessions", type=int, help="exec-mode sessions held open (default 20; 4 with --quick)")
    ap.add_argument("--no-exec", action="store_true", help="skip exec mode")
    ap.add_argument("--only", help="run only these parts, comma-separated, of " + ", ".join(PHASES)
                    + " (e.g. `--only lanes`); prints only unless --output is given")
    ap.add_argument("--perf", action="store_true",
                    help="profile (perf record -a -g) one more throughput window and trace (syscalls, forks, "
                    "context switches) sequential executions: where the CPU time and the latency go. On by "
                    "default when perf is installed, except with --quick; needs root (or a low "
                    "perf_event_paranoid); for the trace, perf mounts tracefs at /sys/kernel/tracing "
                    "when it is not there")
    ap.add_argument("--no-perf", action="store_true", help="no profile and no trace")
    ap.add_argument("--output", help="markdown file whose bench-prefork region is rewritten "
                    "(default docs/benchmarks.md; '-' for none)")
    ap.add_argument("--seed", type=int, help="seed of the random orders (default: random)")
    ap.add_argument("--venv", default=str(BENCH_DIR / "prefork-venv"),
                    help="virtualenv with temporalio and ./python (default target/bench/prefork-venv; created when missing)")
    ap.add_argument("--wfjail", help="use this wfjail binary instead of building with cargo")
    ap.add_argument("--no-build", action="store_true", help="use the newest release build in target/")
    ap.add_argument("--no-install", action="store_true", help="never create the venv or run pip")
    ap.add_argument("--_worker", help=argparse.SUPPRESS)
    ap.add_argument("--_idle", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args._worker:
        return worker_main(args._worker)
    if args._idle:
        return idle_main(args._idle)

    q = args.quick
    args.rounds = args.rounds or (60 if q else 1000)
    args.lane_sessions = args.lane_sessions or (80 if q else 400)
    args.lane_rounds = args.lane_rounds or 1
    args.exec_lane_sessions = args.exec_lane_sessions or (8 if q else 40)
    args.sessions = args.sessions or (50 if q else 200)
    args.exec_rounds = args.exec_rounds or (4 if q else 30)
    args.exec_sessions = args.exec_sessions or (4 if q else 20)
    only = [p.strip() for p in (args.only or "").split(",") if p.strip()]
    if any(p not in PHASES for p in only):
        ap.error("--only takes a comma-separated list of " + ", ".join(PHASES))
    args.only = only or list(PHASES)
    if args.output is None:
        args.output = "-" if q or only else str(REPO / "docs" / "benchmarks.md")
    if args.seed is None:
        args.seed = random.SystemRandom().randrange(1 << 31)
    try:
        lanes = list(dict.fromkeys(int(x) for x in args.lanes.split(",") if x))
        zygote_counts = list(dict.fromkeys(int(x) for x in args.zygotes.split(",") if x))
    except ValueError:
        ap.error("--lanes and --zygotes are comma-separated numbers")
    if not lanes or not zygote_counts or min(lanes + zygote_counts + [
            args.rounds, args.sessions, args.lane_sessions, args.lane_rounds, args.exec_lane_sessions,
            args.exec_rounds, args.exec_sessions]) < 1:
        ap.error("counts must be positive")

    started = time.monotonic()
    command = "scripts/bench-prefork" + "".join(" " + shlex.quote(a) for a in sys.argv[1:])
    leftovers = our_processes()
    if leftovers:
        sys.exit("bench-prefork: processes of an earlier run are still there (pids "
                 + ", ".join(str(p) for p, _c in leftovers) + "): end them first")
    ctx = Ctx()
    try:
        ctx.wfjail = common.build_wfjail(args, PROG)
        ctx.version = wfjail_version()
        ctx.venv = setup_venv(args)
        write_scratch(ctx.venv["py"])
    except Unavailable as e:
        sys.exit(f"bench-prefork: {e}")
    ctx.preload = "temporalio," + MODULE
    ctx.perf = None
    if "perf" in args.only and (args.perf or not (args.quick or args.no_perf)):
        ctx.perf = shutil.which("perf")
        if not ctx.perf:
            if args.perf:
                sys.exit("bench-prefork: --perf needs perf (Debian: linux-perf)")
            log("perf is not installed: no profile or trace (Debian: linux-perf)")
    ctx.max_executions = max(256, args.sessions + 16, args.exec_sessions + 16, max(lanes) + 16)
    # wfjail serve holds about 5 descriptors per live session (zygote mode): with 200 sessions
    # held, a soft limit of 1024 is just enough. Give the servers the hard limit.
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard if hard != resource.RLIM_INFINITY else max(soft, 65536)
    if soft != resource.RLIM_INFINITY and soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(want, 1 << 20), hard))
    if resource.getrlimit(resource.RLIMIT_NOFILE)[0] < 8 * args.sessions + 256:
        log(f"the open-file limit ({resource.getrlimit(resource.RLIMIT_NOFILE)[0]}) may be too low for "
            f"{args.sessions} held sessions (wfjail serve needs ~5 per session)")

    load_start = loadavg()
    busy0, wall0 = cpu_busy_seconds(), time.monotonic()
    result, run_meta = run_all(ctx, args, lanes, zygote_counts)
    busy1, wall1 = cpu_busy_seconds(), time.monotonic()
    if result and result.get("perf"):
        log("analysing the perf data")
        result["perf"]["profile_by_role"] = analyse_profile(ctx.perf, result["perf"])
        result["perf"]["critical_path"] = analyse_trace(ctx.perf, result["perf"])
    meta = {
        "command": command,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "duration": fmt_dur(time.monotonic() - started),
        "seed": args.seed,
        "machine": {**common.machine_info(), "memory_gib": (meminfo("MemTotal") or 0) / 1048576},
        "load_start": load_start,
        "load_end": loadavg(),
        "busy_pct": (100 * (busy1 - busy0) / ((wall1 - wall0) * (os.cpu_count() or 1))
                     if busy0 is not None and busy1 is not None else None),
        "wfjail": ctx.version,
        "venv": {k: ctx.venv[k] for k in ("venv", "python", "temporalio")},
        "policy": policy_text(),
        "preload": ctx.preload,
        "zygote_counts": zygote_counts,
        "lanes": lanes,
        "args": {k: v for k, v in vars(args).items() if not k.startswith("_")},
        **run_meta,
    }
    (BENCH_DIR / "prefork-raw.json").write_text(json.dumps({"meta": meta, "result": result}, indent=1) + "\n")

    rep = Report(result, meta, args)
    print(rep.text())
    print(f"run took {meta['duration']}; raw results in {rel(BENCH_DIR / 'prefork-raw.json')}")
    if result is None:
        print("no results: see target/bench/prefork/*-serve.log")
        return 1
    if args.output != "-":
        write_doc(args.output, rep.markdown())
        print(f"wrote the bench-prefork region of {rel(args.output)}")
    return 1 if rep.problems() else 0
