"""A confined child's words as the worker shows them: escaped to one line, cut to a bound,
and a traceback's frames parsed (never a file it names read); and where a denied call was
made (the child keeps the stacks, the worker matches them to the violations). No
``temporalio`` here."""

from __future__ import annotations

import os
import re
import stat
import sys
import traceback
from typing import Any

from . import source

# Bounds on a stack a child tells: the text read (its end: the innermost frames), frames kept,
# digits of a line number, length of a file or function name or a source line; and on the
# message of its failure.
MAX_STACK_TEXT = 256 * 1024
MAX_STACK_FRAMES = 64
MAX_STACK_NAME = 256
MAX_CHILD_MESSAGE = 4096
# Frames of the child show with this after their file name: the worker never reads a file a
# child names (the source lines are the child's own text), so a hostile workflow cannot get
# lines of the worker's files into its failure.
CHILD_FILE_SUFFIX = " [confined child]"

_FRAME_LINE = re.compile(r'^\s*File "(.*)", line (\d{1,9}), in (.*)$')

# One frame of a child's traceback: (file, line, function, source line).
Frame = tuple[str, int, str, str]

# What a child's text may not carry into the worker's log or a failure: control characters
# (C0 but the tab, DEL, C1: line breaks, ANSI/OSC escapes) and Unicode line and paragraph
# separators, each shown as an escape (as `wfjail run` shows a guest's stderr).
_ESCAPES = {c: "\\x%02x" % c for c in list(range(0x00, 0x20)) + list(range(0x7F, 0xA0))
            if c != 0x09}
_ESCAPES.update({0x2028: "\\u2028", 0x2029: "\\u2029"})


def escape(text: object, limit: int | None = None) -> str:
    """``text`` from a child, safe for one line of the worker's log: escaped (``_ESCAPES``),
    and cut to ``limit`` characters (saying how many were left out)."""
    text = str(text)
    more = ""
    if limit is not None and len(text) > limit:
        more = "... (%d more characters)" % (len(text) - limit)
        text = text[:limit]
    return text.translate(_ESCAPES) + more


def parse_stack(text: str) -> list[Frame]:
    """[(file, line, function, source line)] from a Python traceback's text, outermost
    first (the child's failure stack trace): at most MAX_STACK_FRAMES, the innermost, each
    field bounded. Only the last MAX_STACK_TEXT characters are read."""
    frames = []
    # Split on newlines only: other line breaks a child puts in a field stay in it (escaped).
    lines = text[-MAX_STACK_TEXT:].split("\n")
    for i, line in enumerate(lines):
        m = _FRAME_LINE.match(line)
        if not m:
            continue
        source = ""
        if i + 1 < len(lines) and not _FRAME_LINE.match(lines[i + 1]):
            source = lines[i + 1].strip()
        frames.append((m.group(1)[:MAX_STACK_NAME], int(m.group(2)),
                       m.group(3)[:MAX_STACK_NAME], source[:MAX_STACK_NAME]))
    # The interruption's own frame (where wfjail raised in the child) is not the workflow's.
    while frames and frames[-1][0].endswith(os.path.join("wfjail", "guest.py")):
        frames.pop()
    return frames[-MAX_STACK_FRAMES:]


def stack_text(text: str) -> str:
    """The child's traceback as the worker shows it: its frames (``parse_stack``), each file
    marked ``[confined child]``, every field escaped (``escape``)."""
    out = []
    for filename, lineno, name, source in parse_stack(text):
        out.append('  File "%s%s", line %d, in %s\n' % (escape(filename), CHILD_FILE_SUFFIX,
                                                          lineno, escape(name)))
        if source:
            out.append("    %s\n" % escape(source))
    return "".join(out)


