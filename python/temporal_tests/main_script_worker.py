"""A worker written as many Temporal examples are: the workflow class in the script it runs
(``python main_script_worker.py TARGET QUEUE``), its start under the ``__main__`` guard. It
runs one workflow jailed and prints its result."""

import asyncio
import sys

from temporalio import workflow
from temporalio.client import Client
from temporalio.worker import Worker

from wfjail.temporal import JailedWorkflowRunner


@workflow.defn
class ScriptGreeting:
    @workflow.run
    async def run(self, name: str) -> str:
        return "hello %s from %s" % (name, __name__)


async def main(target: str, queue: str) -> None:
    client = await Client.connect(target)
    async with Worker(client, task_queue=queue, workflows=[ScriptGreeting],
                      workflow_runner=JailedWorkflowRunner()):
        print(await client.execute_workflow(ScriptGreeting.run, "script", id=queue,
                                            task_queue=queue))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
