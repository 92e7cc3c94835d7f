"""Warnings and log records of confined workflow code reach the worker as the SDK's would in
process (issue 18): through the worker's ``warnings`` machinery during the activation, and
as records of the same-named loggers with the SDK's ``extra``, one line per record; and what
a hostile child sends of them is bounded and escaped. On a real dev server:

    WFJAIL_BIN=target/x86_64-unknown-linux-musl/debug/wfjail \\
        target/test-venv/bin/python -m unittest discover -s python/temporal_tests -k Records
"""

import asyncio
import json
import logging
import sys
import types
import unittest
import uuid
import warnings

from temporalio import workflow
from temporalio.worker import Worker

from test_jailed_runner import DevServerTestCase, _Capture  # (puts the examples on the path)

import records_workflows as R  # noqa: E402
import workflows as W  # noqa: E402
from starter import task_failure  # noqa: E402  (the example's own helper)
from wfjail.temporal import JailedWorkflowRunner, relays  # noqa: E402

CHILD = " [confined child]"


def _line_of(marker):
    """The line of ``records_workflows.py`` that ends with the comment ``# marker``."""
    with open(R.__file__) as f:
        for n, line in enumerate(f, 1):
            if line.rstrip().endswith("# " + marker):
                return n
    raise AssertionError(marker)


