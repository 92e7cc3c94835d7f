"""A workflow module whose import starts a thread (as grpc's does) and probes a temporary
directory (as litellm's does: ``tempfile.gettempdir()`` creates a file there): the worker
imports it unconfined, and the zygote preloads it under the policy."""

import tempfile
import threading

from temporalio import workflow

_idle = threading.Event()
threading.Thread(target=_idle.wait, name="preloaded-background", daemon=True).start()
TEMP_DIR = tempfile.gettempdir()


@workflow.defn
class PreloadedThread:
    @workflow.run
    async def run(self, name: str) -> str:
        return "hello %s (%d thread)" % (name, threading.active_count())
