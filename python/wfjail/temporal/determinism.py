"""``check_determinism``: replays of recorded histories under the jailed runner, as given and
under perturbations that deterministic workflow code must not notice."""

from __future__ import annotations

import dataclasses
import errno
import inspect
import json
import os
import shutil
import stat
import tempfile
from typing import Any, Iterable

from .server import absolute_policy
from .worker import JailedWorkflowRunner


# The largest history file read (the Temporal server's own limit on a history is 50 MiB).
MAX_HISTORY_BYTES = 64 * 1024 * 1024


class HistoryError(ValueError):
    """A history ``check_determinism`` cannot judge: it names the history (its file, or its
    workflow id and place in the list) and what is wrong. Raised before any replay: a
    malformed history can stop the SDK's replayer for good (an empty one did)."""


@dataclasses.dataclass
class DeterminismResult:
    """One replay of :func:`check_determinism`: a history, the perturbation it was replayed
    under, and the replay's failure (the SDK's nondeterminism error names the first command
    that diverged), or ``None``."""

    workflow_id: str
    run_id: str
    perturbation: str
    failure: str | None


def _perturbations(runs: int) -> list[tuple[str, str]]:
    """(name, policy text added) for each of ``runs`` replays: as given, then, in turn,
    another Python hash seed and a randomised address layout. The seed and the workflow time
    are the history's own: a replay under the jailed runner always has them."""
    out = [("as given", "")]
    for i in range(1, runs):
        if i % 2:
            seed = 1000 + i
            out.append(("PYTHONHASHSEED=%d" % seed,
                        '[env]\nset = { PYTHONHASHSEED = "%d" }\n' % seed))
        else:
            out.append(("address layout randomised",
                        '[process]\naddress_randomization = "allow"\n'))
    return out


async def check_determinism(histories: Iterable[Any], workflows: Iterable[type], *,
                            policy: str = "temporal-python", runs: int = 3,
                            **options: Any) -> list[DeterminismResult]:
    """Replays each of ``histories`` (``WorkflowHistory`` objects, e.g. from
    ``handle.fetch_history()`` or ``WorkflowHistory.from_json``, or paths of files that
    ``WorkflowHistory.to_json()`` wrote, whose name without ``.json`` is the workflow id)
    ``runs`` times with
    ``JailedWorkflowRunner(policy)``: as given, then under perturbations that deterministic
    workflow code must not notice (Python's hash seed, the address layout). Returns a
    :class:`DeterminismResult` per replay; a ``failure`` names the first diverging command.
    A CI step for workflow repositories: keep histories of real runs, check them on every
    change.

        results = await check_determinism([history], [MyWorkflow])
        assert not [r for r in results if r.failure], results

    ``options`` are the keyword arguments of ``Replayer`` (``data_converter``,
    ``interceptors``, ``plugins``, ``namespace``, ``workflow_failure_exception_types``...:
    give the ones the worker was given, or its payloads do not decode as they did when the
    histories were recorded) and of ``JailedWorkflowRunner`` (``preload``, ``policies``...),
    each passed to the one that takes it.

        await check_determinism([history], [MyWorkflow], data_converter=pydantic_data_converter)
    """
    from temporalio.worker import Replayer

    runner_options, replayer_options = _split_options(options, Replayer)
    workflows = list(workflows)
    histories = _judgeable(histories, workflows)
    base = absolute_policy(policy)
    tmp = tempfile.mkdtemp(prefix="wfjail-determinism-")
    results = []
    try:
        for i, (name, extra) in enumerate(_perturbations(runs)):
            chosen = policy
            if extra:
                chosen = os.path.join(tmp, "perturbed-%d.toml" % i)
                with open(chosen, "w") as f:
                    f.write("extends = %s\n%s" % (json.dumps(base), extra))
            runner = JailedWorkflowRunner(chosen, **runner_options)
            try:
                replayer = Replayer(workflows=workflows, workflow_runner=runner,
                                    **replayer_options)
                for history in histories:
                    r = await replayer.replay_workflow(history, raise_on_replay_failure=False)
                    results.append(DeterminismResult(
                        workflow_id=history.workflow_id,
                        run_id=getattr(history, "run_id", "") or "",
                        perturbation=name,
                        failure=None if r.replay_failure is None else str(r.replay_failure)))
            finally:
                runner.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return results


