"""Run a handler as a wfjail guest: handshake, then request -> result or error, until EOF.

    import wfjail.guest

    def handle(request: bytes) -> bytes:
        wfjail.guest.log("working")
        return request.upper()

    wfjail.guest.run(handle)

The guest runs under a seccomp filter that denies threads, sockets, subprocesses and
exec, so this module uses none of them: blocking os.read/os.write on the two pipe fds
and nothing else. stdout and stderr are the guest's logs; protocol data never goes there.
"""

import errno
import json
import os
import sys

from . import protocol as P
from . import wire
from .errors import ProtocolError, Violation

TYPE_CHECKING = False
if TYPE_CHECKING:  # (typing itself is not loaded in a guest: it would cost every start)
    from types import FrameType, TracebackType
    from typing import (Any, Callable, Dict, List, Literal, NoReturn, Optional, Tuple, Type,
                        Union)

    Handler = Callable[[bytes], Union[bytes, bytearray, memoryview, str]]

# Error texts are cut to these sizes (the message keeps its head, the traceback its
# tail) so that an ERROR frame stays well below any frame cap a policy may set.
_MAX_MESSAGE = 16 * 1024
_MAX_TRACEBACK = 48 * 1024


class _Session:
    """The two pipe fds, once our HELLO is out (LOG and QUERY are legal from then on)."""

    __slots__ = ("rfd", "wfd")

    def __init__(self, rfd: int, wfd: int) -> None:
        self.rfd = rfd
        self.wfd = wfd


_session: "Optional[_Session]" = None


_NO_INIT = object()
_init_value: "Any" = _NO_INIT


def init_value(default: "Any" = None) -> "Any":
    """The session's arguments: the ``init`` of the worker's OPEN (any JSON value), or
    ``default`` when it sent none. In an exec'd guest it comes from ``WFJAIL_INIT``; in a
    zygote session the handler factory also receives it."""
    global _init_value
    if _init_value is _NO_INIT:
        text = os.environ.get("WFJAIL_INIT")
        if text is None:
            return default
        _init_value = json.loads(text)
    return _init_value


def set_init_value(value: "Any") -> None:
    """Set what ``init_value()`` returns (wfjail.zygote: a session child's ``init``)."""
    global _init_value
    _init_value = value


def run(handler: "Handler", *, fds: "Optional[Tuple[int, int]]" = None) -> "NoReturn":
    """Serve requests with ``handler(request: bytes) -> bytes | str`` until the supervisor
    closes the pipe, then exit 0 (one request under ``wfjail run``, several in a session).

    ``fds`` is ``(read_fd, write_fd)``; by default it comes from ``WFJAIL_FDS``. A
    handler exception becomes an ERROR frame; a denied operation (see ``explain``)
    becomes a ``wfjail.Violation`` naming the syscall. The
    process ends with ``os._exit`` so that no atexit hook or interpreter teardown runs
    code the sandbox would refuse after the result is out.
    """
    if fds is None:
        fds = _fds_from_env()
    status = _converse(handler, int(fds[0]), int(fds[1]))
    _flush_stdio()
    os._exit(status)


def connected() -> bool:
    """Whether this process is in ``run`` (its handshake done): LOG reaches the
    supervisor."""
    return _session is not None


def in_call() -> bool:
    """Whether the handler is answering a call: UPCALL (``upcall``) is legal only then."""
    return _session is not None and _calling


def log(text: object, level: int = 20) -> None:
    """Send a LOG frame (10 debug, 20 info, 30 warning, 40 error).

    Outside ``run`` (before the handshake, or in a plain interpreter) the line goes to
    stderr instead, which the supervisor captures as logs too.
    """
    if not isinstance(level, int) or not 0 <= level <= 255:
        raise ValueError("log level must be an int in 0..255, not %r" % (level,))
    text = _clean(str(text))
    session = _session
    if session is None:
        sys.stderr.write("wfjail log %d: %s\n" % (level, text))
        return
    data = text.encode("utf-8")
    cap = P.frame_cap()
    if len(data) > cap - 1:  # cut, but keep it valid UTF-8
        data = data[:cap - 1].decode("utf-8", "ignore").encode("utf-8")
    P.write_frame(session.wfd, P.LOG, bytes((level,)) + data)


class Interrupted(Exception):
    """Raised in the code a call runs when the worker interrupts the call (a workflow that
    never yields, for instance): the call then answers with where it was."""

    __module__ = "wfjail"


_calling = False


def _interrupt(signum: int, frame: "Optional[FrameType]") -> None:
    if _calling:
        raise Interrupted("the worker interrupted this call (it ran too long)")


class UpcallError(Exception):
    """An UPCALL got no answer: why (no worker handles upcalls, or its handler failed)."""

    __module__ = "wfjail"


