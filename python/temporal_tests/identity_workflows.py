"""Workflows that claim another run's identity in what the worker relays of them
(``test_record_identity``): records on the SDK's activity and worker loggers, a record
copying another run's identity suffix, an ``extra`` setting the keys log pipelines
correlate on, and warnings carrying another run's file, line and text."""

import json
import logging
import warnings

from temporalio import workflow

# Another run's identity, in the SDK's suffix form (``Info._logger_details``).
SUFFIX = " ({'attempt': 1, 'namespace': 'default', 'run_id': '%(run_id)s', " \
    "'task_queue': '%(task_queue)s', 'workflow_id': '%(workflow_id)s', " \
    "'workflow_type': 'Victim'})"
# The keys of ``extra`` a forger sets to the victim's values.
CORRELATED = ("otelTraceID", "otelSpanID", "otelServiceName", "otelTraceSampled", "trace_id",
              "span_id", "run_id", "workflow_id", "temporal_workflow", "temporal_activity",
              "workflow_type", "namespace", "task_queue", "wfjail_run", "wfjail_logger",
              "wfjail_guest_mine")


@workflow.defn
class Victim:
    """An honest run: its identity is what the forger claims."""

    @workflow.run
    async def run(self) -> dict:
        info = workflow.info()
        workflow.logger.info("victim: paid")
        return {"workflow_id": info.workflow_id, "run_id": info.run_id,
                "task_queue": info.task_queue}


@workflow.defn
class Forger:
    """Claims the victim's identity on every route the worker relays."""

    @workflow.run
    async def run(self, victim: dict) -> str:
        from wfjail import guest
        from wfjail.temporal import relays

        suffix = SUFFIX % victim
        activity = {"activity_id": "1", "activity_type": "charge", "attempt": 1,
                    "namespace": "default", "task_queue": victim["task_queue"],
                    "workflow_id": victim["workflow_id"], "workflow_run_id": victim["run_id"],
                    "workflow_type": "Victim"}
        # 1. On the SDK's activity logger (a raw frame, and through logging), on the
        #    worker's and on wfjail's own loggers.
        guest.log(relays.RECORD_MARK + json.dumps({
            "name": "temporalio.activity", "level": 30,
            "msg": "identity: charged card ({'activity_id': '1'})",
            "extra": {"temporal_activity": activity}}), 30)
        logging.getLogger("temporalio.activity").warning(
            "identity: activity logger", extra={"temporal_activity": activity})
        logging.getLogger("temporalio.worker").error("identity: worker logger")
        logging.getLogger("wfjail.temporal").error("identity: wfjail logger")
        # 2. On the workflow logger, no temporal_workflow, the victim's suffix as text.
        logging.getLogger("temporalio.workflow").info("identity: refund issued" + suffix)
        guest.log("identity: plain frame" + suffix, 20)
        # 3. The keys pipelines correlate on, set to the victim's.
        workflow.logger.info("identity: correlate", extra={
            **{k: victim["run_id"] for k in CORRELATED},
            "temporal_workflow": {"workflow_id": victim["workflow_id"],
                                  "run_id": victim["run_id"], "update_id": "u1"},
            "temporal_activity": activity, "mine": 1})
        # 4. Warnings with the victim's file, line and text; one copies the worker's mark.
        mark = " [wfjail: warned by workflow Victim, workflow_id %s, run_id %s]" % (
            victim["workflow_id"], victim["run_id"])
        warnings.warn_explicit("identity: victim's update" + mark,
                               workflow.UnfinishedUpdateHandlersWarning,
                               "/srv/victim/workflows.py", 42, module="victim")
        guest.upcall(relays.WARNING_MARK + json.dumps({
            "category": "builtins:RuntimeWarning", "message": "identity: raw" + mark,
            "filename": "/srv/victim/workflows.py", "lineno": 43,
            "module": "victim"}).encode())
        return "forged"
