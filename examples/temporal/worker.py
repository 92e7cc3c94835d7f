"""A Temporal worker whose workflows run confined: the one changed argument is
`workflow_runner=JailedWorkflowRunner()`.

    .venv/bin/python examples/temporal/worker.py [HOST:PORT]
"""

import asyncio
import os
import sys

from temporalio.client import Client
from temporalio.worker import Worker

from wfjail.temporal import JailedWorkflowRunner

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import workflows  # noqa: E402


async def main(target):
    client = await Client.connect(target)
    worker = Worker(
        client,
        task_queue="wfjail-example",
        workflows=[workflows.Greeting, workflows.Counter, workflows.Lucky, workflows.Leaky,
                   workflows.Parent, workflows.Again, workflows.Unrestricted,
                   workflows.Network, workflows.Thread, workflows.ReadFile,
                   workflows.Subprocess, workflows.Sqlite],
        activities=[workflows.greet],
        workflow_runner=JailedWorkflowRunner(),  # the one line
    )
    print("worker running on task queue wfjail-example (Ctrl-C to stop)", flush=True)
    await worker.run()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1:7233"))
