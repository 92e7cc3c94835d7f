"""Workflows, interceptors, converters and patch activation callbacks made inside functions,
as Temporal's contrib plugins make theirs: JailedWorkflowRunner sends them to the confined
child by value (test_byvalue.py)."""

import asyncio
import os
import threading
from datetime import timedelta

from temporalio import activity, workflow
from temporalio.converter import DefaultPayloadConverter
from temporalio.worker import Interceptor, WorkflowInboundInterceptor


@activity.defn
async def shout(text: str) -> str:
    return text.upper()


@workflow.defn
class Tagged:
    """Returns what the run's interceptor tagged, the payload converter's class and the pid
    of the process it ran in."""

    @workflow.run
    async def run(self, text: str) -> dict:
        converter = workflow.payload_converter()
        converter = getattr(converter, "_inner_payload_converter", converter)  # the SDK's wrapper
        return {"tag": getattr(workflow.instance(), "tag", None), "text": text,
                "converter": type(converter).__name__, "pid": os.getpid()}


@workflow.defn
class Patched:
    """Whether ``workflow.patched("my-patch")`` activated the patch."""

    @workflow.run
    async def run(self) -> bool:
        return workflow.patched("my-patch")


@workflow.defn
class Traced:
    """A workflow that calls an activity (the plugins' trace context crosses to it)."""

    @workflow.run
    async def run(self, text: str) -> str:
        return await workflow.execute_activity(shout, text,
                                               start_to_close_timeout=timedelta(seconds=10))


class TaggingInterceptor(Interceptor):
    """As ``temporalio.contrib``'s plugins do: the workflow interceptor class is made in the
    method, with an attribute taken from this instance."""

    def __init__(self, tag: str) -> None:
        self.tag = tag

    def workflow_interceptor_class(self, input):
        tag = self.tag

        class TagInbound(WorkflowInboundInterceptor):
            async def execute_workflow(self, input):
                workflow.instance().tag = "%s (in %s)" % (tag, type(self).__name__)
                return await super().execute_workflow(input)

        return TagInbound


class LockedInterceptor(Interceptor):
    """A workflow interceptor class made in a function whose attribute cannot be pickled."""

    def workflow_interceptor_class(self, input):
        class LockedInbound(WorkflowInboundInterceptor):
            lock = threading.Lock()

        return LockedInbound


def converter_class():
    """A payload converter class made in a function."""

    class LocalConverter(DefaultPayloadConverter):
        pass

    return LocalConverter


def deciding(decision):
    """A patch activation callback made in a function (a closure: it goes by value)."""

    def callback(input) -> bool:
        return decision

    return callback


def not_a_bool(input):
    return "not a bool"


def upserting_memo(input):
    workflow.upsert_memo({"foo": "bar"})
    return True


def drawing_random(input):
    workflow.random().random()
    return True


def scheduling_a_task(input):
    asyncio.get_running_loop().call_soon(lambda: None)
    return True


def reading_info(seen):
    """A callback that reads the run's info (allowed in the read-only context)."""

    def callback(input) -> bool:
        info = workflow.info()
        seen.append((info.workflow_id, info.workflow_type))
        return True

    return callback


def raising(input):
    raise ValueError("flag service down")


def recording(calls, decision):
    """A callback that records its calls in the worker's memory (``calls``)."""

    def callback(input) -> bool:
        calls.append((input.workflow_info.workflow_id, input.patch_id))
        return decision

    return callback


def locked_recording(calls, decision):
    """``recording``, but it cannot be pickled (it holds a lock)."""
    lock = threading.Lock()
    record = recording(calls, decision)

    def callback(input) -> bool:
        with lock:
            return record(input)

    return callback
