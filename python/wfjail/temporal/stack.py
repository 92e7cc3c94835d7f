"""A confined child's words as the worker shows them: escaped to one line, cut to a bound,
and a traceback's frames parsed (never a file it names read). No ``temporalio`` here."""

from __future__ import annotations

import os
import re

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
