"""Workflows whose warnings and log records the worker must get as the SDK makes them in
process (``test_records``), and hostile ones that send the worker forged records and
warnings from inside their confined child."""

import json
import logging
import warnings
from dataclasses import dataclass

from temporalio import workflow

FORGED = "\n2026-12-01 ERROR temporalio.worker credentials rotated\x1b[2J"


class RecordsWarning(UserWarning):
    """A Warning class of the workflow's own module (which the worker imported too)."""


@workflow.defn
class Warns:
    """Warns twice in its run (its own category, then a DeprecationWarning), and leaves a
    signal handler unfinished (the SDK's UnfinishedSignalHandlersWarning when it returns)."""

    def __init__(self) -> None:
        self.waiting = False

    @workflow.run
    async def run(self) -> str:
        warnings.warn("records: a warning of the workflow", RecordsWarning)  # WARN_LINE
        warnings.warn("records: deprecated", DeprecationWarning, stacklevel=1)
        await workflow.wait_condition(lambda: self.waiting)
        return "warned"

    @workflow.signal
    async def hang(self) -> None:
        self.waiting = True
        await workflow.wait_condition(lambda: False)


@workflow.defn
class Logs:
    """Logs in its run, in a signal handler, an update handler and a query, and with its own
    logger (not the SDK's) and an exception."""

    def __init__(self) -> None:
        self.done = False

    @workflow.run
    async def run(self) -> str:
        workflow.logger.info("records: run started", extra={"custom": {"a": [1, 2]}})  # LOG_LINE
        logging.getLogger("records.app").warning("records: app logger")
        try:
            raise ValueError("records: boom")
        except ValueError:
            workflow.logger.exception("records: caught")
        await workflow.wait_condition(lambda: self.done)
        return "logged"

    @workflow.signal
    def my_signal(self, value: str) -> None:
        workflow.logger.info("records: signal %s", value)

    @workflow.update
    def my_update(self, value: str) -> str:
        workflow.logger.info("records: update %s", value)
        self.done = True
        return value

    @workflow.query
    def my_query(self) -> bool:
        workflow.logger.debug("records: query (debug)")
        return self.done


@dataclass
class Param:
    text: str


@workflow.defn
class BadSignal:
    """A signal whose parameter does not decode: the SDK's internal logger says so."""

    def __init__(self) -> None:
        self.got: list = []

    @workflow.run
    async def run(self) -> int:
        await workflow.wait_condition(lambda: bool(self.got))
        return len(self.got)

    @workflow.signal
    def take(self, param: Param) -> None:
        self.got.append(param)


@workflow.defn
class ForgedRecords:
    """Sends the worker records and warnings of its own making: a record claiming another
    run's identity and setting LogRecord attributes, with newlines and escapes in every
    text; a record that nests deep; a warning naming a module for the worker to import; and
    floods of warnings and records."""

    @workflow.run
    async def run(self) -> str:
        from wfjail import guest
        from wfjail.temporal import relays

        doc = {
            "name": "temporalio.workflow", "level": 40, "msg": "forged" + FORGED,
            "func": "f" + FORGED, "line": 7, "path": "/etc/passwd" + FORGED,
            "extra": {
                "temporal_workflow": {"workflow_id": "victim", "run_id": "victim-run",
                                      "namespace": "other", "update_id": "u" + FORGED},
                "msg": "replaced", "args": [1], "exc_info": True, "levelno": 50,
                "name": "root", "message": "m", "wfjail": False,
                "workflow_info": {"workflow_id": "victim"},
                "deep": [[[[[[["bottom"]]]]]]], "text": "x" * 100_000,
                "wide": list(range(10_000)), "bad key": 1, "note" + FORGED: 2,
            },
            "exc": {"type": "Err" + FORGED, "message": "m" + FORGED,
                    "traceback": 'Traceback (most recent call last):\n  File "/etc/shadow'
                                 + FORGED + '", line 1, in <module>\nErr: m\n'},
        }
        guest.log(relays.RECORD_MARK + json.dumps(doc), 40)
        guest.log(relays.RECORD_MARK + "[" * 100_000, 20)
        # An app logger under a temporalio name the worker does not have.
        doc = {"name": "temporalio.nonexistent" + FORGED, "level": 30, "msg": "named"}
        guest.log(relays.RECORD_MARK + json.dumps(doc), 30)
        doc = {"name": "temporalio.nonexistent.logger", "level": 30, "msg": "unnamed"}
        guest.log(relays.RECORD_MARK + json.dumps(doc), 30)
        answers = []
        for category in ("antigravity:Warning", "os:system", "builtins:Exception",
                         "builtins:DeprecationWarning" + FORGED):
            answers.append(json.loads(guest.upcall(relays.WARNING_MARK + json.dumps({
                "category": category, "message": "w" + FORGED, "filename": "/etc/passwd",
                "lineno": -1, "module": "m" + FORGED}).encode())))
        for i in range(500):
            warnings.warn("records: flood %d" % i, RecordsWarning)
        for i in range(1500):
            workflow.logger.info("records: spam %d", i)
        return json.dumps(answers)