class RecordsTests(DevServerTestCase):
    def jailed(self, workflows, run, then, **runner):
        """Starts ``run`` on a worker of ``workflows`` with ``JailedWorkflowRunner(**runner)``
        and returns ``await then(client, handle)``, the worker still running."""
        async def go():
            client = await self.server.client()
            queue = "records-" + uuid.uuid4().hex
            async with Worker(client, task_queue=queue, workflows=workflows,
                              workflow_runner=JailedWorkflowRunner(**runner)):
                h = await client.start_workflow(run, id="records-" + uuid.uuid4().hex,
                                                task_queue=queue)
                return await then(client, h)

        return asyncio.run(go())

    def test_warnings_reach_the_workers_warnings_machinery_with_the_workflows_file_and_line(self):
        with warnings.catch_warnings(record=True) as seen:
            warnings.resetwarnings()
            # The worker's filters decide, by the child's module name too: a
            # DeprecationWarning shows only for the workflow's module.
            warnings.simplefilter("ignore", DeprecationWarning)
            warnings.filterwarnings("always", category=DeprecationWarning,
                                    module="records_workflows")
            warnings.simplefilter("always", UserWarning)
            warnings.simplefilter("always", workflow.UnfinishedSignalHandlersWarning)
            async def then(client, h):
                return h.id, h.result_run_id, await _hang_then_result(client, h)

            wid, run_id, result = self.jailed([R.Warns], R.Warns.run, then)
            self.assertEqual(result, "warned")
        # Each warning's text is followed by the sending run, set by the worker (issue 27).
        sender = " [wfjail: warned by workflow Warns, workflow_id %s, run_id %s]" % (wid, run_id)
        by_class = {}
        for w in seen:
            by_class.setdefault(w.category, []).append(w)
        mine = by_class[R.RecordsWarning]
        self.assertEqual([str(w.message) for w in mine],
                         ["records: a warning of the workflow" + sender])
        self.assertEqual(mine[0].filename, R.__file__ + CHILD)
        self.assertEqual(mine[0].lineno, _line_of("WARN_LINE"))
        self.assertEqual([str(w.message) for w in by_class[DeprecationWarning]],
                         ["records: deprecated" + sender])
        unfinished = by_class[workflow.UnfinishedSignalHandlersWarning]
        self.assertEqual(len(unfinished), 1)
        self.assertIn("[TMPRL1102] Workflow finished while signal handlers are still running",
                      str(unfinished[0].message))
        self.assertTrue(unfinished[0].filename.endswith("_workflow_instance.py" + CHILD))

    def test_a_warning_the_workers_filters_make_an_error_fails_the_task_as_in_process(self):
        async def then(client, h):
            await h.signal(R.Warns.hang)
            failed = await task_failure(h, wait=30.0)
            await h.terminate()
            return failed

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            warnings.simplefilter("error", workflow.UnfinishedSignalHandlersWarning)
            failed = self.jailed([R.Warns], R.Warns.run, then)
        # The SDK's own message: the warning raised in the workflow's activation.
        self.assertIsNotNone(failed)
        self.assertTrue(failed.startswith(
            "[TMPRL1102] Workflow finished while signal handlers are still running"), failed)

    def test_log_records_keep_the_sdks_fields_and_extra_once_each(self):
        async def then(client, h):
            await h.signal(R.Logs.my_signal, "one")
            await h.query(R.Logs.my_query)
            await h.execute_update(R.Logs.my_update, "two", id="update-two")
            return h.id, await h.result()

        adapter = workflow.logger
        saved = adapter.full_workflow_info_on_extra
        adapter.full_workflow_info_on_extra = True
        try:
            with _Capture("temporalio.workflow", logging.DEBUG) as kept, \
                    _Capture(relays.CHILD_LOGGER, logging.INFO) as other:
                # More workflow classes (each warmed up three times in the zygote): still
                # one record per call.
                wid, result = self.jailed([R.Logs, R.Warns, W.Greeting], R.Logs.run, then)
        finally:
            adapter.full_workflow_info_on_extra = saved
        self.assertEqual(result, "logged")
        texts = [r.getMessage() for r in kept]
        for start in ("records: run started", "records: signal one", "records: update two",
                      "records: caught", "records: query (debug)"):
            self.assertEqual(len([t for t in texts if t.startswith(start)]), 1,
                             (start, texts))
        # In the order the workflow logged them (one activation).
        self.assertLess(texts.index(next(t for t in texts if t.startswith("records: run"))),
                        texts.index(next(t for t in texts if t.startswith("records: caught"))))
        started = next(r for r in kept if r.getMessage().startswith("records: run started"))
        self.assertEqual(started.name, "temporalio.workflow")
        self.assertEqual(started.levelno, logging.INFO)
        self.assertEqual(started.funcName, "run")
        self.assertEqual(started.lineno, _line_of("LOG_LINE"))
        self.assertEqual(started.pathname, R.__file__ + CHILD)
        self.assertEqual(started.filename, "records_workflows.py" + CHILD)
        self.assertEqual(started.custom, {"a": [1, 2]})
        self.assertTrue(started.wfjail)
        # The SDK's message suffix (workflow_info_on_message) and extras.
        self.assertIn("'workflow_id': '%s'" % wid, started.getMessage())
        self.assertEqual(started.temporal_workflow["workflow_id"], wid)
        self.assertEqual(started.temporal_workflow["workflow_type"], "Logs")
        self.assertIsInstance(started.workflow_info, workflow.Info)
        self.assertEqual(started.workflow_info.workflow_id, wid)
        signal = next(r for r in kept if r.getMessage().startswith("records: signal one"))
        self.assertEqual(signal.funcName, "my_signal")
        update = next(r for r in kept if r.getMessage().startswith("records: update two"))
        self.assertEqual(update.funcName, "my_update")
        self.assertEqual((update.temporal_workflow["update_id"],
                          update.temporal_workflow["update_name"]),
                         ("update-two", "my_update"))
        self.assertIn("'update_id': 'update-two'", update.getMessage())
        caught = next(r for r in kept if r.getMessage().startswith("records: caught"))
        self.assertEqual(caught.levelno, logging.ERROR)
        self.assertIsNone(caught.exc_info)
        formatted = logging.Formatter().format(caught)
        self.assertIn("ValueError: records: boom", formatted)
        self.assertIn('File "%s%s", line' % (R.__file__, CHILD), formatted)
        # A logger of the workflow's own: the worker's CHILD_LOGGER, with its name.
        app = [r for r in other if r.getMessage() == "records: app logger"]
        self.assertEqual(len(app), 1)
        self.assertEqual((app[0].wfjail_logger, app[0].levelno), ("records.app",
                                                                 logging.WARNING))

    def test_both_layers_warnings_and_records_reach_the_worker_from_the_sdks_sandbox(self):
        async def then(client, h):
            g = await client.start_workflow(R.Logs.run, id=str(uuid.uuid4()),
                                            task_queue=(await h.describe()).task_queue)
            return (await _hang_then_result(client, h),
                    await _update_then_result(client, g))

        with warnings.catch_warnings(record=True) as seen, \
                _Capture("temporalio.workflow", logging.INFO) as kept:
            warnings.simplefilter("always")
            self.assertEqual(self.jailed([R.Warns, R.Logs], R.Warns.run, then, sandboxed=True),
                             ("warned", "logged"))
        categories = [w.category.__name__ for w in seen]
        self.assertIn("UnfinishedSignalHandlersWarning", categories)
        self.assertEqual(len([w for w in seen if str(w.message).startswith(
            "records: a warning of the workflow")]), 1, categories)
        update = [r for r in kept if r.getMessage().startswith("records: update two")]
        self.assertEqual(len(update), 1)
        self.assertEqual((update[0].funcName, update[0].temporal_workflow["update_id"]),
                         ("my_update", "update-two"))

    def test_the_workers_logger_settings_hold_in_the_child(self):
        adapter = workflow.logger
        saved = (adapter.workflow_info_on_message, adapter.workflow_info_on_extra)
        adapter.workflow_info_on_message = adapter.workflow_info_on_extra = False
        try:
            # INFO: the debug record of the query is not even sent.
            with _Capture("temporalio.workflow", logging.INFO) as kept:
                self.assertEqual(self.jailed([R.Logs], R.Logs.run, _update_then_result),
                                 "logged")
        finally:
            adapter.workflow_info_on_message, adapter.workflow_info_on_extra = saved
        update = next(r for r in kept if r.getMessage().startswith("records: update two"))
        self.assertEqual(update.getMessage(), "records: update two")
        self.assertNotIn("temporal_workflow", update.__dict__)
        self.assertNotIn("workflow_info", update.__dict__)

    def test_the_sdks_internal_loggers_are_forwarded_by_name(self):
        import temporalio.worker._workflow_instance as instance_module

        async def then(client, h):
            await h.signal("take", "not a Param")
            await h.signal(R.BadSignal.take, R.Param("good"))
            return h.id, await h.result()

        with _Capture(instance_module.logger.name, logging.INFO) as kept:
            wid, result = self.jailed([R.BadSignal], R.BadSignal.run, then)
        self.assertEqual(result, 1)
        bad = [r for r in kept if r.getMessage().startswith("Failed deserializing signal input")]
        self.assertEqual(len(bad), 1, [r.getMessage() for r in kept])
        self.assertEqual(bad[0].name, "temporalio.worker._workflow_instance")
        self.assertIn(wid, bad[0].getMessage())
        self.assertEqual(bad[0].temporal_workflow["workflow_type"], "BadSignal")

    def test_forged_records_and_warnings_are_bounded_and_escaped(self):
        async def then(client, h):
            return h.id, await h.result()

        with warnings.catch_warnings(record=True) as seen, \
                _Capture("temporalio.workflow", logging.INFO) as kept, \
                _Capture(relays.CHILD_LOGGER, logging.INFO) as other:
            warnings.simplefilter("always")
            wid, result = self.jailed([R.ForgedRecords], R.ForgedRecords.run, then)
        # The category named a module the worker had not imported: not imported, a
        # UserWarning that says it; a name that is not a Warning class: the same.
        self.assertNotIn("antigravity", sys.modules)
        self.assertEqual(json.loads(result), ["shown"] * 4)
        forged = [w for w in seen if str(w.message).startswith("w\\x0a")]
        self.assertEqual(len(forged), 4)
        self.assertEqual([w.category for w in forged], [UserWarning] * 4)
        self.assertIn("antigravity:Warning", str(forged[0].message))
        for w in forged:
            self.assertNotIn("\n", str(w.message))
            self.assertNotIn("\x1b", str(w.message))
            self.assertEqual((w.filename, w.lineno), ("/etc/passwd" + CHILD, 0))
        flood = [w for w in seen if str(w.message).startswith("records: flood")]
        self.assertEqual(len(flood), relays.MAX_WARNINGS - 4)
        # Its one activation relays MAX_LOG_RECORDS records (4 forged ones before the spam).
        spam = [r for r in kept if r.getMessage().startswith("records: spam")]
        self.assertEqual(len(spam), relays.MAX_LOG_RECORDS - 4)
        self.assertEqual(len(kept) + len(other), relays.MAX_LOG_RECORDS)
        record = next(r for r in kept if r.getMessage().startswith("forged"))
        # The child's text, then the SDK's identity suffix made by the worker (issue 27).
        self.assertEqual(record.getMessage(), "forged%s (%s)" % (_escaped(R.FORGED),
                                                                 record.temporal_workflow))
        # The run's identity is the worker's; the child's update id stays, escaped.
        identity = record.temporal_workflow
        self.assertEqual((identity["workflow_id"], identity["namespace"]), (wid, "default"))
        self.assertNotEqual(identity["run_id"], "victim-run")
        self.assertEqual(identity["update_id"], "u" + _escaped(R.FORGED))
        self.assertIsInstance(record.workflow_info, workflow.Info)
        self.assertEqual(record.workflow_info.workflow_id, wid)
        # No LogRecord attribute set by the child.
        self.assertEqual((record.msg, record.args, record.exc_info, record.levelno,
                          record.name, record.wfjail),
                         (record.getMessage(), (), None, logging.ERROR, "temporalio.workflow",
                          True))
        self.assertFalse(hasattr(record, "bad key"))
        self.assertEqual(record.funcName, "f" + _escaped(R.FORGED))
        self.assertEqual(record.pathname, "/etc/passwd" + _escaped(R.FORGED) + CHILD)
        self.assertEqual(record.lineno, 7)
        # Extra values: bounded depth, items and text.
        self.assertEqual(record.deep, [[[[None]]]])
        self.assertLessEqual(len(record.wide), relays.MAX_EXTRA_ITEMS)
        self.assertTrue(record.text.endswith("(%d more characters)"
                                             % (100_000 - relays.MAX_EXTRA_TEXT)))
        # Its exception, as a formatter shows it: no line of the child's making.
        formatted = logging.Formatter().format(record)
        self.assertEqual([line for line in formatted.split("\n") if line.startswith("2026")],
                         [], formatted)
        self.assertNotIn("\x1b", formatted)
        self.assertIn("Err\\x0a2026", formatted)
        # Not JSON (an unclosed array): the text, escaped, cut.
        self.assertTrue([r for r in kept if r.getMessage().startswith(
            relays.RECORD_MARK + "[[[") and r.getMessage().endswith(
                "characters) (%s)" % r.temporal_workflow)
            and len(r.getMessage()) < relays.MAX_LOG_TEXT + 400])  # (+ the sender's suffix)
        # temporalio names the worker does not have go to CHILD_LOGGER, escaped.
        names = sorted(r.wfjail_logger for r in other)
        self.assertEqual(names, sorted(["temporalio.nonexistent" + _escaped(R.FORGED),
                                        "temporalio.nonexistent.logger"]))


