"""`Greeting` with its steps in another order: replaying a history of the real one must fail
with a nondeterminism error, under JailedWorkflowRunner as in process."""

from datetime import timedelta

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from workflows import greet


@workflow.defn(name="Greeting")
class Greeting:
    @workflow.run
    async def run(self, name: str) -> str:
        await workflow.sleep(0.01)
        return await workflow.execute_activity(
            greet, name, start_to_close_timeout=timedelta(seconds=10))
