"""The prefork zygote that ``wfjail serve --zygote`` runs under the policy.

    python -m wfjail.zygote --preload temporalio,my_workflows

It imports what it is told to (and calls each ``module:function`` it is told to: a
warm-up), freezes the garbage collector (so that children share the preloaded objects
copy-on-write instead of touching them), says READY, and then serves one child per session
on request. After READY, off the first session's path, it makes the preloaded heap immortal
on Python 3.12 and 3.13 (``wfjail.immortal``: children that take references to it do not
write its pages) and collapses it into huge pages (``wfjail.hugepages``), a slice at a time
between the forks it serves, then says SETTLED: the children forked before have a heap
marked in part (they copy more of its pages as they write them), those after the settled
one. It keeps one child
forked ahead (a spare, waiting for its session on a socket pair), so that opening a session
does not wait for a fork; the next spare is forked after the answer. A child runs ``wfjail.guest.run`` with the session's handler
on the session socket it was handed, and exits when the session ends. Only the zygote may
fork: the supervisor lets the zygote's ``clone`` through and denies everyone else's. A zygote
with one thread forks through the C library, without CPython's at-fork work (``_raw_fork``).

What it preloads may do what it did in the worker: start threads (they stay in the zygote; a
child has only the thread that forked it, and may start none) and write to ``TMPDIR`` (unless
the policy sets one: a scratch directory wfjail made for this zygote, emptied here before
READY and removed by wfjail before any session, so that ``tempfile.gettempdir()`` at import
finds a directory, as it did in the worker).

Control channel (fd ``WFJAIL_ZYGOTE_FD``, a SOCK_SEQPACKET socket, one frame per packet):

    supervisor -> zygote  FORK    0x31  JSON {"session": n, "handler": "mod:func"} + 2 fds
                                        (the session socket, the session's output pipe)
    zygote -> supervisor  READY   0x32  JSON {"pid": p, "preloaded": [...], "python": "3.11.2",
                                              "session_domain": 7, "control": 2,
                                              "immortal": "after READY" or why not,
                                              "hugepages": "after READY" or why not,
                                              "merging": "any" / "off: why"
                                              (only when WFJAIL_MERGE_PAGES asks)}
                          FORKED  0x33  JSON {"session": n, "pid": p} or {"session": n, "error": "..."}
                          EXITED  0x34  JSON {"pid": p, "status": wait-status, "cpu_ms": f, "max_rss_kb": n}
                          SETTLED 0x35  JSON {"immortal": 205930 (objects) or why not,
                                              "hugepages": KiB collapsed or why not}

Pids are the zygote's own (it is PID 1 of its namespace); the supervisor maps them.

Sessions share one uid and see the host's /proc, so each session child enters a Landlock
domain of its own first thing after the fork, nested in the zygote's: Landlock lets a process
reach another's /proc/PID/fd, mem and environ (ptrace_may_access: also process_vm_*,
pidfd_getfd, kcmp) only if its domain is the other's or an ancestor of it, so siblings (and
the zygote, whose domain is the children's parent) are out of reach, while the unconfined
supervisor still inspects them all. With Landlock ABI >= 6 the nested domain also scopes
signals and abstract unix sockets to the child itself. The nested ruleset takes away no file
access the zygote's own domain grants: it handles only device-node creation and, at ABI >= 2,
reparenting (``REFER``, which any ruleset denies unless a rule grants it), and grants them all
beneath "/". The zygote prepares that ruleset at start-up and READY says
``"session_domain": ABI`` (the kernel's Landlock ABI), or a string saying why it cannot, in
which case the supervisor refuses to serve. A child that cannot enter its domain never runs
its session: it answers ERROR instead of HELLO.
Each session child writes its stdout and stderr to a pipe of its own session.
"""

import _random
import _signal  # type: ignore[import-not-found]  # (no stub: the C half of signal)
import array
import errno
import gc
import importlib
import json
import os
import select
import signal
import socket
import sys

import _socket

from .immortal import ENV as immortal_env
from .immortal import Marking
from .immortal import wanted as wants_immortal
from . import hugepages
from . import merging
from .wire import HEADER
from .wire_control import CONTROL_VERSION, ControlKind, pack_control, pack_exited

TYPE_CHECKING = False
if TYPE_CHECKING:
    import ctypes
    from typing import (Any, Callable, Dict, Generator, Iterable, Iterator, List, Optional,
                        Tuple, Union)

    Handler = Callable[[bytes], Any]
    Spare = Tuple[int, _socket.socket]

FORK, READY = ControlKind.FORK, ControlKind.READY
FORKED, EXITED, SETTLED = ControlKind.FORKED, ControlKind.EXITED, ControlKind.SETTLED
# The next spare is forked once the zygote has had nothing to do for this long: not while a
# session's child starts or exits, which a fork would compete with for the CPUs
# (docs/benchmarks.md, "Prefork latency").
SPARE_IDLE = 0.001
# After READY the zygote marks its heap immortal and collapses it into huge pages
# (``_settle``), a slice at a time between the FORKs it serves: it begins once the first
# session has been forked and the zygote has had nothing to do for SETTLE_IDLE, or after
# SETTLE_AFTER without a FORK, or after SETTLE_FORKS forks (a burst that never leaves it
# idle), so that the first workflow's child does not share the CPUs with it.
SETTLE_IDLE = 0.05
SETTLE_AFTER = 1.0
SETTLE_FORKS = 16
# Objects marked per slice (a few ms), between two looks at the control socket.
MARK_SLICE = 2000
# The largest control packet the zygote takes (a FORK's JSON, its init value included).
CONTROL_MAX = 65536