def upcall(payload: bytes) -> bytes:
    """Ask the worker a question during a call (``bytes`` in, ``bytes`` out): wfjail relays
    it as UPCALL and the worker's answer back as REPLY. Raises ``UpcallError`` when there is
    no answer (``wfjail run`` has no worker; the worker's handler failed)."""
    session = _session
    if session is None:
        raise ProtocolError("closed", "UPCALL is only possible inside wfjail.guest.run()")
    P.write_frame(session.wfd, P.UPCALL, bytes(payload))
    frame = P.read_frame(session.rfd)
    if frame is None:
        raise ProtocolError("closed", "the supervisor closed the pipe instead of answering UPCALL")
    kind, answer = frame
    if kind != P.REPLY or not answer:
        raise ProtocolError("unexpected", "expected REPLY, got %s" % P.NAMES[kind])
    answered, body = wire.parse_reply(answer)
    if not answered:
        raise UpcallError(body.decode("utf-8", "replace"))
    return body


def query_violations() -> "List[Dict[str, Any]]":
    """Ask the supervisor what it denied since the last QUERY; return the list of dicts.

    The supervisor records a violation before the denied call returns, so asking right
    after a failure always sees it.
    """
    session = _session
    if session is None:
        raise ProtocolError("closed", "QUERY is only possible inside wfjail.guest.run()")
    P.write_frame(session.wfd, P.QUERY)
    frame = P.read_frame(session.rfd)
    if frame is None:
        raise ProtocolError("closed", "the supervisor closed the pipe instead of answering QUERY")
    kind, payload = frame
    if kind != P.VIOLATIONS:
        raise ProtocolError("unexpected", "expected VIOLATIONS, got %s" % P.NAMES[kind])
    try:
        found = json.loads(payload.decode("utf-8"))
    except ValueError as e:
        raise ProtocolError("payload", "VIOLATIONS is not UTF-8 JSON: %s" % e) from None
    if not isinstance(found, list) or not all(isinstance(v, dict) for v in found):
        raise ProtocolError("payload", "VIOLATIONS is not a JSON array of objects")
    return found


def explain(exc: BaseException) -> BaseException:
    """Return a ``wfjail.Violation`` for ``exc`` if the supervisor denied its cause.

    Only exceptions that look like a denial (anywhere in the cause/context chain: a
    PermissionError or EPERM, a thread that could not start, an os.urandom() without a
    source) cost a QUERY;
    anything else, or a denial the supervisor did not record, is returned unchanged.
    The Violation's ``__cause__`` is ``exc``.
    """
    if isinstance(exc, Violation) or _session is None or not _looks_denied(exc):
        return exc
    try:
        found = query_violations()
    except (ProtocolError, OSError):
        return exc  # explaining must never hide the original error
    if not found:
        return exc
    violation = Violation.from_dict(_match(exc, found))
    violation.__cause__ = exc
    return violation


class violations_as_exceptions:
    """``with violations_as_exceptions(): ...`` re-raises denials as ``wfjail.Violation``.

    ``run`` does this around the handler already; use it to catch a Violation inside
    the handler.
    """

    def __enter__(self) -> "violations_as_exceptions":
        return self

    def __exit__(self, etype: "Optional[Type[BaseException]]", exc: "Optional[BaseException]",
                 tb: "Optional[TracebackType]") -> "Literal[False]":
        if exc is None:
            return False
        violation = explain(exc)
        if violation is exc:
            return False
        raise violation from exc


# -- the conversation ----------------------------------------------------------------

def _fds_from_env() -> "Tuple[int, int]":
    spec = os.environ.get("WFJAIL_FDS", "")
    try:
        rfd, wfd = (int(x) for x in spec.split(","))
        return rfd, wfd
    except ValueError:
        sys.stderr.write(
            "wfjail: WFJAIL_FDS=%r is not 'READ_FD,WRITE_FD': this program speaks the wfjail "
            "protocol; start it with `wfjail run -- CMD` (or pass fds= to run())\n" % spec)
        _flush_stdio()
        os._exit(2)


def _converse(handler: "Handler", rfd: int, wfd: int) -> int:
    """The whole protocol: handshake, then one call per REQUEST until end-of-file.

    Returns the exit status. One-shot `wfjail run` sends one REQUEST and closes the pipe
    once it has the answer; `wfjail serve` sends one REQUEST per call of a session.
    """
    global _session
    try:
        _read_hello(rfd)
        P.write_frame(wfd, P.HELLO, P.hello_payload(P.VERSION))
    except (ProtocolError, OSError) as exc:
        return _send_last(wfd, P.ERROR, error_payload(exc))
    _session = _Session(rfd, wfd)
    global _calling
    try:
        # _signal, not signal: signal.signal converts to and from enums in Python code, which
        # in a zygote's session child writes pages it would otherwise share.
        import _signal  # type: ignore[import-not-found]  # (no stub: the C half of signal)

        _signal.signal(_signal.SIGUSR2, _interrupt)
    except (ValueError, OSError):  # not the main thread: calls cannot be interrupted
        pass
    while True:
        try:
            frame = P.read_frame(rfd)
            if frame is None:
                break  # no further call: the session is over
            if frame[0] != P.REQUEST:
                raise ProtocolError("unexpected", "expected REQUEST, got %s" % P.NAMES[frame[0]])
        except (ProtocolError, OSError) as exc:
            _session = None
            return _send_last(wfd, P.ERROR, error_payload(exc))
        try:
            _calling = True
            try:
                with violations_as_exceptions():
                    result = handler(frame[1])
            finally:
                _calling = False
            kind, payload = P.RESULT, _result_bytes(result)
            cap = P.frame_cap()
            if len(payload) > cap:  # an ERROR the author can read, not a killed guest
                raise ProtocolError("oversized", "the result of %d bytes exceeds the %d-byte "
                                    "frame cap" % (len(payload), cap))
        except BaseException as exc:  # SystemExit too: each call ends with RESULT or ERROR
            kind, payload = P.ERROR, error_payload(exc)
        if _send_last(wfd, kind, payload) != 0:
            break
    _session = None
    return 0


