"""``check_determinism``: replays of recorded histories under the jailed runner, as given and
under perturbations that deterministic workflow code must not notice."""

from __future__ import annotations

import dataclasses
import inspect
import json
import os
import shutil
import tempfile
from typing import Any, Iterable

from .server import absolute_policy
from .worker import JailedWorkflowRunner


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
    ``handle.fetch_history()`` or ``WorkflowHistory.from_json``) ``runs`` times with
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
                replayer = Replayer(workflows=list(workflows), workflow_runner=runner,
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