# -- where a denied call was made -----------------------------------------------------------
#
# A denial reaches the worker as the session's violation (the syscall and its arguments, from
# wfjail's supervisor), without the workflow's stack. The child keeps the stack of each call
# a policy may deny as Python's audit events announce it (before the call is made), and sends
# them with the completion; the worker shows, for each violation, the stack of the child's
# first such call of its category (and, for a file, path). A thread start has an audit event
# from Python 3.12 on; before, a denied one shows the stack of the workflow's failure, when it
# did not catch it.

# The audit events of calls a policy may deny, by the category wfjail's violations name.
AUDITED_CALLS = {
    **dict.fromkeys(("socket.__new__", "socket.connect", "socket.bind", "socket.sendto",
                     "socket.sendmsg", "socket.getaddrinfo", "socket.gethostbyname",
                     "socket.gethostbyaddr", "socket.getnameinfo"), "network"),
    **dict.fromkeys(("os.system", "os.posix_spawn", "os.fork", "os.forkpty", "os.spawn",
                     "subprocess.Popen", "pty.spawn"), "subprocess"),
    "os.exec": "exec",
    "_thread.start_new_thread": "thread",
    **dict.fromkeys(("open", "sqlite3.connect", "os.mkdir", "os.remove", "os.rename",
                     "os.rmdir", "os.truncate", "os.chmod", "os.chown", "os.link",
                     "os.symlink", "os.utime"), "filesystem"),
}
# Calls kept per activation (the first ones), and characters of a call's path.
MAX_DENIED_CALLS = 16

# The session handler's file: a stack kept starts below its frame.
_CHILD_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "child.py")

_calls: list[dict[str, str]] = []
_in_hook = False
_hooked = False
# Whether an activation is in progress: the zygote's forks and imports are not kept.
_watching = False
# os.open's flags that make an open a write (a read outside the policy is refused by
# Landlock without a violation: only writes are matched).
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


def watch_calls() -> None:
    """(In the child.) Keeps the stack of each call of ``AUDITED_CALLS`` (an audit hook, once
    per process: the zygote's warm-up installs it before forking)."""
    global _hooked
    if not _hooked:
        _hooked = True
        sys.addaudithook(_on_audit)


def _on_audit(event: str, args: tuple[Any, ...]) -> None:
    global _in_hook
    category = AUDITED_CALLS.get(event)
    if category is None or not _watching or _in_hook or len(_calls) >= MAX_DENIED_CALLS:
        return
    path = ""
    if category == "filesystem" and args:
        path = os.fsdecode(args[0]) if isinstance(args[0], (str, bytes)) else ""
        if event == "open":
            mode, flags = (args + (None, 0))[1:3]
            if not (isinstance(mode, str) and set(mode) & set("wax+")) \
                    and not (isinstance(flags, int) and flags & _WRITE_FLAGS):
                return
    _in_hook = True
    try:
        frames = traceback.extract_stack(sys._getframe(1), limit=MAX_STACK_FRAMES)
        # From the SDK's activation on, as the SDK's own failures show it: not the zygote's
        # and the session handler's frames.
        ours = [i for i, f in enumerate(frames) if f.filename == _CHILD_FILE]
        stack = "".join(traceback.format_list(frames[ours[-1] + 1 if ours else 0:]))
        _calls.append({"category": category, "call": event, "path": path[:MAX_STACK_NAME],
                       "stack": stack})
    except Exception:  # noqa: BLE001  (an audit hook that raises fails the call it watches)
        pass
    finally:
        _in_hook = False


def begin_calls() -> None:
    """(In the child.) Keeps the calls of the activation that begins (``take_calls`` ends
    it)."""
    global _watching
    _calls.clear()
    _watching = True


def take_calls() -> list[dict[str, str]]:
    """(In the child.) The calls the activation made (since ``begin_calls``)."""
    global _watching
    _watching = False
    calls = _calls[:]
    _calls.clear()
    return calls


