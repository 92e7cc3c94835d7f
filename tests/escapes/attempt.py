"""Run one Python escape attempt and say how it ended, for tests/suite/run/escapes.rs.

The attempt is the body of a function: `return X` gives the result `str(X)`; falling off the
end gives `ok`; an OSError gives its errno name (EPERM, EACCES...); any other exception its
class name (RuntimeError when a thread cannot start).

Raw runs:    python3 -c "import sys; sys.path.insert(0, DIR); import attempt; attempt.main()" SRC
Framed runs: framed_guest.py, the request is SRC and the RESULT is the same line.
"""

import errno


def run(src):
    """The outcome of attempt `src` as one line, `result=TOKEN`."""
    body = "".join("    " + line + "\n" for line in src.splitlines()) or "    pass\n"
    scope = {}
    exec("def _attempt():\n" + body, scope)
    try:
        out = scope["_attempt"]()
        token = "ok" if out is None else str(out)
    except OSError as e:
        token = errno.errorcode.get(e.errno, "errno%s" % e.errno)
    except BaseException as e:  # noqa: BLE001 - the catalogue wants the class name
        token = type(e).__name__
    return "result=" + token


def main():
    import sys

    print(run(sys.argv[1]), flush=True)
