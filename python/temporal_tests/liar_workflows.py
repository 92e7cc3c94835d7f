"""A workflow that lies to its worker from inside its confined child: it reaches into the
child-side wfjail code and sends what the worker must not believe (forged log lines and
escapes, metric records under the worker's names, another workflow's labels, values no
metric takes)."""

from temporalio import workflow


@workflow.defn
class Liar:
    @workflow.run
    async def run(self) -> str:
        from wfjail import guest
        from wfjail.temporal import child as child_side

        guest.log("lied\n2026-12-01 ERROR temporalio.worker forged record\x1b]0;owned\x07", 20)
        child_side._metric_records.extend([
            ["gauge", "temporal_workflow_completed", "forged-by-liar", None, 5, {}],
            ["counter", "liar_huge", "forged-by-liar", None, 2**64, {}],
            ["histogram_float", "liar_inf", "forged-by-liar", None, float("inf"), {}],
            ["counter", "liar_ok", None, None, 1, {"workflow_type": "Victim",
                                                   "namespace": "elsewhere"}],
        ])
        return "lied"
