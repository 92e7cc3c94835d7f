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