# What a session child reads of its environment, read once here, in the zygote: wfjail set
# it when it started the zygote, and a child that looked it up (``os.environ`` is Python
# code over a dict) wrote pages it would otherwise share (docs/benchmarks.md, "Issue 28: the
# session child, leaner").
_CPU_LIMIT = os.environ.get("WFJAIL_CPU_LIMIT")
_GETRANDOM = os.environ.get("WFJAIL_GETRANDOM")
# The signals a child gets back, as ``_signal`` (C) takes them: ``signal.signal`` converts
# them to and from enums in Python code, which touches the enum classes' objects.
_CHILD_SIGNALS = ((_signal.SIGCHLD, _signal.SIG_DFL), (_signal.SIGINT, _signal.default_int_handler),
                  (_signal.SIGTERM, _signal.SIG_DFL), (_signal.SIGHUP, _signal.SIG_DFL))


def _resolve(spec: str) -> "Callable[..., Any]":
    """``module:function`` -> the function (the module should be preloaded)."""
    module, _, name = spec.partition(":")
    if not module or not name:
        raise ValueError("handler %r is not 'module:function'" % spec)
    # Preloaded: taken from sys.modules as it is (import_module runs importlib's Python code,
    # which in a session child writes pages it would otherwise share).
    obj: "Any" = sys.modules.get(module)
    if obj is None:
        obj = importlib.import_module(module)
    for part in name.split("."):
        obj = getattr(obj, part)
    if not callable(obj):
        raise TypeError("handler %r is not callable" % spec)
    found: "Callable[..., Any]" = obj
    return found


def _leave_zygote(ctl: socket.socket, wake: "Tuple[int, int]") -> "Optional[str]":
    """First thing in a forked child: enter a Landlock domain of its own (out of its
    siblings' and the zygote's reach, and they out of its), drop what belongs to the zygote
    (its control socket, so that the supervisor sees the zygote's death; its SIGCHLD wake-up
    and ignored signals), and take the per-execution CPU limit that the zygote itself does
    not have. Returns None, or why the child has no domain of its own (then it must not run
    its session)."""
    refused = _enter_session_domain()
    _signal.set_wakeup_fd(-1)
    for signum, handler in _CHILD_SIGNALS:
        _signal.signal(signum, handler)
    os.close(ctl.fileno())
    os.close(wake[0])
    os.close(wake[1])
    cpu = _CPU_LIMIT
    if cpu:
        import resource
        resource.setrlimit(resource.RLIMIT_CPU, (int(cpu), int(cpu)))
    return refused


def _reseed() -> None:
    """Python's ``random`` was seeded when the zygote imported it (and again, with fixed
    bytes, when this child was forked ahead): every session would draw the same numbers.
    Reseed it from the session's own randomness — under ``getrandom = "seeded"`` that is the
    session's seed, so ``random.random()`` repeats on replay. Under ``deny`` there is no
    randomness to reseed from (and asking would be a violation)."""
    if _GETRANDOM not in ("allow", "seeded"):
        return
    mod = sys.modules.get("random")
    if mod is not None:
        try:
            inst = mod._inst
            if mod.seed == inst.seed and type(inst) is mod.Random:
                _seed_c_half(inst)
            else:
                mod.seed()
        except Exception:
            pass


def _seed_c_half(inst: "Any") -> None:
    """What ``Random.seed()`` does to a ``random.Random``, its Python half skipped (a child
    that ran it wrote ~30 pages more: docs/benchmarks.md, "Issue 28: the fork, session 18");
    ``gauss_next`` written only when set (a write is a copied page)."""
    _random.Random.seed(inst, None)
    if inst.gauss_next is not None:
        inst.gauss_next = None


def _reseeding(handler: "Handler") -> "Handler":
    """``handler``, reseeding ``random`` before its first call: by then the session's
    randomness is its own (wfjail arms the session's seeded stream when the guest says
    HELLO, before the first call)."""
    pending = [True]

    def reseed_then_handle(request: bytes) -> "Any":
        if pending:
            pending.clear()
            _reseed()
            _forget_collector_history()
        return handler(request)

    return reseed_then_handle


def _forget_collector_history() -> None:
    """Start the collector's counts (``gc.get_count()``) from nothing in every session,
    whatever the zygote's loop allocated before the fork: what is tracked now (the zygote's
    objects since its freeze, this child's start) joins the frozen heap, and freezing zeroes
    the counts (Python 3.11 to 3.13). A collection before the freeze did the same but cost
    the child ~0.3 ms of CPU (it walked, and wrote, the zygote's pages); cycles made before
    the first call are then left to the child's exit.

    First, every frame of the child's stack gets its frame object (CPython makes one
    lazily, a tracked allocation, the first time a frame is looked at: a traceback through
    it, ``f_back``, ``sys._getframe``): which of the frames below the session's the zygote
    had looked at depends on what it did (an exception caught in its loop, the end of its
    settling), and a walk of the stack after the freeze (``traceback.extract_stack``, the
    runner's audit hook at a workflow's first socket) then counted one allocation more in
    some children than in others. Made here, before the freeze, none is made after it in
    any child. The stack itself is the same in every child (``_Forked``)."""
    frame: "Any" = sys._getframe()
    while frame is not None:
        frame = frame.f_back
    gc.freeze()
    # A collection of nothing (the freeze left the generations empty: no object of the
    # zygote's is walked), for what a full one does besides: it empties the free lists
    # (tuples, lists, dicts, floats...). An object taken from a free list is not counted
    # as an allocation, nor one put back as a deallocation, so the counts after the freeze
    # followed what the lists held at the fork: what the zygote last freed (its loop, its
    # settling's slices), which differed between children.
    gc.collect()


