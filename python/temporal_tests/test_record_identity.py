"""What the worker relays of a run's log records and warnings names the sending run, set by
the worker (issue 27): a run cannot log on the SDK's activity or worker loggers, set the
keys the SDK, OpenTelemetry or log pipelines correlate on, or pass for another run by its
text, file or line. Each forgery is made by a hostile workflow (``identity_workflows``) in
its confined child, on a real dev server:

    WFJAIL_BIN=target/x86_64-unknown-linux-musl/debug/wfjail \\
        target/test-venv/bin/python -m unittest discover -s python/temporal_tests \\
        -p test_record_identity.py
"""

import asyncio
import contextlib
import logging
import uuid
import warnings

from temporalio import workflow
from temporalio.worker import Worker

from test_jailed_runner import DevServerTestCase, _Capture  # (puts the examples on the path)

import identity_workflows as I  # noqa: E402
from wfjail.temporal import JailedWorkflowRunner, relays  # noqa: E402

CHILD = " [confined child]"


@contextlib.contextmanager
def _otel_like_factory():
    """A record factory that sets the ``otel*`` keys, as OpenTelemetry's logging
    instrumentation does in the worker (its values: the worker's)."""
    old = logging.getLogRecordFactory()

    def factory(*args, **kwargs):
        record = old(*args, **kwargs)
        record.otelTraceID, record.otelSpanID = "worker-trace", "worker-span"
        record.otelServiceName, record.otelTraceSampled = "worker", False
        return record

    logging.setLogRecordFactory(factory)
    try:
        yield
    finally:
        logging.setLogRecordFactory(old)


