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