class RecordsCategoryTests(unittest.TestCase):
    """The worker maps a child's category name (no server needed)."""

    def test_a_category_is_one_the_worker_has_never_imported_or_made_by_a_modules_code(self):
        touched = []

        class Lazy(types.ModuleType):
            def __getattr__(self, name):
                touched.append(name)
                return R.RecordsWarning

            def __getattribute__(self, name):
                touched.append(name)
                return types.ModuleType.__getattribute__(self, name)

        sys.modules["records_lazy"] = Lazy("records_lazy")
        try:
            self.assertIsNone(relays.warning_category("records_lazy:RecordsWarning"))
        finally:
            del sys.modules["records_lazy"]
        self.assertEqual(touched, [])
        self.assertIs(relays.warning_category("records_workflows:RecordsWarning"),
                      R.RecordsWarning)
        cls = workflow.UnfinishedUpdateHandlersWarning
        self.assertIs(relays.warning_category("%s:%s" % (cls.__module__, cls.__qualname__)), cls)
        self.assertIs(relays.warning_category("builtins:DeprecationWarning"), DeprecationWarning)
        for name in ("builtins:Exception", "os:system", "antigravity:Warning", "builtins",
                     "builtins:__import__", "builtins:DeprecationWarning.__base__",
                     "records_workflows:RecordsWarning\n", 42, "a:" + "b" * 600):
            self.assertIsNone(relays.warning_category(name), name)
        self.assertNotIn("antigravity", sys.modules)


async def _hang_then_result(client, h):
    await h.signal(R.Warns.hang)
    return await h.result()


async def _update_then_result(client, h):
    await h.execute_update(R.Logs.my_update, "two", id="update-two")
    return await h.result()


def _escaped(text):
    from wfjail.temporal.stack import escape

    return escape(text)


if __name__ == "__main__":
    unittest.main()