def _begin_session() -> None:
    """Tell the supervisor that this child's session begins, before any of its code runs: a
    zero-length ``getrandom``, which it answers and notes. Its draws before were the fork's
    (CPython reseeds ``random`` in every forked child, before or after the zygote's FORKED
    registered it, as whether a spare was ready decides): fixed bytes under every policy,
    never a violation. From here on a draw is the session's, judged by its policy (a
    handler module imported here that draws is denied under ``deny``)."""
    try:
        os.getrandom(0)
    except OSError:
        pass  # allowed outright, the kernel answered; never refused by a working supervisor


class _Forked(BaseException):
    """Raised in a session child where it was forked (in ``_spare`` or in ``_serve``'s loop),
    caught by ``run``, which then runs the session (``_child``): every child's stack, and
    all its workflow code can read of it (the frames, their lines, their number, what a walk
    of them allocates), is the same, whichever path forked it and whatever the zygote was
    doing. The unwound frames are kept (``_unwound``, its traceback): nothing they hold is
    freed in the child (their locals are the zygote's objects: freeing them would write the
    shared pages, and the settling's list of the heap holds every object)."""

    def __init__(self, session_fd: int, out_fd: int, handler_spec: str,
                 refused: "Optional[str]", init: "Optional[Tuple[Any]]") -> None:
        super().__init__()
        self.session = (session_fd, out_fd, handler_spec, refused, init)


# In a session child: the ``_Forked`` that unwound it (and, through its traceback, the
# zygote's frames it left).
_unwound: "Optional[_Forked]" = None


def run(argv: "Optional[List[str]]" = None) -> int:
    """The zygote (``main``), and in each session child, once unwound to here, its
    session (``_child``, which never returns)."""
    global _unwound
    try:
        return main(argv)
    except _Forked as forked:
        _unwound = forked
    # Outside the ``except``: the session does not run with an exception being handled.
    _child(*_unwound.session)
    os._exit(1)  # not reached: _child ends the process


def _child(session_fd: int, out_fd: int, handler_spec: str, refused: "Optional[str]" = None,
           init: "Optional[Tuple[Any]]" = None) -> None:
    """In a session child: become a guest on the session socket, with the session's own
    output pipe as stdout and stderr, and never return. ``refused``: why the child has no
    Landlock domain of its own; then it answers ERROR instead of HELLO and exits. ``init``:
    ``(value,)`` when OPEN carried one: the handler is a factory, called once with it, and
    what it returns handles the session's calls."""
    _begin_session()
    from . import guest
    from . import protocol as P

    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    for target in (1, 2):
        os.dup2(out_fd, target)
    if out_fd not in (1, 2, 3, 4):
        os.close(out_fd)
    for target in (3, 4):
        if session_fd != target:
            os.dup2(session_fd, target)
    if session_fd not in (3, 4):
        os.close(session_fd)
    try:
        if refused is not None:
            raise RuntimeError("the session child could not enter a Landlock domain of its "
                               "own, so it does not run the session: %s" % refused)
        handler = _resolve(handler_spec)
        if init is not None:
            guest.set_init_value(init[0])
            handler = handler(init[0])
            if not callable(handler):
                raise TypeError("handler %r called with the session's init returned %r, "
                                "not a callable" % (handler_spec, type(handler).__name__))
    except BaseException as exc:  # the session cannot start: say why instead of HELLO
        try:
            P.write_frame(4, P.ERROR, guest.error_payload(exc))
        finally:
            os._exit(0)
    guest.run(_reseeding(handler), fds=(3, 4))


def _no_stop_notices() -> None:
    """Adds ``SA_NOCLDSTOP`` to the zygote's SIGCHLD handler (Python's ``signal`` module
    cannot): wfjail stops each session child after every answer and continues it with the
    next call, and every stop and continue was a SIGCHLD to the zygote, about ten per
    workflow run, each a wake-up of its loop (a timed ``select`` again, its clock read and
    wait supervised, its own pages written). Only children that exit need it: it reaps them.
    Best effort: where it fails, the zygote is woken as before."""
    try:
        import ctypes

        class SigAction(ctypes.Structure):  # glibc's struct sigaction (x86_64)
            _fields_ = [("handler", ctypes.c_void_p), ("mask", ctypes.c_ulong * 16),
                        ("flags", ctypes.c_int), ("restorer", ctypes.c_void_p)]

        libc = ctypes.CDLL(None, use_errno=True)
        act = SigAction()
        if libc.sigaction(signal.SIGCHLD, None, ctypes.byref(act)) != 0:
            return
        act.flags |= 1  # SA_NOCLDSTOP
        libc.sigaction(signal.SIGCHLD, ctypes.byref(act), None)
    except (OSError, AttributeError):
        pass


