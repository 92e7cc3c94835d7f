"""The workflow of test_immortal: a module-level object the zygote preloads (its warm-up
imports this module) and what a run sees of its reference count."""

import sys

from temporalio import workflow

# Preloaded by the zygote: on Python >= 3.12 made immortal there before any fork.
SHARED = {"greeting": "hello"}


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
