"""A framed wfjail guest that runs the Python escape attempt it is sent (see attempt.py)."""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))

import attempt  # noqa: E402
import wfjail.guest  # noqa: E402

if __name__ == "__main__":
    wfjail.guest.run(lambda request: attempt.run(request.decode("utf-8")))
