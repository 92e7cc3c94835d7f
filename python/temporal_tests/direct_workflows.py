"""A workflow that reads the wall clock and draws randomness directly — what Temporal's
documentation forbids, because a replay would see other values. Under `temporal-python`
(virtual clock, seeded randomness) the jailed runner makes it replay anyway: its
`datetime.now()` is the activation's time and its `random`/`uuid4` come from the run's
randomness seed. Its activity id depends on `uuid4()`, so a replay that draws another value
fails with the SDK's nondeterminism error."""

import datetime
import random
import time
import uuid
from datetime import timedelta

from temporalio import workflow


@workflow.defn
class Direct:
    @workflow.run
    async def run(self) -> list:
        utc = datetime.timezone.utc
        drawn = [datetime.datetime.now(utc).isoformat(), random.random(), str(uuid.uuid4())]
        first = _same_time()
        await workflow.execute_activity("greet", "direct", activity_id="greet-" + drawn[2],
                                        start_to_close_timeout=timedelta(seconds=30))
        return drawn + [first, _same_time()]


def _same_time():
    """The wall clock reads the activation's time to the nanosecond, and `datetime.now()`
    is `workflow.now()` (to the microsecond: the SDK's `now()` goes through a float, which
    may round the last microsecond the other way)."""
    exact = time.time_ns() == workflow.time_ns()
    apart = abs(datetime.datetime.now(datetime.timezone.utc) - workflow.now())
    return exact and apart <= timedelta(microseconds=1)


@workflow.defn
class SetOrder:
    """Schedules one activity per name in the order a `set` iterates them: an order that
    depends on Python's hash seed, which `check_determinism` perturbs."""

    @workflow.run
    async def run(self) -> list:
        names = {"alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta"}
        for name in names:
            await workflow.execute_activity("greet", name, activity_id="greet-" + name,
                                            start_to_close_timeout=timedelta(seconds=30))
        return list(names)
