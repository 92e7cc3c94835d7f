"""The prefork zygote that ``wfjail serve --zygote`` runs under the policy.

    python -m wfjail.zygote --preload temporalio,my_workflows

It imports what it is told to, freezes the garbage collector (so that children share the
preloaded objects copy-on-write instead of touching them), says READY, and then serves one
child per session on request. It keeps one child forked ahead (a spare, waiting for its
session on a socket pair), so that opening a session does not wait for a fork; the next
spare is forked after the answer. A child runs ``wfjail.guest.run`` with the session's handler
on the session socket it was handed, and exits when the session ends. Only the zygote may
fork: the supervisor lets the zygote's ``clone`` through and denies everyone else's.

Control channel (fd ``WFJAIL_ZYGOTE_FD``, a SOCK_SEQPACKET socket, one frame per packet):

    supervisor -> zygote  FORK    0x31  JSON {"session": n, "handler": "mod:func"} + 2 fds
                                        (the session socket, the session's output pipe)
    zygote -> supervisor  READY   0x32  JSON {"pid": p, "preloaded": [...], "python": "3.11.2",
                                              "dumpable": false}
                          FORKED  0x33  JSON {"session": n, "pid": p} or {"session": n, "error": "..."}
                          EXITED  0x34  JSON {"pid": p, "status": wait-status, "cpu_ms": f, "max_rss_kb": n}

Pids are the zygote's own (it is PID 1 of its namespace); the supervisor maps them.

Sessions share one uid and Landlock domain, so after preloading the zygote makes itself
non-dumpable (inherited by every fork, reset only by exec): another session's (or the
zygote's) /proc/PID/fd, mem and environ then need CAP_SYS_PTRACE, which no guest has. If it
cannot, READY says ``"dumpable": true`` (and why) and the supervisor refuses to serve.
Each session child writes its stdout and stderr to a pipe of its own session.
"""

import gc
import importlib
import json
import os
import select
import signal
import socket
import struct
import sys

FORK, READY, FORKED, EXITED = 0x31, 0x32, 0x33, 0x34


def _frame(kind, doc):
    payload = json.dumps(doc).encode("utf-8")
    return struct.pack("<IB", len(payload) + 1, kind) + payload


def _parse(packet):
    if len(packet) < 5:
        raise ValueError("short control packet")
    length, kind = struct.unpack("<IB", packet[:5])
    if length != len(packet) - 4:
        raise ValueError("control packet length mismatch")
    return kind, json.loads(packet[5:].decode("utf-8"))


def _resolve(spec):
    """``module:function`` -> the function (the module should be preloaded)."""
    module, _, name = spec.partition(":")
    if not module or not name:
        raise ValueError("handler %r is not 'module:function'" % spec)
    obj = importlib.import_module(module)
    for part in name.split("."):
        obj = getattr(obj, part)
    if not callable(obj):
        raise TypeError("handler %r is not callable" % spec)
    return obj


def _leave_zygote(ctl, wake):
    """First thing in a forked child: drop what belongs to the zygote (its control socket,
    so that the supervisor sees the zygote's death; its SIGCHLD wake-up and ignored signals),
    and take the per-execution CPU limit that the zygote itself does not have."""
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    for fd in (ctl.fileno(), wake[0], wake[1]):
        os.close(fd)
    cpu = os.environ.get("WFJAIL_CPU_LIMIT")
    if cpu:
        import resource
        resource.setrlimit(resource.RLIMIT_CPU, (int(cpu), int(cpu)))


def _child(session_fd, out_fd, handler_spec):
    """In a session child: become a guest on the session socket, with the session's own
    output pipe as stdout and stderr, and never return."""
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
        handler = _resolve(handler_spec)
    except BaseException as exc:  # the session cannot start: say why instead of HELLO
        try:
            P.write_frame(4, P.ERROR, guest._error_payload(exc))
        finally:
            os._exit(0)
    guest.run(handler, fds=(3, 4))


