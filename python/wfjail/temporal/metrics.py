"""The jailed runner's own metrics, on the worker's Temporal runtime meter (what
``workflow.metric_meter()`` reaches in process: ``Runtime.metric_meter``), so that they show
on the SDK's Prometheus endpoint (or OpenTelemetry collector) next to its ``temporal_...``
metrics, with the same ``namespace``, ``task_queue`` and ``workflow_type`` labels.

Counted in the worker from what it already receives (each session's open, each call, the
report a session ends with), so each worker counts its own runs exactly; a zygote restart
only the server sees, and so its closed guests that linger (not exited yet, holding no
slot): they are in the answer to STATUS (``zygote_restarts``, ``lingering``), which the
worker asks at most every STATUS_EVERY seconds, when it opens a session (on an opener
thread). Every value taken from a
report is checked (a type, a range, a name of the few characters a status or category has):
the report is the server's, but what it says of a run comes from the run's child."""

from __future__ import annotations

import datetime
import re
import threading
import time
from typing import Any, Callable

import temporalio.common
import temporalio.workflow

from ..client import Client
from . import sdk

# The metrics' names (docs/temporal.md, "Metrics"), as the SDK names its own: no unit
# suffix, no ``_total`` (Core's Prometheus exporter adds none).
SESSIONS_OPENED = "wfjail_sessions_opened"
SESSIONS_ENDED = "wfjail_sessions_ended"
SESSIONS_BUSY = "wfjail_sessions_busy"
VIOLATIONS = "wfjail_violations"
ACTIVATION_LATENCY = "wfjail_activation_latency"
WORKFLOW_CPU_TIME = "wfjail_workflow_cpu_time"
WORKFLOW_PEAK_MEMORY = "wfjail_workflow_peak_memory"
ZYGOTE_RESTARTS = "wfjail_zygote_restarts"
GUESTS_LINGERING = "wfjail_guests_lingering"
WAIT_TIMEOUTS = "wfjail_wait_timeouts"

# A report's status and a violation's category as labels: wfjail's own words (``ok``,
# ``violation``, ``network``...); anything else is ``other``. At most this many violation
# entries of a report are counted (serve merges repeats into one entry with a count).
_LABEL = re.compile(r"[a-z][a-z_]{0,31}\Z")
MAX_REPORT_VIOLATIONS = 256
# The status of a session the worker ended without its report (its socket shut down).
NO_REPORT = "no_report"
# How often at most the worker asks a server its zygote restarts (on a session's open).
STATUS_EVERY = 1.0


class _Instruments:
    """The runner's instruments on one meter (made once per meter: each ``create_...``
    is a call into Core)."""

    def __init__(self, meter: temporalio.common.MetricMeter) -> None:
        self.meter = meter  # held: the cache is keyed by its id
        self.opened = meter.create_counter(
            SESSIONS_OPENED, "Confined sessions opened (a workflow run entering the cache).")
        self.ended = meter.create_counter(
            SESSIONS_ENDED, "Confined sessions ended, by the status of their report.")
        self.busy = meter.create_counter(
            SESSIONS_BUSY, "Sessions refused because every slot of the server was taken.")
        self.violations = meter.create_counter(
            VIOLATIONS, "What wfjail denied (or warned of) in ended sessions, by category.")
        self.latency = meter.create_histogram_timedelta(
            ACTIVATION_LATENCY, "Time from an activation sent to its confined run to the "
            "answer.")
        self.cpu = meter.create_histogram_timedelta(
            WORKFLOW_CPU_TIME, "CPU time (user and system) of a confined session, one per "
            "workflow run's stay in the cache.")
        self.memory = meter.create_histogram_float(
            WORKFLOW_PEAK_MEMORY, "Peak resident memory of a confined session's process, "
            "one per workflow run's stay in the cache.", "MiB")
        self.restarts = meter.create_counter(
            ZYGOTE_RESTARTS, "Zygotes of the runner's servers that died and were replaced.")
        self.lingering = meter.create_gauge(
            GUESTS_LINGERING, "Guests of a runner's server closed but not exited yet (they "
            "hold no slot), as its last STATUS said.")
        self.wait_timeouts = meter.create_counter(
            WAIT_TIMEOUTS, "Waits on a session's path in the worker that ended on their "
            "backstop, not on the event they wait for, by wait (room, open).")


_instruments: dict[int, _Instruments] = {}
_instruments_lock = threading.Lock()


def _of(meter: temporalio.common.MetricMeter) -> _Instruments:
    with _instruments_lock:
        made = _instruments.get(id(meter))
        if made is None or made.meter is not meter:
            if len(_instruments) >= 64:  # meters of runtimes long gone
                _instruments.clear()
            made = _instruments[id(meter)] = _Instruments(meter)
        return made


def run_meter(det: Any) -> temporalio.common.MetricMeter | None:
    """The worker's runtime meter (the SDK's extern function for ``workflow.metric_meter``:
    the meter of the runtime of the worker's client), or None."""
    get: Callable[[], temporalio.common.MetricMeter] | None = \
        det.extern_functions.get(sdk.METRIC_METER_EXTERN)
    return get() if get is not None else None


