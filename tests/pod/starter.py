"""Run inside the pod's worker container by scripts/test-pod (`podman exec ... python -`, from
the worker's directory): waits for the dev server and the worker, starts the example's
workflows on the worker's task queue and checks what became of each. Exits 1 on any
mismatch; prints one line per workflow."""

import asyncio
import os
import sys
import uuid
from datetime import timedelta

from temporalio.client import Client, WorkflowFailureError
from temporalio.service import RPCError

import workflows
from starter import task_failure  # examples/temporal/starter.py, beside it in the image

QUEUE = "wfjail-example"
TARGET = "127.0.0.1:7233"
failures = []


def expect(name, got, ok):
    print("pod starter: %s -> %r: %s" % (name, got, "ok" if ok else "WRONG"), flush=True)
    if not ok:
        failures.append(name)


async def connect(wait=60.0):
    loop = asyncio.get_running_loop()
    end = loop.time() + wait
    while True:
        try:
            return await Client.connect(TARGET)
        except (RuntimeError, RPCError):
            if loop.time() > end:
                raise
            await asyncio.sleep(0.5)


async def main():
    client = await connect()

    async def run(wf, *args):
        # The run's timeout bounds a worker that never polls (it would hang the test).
        return await client.execute_workflow(wf, *args, id=str(uuid.uuid4()), task_queue=QUEUE,
                                             run_timeout=timedelta(seconds=60))

    got = await run(workflows.Greeting.run, "pod")
    expect("Greeting", got, got == "Hello, pod!")
    got = await run(workflows.Lucky.run)
    expect("Lucky", got, len(got) == 4 and all(isinstance(n, int) for n in got[:3]))
    got = [await run(workflows.Leaky.run, "a"), await run(workflows.Leaky.run, "b")]
    expect("Leaky, twice (a process per run)", got, got == [["a"], ["b"]])
    got = await run(workflows.Parent.run, "kid")
    expect("Parent", got, got == ["Hello, kid!", "Hello, local kid!"])
    handle = await client.start_workflow(workflows.Counter.run, id=str(uuid.uuid4()),
                                         task_queue=QUEUE, run_timeout=timedelta(seconds=60))
    await handle.signal(workflows.Counter.add, 2)
    await handle.signal(workflows.Counter.add, 3)
    query = await handle.query(workflows.Counter.value)
    update = await handle.execute_update(workflows.Counter.finish)
    got = [query, update, await handle.result()]
    expect("Counter (signals, query, update)", got, got == [5, 5, 5])
    for wf, word in ((workflows.Network, "socket"), (workflows.ReadFile, "/etc/hostname")):
        handle = await client.start_workflow(wf.run, id=str(uuid.uuid4()), task_queue=QUEUE)
        message = await task_failure(handle, wait=30.0)
        expect("%s (task fails, naming %s)" % (wf.__name__, word), message,
               message is not None and word in message)
        await handle.terminate()
    if failures:
        print("pod starter: FAILED: %s" % ", ".join(failures), flush=True)
        sys.exit(1)
    print("pod starter: all %d checks passed" % 7, flush=True)


status = 0
try:
    asyncio.run(main())
except WorkflowFailureError as e:
    print("pod starter: FAILED: a workflow failed: %s (%s)" % (e, e.cause), flush=True)
    status = 1
except SystemExit as e:
    status = int(e.code or 0)
# Not through the interpreter's finalization: the SDK's native client thread sometimes aborts
# it ("PyGILState_Release: thread state must be current", SIGABRT; 1 exit in 4 here), which
# says nothing about the workflows.
sys.stdout.flush()
sys.stderr.flush()
os._exit(status)
