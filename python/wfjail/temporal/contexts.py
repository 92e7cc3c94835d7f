"""The serialization contexts of a run's commands, derived in the worker from the run's own
info and the commands the child's completion carries (the payload codec asks for them
between activations: for a command's payloads, then for its result's); nothing a child says
about a context is taken."""

from __future__ import annotations

import dataclasses
from typing import Any

import temporalio.workflow
from temporalio.api.enums.v1 import CommandType
from temporalio.bridge.proto.workflow_activation import WorkflowActivation
from temporalio.bridge.proto.workflow_completion import WorkflowActivationCompletion
from temporalio.converter import (
    ActivitySerializationContext,
    NexusSerializationContext,
    WorkflowSerializationContext,
)

# At most this many command contexts are kept per run (the oldest go first; a command whose
# context went gets the workflow's own, the run's namespace and workflow id).
MAX_COMMAND_CONTEXTS = 10_000
# A command with a longer name or id (the server refuses ids and names past 1,000 characters
# by default) gets the workflow's context: what a run keeps stays small.
MAX_CONTEXT_FIELD = 1000

# A command's key: (command type, seq), as the SDK's CommandInfo names it.
CommandKey = tuple[int, int]

# The command variants that have a context of their own: their command type.
COMMAND_TYPES: dict[str, int] = {
    "schedule_activity": CommandType.COMMAND_TYPE_SCHEDULE_ACTIVITY_TASK,
    "schedule_local_activity": CommandType.COMMAND_TYPE_SCHEDULE_ACTIVITY_TASK,
    "start_child_workflow_execution": CommandType.COMMAND_TYPE_START_CHILD_WORKFLOW_EXECUTION,
    "signal_external_workflow_execution":
        CommandType.COMMAND_TYPE_SIGNAL_EXTERNAL_WORKFLOW_EXECUTION,
    "schedule_nexus_operation": CommandType.COMMAND_TYPE_SCHEDULE_NEXUS_OPERATION,
}
# The activation jobs that carry a command's last payloads (its result): the command variant
# each resolves.
RESOLVED_BY = {
    "resolve_activity": "schedule_activity",
    "resolve_child_workflow_execution": "start_child_workflow_execution",
    # Unless it says the child started: its result comes later.
    "resolve_child_workflow_execution_start": "start_child_workflow_execution",
    "resolve_signal_external_workflow": "signal_external_workflow_execution",
    "resolve_nexus_operation": "schedule_nexus_operation",
}


# A command's own context (each a dataclass).
CommandContext = (ActivitySerializationContext | WorkflowSerializationContext
                  | NexusSerializationContext)


def _context(info: temporalio.workflow.Info, which: str, v: Any) -> CommandContext | None:
    """The context of command ``v`` (variant ``which``) as the SDK's
    ``get_serialization_context`` gives it in process, or None for the workflow's own."""
    if which in ("schedule_activity", "schedule_local_activity"):
        local = which == "schedule_local_activity"
        return ActivitySerializationContext(
            namespace=info.namespace, workflow_id=info.workflow_id,
            workflow_type=info.workflow_type, activity_type=v.activity_type,
            # The SDK's context has the id the workflow gave, None when it gave none (the
            # command then carries the seq as the id).
            activity_id=None if v.activity_id == str(v.seq) else v.activity_id,
            activity_task_queue=(info.task_queue if local
                                 else v.task_queue or info.task_queue),
            is_local=local)
    if which == "start_child_workflow_execution":
        return WorkflowSerializationContext(namespace=info.namespace, workflow_id=v.workflow_id)
    if which == "signal_external_workflow_execution":
        return WorkflowSerializationContext(
            namespace=info.namespace,
            workflow_id=v.child_workflow_id or v.workflow_execution.workflow_id)
    import temporalio.nexus.system

    # A system endpoint's context is built from the operation's input object, which only the
    # child has: such a command gets the workflow's context.
    if temporalio.nexus.system.is_system_endpoint(v.endpoint):
        return None
    return NexusSerializationContext(endpoint=v.endpoint, service=v.service,
                                     operation=v.operation)


def command_contexts(info: temporalio.workflow.Info, completion: WorkflowActivationCompletion,
                     ) -> dict[CommandKey, CommandContext]:
    """{(command type, seq): serialization context} of the completion's commands, derived
    from the run's own ``info`` (namespace, workflow id and type, task queue) and the
    commands' fields: the namespace is always the run's. A context with a field over
    MAX_CONTEXT_FIELD characters is left out."""
    out: dict[CommandKey, CommandContext] = {}
    for c in completion.successful.commands:
        which = c.WhichOneof("variant")
        if which not in COMMAND_TYPES:
            continue
        v = getattr(c, which)
        ctx = _context(info, which, v)
        if ctx is not None:
            out[(COMMAND_TYPES[which], v.seq)] = ctx
    return {k: ctx for k, ctx in out.items()
            if not any(isinstance(getattr(ctx, f.name), str)
                       and len(getattr(ctx, f.name)) > MAX_CONTEXT_FIELD
                       for f in dataclasses.fields(ctx))}


def resolved_keys(act: WorkflowActivation) -> list[CommandKey]:
    """The command keys whose last payloads an activation carries (their results)."""
    keys: list[CommandKey] = []
    for job in act.jobs:
        which = job.WhichOneof("variant")
        if which not in RESOLVED_BY:
            continue
        v = getattr(job, which)
        if which == "resolve_child_workflow_execution_start" and v.HasField("succeeded"):
            continue
        keys.append((COMMAND_TYPES[RESOLVED_BY[which]], v.seq))
    return keys