def _spare(ctl, wake):
    """Fork a child ahead of demand: it waits for its session (socket + handler) on a
    socket pair, so that opening a session does not wait for a fork. Returns (pid, socket)."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    pid = _fork()
    if pid == 0:
        _leave_zygote(ctl, wake)
        ours.close()
        try:
            msg, fds, _, _ = socket.recv_fds(theirs, 65536, 2)
        except OSError:
            os._exit(0)
        theirs.close()
        if not msg or len(fds) != 2:
            os._exit(0)  # the zygote is gone, or sent nonsense
        _child(fds[0], fds[1], json.loads(msg.decode("utf-8")).get("handler", ""))
    theirs.close()
    return pid, ours


def _hand_over(spare, session_fds, handler):
    """Give a session (its socket and output pipe) to a spare child; False if the spare is
    gone."""
    pid, sock = spare
    try:
        socket.send_fds(sock, [json.dumps({"handler": handler}).encode("utf-8")], session_fds)
        return True
    except OSError:
        return False
    finally:
        sock.close()


def _make_undumpable():
    """prctl(PR_SET_DUMPABLE, 0) on the zygote (and so on every child it forks); None when
    done, else why not."""
    PR_SET_DUMPABLE, PR_GET_DUMPABLE = 4, 3
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
            return "prctl(PR_SET_DUMPABLE): %s" % os.strerror(ctypes.get_errno())
        if libc.prctl(PR_GET_DUMPABLE, 0, 0, 0, 0) != 0:
            return "prctl(PR_GET_DUMPABLE) still says dumpable"
    except Exception as exc:
        return "%s: %s" % (type(exc).__name__, exc)
    return None


def _fork():
    """os.fork(), retried: the fork waits for the supervisor (seccomp user notification),
    and a SIGCHLD arriving meanwhile interrupts it with EINTR."""
    while True:
        try:
            return os.fork()
        except InterruptedError:
            continue


def main(argv=None):
    import argparse

    parser = argparse.ArgumentParser(prog="python -m wfjail.zygote")
    parser.add_argument("--preload", default="", help="comma-separated modules to import")
    parser.add_argument("--no-spare", action="store_true",
                        help="fork when a session opens instead of keeping a child ready")
    args = parser.parse_args(argv)
    fd = int(os.environ.get("WFJAIL_ZYGOTE_FD", "3"))
    ctl = socket.socket(fileno=fd)
    # The zygote lives as long as the server: no interrupt from a terminal or a stray signal
    # ends it (its children get default handling back).
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    import resource  # noqa: F401  (children use it for their CPU limit)

    preloaded, error = [], None
    for name in filter(None, (m.strip() for m in args.preload.split(","))):
        try:
            importlib.import_module(name)
            preloaded.append(name)
        except BaseException as exc:
            error = "preloading %s: %s: %s" % (name, type(exc).__name__, exc)
            break
    from . import guest, protocol  # noqa: F401  (the children need them; load them now)

    dumpable = _make_undumpable()
    gc.collect()
    gc.freeze()
    wake = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wake[1])
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.siginterrupt(signal.SIGCHLD, False)  # SA_RESTART: restart interrupted calls
    ready = {"pid": os.getpid(), "preloaded": preloaded, "python": sys.version.split()[0],
             "dumpable": dumpable is not None}
    if dumpable is not None:
        ready["dumpable_error"] = dumpable
    if error:
        ready["error"] = error
    ctl.sendall(_frame(READY, ready))
    if error:
        return 1
    sys.stdout.flush()
    sys.stderr.flush()

    forking_ahead = not args.no_spare
    spare = _spare(ctl, wake) if forking_ahead else None
    while True:
        try:
            # A timeout too: children are reaped even if the wake-up pipe stayed silent.
            readable, _, _ = select.select([ctl, wake[0]], [], [], 1.0)
        except InterruptedError:
            continue
        if wake[0] in readable:
            try:
                while os.read(wake[0], 512):
                    pass
            except BlockingIOError:
                pass
        if ctl in readable:
            msg, fds, _, _ = socket.recv_fds(ctl, 65536, 2)
            if not msg:
                return 0  # the supervisor is gone
            kind, doc = _parse(msg)
            if kind != FORK or len(fds) != 2:
                for f in fds:
                    os.close(f)
                continue
            handler = str(doc.get("handler", ""))
            if spare is not None and _hand_over(spare, fds, handler):
                pid = spare[0]
            else:
                try:
                    pid = _fork()
                except OSError as exc:
                    for f in fds:
                        os.close(f)
                    ctl.sendall(_frame(FORKED, {"session": doc.get("session"), "error": str(exc)}))
                    continue
                if pid == 0:
                    _leave_zygote(ctl, wake)
                    _child(fds[0], fds[1], handler)
            spare = None
            for f in fds:
                os.close(f)
            ctl.sendall(_frame(FORKED, {"session": doc.get("session"), "pid": pid}))
        if spare is None and forking_ahead:
            try:
                spare = _spare(ctl, wake)  # after the answer: off the session's path
            except OSError:
                spare = None
        # Reap every child that ended, and tell the supervisor how.
        while True:
            try:
                pid, status, usage = os.wait4(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            if spare is not None and pid == spare[0]:
                spare[1].close()  # the spare died before its session: make another
                spare = None
            ctl.sendall(_frame(EXITED, {
                "pid": pid,
                "status": status,
                "cpu_ms": (usage.ru_utime + usage.ru_stime) * 1000.0,
                "max_rss_kb": usage.ru_maxrss,
            }))


if __name__ == "__main__":
    sys.exit(main())
