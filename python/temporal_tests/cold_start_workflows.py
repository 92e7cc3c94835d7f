"""Workflows of test_cold_start.py and scripts/bench-cold-start: one that completes in its
first activation, and one that stays open (cached) until signalled."""

from temporalio import workflow


@workflow.defn
class OneActivation:
    @workflow.run
    async def run(self, name: str) -> str:
        return "cold " + name


@workflow.defn
class WaitsForSignal:
    def __init__(self) -> None:
        self._go = False

    @workflow.signal
    def go(self) -> None:
        self._go = True

    @workflow.run
    async def run(self, n: int) -> int:
        await workflow.wait_condition(lambda: self._go)
        return n