def _spare(ctl: socket.socket, wake: "Tuple[int, int]") -> "Spare":
    """Fork a child ahead of demand: it waits for its session on a socket pair (one message:
    the FORK's handler and init as JSON, with the session's socket and output pipe),
    so that opening a session does not wait for a fork. Returns (pid, socket). The pair is
    made with ``_socket`` (C objects: no Python-level ``socket.socket`` to build and later
    destroy in the zygote)."""
    ours, theirs = _socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    pid = _fork()
    if pid == 0:
        refused = _leave_zygote(ctl, wake)
        ours.close()
        try:
            msg, fds, _, _ = socket.recv_fds(theirs, CONTROL_MAX, 2)  # type: ignore[arg-type]
        except OSError:
            os._exit(0)
        theirs.close()
        if not msg or len(fds) != 2:
            os._exit(0)  # the zygote is gone, or sent nonsense
        doc = json.loads(msg.decode("utf-8"))
        init = (doc["init"],) if "init" in doc else None
        raise _Forked(fds[0], fds[1], str(doc.get("handler", "")), refused, init)
    theirs.close()
    return pid, ours


# Landlock (include/uapi/linux/landlock.h); x86_64 syscall numbers.
_SYS_LANDLOCK_CREATE_RULESET, _SYS_LANDLOCK_ADD_RULE, _SYS_LANDLOCK_RESTRICT_SELF = 444, 445, 446
_LANDLOCK_CREATE_RULESET_VERSION = 1
_LANDLOCK_RULE_PATH_BENEATH = 1
_ACCESS_FS_MAKE_CHAR, _ACCESS_FS_MAKE_BLOCK, _ACCESS_FS_REFER = 1 << 6, 1 << 11, 1 << 13
_SCOPE_ABSTRACT_UNIX_SOCKET, _SCOPE_SIGNAL = 1 << 0, 1 << 1

# Set by _prepare_session_domain (in the zygote, inherited by every child): the ruleset's fd
# and the libc whose syscall() enters it; or the reason there is none.
_session_ruleset: "Optional[int]" = None
_session_libc: "Optional[ctypes.CDLL]" = None
_session_refused: "Optional[str]" = "the zygote prepared no Landlock domain for its sessions"


def _prepare_session_domain() -> "Union[int, str]":
    """At start-up, before any fork: probe the Landlock ABI and build the ruleset each session
    child enforces on itself (see the module's doc). Returns the ABI, or a string saying why
    there is no such domain."""
    global _session_ruleset, _session_libc, _session_refused
    try:
        import ctypes

        class RulesetAttr(ctypes.Structure):
            _fields_ = [("handled_access_fs", ctypes.c_uint64),
                        ("handled_access_net", ctypes.c_uint64),
                        ("scoped", ctypes.c_uint64)]

        class PathBeneathAttr(ctypes.Structure):
            _pack_ = 1
            _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]

        libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall.restype = ctypes.c_long

        def fail(what: str) -> str:
            global _session_refused
            _session_refused = "%s: %s" % (what, os.strerror(ctypes.get_errno()))
            return _session_refused

        abi: int = libc.syscall(_SYS_LANDLOCK_CREATE_RULESET, None, 0,
                                _LANDLOCK_CREATE_RULESET_VERSION)
        if abi < 0:
            # ENOSYS: a kernel without Landlock; EOPNOTSUPP: Landlock not enabled at boot.
            return fail("landlock_create_ruleset(LANDLOCK_CREATE_RULESET_VERSION)")
        handled = _ACCESS_FS_MAKE_CHAR | _ACCESS_FS_MAKE_BLOCK
        if abi >= 2:
            handled |= _ACCESS_FS_REFER
        scoped = _SCOPE_ABSTRACT_UNIX_SOCKET | _SCOPE_SIGNAL if abi >= 6 else 0
        attr = RulesetAttr(handled, 0, scoped)
        # The size of the fields this ABI knows (a larger one is refused by older kernels
        # only if its extra fields are non-zero; the exact size avoids relying on that).
        size = ctypes.sizeof(attr) if abi >= 6 else 8
        fd = libc.syscall(_SYS_LANDLOCK_CREATE_RULESET, ctypes.byref(attr), size, 0)
        if fd < 0:
            return fail("landlock_create_ruleset")
        root = os.open("/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            rule = PathBeneathAttr(handled, root)
            if libc.syscall(_SYS_LANDLOCK_ADD_RULE, fd, _LANDLOCK_RULE_PATH_BENEATH,
                            ctypes.byref(rule), 0) != 0:
                err = fail("landlock_add_rule")
                os.close(fd)
                return err
        finally:
            os.close(root)
    except Exception as exc:
        _session_refused = "%s: %s" % (type(exc).__name__, exc)
        return _session_refused
    _session_ruleset, _session_libc, _session_refused = fd, libc, None
    return abi


def _enter_session_domain() -> "Optional[str]":
    """In a freshly forked child: enforce the prepared ruleset on itself (a Landlock domain of
    its own, nested in the zygote's). None when done, else why not. No import, no open: the
    zygote's reads may be watched after preloading."""
    if _session_ruleset is None or _session_libc is None:
        return _session_refused
    try:
        # no_new_privs is set (wfjail set it before the exec), as landlock_restrict_self needs.
        if _session_libc.syscall(_SYS_LANDLOCK_RESTRICT_SELF, _session_ruleset, 0) != 0:
            import ctypes  # already imported by the zygote: no file is read
            return "landlock_restrict_self: %s" % os.strerror(ctypes.get_errno())
    except Exception as exc:
        return "%s: %s" % (type(exc).__name__, exc)
    finally:
        try:
            os.close(_session_ruleset)
        except OSError:
            pass
    return None


def _use_scratch() -> "Optional[str]":
    """Before preloading: the scratch directory wfjail made for this zygote (the only place it
    may write, until READY) becomes ``TMPDIR``, unless the policy sets one, so that code which
    probes a temporary directory at import (``tempfile.gettempdir()``) finds one, as it did in
    the worker. Returns the directory to drop before READY."""
    scratch = os.environ.pop("WFJAIL_ZYGOTE_SCRATCH", None)
    if scratch and "TMPDIR" not in os.environ:
        os.environ["TMPDIR"] = scratch
    return scratch


def _drop_scratch(scratch: str) -> "Optional[str]":
    """After preloading, before READY: empty the scratch directory (wfjail removes it once
    READY arrives, before any session: a session child may not write, there or anywhere the
    policy does not grant), and give the children the ``TMPDIR`` they had without it. None,
    or why it could not."""
    import shutil
    import tempfile

    if os.environ.get("TMPDIR") == scratch:
        del os.environ["TMPDIR"]
    # A later gettempdir() looks again (and, in a session, is judged like any write).
    if tempfile.tempdir is not None and os.path.abspath(tempfile.tempdir) == scratch:
        tempfile.tempdir = None
    try:
        device = os.stat(scratch).st_dev
        for entry in os.scandir(scratch):
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path)
            else:
                os.unlink(entry.path)
    except OSError as exc:
        return "emptying the zygote's scratch directory %s: %s" % (scratch, exc)
    return _kept_open(device)