def _label(value: object) -> str:
    return value if isinstance(value, str) and _LABEL.match(value) else "other"


def _number(value: object, top: float) -> float | None:
    """A report's number in [0, top), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if 0 <= value < top else None


class RunMetrics:
    """One workflow run's session, counted on the worker's meter with the run's labels."""

    def __init__(self, meter: temporalio.common.MetricMeter | None,
                 info: temporalio.workflow.Info) -> None:
        self._metrics = _of(meter) if meter is not None else None
        self._labels: dict[str, str | int | float | bool] = {
            "namespace": info.namespace, "task_queue": info.task_queue,
            "workflow_type": info.workflow_type}

    def opened(self) -> None:
        if self._metrics is not None:
            self._metrics.opened.add(1, self._labels)

    def busy(self) -> None:
        if self._metrics is not None:
            self._metrics.busy.add(1, self._labels)

    def wait_timeout(self, wait: str) -> None:
        """A wait of the run's session (``room``, ``open``) ended on its backstop."""
        if self._metrics is not None:
            self._metrics.wait_timeouts.add(1, {**self._labels, "wait": wait})

    def call(self, seconds: float) -> None:
        if self._metrics is not None:
            self._metrics.latency.record(datetime.timedelta(seconds=seconds), self._labels)

    def ended(self, report: dict[str, Any] | None) -> None:
        """The session ended with ``report`` (None: the worker shut it down without one).
        Whether and when a session has ended is the run's proxy's to say
        (``worker._JailedInstance._note_end``, once per session); this counts how."""
        if self._metrics is None:
            return
        m, labels = self._metrics, self._labels
        if not isinstance(report, dict):
            m.ended.add(1, {**labels, "status": NO_REPORT})
            return
        m.ended.add(1, {**labels, "status": _label(report.get("status"))})
        violations = report.get("violations")
        by_category: dict[str, int] = {}
        for v in (violations if isinstance(violations, list) else [])[:MAX_REPORT_VIOLATIONS]:
            if not isinstance(v, dict):
                continue
            count = _number(v.get("count", 1), 2**32)
            category = _label(v.get("category"))
            by_category[category] = by_category.get(category, 0) + int(count or 1)
        for category, n in sorted(by_category.items()):
            m.violations.add(n, {**labels, "category": category})
        cpu_ms = _number(report.get("cpu_ms"), 10.0**12)
        if cpu_ms is not None:
            m.cpu.record(datetime.timedelta(milliseconds=cpu_ms), labels)
        rss_kb = _number(report.get("max_rss_kb"), 2.0**50)
        if rss_kb:
            m.memory.record(rss_kb / 1024.0, labels)


class ServerRestarts:
    """Relays a server's zygote restarts (its STATUS answer) to the meters of the workers
    that use it: each meter gets what the server counted since that meter last heard; and
    its lingering guests (a gauge, as STATUS said them last)."""

    def __init__(self, client: Client, policy: str) -> None:
        self._client = client
        self._policy = policy
        self._lock = threading.Lock()
        self._asked = 0.0
        self._heard: dict[int, tuple[_Instruments, int]] = {}  # id(meter) -> restarts heard

    def poll(self, meter: temporalio.common.MetricMeter | None, force: bool = False) -> None:
        """Asks the server (at most every STATUS_EVERY seconds, unless ``force``) and adds
        the restarts ``meter`` has not heard of. A server that does not answer (stopped,
        restarting) is asked again next time."""
        if meter is None:
            return
        instruments = _of(meter)
        with self._lock:
            now = time.monotonic()
            if not force and now - self._asked < STATUS_EVERY \
                    and id(meter) in self._heard:
                return
            self._asked = now
        try:
            status = self._client.status()
        except Exception:  # noqa: BLE001  (a metric never fails a workflow task)
            return
        doc = status if isinstance(status, dict) else {}
        lingering = _number(doc.get("lingering"), 2.0**31)
        if lingering is not None:
            instruments.lingering.set(int(lingering), {"policy": self._policy})
        count = _number(doc.get("zygote_restarts"), 2.0**63)
        with self._lock:
            _, heard = self._heard.get(id(meter), (instruments, 0))
            if count is None:
                # A server that does not count restarts (an older binary) is asked again
                # only after STATUS_EVERY, as one that does: not on every open.
                self._heard[id(meter)] = (instruments, heard)
                return
            self._heard[id(meter)] = (instruments, max(heard, int(count)))
            if count > heard:
                instruments.restarts.add(int(count) - heard, {"policy": self._policy})


_servers: dict[str, ServerRestarts] = {}
_servers_lock = threading.Lock()


def server_restarts(client: Client, policy: str) -> ServerRestarts:
    """The relay of the server at ``client``'s socket (one per server, whichever runners
    share it)."""
    with _servers_lock:
        relay = _servers.get(client.path)
        if relay is None or relay._client is not client:
            if len(_servers) >= 256:  # servers long stopped
                _servers.clear()
            relay = _servers[client.path] = ServerRestarts(client, policy)
        return relay
