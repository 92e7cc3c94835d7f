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