def _kept_open(device: int) -> "Optional[str]":
    """Why the zygote cannot serve if what it preloaded keeps a file of its scratch directory
    open (a regular file on its device, removed): every session child would inherit that
    descriptor, and could write where no session may."""
    import resource
    import stat

    for fd in range(min(resource.getrlimit(resource.RLIMIT_NOFILE)[0], 65536)):
        try:
            st = os.fstat(fd)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode) and st.st_nlink == 0 and st.st_dev == device:
            return ("a preloaded module keeps a file of its temporary directory open (fd %d): "
                    "every session would inherit it and could write there; close it at "
                    "import, or have it opened when a workflow needs it" % fd)
    return None


def _settle(marking: "Optional[Marking]", collapsing: "Optional[Iterator[None]]",
            immortal: "Union[int, str]", huge: "Union[int, str]",
            ) -> "Optional[Generator[None, None, Dict[str, Union[int, str]]]]":
    """The zygote's work after READY, a slice per step (a generator: ``_serve`` steps it
    while no FORK waits), returning SETTLED's document: the heap marked immortal
    (``wfjail.immortal``: objects marked, or why not), then collapsed into huge pages
    (``wfjail.hugepages``: KiB, or why not). None when there is nothing to do (SETTLED
    then follows READY). No warm-up is deferred to it: what a warm-up makes (caches, lazily
    built objects) would be missing in the children forked before it ran, and their code
    would read another interpreter than the later children's (measured: a run forked before
    it and its replay after read another ``gc.get_count()``)."""
    if marking is None and collapsing is None:
        return None
    return _settling(marking, collapsing, immortal, huge)


def _settling(marking: "Optional[Marking]", collapsing: "Optional[Iterator[None]]",
              immortal: "Union[int, str]", huge: "Union[int, str]",
              ) -> "Generator[None, None, Dict[str, Union[int, str]]]":
    if marking is not None:
        while not marking.step(MARK_SLICE):
            yield
        immortal = marking.marked
    if collapsing is not None:
        while True:
            try:
                next(collapsing)
            except StopIteration as done:
                huge = done.value
                break
            yield
    return {"immortal": immortal, "hugepages": huge}


def _fork() -> int:
    """A fork (``os.fork()``, or the C library's ``fork`` where ``_choose_fork`` found it
    safe), retried: the fork waits for the supervisor (seccomp user notification), and a
    SIGCHLD arriving meanwhile interrupts it with EINTR."""
    raw = _raw_fork
    while True:
        if raw is None:
            try:
                return os.fork()
            except InterruptedError:
                continue
        pid: int = raw()
        if pid == 0:
            _after_raw_fork_child()
            return 0
        if pid > 0:
            return pid
        import ctypes

        err = ctypes.get_errno()
        if err != errno.EINTR:
            raise OSError(err, os.strerror(err))


# Forking without CPython's at-fork work (docs/benchmarks.md, "Issue 28: the fork, session
# 18"). ``os.fork()`` runs, in every child, ``PyOS_AfterFork_Child`` and the callbacks
# registered with ``os.register_at_fork``: ``threading._after_fork`` (rebuilds the thread
# table and its locks), ``logging``'s re-creation of every handler's lock, ``random``'s
# reseed; and in the zygote, ``logging``'s lock taken before and released after. In Python
# code on a frozen heap that is ~210 pages a child writes (and copies) and ~12 the zygote
# does, ~0.5 ms of a session child's CPU. All of it exists for other threads: locks one of
# them held at the fork, their thread states, the GIL they waited for. A zygote with one
# thread, forking from its loop (which holds none of those locks), needs none of it but the
# reseed: there the C library's ``fork`` is called with the GIL held (``ctypes.PyDLL``) and
# the child reseeds ``random`` as CPython's callback did (the same draw, answered as
# before). Anything else makes it ``os.fork()`` as before: another thread, a callback
# registered that is not one of the standard library's above, another interpreter.
_raw_fork: "Optional[Callable[[], int]]" = None
# How the zygote forks: "libc", or "os.fork: why not" (tests read it in a child).
fork_path = "os.fork: not chosen yet"
# What ``os.register_at_fork`` was given since ``_watch_at_fork`` (each call's keywords).
_at_fork_seen: "List[Dict[str, Any]]" = []
# The standard library's at-fork callbacks a single-threaded fork from the loop needs not
# run, by module and name (Python 3.11 to 3.13); ``random``'s and ``concurrent.futures``'
# are bound methods, checked by their object.
_AT_FORK_SKIPPABLE = {
    "threading": ("_after_fork",),
    "logging": ("_acquireLock", "_releaseLock", "_after_at_fork_child_reinit_locks",
                "_prepareFork", "_afterFork"),
    "asyncio.events": ("on_fork",),
}


