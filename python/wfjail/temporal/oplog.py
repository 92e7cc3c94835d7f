"""What an operator finds of a confined run in the worker's log (the ``wfjail.temporal``
logger): each session's output lines (what its child wrote on stdout and stderr, which
``wfjail serve`` echoes behind ``[session N]``) as records that name the run (workflow id,
run id, type, task queue, attempt, session, pid: in ``extra`` and in the message), and a
WARNING with the report's status and violations when a session ends badly.

A run's task that fails is retried in a new session that replays the run's history: its
child writes the same lines again. A line that an earlier session of the same run wrote is
not logged again (the session's end says how many were left out); nor is an end that says
what an earlier one of the run said (DEBUG then).

Everything here is the child's words: each line escaped (one record, one line: no forged
records, no terminal escapes) and cut to OUTPUT_LINE_CHARS; what is kept per run and session
is bounded. The server's own messages, and everything when no handler is set above
``wfjail.temporal`` (logging not configured), are copied to the worker's stderr as they
come, as before."""

from __future__ import annotations

import collections
import hashlib
import logging
import os
import re
import threading
from typing import Any

import temporalio.workflow

from .stack import MAX_CHILD_MESSAGE, escape

_log = logging.getLogger("wfjail.temporal")

# A child's output line as a record: at most this many characters (escaped), at this level
# (output of confined workflow code is out of band: its log records go through
# workflow.logger, relays.LogRelay).
OUTPUT_LINE_CHARS = 1024
OUTPUT_LEVEL = logging.WARNING
# Sessions whose identity is kept (their lines may come after they ended), runs whose lines
# are remembered for their retries (the most recently opened), and lines remembered per run
# (64-bit digests: a few MiB at most in all).
MAX_SESSIONS = 4096
MAX_RUNS = 512
MAX_LINES_PER_RUN = 256
# Lines of a session not known yet (its OPENED still on its way to the worker's thread) wait
# for it: at most this many per session, for this many sessions (older ones are logged
# without a run).
MAX_PENDING_LINES = 64
MAX_PENDING_SESSIONS = 64
# At most this many violations in a session's end record.
MAX_END_VIOLATIONS = 8

_SESSION_LINE = re.compile(rb"\[session (\d{1,19})\] ?")
# The server's word on same-page merging at a zygote's start (``merge_pages=True``): logged,
# INFO when on, WARNING when off (it says why), never only on stderr.
_MERGING_LINE = re.compile(rb"wfjail: zygote \d+: same-page merging (on|off): ")


class _Run:
    """What the log remembers of a run: digests of the lines its sessions wrote and of its
    sessions' ends."""

    def __init__(self) -> None:
        self.seen: set[int] = set()
        self._lock = threading.Lock()  # its sessions' lines come on several threads

    def first_time(self, text: str) -> bool:
        digest = int.from_bytes(hashlib.blake2b(text.encode("utf-8", "replace"),
                                                digest_size=8).digest(), "big")
        with self._lock:
            if digest in self.seen:
                return False
            if len(self.seen) < MAX_LINES_PER_RUN:
                self.seen.add(digest)
            return True


class SessionLog:
    """One session of a run, as the worker's log names it."""

    def __init__(self, session: object, pid: object, info: temporalio.workflow.Info,
                 run: _Run) -> None:
        self.session = session if isinstance(session, int) else None
        self.pid = pid if isinstance(pid, int) and not isinstance(pid, bool) else None
        self.identity: dict[str, Any] = {
            "namespace": info.namespace, "task_queue": info.task_queue,
            "workflow_id": info.workflow_id, "run_id": info.run_id,
            "workflow_type": info.workflow_type, "attempt": info.attempt}
        self.extra: dict[str, Any] = {"temporal_workflow": self.identity,
                                      "wfjail_session": self.session, "wfjail_pid": self.pid}
        self.name = "workflow %s %s (run %s, attempt %s, task queue %s, session %s, pid %s)" % (
            escape(info.workflow_type, 256), escape(info.workflow_id, 256),
            escape(info.run_id, 64), info.attempt, escape(info.task_queue, 256),
            self.session, self.pid)
        self._run = run
        self.left_out = 0

    def output(self, raw: bytes) -> None:
        """A line the session's child wrote (without its ``[session N]`` prefix)."""
        text = escape(raw.decode("utf-8", "replace").rstrip("\r\n"), OUTPUT_LINE_CHARS)
        if not self._run.first_time("output:" + text):
            self.left_out += 1
            return
        _log.log(OUTPUT_LEVEL, "%s wrote: %s", self.name, text, extra=self.extra)

    def ended(self, report: dict[str, Any] | None) -> None:
        """The session ended with ``report``: a WARNING when the report's status is not
        ``ok`` or it lists violations (DEBUG when an earlier session of the run ended with
        the same words); INFO for the lines left out as repeats."""
        if self.left_out:
            _log.info("%s ended; %d lines of its output repeated an earlier session's of the "
                      "run and were not logged again", self.name, self.left_out,
                      extra=self.extra)
        if not isinstance(report, dict):
            return
        _note_degraded(report, self)
        status = report.get("status")
        violations = report.get("violations")
        violations = violations if isinstance(violations, list) else []
        if status == "ok" and not violations:
            return
        words = ["%s ended: %s" % (self.name, escape(status, 64))]
        error = report.get("error")
        if isinstance(error, str) and error:
            words.append(escape(error, MAX_CHILD_MESSAGE))
        elif not violations:
            words.append(end_reason(report))
        for v in violations[:MAX_END_VIOLATIONS]:
            if isinstance(v, dict):
                words.append("%s %s(%s) %s [%s]" % tuple(
                    escape(v.get(k), 256) for k in ("category", "syscall", "args", "action",
                                                     "rule")))
        if len(violations) > MAX_END_VIOLATIONS:
            words.append("and %d more violations" % (len(violations) - MAX_END_VIOLATIONS))
        text = "; ".join(words[1:])
        first = self._run.first_time("end:" + text)
        _log.log(logging.WARNING if first else logging.DEBUG, "%s: %s%s", words[0], text,
                 "" if first else " (as an earlier session of the run)", extra={
                     **self.extra, "wfjail_status": escape(status, 64),
                     "wfjail_violations": min(len(violations), 10**6)})


