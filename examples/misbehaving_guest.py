"""A guest that does what workflow code must not, to see wfjail name it.

    echo '{"try": "network"}' | \
        wfjail run -p default -- /usr/bin/python3 examples/misbehaving_guest.py

"try" is one of network, thread, fork, exec, urandom, sleep. The handler does not catch
the failure: wfjail.guest.run turns the denied call into a wfjail.Violation naming the
syscall, its arguments and a hint. `urandom` and `sleep` are denied only by policies that
say so (`strict`; `temporal-python` denies sleep). Unconfined, the operations go through:
the connection is refused by the closed port, and exec replaces the guest, so that run
ends without a result.
"""

import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))

import wfjail.guest  # noqa: E402


def network():
    import socket
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(1)
        s.connect(("127.0.0.1", 9))


def thread():
    import threading
    t = threading.Thread(target=lambda: None)
    t.start()
    t.join()


def fork():
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)


def exec_():
    os.execv("/bin/true", ["true"])


def urandom():
    os.urandom(16)


def sleep():
    import time
    time.sleep(0.01)


ATTEMPTS = {"network": network, "thread": thread, "fork": fork, "exec": exec_,
            "urandom": urandom, "sleep": sleep}


def handle(request):
    what = json.loads(request)["try"]
    if what not in ATTEMPTS:
        raise ValueError("unknown attempt %r; try one of %s" % (what, ", ".join(ATTEMPTS)))
    wfjail.guest.log("trying %s" % what)
    ATTEMPTS[what]()
    return json.dumps({"try": what, "outcome": "allowed: this guest is not confined"})


if __name__ == "__main__":
    wfjail.guest.run(handle)