def denied_stack(violations: list[dict[str, Any]], calls: object, failure_stack: str = "",
                 failure: str = "") -> str:
    """(In the worker.) The stack trace of a task failed for ``violations``: for each, the
    stack of the first of the child's ``calls`` (its words, checked here: at most
    MAX_DENIED_CALLS, each parsed by ``stack_text``) of the violation's category (and path,
    for a file); else the stack of the workflow's own failure (``failure``, its message)
    when the completion failed. Empty when there is neither."""
    kept = [c for c in (calls if isinstance(calls, list) else [])[:MAX_DENIED_CALLS]
            if isinstance(c, dict) and all(isinstance(c.get(k), str)
                                           for k in ("category", "call", "path", "stack"))]
    out = []
    for v in violations[:MAX_DENIED_CALLS]:
        args = str(v.get("args", ""))
        same = [c for c in kept if c["category"] == v.get("category")]
        # A file's call by its path when the violation names it (a relative path may not).
        call = next((c for c in same if c["path"] and c["path"] in args),
                    same[0] if same else None)
        if call is None:
            continue
        out.append("wfjail denied %s %s(%s) here (%s):\n%s" % (
            escape(v.get("category"), MAX_STACK_NAME), escape(v.get("syscall"), MAX_STACK_NAME),
            escape(args, MAX_STACK_NAME), escape(call["call"], MAX_STACK_NAME),
            stack_text(call["stack"])))
    if not out and failure_stack:
        out.append("the workflow's failure (%s):\n%s" % (escape(failure, MAX_CHILD_MESSAGE),
                                                         stack_text(failure_stack)))
    return "".join(out)


# -- a read the policy refused --------------------------------------------------------------
#
# Landlock refuses a read outside the policy's grants in the kernel, with EACCES and no
# report: the workflow's failure is a bare PermissionError. The child tells it from a
# refusal by the file's mode bits (the same errno), by the file's own mode: a file its mode
# lets this process read, refused all the same, was refused by the policy (stat is not
# refused by Landlock). The worker names its policy (``refused_read_text``).

_PERMISSION_DENIED = re.compile(r"^\[Errno 13\] Permission denied: ('.*'|\".*\")$", re.S)


def policy_refused_read(message: str) -> str | None:
    """(In the child.) The path (absolute) of a workflow failure ``message`` that is a
    PermissionError on opening a file, when the file's mode bits let this process read it
    (so the policy's Landlock grants refused it), else None."""
    m = _PERMISSION_DENIED.match(message)
    if not m:
        return None
    try:
        path = source.literal_eval(m.group(1))
        st = os.stat(path)
    except (ValueError, SyntaxError, TypeError, OSError):
        return None
    if not isinstance(path, str):
        return None
    if st.st_uid == os.geteuid():
        bit = stat.S_IRUSR
    elif st.st_gid == os.getegid() or st.st_gid in os.getgroups():
        bit = stat.S_IRGRP
    else:
        bit = stat.S_IROTH
    return os.path.abspath(path) if st.st_mode & bit else None


def _quoted_path(message: str) -> str | None:
    """The path a ``[Errno 13] Permission denied: 'PATH'`` message names, or None."""
    m = _PERMISSION_DENIED.match(message)
    try:
        path = source.literal_eval(m.group(1)) if m else None
    except (ValueError, SyntaxError):
        return None
    return path if isinstance(path, str) else None


def refused_read_text(message: str, path: object, policy: str) -> str:
    """(In the worker.) A failure ``message`` (the child's) with what the child found: the
    policy does not grant reading ``path`` (the child's word, bounded and escaped), and how
    to grant it. ``message`` as it is when ``path`` is not a string naming its file."""
    quoted = _quoted_path(message)
    # The file the message names (as the workflow wrote it: maybe relative) is the one.
    if not isinstance(path, str) or not path or quoted is None \
            or os.path.basename(quoted) != os.path.basename(path):
        return message
    return ("%s (wfjail: policy %s does not let workflow code read %s: grant it in the "
            "[filesystem] read list of a policy that extends it (docs/policy-format.md) and "
            "pass JailedWorkflowRunner(policy=...), or read it in an activity)"
            % (message, policy, escape(path, MAX_STACK_NAME)))