def _watch_at_fork() -> None:
    """Before anything is preloaded: every ``os.register_at_fork`` is still made, and noted
    (``_choose_fork`` forks through ``os.fork()`` when one it does not know was)."""
    register = os.register_at_fork

    def register_at_fork(**callbacks: "Any") -> None:
        register(**callbacks)
        _at_fork_seen.append(callbacks)

    os.register_at_fork = register_at_fork


def _skippable(callback: "Any") -> bool:
    """Whether ``callback`` is one of the standard library's at-fork callbacks that a
    single-threaded fork from the loop needs not run (``random``'s the child does itself)."""
    owner = getattr(callback, "__self__", None)
    if owner is not None:
        random = sys.modules.get("random")
        if random is not None and owner is getattr(random, "_inst", None):
            return getattr(callback, "__name__", None) == "seed"
        futures = sys.modules.get("concurrent.futures.thread")
        return futures is not None and owner is getattr(futures, "_global_shutdown_lock", None)
    names = _AT_FORK_SKIPPABLE.get(getattr(callback, "__module__", None) or "", ())
    return getattr(callback, "__name__", None) in names


def _threads() -> "Optional[int]":
    """The process's threads, or None when they cannot be counted: the link count of
    ``/proc/self/task`` is 2 + its threads (procfs), and ``stat`` is what the zygote's
    Landlock domain lets it do there (its files cannot be read)."""
    try:
        return os.stat("/proc/self/task").st_nlink - 2
    except OSError:
        return None


def _choose_fork() -> str:
    """Once, before the loop's first fork: the C library's ``fork`` where nothing needs
    CPython's at-fork work (see ``_raw_fork``), else ``os.fork()``. Returns ``fork_path``."""
    global _raw_fork, _reseed_at_fork, fork_path
    why = None
    if sys.implementation.name != "cpython" or sys.version_info[:2] not in ((3, 11), (3, 12),
                                                                           (3, 13)):
        why = "not CPython 3.11 to 3.13"
    elif hasattr(sys, "_is_gil_enabled"):
        why = "a free-threaded build" if not sys._is_gil_enabled() else None
    if why is None:
        threading = sys.modules.get("threading")
        if threading is not None and threading.active_count() != 1:
            why = "%d Python threads" % threading.active_count()
    if why is None:
        n = _threads()
        why = ("the thread count is not readable" if n is None
               else "%d threads" % n if n != 1 else None)
    if why is None:
        for callbacks in _at_fork_seen:
            for callback in callbacks.values():
                if not _skippable(callback):
                    why = "an at-fork callback of %s" % getattr(callback, "__module__", "?")
    if why is None:
        try:
            import ctypes

            fork = ctypes.PyDLL(None, use_errno=True).fork
            fork.restype, fork.argtypes = ctypes.c_int, []
        except (OSError, AttributeError) as exc:
            why = "no fork in the C library: %s" % exc
    if why is not None:
        fork_path = "os.fork: " + why
        return fork_path
    random = sys.modules.get("random")
    if random is not None:
        _reseed_at_fork = random._inst
    events = sys.modules.get("asyncio.events")
    if events is not None and hasattr(events, "on_fork"):
        # What its at-fork callback does in a child (Python 3.12+), done once here: the zygote
        # runs no event loop (its wake-up descriptor the child drops in _leave_zygote).
        policy = events._event_loop_policy
        if policy is not None:
            policy._local = events.BaseDefaultEventLoopPolicy._Local()
        events._set_running_loop(None)
    _raw_fork, fork_path = fork, "libc"
    return fork_path


# ``random``'s instance, reseeded (``_seed_c_half``) in a child forked through the C library.
_reseed_at_fork: "Optional[Any]" = None


def _after_raw_fork_child() -> None:
    """In a child forked through the C library: what of CPython's at-fork work it needs,
    ``random``'s reseed (``Random.seed()``: its C half; the draw is answered as before a
    session: fixed bytes)."""
    if _reseed_at_fork is not None:
        _seed_c_half(_reseed_at_fork)


