"""Temporal: run each cached workflow run in a confined process of its own.

    from wfjail.temporal import JailedWorkflowRunner

Importing this package needs ``temporalio``; the rest of the ``wfjail`` package does not.
docs/temporal.md says how it works.
"""

from .worker import DeterminismResult, JailedWorkflowRunner, check_determinism

__all__ = ["DeterminismResult", "JailedWorkflowRunner", "check_determinism"]
