"""The handlers the container test's zygote preloads (tests/oci/inside.py)."""

import socket


def echo(request):
    return b"echo " + request


def connect(request):
    socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    return b"not reached"


def workflow(request):
    """What a workflow reads that a replay must read again: the clock and randomness (under
    temporal-python: the session's time and seed), and an address (the pinned layout's)."""
    import datetime
    import json
    import random
    import time
    import uuid
    return json.dumps({
        "time": time.time(),
        "now": datetime.datetime.now(datetime.timezone.utc).isoformat(),
        "random": random.random(),
        "uuid": str(uuid.uuid4()),
        "id": id(object()),
    }).encode()
