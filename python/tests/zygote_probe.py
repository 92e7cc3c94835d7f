"""A handler factory for test_zygote_loop: what the spare child received in its hand-over
(the message ``wfjail.zygote._spare`` read), as its answer to every call."""

import sys


def factory(init):
    # The child's stack was unwound from where it was forked (wfjail.zygote._Forked): the
    # spare's frame is in the traceback the zygote keeps.
    tb, seen = sys.modules["__main__"]._unwound.__traceback__, None
    while tb is not None:
        if tb.tb_frame.f_code.co_name == "_spare":
            seen = tb.tb_frame.f_locals.get("msg")
        tb = tb.tb_next
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


def reads(request):
    """What a session's code can read of the interpreter, as its answer (JSON): the
    collector's counts after a walk of the whole stack (which makes the frame objects not
    made yet, and allocates what the free lists may or may not hold: the runner's audit hook
    walks it at a workflow's first socket), the stack itself, and the reference count of an
    object the zygote preloaded. test_zygote_loop asks it of children forked at every point
    of a zygote's life, of three zygotes: the same answer from each (issue 27's guarantee;
    issue 29's settling after READY broke it)."""
    import gc
    import json
    import os
    import traceback

    stack = traceback.extract_stack()
    count = list(gc.get_count())
    return json.dumps({
        "gc.get_count()": count,
        "stack": [[os.path.basename(f.filename), f.name, f.lineno] for f in stack],
        "sys.getrefcount(json._default_decoder)": sys.getrefcount(json._default_decoder),
    }).encode()
