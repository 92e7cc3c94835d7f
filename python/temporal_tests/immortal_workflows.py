"""Workflows of test_immortal: a module-level object the zygote preloads (its warm-up imports
this module), what a run sees of its reference count, and a run that stays open (cached)."""

import sys

from temporalio import workflow

# Preloaded by the zygote: on Python >= 3.12 made immortal there before any fork.
SHARED = {"greeting": "hello", "names": ["a", "b", "c"]}


@workflow.defn
class SharedRefcount:
    """Takes references to SHARED across two activations and returns its refcount each time."""

    @workflow.run
    async def run(self) -> list:
        held = [SHARED, SHARED, SHARED]
        first = sys.getrefcount(SHARED)
        await workflow.sleep(0.01)  # a second activation, in the same child
        held.extend([SHARED] * 10)
        return [first, sys.getrefcount(SHARED), len(held), SHARED["greeting"]]


@workflow.defn
class Held:
    """Stays open (a cached run) until ``finish``; answers ``seen`` from SHARED meanwhile."""

    def __init__(self) -> None:
        self.done = False
        self.count = 0

    @workflow.run
    async def run(self) -> int:
        await workflow.wait_condition(lambda: self.done)
        return self.count

    @workflow.signal
    def add(self, n: int) -> None:
        self.count += n + len(SHARED["names"])

    @workflow.signal
    def finish(self) -> None:
        self.done = True

    @workflow.query
    def seen(self) -> int:
        return self.count