def end_reason(report: dict[str, Any]) -> str:
    """Why a session ended, for a report that gives no ``error``: its signal, its exit code
    or its stderr's last line (a guest killed by a signal has no words of its own), and
    ``no reason given`` rather than nothing."""
    parts = []
    signal = report.get("signal")
    if isinstance(signal, str) and signal:
        parts.append("killed by %s" % escape(signal, 32))
    code = report.get("exit_code")
    if isinstance(code, int) and not isinstance(code, bool) and (code != 0 or not parts):
        parts.append("exit code %d" % code)
    tail = report.get("stderr_tail")
    if isinstance(tail, str) and tail.strip():
        parts.append("its stderr ended: %s" % escape(tail.strip().splitlines()[-1],
                                                      MAX_CHILD_MESSAGE))
    return ", ".join(parts) or "no reason given (the report has no error, signal or exit code)"


# What sessions ran without (layers the container or kernel refused, e.g. the pinned address
# layout under a default seccomp profile): every run of the policy goes without them, so it is
# said once per process and set of layers, at WARNING, instead of on each run.
_DEGRADED = _Run()
MAX_DEGRADED = 16


def _note_degraded(report: dict[str, Any], log: SessionLog) -> None:
    layers = report.get("layers")
    degraded = layers.get("degraded") if isinstance(layers, dict) else None
    if not isinstance(degraded, list):
        return
    items = [escape(d, 512) for d in degraded[:MAX_DEGRADED] if isinstance(d, str)]
    text = "; ".join(items)
    if items and _DEGRADED.first_time(text):
        _log.warning("confined workflow runs go without what this host refused: %s (first "
                     "seen in %s; `wfjail check -p POLICY` there says what each costs and how "
                     "to get it back)", text, log.name,
                     extra={**log.extra, "wfjail_degraded": items})


class _Registry:
    """Sessions by number (the server's: one server per policy, each numbering from 1), and
    runs by run id; both bounded, oldest first out."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sessions: collections.OrderedDict[tuple[str, int], SessionLog] = \
            collections.OrderedDict()
        self._runs: collections.OrderedDict[str, _Run] = collections.OrderedDict()
        self._pending: collections.OrderedDict[tuple[str, int], list[bytes]] = \
            collections.OrderedDict()
        # Per server: the session whose line was cut (a long line is read in pieces: the
        # next piece has no prefix), or None.
        self._cut: dict[str, tuple[str, int] | None] = {}

    def opened(self, server: str, session: object, pid: object,
               info: temporalio.workflow.Info) -> SessionLog:
        with self._lock:
            run = self._runs.pop(info.run_id, None) or _Run()
            self._runs[info.run_id] = run
            while len(self._runs) > MAX_RUNS:
                self._runs.popitem(last=False)
            log = SessionLog(session, pid, info, run)
            pending: list[bytes] = []
            if log.session is not None:
                key = (server, log.session)
                self._sessions[key] = log
                while len(self._sessions) > MAX_SESSIONS:
                    self._sessions.popitem(last=False)
                pending = self._pending.pop(key, [])
        for line in pending:
            log.output(line)
        return log

    def output(self, server: str, line: bytes) -> None:
        """A line of the server's stderr (``server``: which, by its socket)."""
        if not _log.hasHandlers():
            _write_raw(line)
            return
        m = _SESSION_LINE.match(line)
        with self._lock:
            cut = self._cut.pop(server, None)
            if m is not None:
                cut = (server, int(m.group(1)))
            if not line.endswith(b"\n") and cut is not None and len(self._cut) < 1024:
                self._cut[server] = cut
        if m is None and cut is not None:  # the rest of a session's long line
            self._session_line(cut, line)
            return
        merging = _MERGING_LINE.match(line) if m is None else None
        if merging is not None:
            _log.log(logging.INFO if merging.group(1) == b"on" else logging.WARNING, "%s",
                     escape(line.decode("utf-8", "replace").rstrip("\r\n"), 1000))
            return
        if m is None:
            # The server's own words (`wfjail: zygote 0 restarted`, a zygote's `[zygote i]`
            # lines; under -q, only what went wrong) as they were: a failed start's are in
            # its error, logged once (server.py).
            _write_raw(line)
            return
        self._session_line((server, int(m.group(1))), line[m.end():])

    def _session_line(self, key: tuple[str, int], rest: bytes) -> None:
        stale: tuple[tuple[str, int], list[bytes]] | None = None
        with self._lock:
            log = self._sessions.get(key)
            if log is None:
                waiting = self._pending.setdefault(key, [])
                if len(waiting) < MAX_PENDING_LINES:
                    waiting.append(rest)
                if len(self._pending) > MAX_PENDING_SESSIONS:
                    stale = self._pending.popitem(last=False)
        if log is not None:
            log.output(rest)
        if stale is not None:
            for old in stale[1]:
                _log.log(OUTPUT_LEVEL, "session %d of no known run wrote: %s", stale[0][1],
                         escape(old.decode("utf-8", "replace").rstrip("\r\n"),
                                OUTPUT_LINE_CHARS), extra={"wfjail_session": stale[0][1]})


def _write_raw(line: bytes) -> None:
    try:
        os.write(2, line)
    except OSError:
        pass


REGISTRY = _Registry()
