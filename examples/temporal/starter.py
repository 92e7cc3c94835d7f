"""Starts the example's workflows and prints what became of each: the clean ones complete,
each misbehaving one fails its workflow task with what wfjail denied.

    .venv/bin/python examples/temporal/starter.py [HOST:PORT]
"""

import asyncio
import os
import sys
import uuid

from temporalio.client import Client

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import workflows  # noqa: E402

QUEUE = "wfjail-example"


async def task_failure(handle, wait=5.0):
    """The first workflow task failure of a run, waiting up to `wait` seconds for it."""
    loop = asyncio.get_running_loop()
    end = loop.time() + wait
    while loop.time() < end:
        async for e in handle.fetch_history_events():
            if e.HasField("workflow_task_failed_event_attributes"):
                return e.workflow_task_failed_event_attributes.failure.message
        await asyncio.sleep(0.2)
    return None


async def main(target):
    client = await Client.connect(target)
    run = lambda wf, *args: client.execute_workflow(wf, *args, id=str(uuid.uuid4()), task_queue=QUEUE)  # noqa: E731
    print("Greeting:", await run(workflows.Greeting.run, "wfjail"))
    print("Lucky:", await run(workflows.Lucky.run))
    print("Leaky, twice:", await run(workflows.Leaky.run, "a"), await run(workflows.Leaky.run, "b"))
    print("Parent:", await run(workflows.Parent.run, "kid"))
    print("Unrestricted (permissive policy, reported on the worker):",
          await run(workflows.Unrestricted.run))
    for wf in (workflows.Network, workflows.Thread, workflows.ReadFile, workflows.Subprocess,
               workflows.Sqlite):
        handle = await client.start_workflow(wf.run, id=str(uuid.uuid4()), task_queue=QUEUE)
        message = await task_failure(handle)
        print("%s: task failed: %s" % (wf.__name__, message))
        await handle.terminate()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1:7233"))
