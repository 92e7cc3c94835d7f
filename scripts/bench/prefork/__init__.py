"""scripts/bench-prefork, split by concern. The script is the entry point (it keeps its name,
options and output); these modules are what it runs:

  driver.py    the command line, the virtualenv, the `wfjail serve` processes, the run
  guests.py    the workload: the workflow module, the guests, the bare-fork baseline, the policy
  worker.py    the worker that runs under `wfjail serve` and measures each phase
  measure.py   /proc readers and percentiles, for the driver and the worker
  perf.py      --perf: the profile by process role and the critical path from the trace
  report.py    the tables, the markdown region of docs/benchmarks.md, the targets

This file holds what they all share: the benchmark's name in log lines, its scratch
directories, the script that `wfjail serve` runs as its worker, and the environment of the
processes it starts.
"""

import functools
import os
from pathlib import Path

import common  # scripts/bench/common.py (the script puts scripts/bench on sys.path)
from common import REPO

PROG = "bench-prefork"
SCRIPT = Path(__file__).resolve().parents[2] / "bench-prefork"  # the worker `wfjail serve` runs
log = functools.partial(common.log, PROG)
run_quiet = functools.partial(common.run_quiet, timeout=900)
BENCH_DIR = REPO / "target" / "bench"  # git-ignored
WORK = BENCH_DIR / "prefork"  # scratch: the serve processes' working directory


def clean_env():
    env = dict(os.environ)
    for k in ("PYTHONPATH", "PYTHONHOME", "WFJAIL_SOCKET", "BENCH_PREFORK_REEXEC"):
        env.pop(k, None)
    return env

