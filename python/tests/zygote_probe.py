"""A handler factory for test_zygote_loop: what the spare child received in its hand-over
(the message ``wfjail.zygote._spare`` read), as its answer to every call."""

import sys


def factory(init):
    frame, seen = sys._getframe(1), None
    while frame is not None:
        if frame.f_code.co_name == "_spare":
            seen = frame.f_locals.get("msg")
        frame = frame.f_back
    return lambda request: repr(seen).encode()


def forking(init):
    """How this child was forked, and the state CPython's at-fork work would have reset."""
    import json
    import logging
    import random
    import threading

    zygote = sys.modules["__main__"]  # python -m wfjail.zygote
    locked = logging._lock.acquire(timeout=30)  # type: ignore[attr-defined]
    if locked:
        logging._lock.release()  # type: ignore[attr-defined]
    seen = {"fork_path": getattr(zygote, "fork_path", None),
            "main_thread": threading.current_thread() is threading.main_thread(),
            "ident": threading.main_thread().ident == threading.get_ident(),
            "threads": threading.active_count(), "logging_lock": locked,
            "random": random.random()}
    return lambda request: json.dumps(seen).encode()


def start_thread():
    """A preload that leaves a thread running in the zygote."""
    import threading
    import time

    threading.Thread(target=time.sleep, args=(3600,), daemon=True).start()


def register_at_fork():
    """A preload that registers an at-fork callback of its own."""
    import os

    os.register_at_fork(after_in_child=lambda: None)
