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
