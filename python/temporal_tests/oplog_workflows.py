"""Workflows of test_oplog.py: one that writes on its stderr and fails its task (so that each
retry replays it in a new confined session, which writes the same line again)."""

import sys

from temporalio import workflow


@workflow.defn
class PrintsThenFails:
    @workflow.run
    async def run(self) -> str:
        print("oplog: a line of %s\x1b[31m" % workflow.info().workflow_id, file=sys.stderr)
        raise RuntimeError("oplog: this task fails (the worker retries it)")
