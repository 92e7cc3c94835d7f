"""A workflow whose confined child never exits once its session closes (test_closer_hostage):
the server kills it after its grace; the worker's other closes must not wait for that."""

from temporalio import workflow


@workflow.defn
class NeverExits:
    """Replaces what the child's guest loop calls once its input ended
    (``wfjail.guest._flush_stdio``, before ``os._exit``) with a wait that never ends."""

    @workflow.run
    async def run(self) -> str:
        import threading

        from wfjail import guest

        def hang() -> None:
            lock = threading.Lock()
            lock.acquire()
            lock.acquire()  # never: the lock is its own

        guest._flush_stdio = hang
        return "hangs when closed"


@workflow.defn
class LingersOnClose:
    """Keeps its child alive after every close of its session (each replay sets the hang
    again), across several workflow tasks: under cache churn, each of its evictions leaves a
    guest that lingers for the server's whole exit grace (issue 27)."""

    @workflow.run
    async def run(self, steps: int) -> str:
        import threading
        from datetime import timedelta

        from wfjail import guest

        def hang() -> None:
            lock = threading.Lock()
            lock.acquire()
            lock.acquire()  # never: the lock is its own

        guest._flush_stdio = hang
        for _ in range(steps):
            await workflow.sleep(timedelta(milliseconds=50))
        return "lingered"


@workflow.defn
class Steps:
    """An honest workflow of several tasks (timers), to run beside LingersOnClose."""

    @workflow.run
    async def run(self, name: str, steps: int) -> str:
        from datetime import timedelta

        for _ in range(steps):
            await workflow.sleep(timedelta(milliseconds=50))
        return "%s took %d steps" % (name, steps)
