"""Page faults (and CPU) of a zygote session child against a bare fork + one request.

An unconfined model of `wfjail serve --zygote`'s children (no seccomp, no supervisor; a
Landlock domain per child as the zygote makes it), for counting what a session child writes
that a bare forked child does not. Minor faults are a count, not a timing: no lock needed.
Run it with the interpreter (venv) and the preloaded modules of the benchmark:

    WFJAIL_GETRANDOM=seeded PYTHONPATH=python target/bench/prefork-venv/bin/python \\
        scripts/bench/child_faults.py --path target/bench/prefork --preload temporalio,bench_prefork_wf \\
        --handler bench_prefork_wf:handle 200

(target/bench/prefork/bench_prefork_wf.py is written by scripts/bench-prefork.) Prints the
median minor faults and the mean CPU of each kind of child.
"""

import argparse
import gc
import importlib
import json
import os
import signal
import socket
import statistics
import sys

ap = argparse.ArgumentParser()
ap.add_argument("--path", action="append", default=[], help="added to sys.path")
ap.add_argument("--preload", default="", help="modules to import, comma-separated")
ap.add_argument("--handler", required=True, help="module:function")
ap.add_argument("n", type=int, nargs="?", default=200, help="children of each kind")
args = ap.parse_args()
sys.path[:0] = args.path
for name in filter(None, args.preload.split(",")):
    importlib.import_module(name)

import traceback  # noqa: E402,F401  (as zygote.main: loaded before the children start)

from wfjail import guest  # noqa: E402,F401  (as zygote.main)
from wfjail import protocol as P  # noqa: E402
from wfjail import zygote  # noqa: E402

print("session domain (Landlock ABI, or why none):", zygote._prepare_session_domain())
handler = zygote._resolve(args.handler)
P.frame_cap()
gc.collect()
gc.freeze()
wake = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)  # the zygote's SIGCHLD wake-up, as in main()
signal.set_wakeup_fd(wake[1])
signal.signal(signal.SIGCHLD, lambda *_: None)
devnull = os.open("/dev/null", os.O_WRONLY)
REQ = b"x" * 64


def bare():
    """The benchmark's baseline: fork, the child answers one request over a socketpair."""
    a, b = socket.socketpair()
    pid = os.fork()
    if pid == 0:
        a.close()
        os.write(b.fileno(), handler(os.read(b.fileno(), 65536)))
        os._exit(0)
    b.close()
    a.sendall(REQ)
    a.recv(65536)
    a.close()
    return os.wait4(pid, 0)[2]


def session():
    """A spare as zygote._spare forks it, handed a session; HELLO, one REQUEST, EOF."""
    ctl, ctl_peer = socket.socketpair()
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    pid = os.fork()
    if pid == 0:  # the child's side of zygote._spare
        refused = zygote._leave_zygote(ctl, os.pipe())
        ours.close()
        msg, fds, _, _ = socket.recv_fds(theirs, 65536, 2)
        theirs.close()
        doc = json.loads(msg.decode("utf-8"))
        zygote._child(fds[0], fds[1], doc.get("handler", ""), refused, None)
    theirs.close()
    ctl.close()
    s, peer = socket.socketpair()
    socket.send_fds(ours, [json.dumps({"handler": args.handler}).encode()],
                    [peer.fileno(), devnull])
    ours.close()
    peer.close()
    fd = s.fileno()
    P.write_frame(fd, P.HELLO, P.hello_payload(P.VERSION))
    frame = P.read_frame(fd)
    assert frame is not None and frame[0] == P.HELLO, frame
    P.write_frame(fd, P.REQUEST, REQ)
    frame = P.read_frame(fd)
    assert frame is not None and frame[0] == P.RESULT, frame
    s.close()
    ctl_peer.close()
    return os.wait4(pid, 0)[2]


for name, make in (("bare fork + request", bare), ("session child", session)):
    make()
    usage = [make() for _ in range(args.n)]
    print("%-20s minflt median %4d   CPU mean %.3f ms" % (
        name, statistics.median(u.ru_minflt for u in usage),
        1000 * statistics.mean(u.ru_utime + u.ru_stime for u in usage)))
