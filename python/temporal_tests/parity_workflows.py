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


# -- denied calls: the failure's stack trace shows where (each marked "# denied here"; the
# example's Network and Thread workflows too) --------------------------------------------


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


# -- external payload storage: each payload here is over the test's size threshold ----------

BIG = 100


@activity.defn
async def echo(text: str) -> str:
    return text


@workflow.defn
class StoreChild:
    """Waits for a signal; its result is stored for its parent."""

    def __init__(self) -> None:
        self.poked = ""

    @workflow.signal
    def poke(self, text: str) -> None:
        self.poked = text

    @workflow.run
    async def run(self, text: str) -> str:
        await workflow.wait_condition(lambda: bool(self.poked))
        return "child " + text[:1] * BIG + self.poked[:1]


@workflow.defn
class StoreParent:
    """An activity, a child workflow, a signal to it: each with a payload stored."""

    @workflow.run
    async def run(self, text: str) -> str:
        echoed = await workflow.execute_activity(
            echo, "a" * BIG, start_to_close_timeout=timedelta(seconds=30))
        child = await workflow.start_child_workflow(
            StoreChild.run, "c" * BIG, id=workflow.info().workflow_id + "-child")
        await child.signal(StoreChild.poke, "s" * BIG)
        return "%s %s %s" % (text[:1], echoed[:1], await child)


@workflow.defn
class ReadsFile:
    """Reads the file it is given (and lets the error fail the task)."""

    @workflow.run
    async def run(self, path: str) -> str:
        with open(path) as f:
            return f.read()
