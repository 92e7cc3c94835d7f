"""The ``wfjail serve --zygote`` a ``JailedWorkflowRunner`` starts per policy: its argv, the
policy file that lets the zygote import what the worker imports, its start and its stop."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Sequence

from ..client import Client
from ..errors import ProtocolError
from .child import WARM_ENV, WARM_UP

# How long a server may take to say it is ready (its zygotes preloaded and warmed up).
READY_WITHIN = 120


class Server:
    """One ``wfjail serve --zygote`` of the runner, for one policy."""

    def __init__(self, wfjail: str | None, policy: str, *, socket: str | None,
                 classes: Sequence[str], preload: Sequence[str], max_sessions: int,
                 zygotes: int | None) -> None:
        if not wfjail:
            raise RuntimeError("wfjail: the `wfjail` binary is not on PATH; pass "
                               "JailedWorkflowRunner(wfjail=...)")
        self.tmp = tempfile.mkdtemp(prefix="wfjail-temporal-")
        sock = socket or os.path.join(self.tmp, "serve.sock")
        # The warm-up (WARM_UP) where the import of this package warmed up before: right
        # after temporalio.worker, before the workflows' modules (it imports them).
        preload = ["temporalio.worker", WARM_UP] + list(preload)
        argv = [wfjail, "serve", "-q", "-p", policy_file(self.tmp, policy, classes),
                "--socket", sock, "--max-executions", str(max_sessions), "--zygote",
                "--python", sys.executable, "--preload", ",".join(preload),
                "--exit-with-parent"]
        if zygotes:
            argv += ["--zygotes", str(zygotes)]
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL)
        self.client = Client(sock)
        deadline = time.monotonic() + READY_WITHIN
        while True:
            try:
                self.client.status()
                return
            except (OSError, ProtocolError):
                if self.proc.poll() is not None:
                    raise RuntimeError("wfjail serve exited with status %s before it was "
                                       "ready (its messages are above)"
                                       % self.proc.returncode) from None
                if time.monotonic() > deadline:
                    raise RuntimeError("wfjail serve was not ready within %d s"
                                       % READY_WITHIN) from None
                time.sleep(0.02)

    def alive(self) -> bool:
        return self.proc.poll() is None


def absolute_policy(policy: str) -> str:
    """``policy`` as an ``extends`` value that holds wherever the policy file is: a built-in
    name as it is, a file's path made absolute."""
    if "/" in policy or policy.endswith(".toml"):
        return os.path.abspath(policy)
    return policy


def policy_file(tmp: str, policy: str, classes: Sequence[str]) -> str:
    """A policy extending ``policy`` that lets the zygote import what the worker imports: the
    worker's import path, read-only, and as PYTHONPATH; and the interpreter itself where a
    venv's `python` links to (pyenv, a python.org build...). Its environment names the
    workflow ``classes`` for the zygote's warm-up."""
    path = [os.path.abspath(p or ".") for p in sys.path]
    path = [p for i, p in enumerate(path) if os.path.exists(p) and p not in path[:i]]
    prefixes = [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
                os.path.dirname(os.path.dirname(os.path.realpath(sys.executable)))]
    reads = path + [p for i, p in enumerate(prefixes)
                    if os.path.isdir(p) and p not in path and p not in prefixes[:i]]
    text = ("extends = %s\n[filesystem]\nread = [%s]\n[env]\n"
            "set = { PYTHONPATH = %s, %s = %s }\n") % (
        json.dumps(absolute_policy(policy)), ", ".join(json.dumps(p) for p in reads),
        json.dumps(os.pathsep.join(path)), WARM_ENV, json.dumps(",".join(classes)))
    out = os.path.join(tmp, "policy.toml")
    with open(out, "w") as f:
        f.write(text)
    return out


def stop(server: subprocess.Popen[bytes], tmp: str | None) -> None:
    """Ends ``server`` (SIGTERM, then SIGKILL after 10 s) and removes its directory."""
    if server.poll() is None:
        server.terminate()
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
    if tmp:
        shutil.rmtree(tmp, ignore_errors=True)
