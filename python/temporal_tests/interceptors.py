"""An interceptor with an extern function: workflow code (in the confined child) calls a
function that runs in the worker."""

from temporalio import workflow
from temporalio.worker import Interceptor, WorkflowInboundInterceptor

RECORDED = []


def _record(text):
    RECORDED.append(text)
    return len(RECORDED)


class RecordingInterceptor(Interceptor):
    def workflow_interceptor_class(self, input):
        input.unsafe_extern_functions["record"] = _record
        return _Inbound


class _Inbound(WorkflowInboundInterceptor):
    async def execute_workflow(self, input):
        n = workflow.extern_functions()["record"]("started " + workflow.info().workflow_type)
        result = await super().execute_workflow(input)
        if isinstance(result, str):
            result = "%s (record %d)" % (result, n)
        return result
