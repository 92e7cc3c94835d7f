"""The handlers the container test's zygote preloads (tests/oci/inside.py)."""

import socket


def echo(request):
    return b"echo " + request


def connect(request):
    socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    return b"not reached"
