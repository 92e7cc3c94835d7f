"""The serialization contexts and external storage contexts of a run's commands, derived in
the worker from the run's own info and the commands the child's completion carries (the
payload codec and the storage drivers ask for them between activations: for a command's
payloads, then for its result's); nothing a child says about a context is taken."""

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
    StorageDriverStoreContext,
    StorageDriverWorkflowInfo,
    WorkflowSerializationContext,
)

from . import sdk

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


def keep(kept: dict[CommandKey, Any], new: dict[CommandKey, Any],
         resolved: list[CommandKey]) -> None:
    """Updates a run's ``kept`` contexts after an activation: those of the commands it
    ``resolved`` (``resolved_keys``) go, the completion's ``new`` ones come, and at most
    MAX_COMMAND_CONTEXTS stay (the oldest go first)."""
    for key in resolved:
        kept.pop(key, None)
    kept.update(new)
    while len(kept) > MAX_COMMAND_CONTEXTS:
        del kept[next(iter(kept))]


def command_store_contexts(info: temporalio.workflow.Info,
                           completion: WorkflowActivationCompletion,
                           ) -> dict[CommandKey, StorageDriverStoreContext]:
    """{(command type, seq): external storage context} of the completion's commands that
    target another workflow, as the SDK's ``get_external_store_context`` gives them in
    process while the command is pending: a child workflow (its id and type) and a signal's
    target (its id), in the run's namespace. A field over MAX_CONTEXT_FIELD characters
    leaves the command to the run's own context."""
    out: dict[CommandKey, StorageDriverStoreContext] = {}
    for c in completion.successful.commands:
        which = c.WhichOneof("variant")
        if which == "start_child_workflow_execution":
            v = c.start_child_workflow_execution
            target = StorageDriverWorkflowInfo(namespace=info.namespace, id=v.workflow_id,
                                               type=v.workflow_type)
        elif which == "signal_external_workflow_execution":
            s = c.signal_external_workflow_execution
            target = StorageDriverWorkflowInfo(
                namespace=info.namespace,
                id=s.child_workflow_id or s.workflow_execution.workflow_id)
        else:
            continue
        if max(len(target.id or ""), len(target.type or "")) <= MAX_CONTEXT_FIELD:
            out[(COMMAND_TYPES[which], getattr(c, which).seq)] = StorageDriverStoreContext(
                target=target)
    return out


def store_context(info: temporalio.workflow.Info, command_info: sdk.CommandInfo | None,
                  kept: dict[CommandKey, StorageDriverStoreContext],
                  ) -> StorageDriverStoreContext:
    """The external storage context of a command (``command_info``, None for a payload of
    no command), as the SDK's in-process instance gives it: a pending child workflow's or
    signal's target (``kept``, from ``command_store_contexts``); the parent, for the result
    of a child run that was not continued as new; else the run itself (its namespace, id,
    run id and type: an activity's payloads are stored under the workflow, as in process)."""
    if command_info is not None:
        key = (int(command_info.command_type), int(command_info.command_seq))
        if key in kept:
            return kept[key]
        if (key[0] == CommandType.COMMAND_TYPE_COMPLETE_WORKFLOW_EXECUTION
                and info.parent is not None and info.continued_run_id is None):
            return StorageDriverStoreContext(target=StorageDriverWorkflowInfo(
                id=info.parent.workflow_id, run_id=info.parent.run_id,
                namespace=info.parent.namespace))
    return StorageDriverStoreContext(target=StorageDriverWorkflowInfo(
        id=info.workflow_id, run_id=info.run_id, type=info.workflow_type,
        namespace=info.namespace))
