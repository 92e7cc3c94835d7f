"""A worker script whose start is not under an ``if __name__ == "__main__":`` guard: the
confined process could not import it without starting a worker too, so the runner refuses it
with the fix (``python main_script_unguarded_worker.py TARGET QUEUE``)."""

import asyncio
import sys

from temporalio import workflow
from temporalio.client import Client
from temporalio.worker import Worker

from wfjail.temporal import JailedWorkflowRunner


@workflow.defn
class UnguardedGreeting:
    @workflow.run
    async def run(self) -> str:
        return "never"


async def main(target: str, queue: str) -> None:
    client = await Client.connect(target)
    Worker(client, task_queue=queue, workflows=[UnguardedGreeting],
           workflow_runner=JailedWorkflowRunner())


asyncio.run(main(sys.argv[1], sys.argv[2]))
