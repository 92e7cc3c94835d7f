"""A pytest plugin (`-p wfjail_runner_plugin`, no conftest) for running Temporal's own SDK
tests under a chosen workflow runner.

WFJAIL_SUITE_RUNNER (unsandboxed | sandboxed | jailed) picks the runner that every `Worker`
and `Replayer` gets when the test does not pass `workflow_runner=` itself: the constructors'
default is replaced, nothing else. `sandboxed` leaves the SDK's own default alone (its
`SandboxedWorkflowRunner`). WFJAIL_SUITE_JSON names the file where the outcome of every test
is written (passed/failed/skipped/error node ids and the first lines of each failure).

Imported before the SDK checkout's conftest, so `temporalio` here is the installed wheel
(run pytest with `--import-mode=append`: the checkout's own `temporalio/` sources, which have
no native bridge, must not shadow it, in this process or in a jailed runner's zygote, which
gets this process's `sys.path`).
"""

import functools
import inspect
import json
import os
import sys

import temporalio.worker

RUNNER = os.environ.get("WFJAIL_SUITE_RUNNER", "sandboxed")
if RUNNER not in ("unsandboxed", "sandboxed", "jailed"):
    raise SystemExit("WFJAIL_SUITE_RUNNER: unsandboxed, sandboxed or jailed, not %r" % RUNNER)


def _make_runner():
    _results["runners_made"] += 1
    if RUNNER == "unsandboxed":
        return temporalio.worker.UnsandboxedWorkflowRunner()
    from wfjail.temporal import JailedWorkflowRunner

    return JailedWorkflowRunner()


def _helper_defaults():
    """The runner objects that the SDK's test helpers pass when their caller chose none
    (`tests.helpers.new_worker(..., workflow_runner=SandboxedWorkflowRunner())` passes its
    default on to `Worker`): these count as "not chosen" too, by identity."""
    helpers = sys.modules.get("tests.helpers")
    found = []
    for name in ("new_worker",):
        fn = getattr(helpers, name, None)
        if fn is None:
            continue
        param = inspect.signature(fn).parameters.get("workflow_runner")
        if param is not None and param.default is not inspect.Parameter.empty:
            found.append(param.default)
    return [d for d in found if d is not None]


def _default_runner(cls):
    init = cls.__init__

    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        if "workflow_runner" not in kwargs or any(
                kwargs["workflow_runner"] is d for d in _helper_defaults()):
            kwargs["workflow_runner"] = _make_runner()
        init(self, *args, **kwargs)

    cls.__init__ = __init__


if RUNNER != "sandboxed":
    _default_runner(temporalio.worker.Worker)
    _default_runner(temporalio.worker.Replayer)

_results = {"runner": RUNNER, "passed": [], "failed": [], "skipped": [], "error": [], "errors": {},
            "runners_made": 0}


def pytest_report_header(config):
    return "wfjail: default workflow runner %s (temporalio from %s)" % (
        RUNNER, os.path.dirname(temporalio.__file__))


def _write(exitstatus=None):
    path = os.environ.get("WFJAIL_SUITE_JSON")
    if not path:
        return
    # A test that passed its call and then failed its teardown counts as an error only.
    bad = set(_results["error"]) | set(_results["failed"])
    out = dict(_results, passed=[n for n in _results["passed"] if n not in bad],
               exitstatus=exitstatus, complete=exitstatus is not None)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(out, f, indent=1, sort_keys=True)
    os.replace(tmp, path)


def pytest_runtest_logfinish(nodeid, location):
    # After every test, so that a run stopped by a timeout still says what it measured.
    _write()


def pytest_runtest_logreport(report):
    nodeid = report.nodeid
    if report.when == "call" or (report.when in ("setup", "teardown") and report.outcome != "passed"):
        if report.skipped:
            if nodeid not in _results["skipped"]:
                _results["skipped"].append(nodeid)
            return
        if report.failed:
            key = "failed" if report.when == "call" else "error"
            if nodeid not in _results[key]:
                _results[key].append(nodeid)
            text = getattr(report, "longreprtext", "") or ""
            # The exception lines ("E   ...") say the cause; keep a few of them.
            lines = [l for l in text.splitlines() if l.startswith("E ")][:12]
            _results["errors"][nodeid] = "\n".join(lines) or text[-2000:]
            return
        if report.when == "call":
            _results["passed"].append(nodeid)


def pytest_sessionfinish(session, exitstatus):
    _write(int(exitstatus))