def main(argv: "Optional[List[str]]" = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m wfjail.zygote")
    parser.add_argument("--preload", default="", help="comma-separated modules to import")
    parser.add_argument("--no-spare", action="store_true",
                        help="fork when a session opens instead of keeping a child ready")
    parser.add_argument("--no-immortal", action="store_true",
                        help="leave the preloaded heap mortal (also WFJAIL_IMMORTAL=0)")
    parser.add_argument("--no-hugepages", action="store_true",
                        help="leave the heap in 4 KiB pages (also WFJAIL_HUGEPAGES=0)")
    args = parser.parse_args(argv)
    _watch_at_fork()
    fd = int(os.environ.get("WFJAIL_ZYGOTE_FD", "3"))
    ctl = socket.socket(fileno=fd)
    # The zygote lives as long as the server: no interrupt from a terminal or a stray signal
    # ends it (its children get default handling back).
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    import resource  # noqa: F401  (children use it for their CPU limit)
    # Before preloading (its opens may be watched after it): the sessions' Landlock domain.
    session_domain = _prepare_session_domain()

    scratch = _use_scratch()
    preloaded, error = [], None
    for name in filter(None, (m.strip() for m in args.preload.split(","))):
        try:
            if ":" in name:
                _resolve(name)()  # "module:function": imported, then called (a warm-up)
            else:
                importlib.import_module(name)
            preloaded.append(name)
        except BaseException as exc:
            error = "preloading %s: %s: %s" % (name, type(exc).__name__, exc)
            import traceback
            traceback.print_exc()  # where it raised: on wfjail's stderr as [zygote i] lines
            break
    from . import guest, protocol  # noqa: F401  (the children need them; load them now)
    import traceback  # noqa: F401  (guest.error_payload imports it when a handler fails)
    if scratch and not error:
        error = _drop_scratch(scratch)

    protocol.frame_cap()  # read once here, for every child

    # Threads a preloaded module started stay in the zygote (a child has only the thread that
    # forked it): Python 3.12+ warns at every fork of a multi-threaded process.
    import warnings
    warnings.filterwarnings("ignore", r"This process .* is multi-threaded", DeprecationWarning)

    gc.collect()
    # Python >= 3.12: the preloaded heap immortal, so that children reading it do not write
    # its pages (wfjail.immortal); then the heap in 2 MiB pages: each fork copies, and each
    # exit drops, far fewer page-table entries (wfjail.hugepages). Both are done after READY
    # (``_settle``), off the first session's path; SETTLED says how they went.
    immortal: "Union[int, str]" = "off (--no-immortal or %s=0)" % immortal_env
    huge: "Union[int, str]" = "off (--no-hugepages or %s=0)" % hugepages.ENV
    marking: "Optional[Marking]" = None
    collapsing = None
    # The objects, taken before the freeze hides them from the collector (its ranges are
    # found from their addresses).
    objects = gc.get_objects()
    if not args.no_immortal and wants_immortal(os.environ):
        made = Marking.of(objects)
        if isinstance(made, str):
            immortal = made
            if sys.version_info >= (3, 12):
                print("wfjail.zygote: the preloaded heap stays mortal: %s" % made,
                      file=sys.stderr)
        else:
            marking, immortal = made, "after READY"
    if not args.no_hugepages and hugepages.wanted(os.environ):
        # The addresses, walked at the collapse's first step: of the objects when the
        # marking holds them anyway until they are immortal (3.12+: then holding them changes
        # nothing a child reads), else taken here (an array: no reference to them after READY).
        addresses: "Iterable[int]" = (
            (id(o) for o in objects) if marking is not None else array.array("Q", map(id, objects)))
        collapsing, huge = hugepages.collapsing(addresses), "after READY"
    # Only the marking (3.12+: the objects it marks) holds the objects after READY: what the
    # settling holds is alive in the children forked before it ends, freed in those after.
    settle = _settle(marking, collapsing, immortal, huge)
    del objects
    # Same-page merging for this zygote and its children, when the server asks
    # (wfjail.merging): the server opted this process in before its exec; what the kernel
    # says of it, or why it is off. The server says whether the host merges.
    merge_mode = merging.wanted(os.environ)
    merged: "Optional[str]" = None
    if merge_mode:
        merged = merging.status(merge_mode)
    gc.freeze()
    wake = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wake[1])
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.siginterrupt(signal.SIGCHLD, False)  # SA_RESTART: restart interrupted calls
    _no_stop_notices()
    ready = {"pid": os.getpid(), "preloaded": preloaded, "python": sys.version.split()[0],
             "session_domain": session_domain, "control": CONTROL_VERSION,
             "immortal": immortal, "hugepages": huge}
    if merged is not None:
        ready["merging"] = merged
    if error:
        ready["error"] = error
    ctl.sendall(pack_control(READY, ready))
    if error:
        return 1
    if settle is None:  # nothing to do after READY: settled already
        ctl.sendall(pack_control(SETTLED, {"immortal": immortal, "hugepages": huge}))
    sys.stdout.flush()
    sys.stderr.flush()

    return _serve(ctl, wake, not args.no_spare, settle)


