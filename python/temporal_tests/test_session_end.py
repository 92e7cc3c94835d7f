"""A run's session ends once in the worker's metrics, whichever of its paths tells of the
end (the activation that brought the report, the eviction's close, the closer's):
``_JailedInstance._note_end`` is the one place that knows whether it ended; ``RunMetrics``
only counts how. No server is needed (the meter is a real runtime's, read from its buffer):

    target/test-venv/bin/python -m unittest discover -s python/temporal_tests -k SessionEnd
"""

import unittest

from temporalio.runtime import MetricBuffer, Runtime, TelemetryConfig

from test_worker_trust import FakeSession, _det

from wfjail.temporal import metrics, worker


def _ended(buffer):
    """(status, value) of each wfjail_sessions_ended update since the last call."""
    return [(u.attributes.get("status"), u.value) for u in buffer.retrieve_updates()
            if u.metric.name == metrics.SESSIONS_ENDED]


class SessionEndTests(unittest.TestCase):
    def setUp(self):
        self.buffer = MetricBuffer(1000)
        self.meter = Runtime(telemetry=TelemetryConfig(metrics=self.buffer)).metric_meter

    def _instance(self, report):
        det = _det()
        session = FakeSession()
        session.report = report
        return worker._JailedInstance(session, det,
                                      run_metrics=metrics.RunMetrics(self.meter, det.info))

    def test_a_session_that_ended_is_counted_once_whatever_tells_of_it(self):
        inst = self._instance({"status": "ok"})
        inst._note_end(closed=False)  # the activation saw the report
        inst._note_end(closed=True)  # the eviction closed it
        inst._close()  # and the closer
        self.assertEqual(_ended(self.buffer), [("ok", 1)])

    def test_a_session_closed_without_a_report_is_counted_once_as_such(self):
        inst = self._instance(None)
        inst._note_end(closed=False)  # no report yet: not over
        self.assertEqual(_ended(self.buffer), [])
        inst._close()
        inst._note_end(closed=True)
        self.assertEqual(_ended(self.buffer), [(metrics.NO_REPORT, 1)])


if __name__ == "__main__":
    unittest.main()
