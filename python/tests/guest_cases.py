"""Guests that test_guest.py runs in a subprocess: ``python guest_cases.py CASE``.

The pipe fds come from WFJAIL_FDS as under wfjail; ``MOVE_FDS=R,W`` first moves them
onto 3 and 4 exactly as the supervisor lays them out, and ``EXPLICIT_FDS=R,W`` passes
them to ``run(fds=...)`` instead of the environment.
"""

import errno
import fcntl
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import wfjail  # noqa: E402
import wfjail.guest as guest  # noqa: E402


def echo(request):
    return b"echo:" + request


_calls = 0


def counter(request):
    """Module state persists across the calls of one session (one process)."""
    global _calls
    _calls += 1
    return b"%d:" % _calls + request


def text(request):
    return "h\u00e9llo " + request.decode()


def fail(request):
    raise ValueError("bad input: %r" % request)


def wrong_type(request):
    return 42


def denied(request):
    """What a connect() the filter refused looks like from Python."""
    raise PermissionError(errno.EPERM, "Operation not permitted")


def wrapped_denial(request):
    """A library that hides the PermissionError behind its own exception."""
    try:
        denied(request)
    except OSError as e:
        raise ConnectionError("could not reach the service") from e


def no_thread(request):
    raise RuntimeError("can't start new thread")


def no_random(request):
    """What os.urandom() raises when getrandom and /dev/urandom are both denied."""
    raise NotImplementedError("/dev/urandom (or equivalent) not found")


def logs(request):
    print("to stdout")
    print("to stderr", file=sys.stderr)
    guest.log("first")
    guest.log("careful", level=30)
    return b"done"


def catch(request):
    try:
        with guest.violations_as_exceptions():
            denied(request)
    except wfjail.Violation as v:
        doc = v.to_dict()
        doc.update(str=str(v), errno=v.errno, cause=type(v.__cause__).__name__,
                   is_permission_error=isinstance(v, PermissionError))
        return json.dumps(doc)
    return b"not raised"


def query(request):
    return json.dumps(guest.query_violations())


def huge(request):
    return b"x" * (16 * 1024 * 1024 + 1)


def exits(request):
    sys.exit(3)


def interrupted(request):
    """What the worker's interrupt (SIGUSR2 during a call) does: the call answers with where
    it was."""
    import signal

    os.kill(os.getpid(), signal.SIGUSR2)
    for _ in range(10 ** 8):
        pass
    return b"not interrupted"


CASES = {f.__name__: f for f in (echo, counter, text, fail, wrong_type, denied, wrapped_denial,
                                  no_thread, no_random, logs, catch, query, exits,
                                  huge, interrupted)}


def move_fds(spec):
    """dup2 the inherited pipe ends onto 3 and 4, as the supervisor lays them out."""
    rfd, wfd = (int(x) for x in spec.split(","))
    high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in (rfd, wfd)]
    os.close(rfd)
    os.close(wfd)
    for src, dst in zip(high, (3, 4)):
        os.dup2(src, dst)
        os.close(src)
    os.environ["WFJAIL_FDS"] = "3,4"


if __name__ == "__main__":
    if os.environ.get("MOVE_FDS"):
        move_fds(os.environ["MOVE_FDS"])
    handler = CASES[sys.argv[1]]
    explicit = os.environ.get("EXPLICIT_FDS")
    if explicit:
        guest.run(handler, fds=tuple(int(x) for x in explicit.split(",")))
    guest.run(handler)
