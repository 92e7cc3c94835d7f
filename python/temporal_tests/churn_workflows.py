"""Workflows of test_cache_churn: runs that stay open, each waiting for its signals, so that
a small cache evicts and reopens them over and over."""

from temporalio import workflow


@workflow.defn
class Tally:
    """Adds up ``expect`` signals, then returns the sum."""

    def __init__(self) -> None:
        self.total = 0
        self.seen = 0

    @workflow.run
    async def run(self, expect: int) -> int:
        await workflow.wait_condition(lambda: self.seen >= expect)
        return self.total

    @workflow.signal
    def add(self, n: int) -> None:
        self.total += n
        self.seen += 1

    @workflow.query
    def seen_count(self) -> int:
        return self.seen
