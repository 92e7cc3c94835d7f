"""Make the zygote's heap immortal before it forks sessions (CPython 3.12 and 3.13, PEP 683).

A forked child that only reads the zygote's objects still writes their pages: every
reference it takes increments the shared object's ``ob_refcnt``, and the kernel copies the
whole 4 KiB page. An immortal object (its refcount's low 32 bits all set, on a 64-bit build)
is skipped by ``Py_INCREF``/``Py_DECREF``, so its page stays shared. The zygote marks every
object it holds (``gc.get_objects()`` and, through them, the untracked objects they refer
to: strings, code, tuples of constants...) once: the objects are listed after preloading and
its last ``gc.collect()``, before it freezes the collector (``gc.get_objects()`` no longer
sees frozen objects), and marked after READY, a ``Marking.step`` at a time between forks. Code objects are not GC types: their constants and names
are reached through their attributes. docs/benchmarks.md, "Issue 20", has what it saves.

What it costs: a marked object is never freed. The zygote keeps what it preloaded for its
life anyway; an object a session child drops stays allocated in that child only, until the
child exits; its finalizer (``__del__``, a weakref callback) does not run. Mutating a marked
object is fine (its refcount is not its value). An extension built against an older
limited API may still increment such a refcount inline: the object becomes mortal again
with a refcount near 2**32, never freed either (PEP 683, "accidental de-immortalizing").

Python 3.11 has no immortal objects: ``immortalize`` does nothing there and says so.
Free-threaded builds (biased reference counts) and debug builds (``Py_TRACE_REFS``: the
refcount is not the object's first field) are refused, as is any version this module does
not know the value for. The policy turns it off with ``WFJAIL_IMMORTAL=0`` in its ``[env]``,
``python -m wfjail.zygote --no-immortal`` too."""

import gc
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import List, Mapping, Optional, Union

# The environment variable that turns the marking off ("0"); anything else leaves it on.
ENV = "WFJAIL_IMMORTAL"
# _Py_IMMORTAL_REFCNT of 64-bit builds with the GIL: UINT_MAX in 3.12's and 3.13's object.h.
IMMORTAL_REFCNT = {(3, 12): 0xFFFFFFFF, (3, 13): 0xFFFFFFFF}


# A code object is not a GC type (gc.get_referents gives nothing): what it refers to, its
# constants (strings, numbers, nested code) and names among them, is reached through these.
CODE_REFERENTS = ("co_consts", "co_names", "co_varnames", "co_cellvars", "co_freevars",
                  "co_filename", "co_name", "co_qualname", "co_linetable", "co_exceptiontable")


def unsupported() -> "Union[str, None]":
    """None if this interpreter's objects can be marked immortal, else why not."""
    import sysconfig

    version = sys.version_info[:2]
    if version < (3, 12):
        return "Python %d.%d has no immortal objects (PEP 683 is 3.12+)" % version
    if sysconfig.get_config_var("Py_GIL_DISABLED"):
        return "a free-threaded build counts references per thread (not marked)"
    if version not in IMMORTAL_REFCNT:
        return "Python %d.%d: the immortal refcount of this version is not known" % version
    if sys.maxsize < 2 ** 32 or hasattr(sys, "getobjects"):
        return "not a 64-bit release build (the refcount is not where it is expected)"
    import ctypes

    probe = object()
    # The object's first word is its refcount: getrefcount counts its own argument too.
    if ctypes.c_ssize_t.from_address(id(probe)).value != sys.getrefcount(probe) - 1:
        return "an object's first word is not its reference count"
    if ctypes.c_ssize_t.from_address(id(None)).value != IMMORTAL_REFCNT[version]:
        return "None's reference count is not the immortal value of Python %d.%d" % version
    return None


def immortalize() -> "Union[int, str]":
    """Mark every object the collector tracks, and the untracked objects reachable from them
    through untracked objects, immortal. Returns how many objects were marked, or, unmarked,
    why not. Call it after the last ``gc.collect()`` and before ``gc.freeze()``."""
    marking = Marking.of(gc.get_objects())
    if isinstance(marking, str):
        return marking
    while not marking.step(1 << 62):
        pass
    return marking.marked


class Marking:
    """The marking of ``objects`` (``gc.get_objects()``, taken before ``gc.freeze()``: it no
    longer sees frozen objects) and of the untracked objects they reach, a ``step`` at a
    time: the zygote marks its heap after READY, between the forks it serves. A child forked
    before the marking ends has a heap marked in part: what is marked stays so in it (never
    freed there), the rest is mortal (its pages are copied as it writes them, as with no
    marking at all). A page the zygote marks after a fork is copied in the zygote; the
    children keep the page they had."""

    def __init__(self, objects: "List[object]") -> None:
        import ctypes

        self._value = IMMORTAL_REFCNT[sys.version_info[:2]]
        self._code = type(unsupported.__code__)
        # Memory as words from address 8 (ctypes refuses to index a NULL pointer): an
        # object's refcount is words[address // 8 - 1]; one pointer, not a ctypes object per
        # object.
        self._words = ctypes.cast(ctypes.c_void_p(8), ctypes.POINTER(ctypes.c_ssize_t))
        # Copied at the first step (after READY: a copy of ~130,000 references), the list
        # being another's too (the zygote's collapse takes the objects' addresses).
        self._objects: "Optional[List[object]]" = objects
        self._todo: "List[object]" = []
        self.marked = 0

    @classmethod
    def of(cls, objects: "List[object]") -> "Union[Marking, str]":
        """The marking of ``objects``, or why this interpreter's cannot be marked."""
        why = unsupported()
        return why if why is not None else cls(objects)

    def step(self, budget: int) -> bool:
        """Marks up to ``budget`` objects more; True once every one is."""
        if self._objects is not None:
            # The copy is not in itself, so not marked (freed at the end).
            self._todo, self._objects = list(self._objects), None
            return False
        todo, words, value, code = self._todo, self._words, self._value, self._code
        # An object whose refcount is the immortal value is marked (or was immortal already):
        # it is not walked again. No set of the addresses seen: its ~130,000 integers, made
        # after READY and freed at the end, left partly used pools in the heap the children
        # share (they then wrote those pages as they allocated).
        while todo and budget > 0:
            budget -= 1
            obj = todo.pop()
            at = (id(obj) >> 3) - 1
            if words[at] == value:
                continue
            words[at] = value
            self.marked += 1
            refs = gc.get_referents(obj)
            if type(obj) is code:
                refs = [getattr(obj, name) for name in CODE_REFERENTS]
            for ref in refs:
                if not gc.is_tracked(ref) and words[(id(ref) >> 3) - 1] != value:
                    todo.append(ref)
        return not todo


def wanted(environ: "Mapping[str, str]") -> bool:
    """Whether the policy's environment leaves the marking on (``WFJAIL_IMMORTAL=0``: off)."""
    return environ.get(ENV, "1").strip() not in ("0", "off", "false", "no")
