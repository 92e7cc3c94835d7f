"""A workflow module that imports in the worker but raises when the zygote preloads it (it
needs something the confined process does not have: here, it is told so by the zygote's
control descriptor in its environment)."""

import os

from temporalio import workflow

if os.environ.get("WFJAIL_ZYGOTE_FD"):
    raise RuntimeError("preload-broken: the license server is unreachable from here")


@workflow.defn
class PreloadBroken:
    @workflow.run
    async def run(self) -> str:
        return "never confined"
