"""The prefork zygote that ``wfjail serve --zygote`` runs under the policy.

    python -m wfjail.zygote --preload temporalio,my_workflows

It imports what it is told to, freezes the garbage collector (so that children share the
preloaded objects copy-on-write instead of touching them), says READY, and then forks one
child per session on request. A child runs ``wfjail.guest.run`` with the session's handler
on the session socket it was handed, and exits when the session ends. Only the zygote may
fork: the supervisor lets the zygote's ``clone`` through and denies everyone else's.

Control channel (fd ``WFJAIL_ZYGOTE_FD``, a SOCK_SEQPACKET socket, one frame per packet):

    supervisor -> zygote  FORK    0x31  JSON {"session": n, "handler": "mod:func"} + 1 fd
    zygote -> supervisor  READY   0x32  JSON {"pid": p, "preloaded": [...], "python": "3.11.2"}
                          FORKED  0x33  JSON {"session": n, "pid": p} or {"session": n, "error": "..."}
                          EXITED  0x34  JSON {"pid": p, "status": wait-status, "cpu_ms": f, "max_rss_kb": n}

Pids are the zygote's own (it is PID 1 of its namespace); the supervisor maps them.
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


def _child(ctl, wake, session_fd, handler_spec):
    """In the forked child: become a guest on the session socket and never return."""
    from . import guest
    from . import protocol as P

    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    for fd in (ctl.fileno(), wake[0], wake[1]):
        os.close(fd)
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
    args = parser.parse_args(argv)
    fd = int(os.environ.get("WFJAIL_ZYGOTE_FD", "3"))
    ctl = socket.socket(fileno=fd)

    preloaded, error = [], None
    for name in filter(None, (m.strip() for m in args.preload.split(","))):
        try:
            importlib.import_module(name)
            preloaded.append(name)
        except BaseException as exc:
            error = "preloading %s: %s: %s" % (name, type(exc).__name__, exc)
            break
    from . import guest, protocol  # noqa: F401  (the children need them; load them now)

    gc.collect()
    gc.freeze()
    wake = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wake[1])
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.siginterrupt(signal.SIGCHLD, False)  # SA_RESTART: restart interrupted calls
    ready = {"pid": os.getpid(), "preloaded": preloaded, "python": sys.version.split()[0]}
    if error:
        ready["error"] = error
    ctl.sendall(_frame(READY, ready))
    if error:
        return 1
    sys.stdout.flush()
    sys.stderr.flush()

    while True:
        try:
            readable, _, _ = select.select([ctl, wake[0]], [], [])
        except InterruptedError:
            continue
        if wake[0] in readable:
            try:
                while os.read(wake[0], 512):
                    pass
            except BlockingIOError:
                pass
        if ctl in readable:
            msg, fds, _, _ = socket.recv_fds(ctl, 65536, 1)
            if not msg:
                return 0  # the supervisor is gone
            kind, doc = _parse(msg)
            if kind != FORK or len(fds) != 1:
                for f in fds:
                    os.close(f)
                continue
            session_fd = fds[0]
            try:
                pid = _fork()
            except OSError as exc:
                os.close(session_fd)
                ctl.sendall(_frame(FORKED, {"session": doc.get("session"), "error": str(exc)}))
                continue
            if pid == 0:
                _child(ctl, wake, session_fd, str(doc.get("handler", "")))
            os.close(session_fd)
            ctl.sendall(_frame(FORKED, {"session": doc.get("session"), "pid": pid}))
        # Reap every child that ended, and tell the supervisor how.
        while True:
            try:
                pid, status, usage = os.wait4(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            ctl.sendall(_frame(EXITED, {
                "pid": pid,
                "status": status,
                "cpu_ms": (usage.ru_utime + usage.ru_stime) * 1000.0,
                "max_rss_kb": usage.ru_maxrss,
            }))


if __name__ == "__main__":
    sys.exit(main())