def _serve(ctl: socket.socket, wake: "Tuple[int, int]", forking_ahead: bool,
           settle: "Optional[Generator[None, None, Dict[str, Union[int, str]]]]" = None,
           ) -> int:
    """The zygote's loop, until the supervisor is gone: FORK -> a child (the spare, or a fork)
    and FORKED; SIGCHLD -> reap, EXITED; idle for SPARE_IDLE without a spare -> the next one;
    ``settle`` (``_settle``), stepped a slice at a time while nothing else waits once it
    began (SETTLE_IDLE, SETTLE_AFTER, SETTLE_FORKS), then SETTLED, and the spare forked
    before it ended is replaced by one of the settled heap.

    Every page the zygote writes after a fork is copied once, since the spare and the
    sessions share it: the loop touches as little as it can. What it uses is made here,
    together (a receive buffer, one poll object, bound methods and plain ints in locals: no
    module attribute looked up, no ``IntFlag`` operator; of our helpers only ``_fork``, when no
    spare is ready);
    a FORK's descriptors go to the spare as received (``_hand_over``, inlined; with its
    handler and init re-encoded, the only ``json.dumps``, on the spare's path alone);
    FORKED and EXITED are formatted bytes, not ``json.dumps``. It waits without a timeout
    while a spare is ready (the wake-up pipe of ``signal.set_wakeup_fd`` says when a child
    exits; a timed wait reads the clock, a supervised call here): the only timeout is the
    idle wait before forking a spare."""
    ctl_fd, wake_fd = ctl.fileno(), wake[0]
    poller = select.poll()
    poller.register(ctl_fd, select.POLLIN)
    poller.register(wake_fd, select.POLLIN)
    poll, recv_into, send = poller.poll, ctl.recvmsg_into, ctl.send
    read, wait4, close, fork = os.read, os.wait4, os.close, _fork
    loads, dumps = json.loads, json.dumps
    pack_header, unpack_header, header_size = HEADER.pack, HEADER.unpack_from, HEADER.size
    buf = bytearray(CONTROL_MAX)
    bufs = [buf]
    room = socket.CMSG_SPACE(3 * 4)  # 2 descriptors, and a third shows that there were more
    sol_socket, scm_rights, wnohang = int(socket.SOL_SOCKET), int(socket.SCM_RIGHTS), os.WNOHANG
    truncated, ctruncated = int(socket.MSG_TRUNC), int(socket.MSG_CTRUNC)
    fork_kind, forked_kind = int(FORK), int(FORKED)
    forked_doc = b'{"session": %d, "pid": %d}'
    idle_ms = max(1, round(SPARE_IDLE * 1000))
    _choose_fork()
    settling, settle_began, forks = settle, False, 0
    settle_wait_ms = max(1, round(SETTLE_AFTER * 1000))
    spare = _spare(ctl, wake) if forking_ahead else None
    while True:
        if settling is not None and settle_began:
            timeout: "Optional[int]" = 0
        elif spare is None and forking_ahead:
            timeout = idle_ms
        elif settling is not None:
            timeout = settle_wait_ms
        else:
            timeout = None
        events = poll(timeout)
        reap = not events
        for fd, _ in events:
            if fd == wake_fd:
                reap = True
                try:
                    read(wake_fd, 512)  # a few bytes: what is left wakes the next poll
                except BlockingIOError:
                    pass
                continue
            n, ancdata, flags, _ = recv_into(bufs, room)
            fds: "List[int]" = []
            for level, what, data in ancdata:
                if level == sol_socket and what == scm_rights:
                    fds += memoryview(data)[:len(data) // 4 * 4].cast("i").tolist()
            if n == 0 and not fds:
                return 0  # the supervisor is gone
            if flags & truncated:
                for f in fds:
                    close(f)
                raise ValueError("control packet longer than %d bytes" % CONTROL_MAX)
            if n < header_size:
                raise ValueError("control packet length mismatch")
            length, kind = unpack_header(buf)
            if length != n - 4:
                raise ValueError("control packet length mismatch")
            if kind != fork_kind or len(fds) != 2 or flags & ctruncated:
                for f in fds:
                    close(f)
                continue
            doc = loads(buf[header_size:n])
            session = doc.get("session")
            pid = 0
            if spare is not None:
                # _hand_over, inlined: the FORK's descriptors as received, its handler and
                # init (not its session number: a session learns nothing of how many came
                # before it); a spare that is gone (EPIPE) leaves the fork below to do it.
                doc.pop("session", None)
                try:
                    spare[1].sendmsg((dumps(doc).encode(),), ancdata)
                    pid = spare[0]
                except OSError:
                    pass
                spare[1].close()
                spare = None
            if not pid:
                try:
                    pid = fork()
                except OSError as exc:
                    for f in fds:
                        close(f)
                    send(pack_control(FORKED, {"session": session, "error": str(exc)}))
                    continue
                if pid == 0:
                    init = (doc["init"],) if "init" in doc else None
                    raise _Forked(fds[0], fds[1], str(doc.get("handler", "")),
                                  _leave_zygote(ctl, wake), init)
            for f in fds:
                close(f)
            if type(session) is int:
                answer = forked_doc % (session, pid)
                send(pack_header(len(answer) + 1, forked_kind) + answer)
            else:
                send(pack_control(FORKED, {"session": session, "pid": pid}))
            if settling is not None:
                # After the first fork: once idle for SETTLE_IDLE; after a burst: now.
                forks += 1
                settle_wait_ms = max(1, round(SETTLE_IDLE * 1000))
                settle_began = settle_began or forks >= SETTLE_FORKS
        # Reap every child that ended, and tell the supervisor how.
        while reap:
            try:
                pid, status, usage = wait4(-1, wnohang)
            except ChildProcessError:
                break
            if pid == 0:
                break
            if spare is not None and pid == spare[0]:
                spare[1].close()  # the spare died before its session: make another
                spare = None
            send(pack_exited(pid, status, (usage.ru_utime + usage.ru_stime) * 1000.0,
                             usage.ru_maxrss))
        # The next spare is forked off the sessions' path: once the zygote is idle (a FORK
        # that finds no spare forks at once).
        if spare is None and forking_ahead and not events:
            try:
                spare = _spare(ctl, wake)
            except OSError:
                spare = None
        elif settling is not None and not events:
            # Idle with a spare ready (or none wanted): the next slice of the settling.
            settle_began = True
            try:
                next(settling)
            except StopIteration as done:
                settling = None
                send(pack_control(SETTLED, done.value))
                if spare is not None:
                    # Forked from the heap before it settled: its end (EOF) is reaped
                    # like any child's, and the next spare is forked from the settled heap.
                    spare[1].close()
                    spare = None

if __name__ == "__main__":
    sys.exit(run())