def _read_hello(rfd: int) -> int:
    frame = P.read_frame(rfd)
    if frame is None:
        raise ProtocolError("closed", "the supervisor closed the pipe before HELLO")
    kind, payload = frame
    if kind != P.HELLO:
        raise ProtocolError("handshake", "expected HELLO, got %s" % P.NAMES[kind])
    version = P.parse_hello(payload)
    if version < P.VERSION:
        raise ProtocolError("handshake", "the supervisor speaks protocol version %d; this "
                            "guest needs version %d" % (version, P.VERSION))
    return version


def _send_last(wfd: int, kind: int, payload: bytes) -> int:
    try:
        P.write_frame(wfd, kind, payload)
        return 0
    except OSError as e:  # the supervisor is gone: nobody to tell but the log
        sys.stderr.write("wfjail: could not send %s: %s\n" % (P.NAMES[kind], e))
        return 1


def _result_bytes(result: object) -> bytes:
    if isinstance(result, str):
        return result.encode("utf-8")
    if isinstance(result, (bytes, bytearray, memoryview)):
        return bytes(result)
    raise TypeError("the handler returned %s; return bytes or str" % type(result).__name__)


def error_payload(exc: BaseException) -> bytes:
    """The ERROR frame's JSON: type, message and the formatted (chained) traceback."""
    try:
        message = str(exc)
    except Exception:
        message = "<str() of %s failed>" % type(exc).__name__
    try:
        # Imported here, not at the top: `traceback` (with linecache, tokenize, textwrap and
        # contextlib) costs an exec'd guest milliseconds at every start, and only a failing
        # handler needs it. A zygote imports it before its children start (zygote.py).
        import traceback

        tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    except Exception:
        tb = "<the traceback could not be formatted>\n"
    if len(message) > _MAX_MESSAGE:
        message = message[:_MAX_MESSAGE] + "... [cut]"
    if len(tb) > _MAX_TRACEBACK:
        tb = "[cut] ..." + tb[-_MAX_TRACEBACK:]
    doc = {"type": _type_name(type(exc)), "message": _clean(message), "traceback": _clean(tb)}
    return json.dumps(doc, ensure_ascii=False).encode("utf-8")


def _type_name(cls: type) -> str:
    """`ValueError`, `wfjail.Violation`, `json.decoder.JSONDecodeError`..."""
    module = getattr(cls, "__module__", None)
    name = getattr(cls, "__qualname__", cls.__name__)
    if module in (None, "builtins", "__main__"):
        return name
    return "%s.%s" % (module, name)


def _chain(exc: "Optional[BaseException]") -> "List[BaseException]":
    """``exc`` and its causes (the chain is finite, but stay cheap: at most 16)."""
    chain: "List[BaseException]" = []
    while exc is not None and len(chain) < 16:
        chain.append(exc)
        exc = exc.__cause__ or exc.__context__
    return chain


def _denial_category(exc: BaseException) -> "Optional[str]":
    """The violation category an exception that is not an EPERM shows a denial by."""
    if isinstance(exc, RuntimeError) and "start new thread" in str(exc):
        return "thread"
    # os.urandom() under `random.getrandom = "deny"`: getrandom fails with EPERM,
    # CPython falls back to /dev/urandom, Landlock refuses it, and CPython reports that.
    if isinstance(exc, NotImplementedError) and "/dev/urandom" in str(exc):
        return "random"
    return None


def _looks_denied(exc: BaseException) -> bool:
    return any(
        isinstance(e, PermissionError)
        or (isinstance(e, OSError) and e.errno == errno.EPERM)
        or _denial_category(e) is not None
        for e in _chain(exc))


def _match(exc: BaseException, found: "List[Dict[str, Any]]") -> "Dict[str, Any]":
    """The recorded violation that explains ``exc``: the one naming the file the exception
    names (a denied open: a late import, a write outside the policy), else the one of the
    exception's kind (a thread, randomness), else the most recent."""
    chain = _chain(exc)
    for e in chain:
        name = getattr(e, "filename", None)
        if isinstance(name, str) and name:
            for v in found:
                if name in str(v.get("args", "")):
                    return v
    for e in chain:
        category = _denial_category(e)
        if category is None:
            continue
        for recorded in found[::-1]:
            if recorded.get("category") == category:
                return recorded
    return found[-1]


def _clean(text: str) -> str:
    """Make text encodable as UTF-8 (lone surrogates would break the supervisor's JSON)."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _flush_stdio() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except Exception:
            pass
