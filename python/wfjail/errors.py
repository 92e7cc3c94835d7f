"""The two exceptions of the wfjail guest library.

Both claim ``__module__ = "wfjail"`` so that tracebacks and ERROR frames name them
``wfjail.Violation`` and ``wfjail.ProtocolError``, whatever file defines them.
"""

import errno

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, Tuple


class ProtocolError(Exception):
    """A malformed, oversized, truncated or out-of-order frame.

    ``code`` is machine-readable. The codec uses exactly the names of
    ``docs/protocol-vectors.json``: ``"truncated"``, ``"oversized"``, ``"empty"``,
    ``"unknown-kind"``. The conversation layer (``wfjail.guest``) adds ``"handshake"``
    (bad HELLO), ``"unexpected"`` (a frame of the wrong kind), ``"payload"`` (a
    VIOLATIONS payload that is not a JSON array of objects) and ``"closed"`` (the
    supervisor's pipe ended).
    """

    __module__ = "wfjail"

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class Violation(PermissionError):
    """A denied operation, explained by what the supervisor recorded about it.

    A ``PermissionError`` (errno ``EPERM``) so that code already handling the
    denial keeps working; the fields are those of a report's violation object
    (docs/contract.md, "Violations"). Note: ``args`` is the decoded syscall
    arguments (a string), as in the report; the exception's constructor tuple is
    not reachable under that name.
    """

    __module__ = "wfjail"

    traceback: str  # set on a Violation raised in the worker: the guest's traceback

    def __init__(self, category: object = "other", syscall: object = "", args: object = "",
                 action: object = "denied", rule: object = "", hint: object = "",
                 count: "Any" = 1) -> None:
        self.category = str(category)
        self.syscall = str(syscall)
        self._syscall_args = str(args)
        self.action = str(action)
        self.rule = str(rule)
        self.hint = str(hint)
        self.count = count
        super().__init__(errno.EPERM, self._summary())

    # BaseException.args is a data descriptor; a property here takes precedence over
    # it, so `exc.args` is the report's field while the C-level tuple stays intact for
    # repr() and pickling.
    @property
    def args(self) -> str:  # type: ignore[override]
        return self._syscall_args

    @classmethod
    def from_dict(cls, d: "Dict[str, Any]") -> "Violation":
        """Build one from a violation object of a VIOLATIONS frame."""
        if not isinstance(d, dict):
            raise TypeError("a violation must be a JSON object, not %s" % type(d).__name__)
        count = d.get("count", 1)
        return cls(
            category=d.get("category", "other"),
            syscall=d.get("syscall", ""),
            args=d.get("args", ""),
            action=d.get("action", "denied"),
            rule=d.get("rule", ""),
            hint=d.get("hint", ""),
            count=count if isinstance(count, int) else 1,
        )

    def to_dict(self) -> "Dict[str, Any]":
        return {
            "category": self.category, "syscall": self.syscall, "args": self.args,
            "action": self.action, "rule": self.rule, "hint": self.hint,
            "count": self.count,
        }

    def head(self) -> str:
        """The start of the summary, naming the call: "network: connect(AF_INET ...)"."""
        return "%s: %s(%s)" % (self.category, self.syscall, self._syscall_args)

    def _summary(self) -> str:
        # e.g. "network: connect(AF_INET 127.0.0.1:9) denied — network is denied in
        # workflow code; do it in an activity"
        text = "%s %s" % (self.head(), self.action)
        if isinstance(self.count, int) and self.count > 1:
            text += " (x%d)" % self.count
        if self.hint:
            text += " \u2014 " + self.hint
        return text

    def __str__(self) -> str:
        return self._summary()

    def __reduce__(self) -> "Tuple[Callable[..., Violation], Tuple[Any, ...]]":
        # OSError's own reduce would replay (errno, strerror) into our constructor.
        return (type(self), (self.category, self.syscall, self._syscall_args, self.action,
                             self.rule, self.hint, self.count))
