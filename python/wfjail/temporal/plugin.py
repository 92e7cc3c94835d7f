"""``JailedPlugin``: a Temporal worker plugin that runs the worker's workflows jailed and lets
the Worker poll only once their server runs; a worker whose server cannot start fails to
start, with the reason."""

from __future__ import annotations

from typing import Any, Awaitable, Callable

import temporalio.worker

from ..binary import find_wfjail
from .worker import JailedWorkflowRunner, ReadyFirst, _Plugin, _ready

# ``ReadyFirst`` (the step a runner adds to its Worker's run) lives beside the runner, which
# makes it: re-exported here, where it was.
__all__ = ["JailedPlugin", "ReadyFirst"]


class JailedPlugin(_Plugin):
    """Sets each Worker's (and Replayer's) ``workflow_runner`` to a ``JailedWorkflowRunner``
    made with ``runner_options`` (one per Worker: its servers are shared per process and
    configuration), unless the Worker was given one already; and, when the Worker runs,
    awaits ``runner.ready()`` (off the event loop) before the Worker polls: ``Worker.run()``
    (or ``async with worker``) raises ``ServerNotReady`` when the binary is missing, the
    policy does not load or a zygote cannot import a workflow's module.

        worker = Worker(client, task_queue="q", workflows=[...], plugins=[JailedPlugin()])
    """

    def __init__(self, **runner_options: Any) -> None:
        # A missing binary is refused here, as JailedWorkflowRunner() refuses it: before any
        # Worker is made with the plugin (``WfjailNotFound``, naming where it looked).
        find_wfjail(runner_options.get("wfjail"))
        self._options = runner_options

    def configure_worker(self, config: temporalio.worker.WorkerConfig,
                         ) -> temporalio.worker.WorkerConfig:
        if not isinstance(config.get("workflow_runner"), JailedWorkflowRunner):
            config["workflow_runner"] = JailedWorkflowRunner(**self._options)
        return config

    async def run_worker(self, worker: temporalio.worker.Worker,
                         next: Callable[[temporalio.worker.Worker], Awaitable[None]]) -> None:
        runner = worker.config(active_config=True).get("workflow_runner")
        if isinstance(runner, JailedWorkflowRunner):
            await _ready(worker, runner)
        await next(worker)

    def configure_replayer(self, config: temporalio.worker.ReplayerConfig,
                           ) -> temporalio.worker.ReplayerConfig:
        if not isinstance(config.get("workflow_runner"), JailedWorkflowRunner):
            config["workflow_runner"] = JailedWorkflowRunner(**self._options)
        return config