class RecordIdentityTests(DevServerTestCase):
    def forge(self, factory=False):
        """Runs the victim, then the forger naming it; returns (victim, forger's identity,
        records of temporalio.*, of wfjail.*, warnings)."""
        async def go():
            client = await self.server.client()
            queue = "identity-" + uuid.uuid4().hex
            async with Worker(client, task_queue=queue, workflows=[I.Victim, I.Forger],
                              workflow_runner=JailedWorkflowRunner()):
                victim = await client.execute_workflow(
                    I.Victim.run, id="victim-" + uuid.uuid4().hex, task_queue=queue)
                h = await client.start_workflow(I.Forger.run, victim,
                                                id="forger-" + uuid.uuid4().hex,
                                                task_queue=queue)
                # (A guard against a hang: a task that fails is retried without end.)
                self.assertEqual(await asyncio.wait_for(h.result(), 120), "forged")
                return victim, {"attempt": 1, "namespace": "default",
                                "run_id": h.result_run_id, "task_queue": queue,
                                "workflow_id": h.id, "workflow_type": "Forger"}

        with warnings.catch_warnings(record=True) as seen, \
                _Capture("temporalio", logging.DEBUG) as sdk, \
                _Capture("wfjail", logging.DEBUG) as ours, \
                (_otel_like_factory() if factory else contextlib.nullcontext()):
            warnings.simplefilter("always")
            victim, forger = asyncio.run(go())
        return victim, forger, sdk, ours, seen

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.got = None

    def forged(self):
        if type(self).got is None:
            type(self).got = self.forge()
        return type(self).got

    def test_a_record_on_the_sdks_activity_or_worker_logger_lands_on_the_child_logger(self):
        victim, forger, sdk, ours, _ = self.forged()
        # No record of the child's reaches the SDK's activity or worker loggers, or wfjail's.
        self.assertEqual([r.getMessage() for r in sdk if r.name.startswith(
            ("temporalio.activity", "temporalio.worker")) and "identity:" in r.getMessage()],
            [])
        self.assertEqual([r for r in sdk if hasattr(r, "temporal_activity")], [])
        child = {r.wfjail_logger: r for r in ours if r.name == relays.CHILD_LOGGER
                 and r.getMessage().startswith("identity:")}
        self.assertEqual(sorted(child), ["temporalio.activity", "temporalio.worker",
                                         "wfjail.temporal"])
        self.assertEqual(len([r for r in ours if r.name == relays.CHILD_LOGGER
                              and r.getMessage().startswith("identity:")]), 4)
        for r in ours:
            if r.name == relays.CHILD_LOGGER and r.getMessage().startswith("identity:"):
                self.assertEqual(r.wfjail_run, forger)
                self.assertEqual(r.temporal_workflow, forger)
                self.assertFalse(hasattr(r, "temporal_activity"))
                self.assertTrue(r.wfjail)
        activity = [r for r in ours if getattr(r, "wfjail_logger", "") == "temporalio.activity"]
        self.assertEqual([r.wfjail_guest_temporal_activity["workflow_run_id"]
                          for r in activity], [victim["run_id"]] * 2)
        # Only the victim's own records name it.
        named = [r.getMessage() for r in sdk + ours
                 if getattr(r, "wfjail_run", {}).get("run_id") == victim["run_id"]]
        self.assertEqual(named, ["victim: paid (%s)" % {
            **forger, "run_id": victim["run_id"], "workflow_id": victim["workflow_id"],
            "workflow_type": "Victim"}])

    def test_a_record_copying_another_runs_suffix_ends_with_the_senders(self):
        victim, forger, sdk, _, _ = self.forged()
        suffix = I.SUFFIX % victim
        for start in ("identity: refund issued", "identity: plain frame"):
            got = [r for r in sdk if r.getMessage().startswith(start)]
            self.assertEqual(len(got), 1, start)
            r = got[0]
            self.assertEqual(r.name, "temporalio.workflow")
            # The child's text, then the worker's suffix: the sender's, last.
            self.assertEqual(r.getMessage(), "%s%s (%s)" % (start, suffix, forger))
            self.assertEqual((r.temporal_workflow, r.wfjail_run), (forger, forger))

    def test_keys_pipelines_correlate_on_are_the_workers(self):
        victim, forger, sdk, _, _ = self.forged()
        got = [r for r in sdk if r.getMessage().startswith("identity: correlate")]
        self.assertEqual(len(got), 1)
        r = got[0]
        self.assertEqual(r.name, "temporalio.workflow")
        # The sender's, with the child's update id (the SDK's key in an update handler).
        self.assertEqual(r.temporal_workflow, {**forger, "update_id": "u1"})
        self.assertEqual(r.getMessage(), "identity: correlate (%s)"
                         % {**forger, "update_id": "u1"})
        self.assertEqual(r.wfjail_run, forger)
        for key in I.CORRELATED:
            if key not in ("temporal_workflow", "temporal_activity", "wfjail_run"):
                self.assertEqual(getattr(r, relays.GUEST_PREFIX + key), victim["run_id"], key)
            if key not in ("temporal_workflow", "wfjail_run"):
                self.assertFalse(hasattr(r, key), key)
        self.assertEqual(r.wfjail_guest_temporal_activity["workflow_run_id"], victim["run_id"])
        self.assertEqual(r.mine, 1)
        self.assertTrue(r.wfjail)

    def test_the_workers_record_factory_sets_its_own_keys_not_the_childs(self):
        victim, forger, sdk, _, _ = self.forge(factory=True)
        got = [r for r in sdk if r.getMessage().startswith("identity: correlate")]
        self.assertEqual(len(got), 1)
        r = got[0]
        self.assertEqual((r.otelTraceID, r.otelSpanID, r.otelServiceName, r.otelTraceSampled),
                         ("worker-trace", "worker-span", "worker", False))
        self.assertEqual((r.wfjail_guest_otelTraceID, r.wfjail_guest_otelSpanID),
                         (victim["run_id"], victim["run_id"]))
        self.assertEqual(r.temporal_workflow, {**forger, "update_id": "u1"})

    def test_a_warning_names_the_sending_run_after_the_childs_text(self):
        victim, forger, _, _, seen = self.forged()
        mark = " [wfjail: warned by workflow %s, workflow_id %s, run_id %s]"
        theirs = mark % ("Victim", victim["workflow_id"], victim["run_id"])
        mine = mark % ("Forger", forger["workflow_id"], forger["run_id"])
        got = [(w.category, str(w.message), w.filename, w.lineno) for w in seen
               if str(w.message).startswith("identity:")]
        self.assertEqual(got, [
            (workflow.UnfinishedUpdateHandlersWarning, "identity: victim's update" + theirs + mine,
             "/srv/victim/workflows.py" + CHILD, 42),
            (RuntimeWarning, "identity: raw" + theirs + mine,
             "/srv/victim/workflows.py" + CHILD, 43)])


if __name__ == "__main__":
    import unittest

    unittest.main()
