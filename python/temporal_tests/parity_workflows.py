"""Workflows of test_parity.py: what the worker shows of a confined run (a failure's stack,
storage contexts, a refused read) must match what the SDK shows in process."""

import decimal
from datetime import timedelta

import pydantic
from temporalio import activity, workflow


class Order(pydantic.BaseModel):
    """A pydantic model with a Decimal: the default JSON converter cannot encode it."""

    item: str
    price: decimal.Decimal


@workflow.defn
class Priced:
    """Takes and returns a pydantic model (pydantic_data_converter's payloads)."""

    @workflow.run
    async def run(self, order: Order) -> Order:
        await workflow.sleep(0.01)
        return Order(item=order.item.upper(), price=order.price * 2)


# -- denied calls: the failure's stack trace shows where (each marked "# denied here") -------


@workflow.defn
class SwallowedSocket:
    """Opens a socket and swallows the error: the task fails all the same, at this line."""

    @workflow.run
    async def run(self) -> str:
        import socket

        try:
            socket.create_connection(("127.0.0.1", 7233), timeout=1)  # denied here
        except OSError:
            pass
        return "pretended it worked"


@workflow.defn
class StartsThread:
    """Starts a thread (no audit event: the stack is the workflow's own failure's)."""

    @workflow.run
    async def run(self) -> str:
        import threading

        threading.Thread(target=print).start()  # denied here
        return "started"


@workflow.defn
class RunsProgram:
    """Runs a program through C (posix.system), in a helper function."""

    @workflow.run
    async def run(self) -> int:
        return _system()


def _system() -> int:
    import posix

    return posix.system("true")  # denied here


@workflow.defn
class WritesFile:
    """Writes a file outside the policy, swallowing the error."""

    @workflow.run
    async def run(self) -> str:
        try:
            with open("/tmp/wfjail-parity-write", "w"):  # denied here
                pass
        except OSError:
            pass
        return "wrote nothing"
