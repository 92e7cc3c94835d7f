"""Temporal: run each cached workflow run in a confined process of its own.

    from wfjail.temporal import JailedWorkflowRunner

    worker = Worker(client, task_queue="q", workflows=[MyWorkflow], activities=[...],
                    workflow_runner=JailedWorkflowRunner())

or, so that the worker polls only once its server runs and fails to start when it cannot,
``plugins=[JailedPlugin()]`` (``plugin``) instead of ``workflow_runner``.

``JailedWorkflowRunner`` is a ``temporalio.worker.WorkflowRunner``. It starts a ``wfjail
serve`` of its own (prefork mode, the worker's interpreter, the policy ``temporal-python``
unless told otherwise) that preloads ``temporalio`` and the worker's workflow modules once;
each workflow run the worker caches is one session forked from it, confined by the kernel
(no network, files, threads, subprocesses), and every activation is one call carrying the
activation's protobuf bytes. Eviction closes the session.

What crosses from a child to the worker is protobuf and JSON only: the worker never
unpickles anything a (possibly hostile) workflow sends. A call during which wfjail denied
something fails the workflow task with what was denied (the syscall, its arguments, the rule
and a hint), even when the workflow caught the error.

Importing this package needs ``temporalio``; the rest of the ``wfjail`` package does not.
Extern functions (interceptors' ``unsafe_extern_functions``, the local-activity check) and
``patch_activation_callback`` run in the worker, called by name from the child (typed JSON
arguments and results, rebuilt from the worker function's own type hints: ``typed_json``);
metric records ride on the completions to the worker's meter.

The modules: ``worker`` (the runner, the instance proxy, the watchdog), ``plugin``
(``JailedPlugin``), ``server`` (the
``wfjail serve`` a runner starts), ``child`` (what runs in the confined child and the
zygote), ``recipe`` (what crosses from the worker to a child when its session opens),
``relays`` (what the worker takes from a child: replies, log and metric records, upcalls),
``contexts`` (the serialization contexts of a run's commands), ``stack`` (a child's words and
traceback as the worker shows them), ``sdk`` (every private SDK use, and the version check),
``determinism`` (``check_determinism``). Importing them does no work beyond definitions.
"""

from .determinism import DeterminismResult, HistoryError, check_determinism
from .plugin import JailedPlugin
from .sdk import UntestedTemporalio
from .worker import JailedWorkflowRunner, ServerNotReady

__all__ = ["DeterminismResult", "HistoryError", "JailedPlugin", "JailedWorkflowRunner",
           "ServerNotReady", "UntestedTemporalio", "check_determinism"]
