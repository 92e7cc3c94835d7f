"""The worker's view of a confined run matches the SDK's in process (issue 18): a failure's
stack trace in the history, external storage contexts, check_determinism with the worker's
data converter, a refused read that names the policy. On a real dev server, as
test_jailed_runner.py:

    WFJAIL_BIN=target/x86_64-unknown-linux-gnu/debug/wfjail \\
        target/test-venv/bin/python -m unittest discover -s python/temporal_tests -k parity
"""

import asyncio
import decimal
import unittest
import uuid

from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Worker

from test_jailed_runner import DevServerTestCase
from wfjail.temporal import JailedWorkflowRunner, check_determinism

import parity_workflows as P


class ParityTests(DevServerTestCase):
    def test_check_determinism_replays_with_the_workers_data_converter(self):
        async def go():
            client = await self.server.client()
            client = client.__class__(**{**client.config(),
                                         "data_converter": pydantic_data_converter})
            queue = "priced-" + uuid.uuid4().hex
            wid = str(uuid.uuid4())
            async with Worker(client, task_queue=queue, workflows=[P.Priced],
                              workflow_runner=JailedWorkflowRunner()):
                result = await client.execute_workflow(
                    P.Priced.run, P.Order(item="tea", price=decimal.Decimal("1.10")),
                    id=wid, task_queue=queue)
            history = await client.get_workflow_handle(wid).fetch_history()
            checked = await check_determinism([history], [P.Priced],
                                              data_converter=pydantic_data_converter)
            # Without the worker's converter the input does not decode: each replay fails.
            unchecked = await check_determinism([history], [P.Priced], runs=1)
            return result, checked, unchecked

        result, checked, unchecked = asyncio.run(go())
        self.assertEqual(result, P.Order(item="TEA", price=decimal.Decimal("2.20")))
        self.assertEqual([r.perturbation for r in checked],
                         ["as given", "PYTHONHASHSEED=1001", "address layout randomised"])
        self.assertEqual([r.failure for r in checked], [None, None, None], checked)
        self.assertEqual(len(unchecked), 1)
        self.assertIsNotNone(unchecked[0].failure)

    def test_check_determinism_refuses_an_option_nobody_takes(self):
        with self.assertRaisesRegex(TypeError, "neither Replayer nor JailedWorkflowRunner.*"
                                    "data_convertor"):
            asyncio.run(check_determinism([], [P.Priced], data_convertor=None))


if __name__ == "__main__":
    unittest.main()