def _split_options(options: dict[str, Any], replayer: type,
                   ) -> tuple[dict[str, Any], dict[str, Any]]:
    """``check_determinism``'s keyword arguments split into ``JailedWorkflowRunner``'s and
    ``Replayer``'s, by the names each one's ``__init__`` takes (none is both's). The
    replayer's ``workflow_runner`` and ``workflows`` are the check's own."""
    runner_names = set(inspect.signature(JailedWorkflowRunner.__init__).parameters) - {
        "self", "policy"}
    replayer_names = set(inspect.signature(replayer).parameters) - {
        "self", "workflows", "workflow_runner"}
    unknown = sorted(set(options) - runner_names - replayer_names)
    if unknown:
        raise TypeError("check_determinism() got keyword arguments that neither Replayer nor "
                        "JailedWorkflowRunner takes: %s" % ", ".join(unknown))
    return ({k: v for k, v in options.items() if k in runner_names},
            {k: v for k, v in options.items() if k in replayer_names})


def _judgeable(histories: Iterable[Any], workflows: list[type]) -> list[Any]:
    """``histories`` as ``WorkflowHistory`` objects (a path's file read: ``_load``), each
    checked to be one a replay can judge; else ``HistoryError`` saying which and why. None
    at all is an error too: a check of nothing must not pass."""
    from temporalio.client import WorkflowHistory

    out = []
    for i, history in enumerate(histories):
        if isinstance(history, (str, os.PathLike)):
            name = os.fspath(history)
            history = _load(name)
        elif isinstance(history, WorkflowHistory):
            name = "history %d (workflow id %r)" % (i, history.workflow_id)
        else:
            raise HistoryError("history %d is a %s, not a WorkflowHistory or the path of a "
                               "history file" % (i, type(history).__name__))
        _check(name, history, workflows)
        out.append(history)
    if not out:
        raise HistoryError("check_determinism() was given no histories: there is nothing to "
                           "judge (did the list of history files come out empty?)")
    return out


def _load(path: str) -> Any:
    """The history in file ``path`` (as ``WorkflowHistory.to_json()`` writes it), read only
    if it is a regular file (not a symbolic link, a fifo or a device) of at most
    MAX_HISTORY_BYTES."""
    from temporalio.client import WorkflowHistory

    try:
        # O_NONBLOCK: a fifo's open does not wait for a writer (it is refused below).
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise HistoryError("%s: is a symbolic link; give the history file itself" % path
                               ) from None
        raise HistoryError("%s: cannot be read: %s" % (path, e.strerror)) from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise HistoryError("%s: is not a regular file; give the history file itself" % path)
        data = f.read(MAX_HISTORY_BYTES + 1)
    if len(data) > MAX_HISTORY_BYTES:
        raise HistoryError("%s: is larger than %d bytes, more than a Temporal history can be"
                           % (path, MAX_HISTORY_BYTES))
    try:
        doc = json.loads(data)
    except RecursionError:
        raise HistoryError("%s: its JSON is nested too deeply to be a history" % path
                           ) from None
    except ValueError as e:
        raise HistoryError("%s: is not JSON (%s)" % (path, e)) from None
    workflow_id = os.path.basename(path)
    if workflow_id.endswith(".json"):
        workflow_id = workflow_id[:-len(".json")]
    try:
        return WorkflowHistory.from_json(workflow_id, doc)
    except RecursionError:
        raise HistoryError("%s: its JSON is nested too deeply to be a history" % path
                           ) from None
    except Exception as e:  # the parser's own errors: any type
        raise HistoryError("%s: is not a workflow history as WorkflowHistory.to_json() writes "
                           "it (%s)" % (path, str(e)[:200])) from None


def _check(name: str, history: Any, workflows: list[type]) -> None:
    """Raises ``HistoryError`` unless ``history`` starts a run of one of ``workflows`` (or
    there is a dynamic one), its events are numbered 1, 2, 3... in order, and a workflow
    task of it completed (its commands are what a replay is compared with)."""
    events = list(history.events)
    if not events:
        raise HistoryError("%s: has no events" % name)
    first = events[0]
    if not first.HasField("workflow_execution_started_event_attributes"):
        raise HistoryError("%s: its first event is not WorkflowExecutionStarted" % name)
    for n, event in enumerate(events, 1):
        if event.event_id != n:
            raise HistoryError("%s: its events are not numbered 1, 2, 3... in order (event %d "
                               "has id %d)" % (name, n, event.event_id))
    wanted = first.workflow_execution_started_event_attributes.workflow_type.name
    types = [getattr(w, "__temporal_workflow_definition", None) for w in workflows]
    names = [t.name for t in types if t is not None]
    dynamic = any(t is not None and t.name is None for t in types)
    if not dynamic and wanted not in names:
        raise HistoryError("%s: is a history of workflow type %r, which is not among the "
                           "workflows given (%s)" % (name, wanted, ", ".join(
                               repr(n) for n in names) or "none"))
    if not any(e.HasField("workflow_task_completed_event_attributes") for e in events):
        raise HistoryError("%s: no workflow task of it completed: there are no commands to "
                           "compare a replay with (cannot judge)" % name)
