"""Typed JSON for values that cross from a confined child to its worker.

Extern functions (Temporal interceptors' ``unsafe_extern_functions``) run in the worker but
are called from workflow code in the child, with arguments such as the OpenTelemetry
interceptor's frozen dataclass of span parameters (an enum, an exception, nested dicts). The
worker must never unpickle or import what a possibly hostile child names, so values travel as
JSON with a few tagged forms, and the worker rebuilds them **from its own type hints**: a
dataclass or enum is rebuilt only as the class the worker's function declares for that
parameter, an exception as a stand-in (``ChildException``) carrying the child's type name,
message and traceback as text. Nothing the child sends chooses code to run in the worker.

Tagged forms (a JSON object with exactly one key):
``{"$wfjail:dataclass": [qualname, {field: value}]}``, ``{"$wfjail:enum": [qualname, value]}``,
``{"$wfjail:exception": {"type", "message", "traceback"}}``, ``{"$wfjail:bytes": base64}``,
``{"$wfjail:tuple": [values]}``. A plain dict whose keys are strings is a JSON object; one
with a key starting ``$wfjail:`` is refused.
"""

from __future__ import annotations

import base64
import collections.abc
import dataclasses
import enum
import traceback
import types
import typing
from typing import Any, Callable

_TAG = "$wfjail:"
MAX_DEPTH = 32
# At most this many values (each list, object, string, number...) are rebuilt for one call's
# arguments: rebuilding costs the worker's time (a few microseconds a value) while the child
# waits, so a child must not send millions.
MAX_VALUES = 10_000


class ChildException(Exception):
    """An exception raised in the child, as the worker sees it: ``child_type`` is its
    qualified type name, ``child_traceback`` the formatted traceback."""

    def __init__(self, child_type: str, message: str, child_traceback: str = "") -> None:
        super().__init__(message)
        self.child_type = child_type
        self.child_traceback = child_traceback

    def __str__(self) -> str:
        return "%s: %s" % (self.child_type, self.args[0] if self.args else "")


def _qualname(cls: type) -> str:
    return "%s.%s" % (cls.__module__, cls.__qualname__)


def encode(value: object, _depth: int = 0) -> Any:
    """``value`` as JSON-ready data (in the child). Raises TypeError for what has no form."""
    if _depth > MAX_DEPTH:
        raise TypeError("a value nested deeper than %d levels" % MAX_DEPTH)
    d = _depth + 1
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, enum.Enum):
        return {_TAG + "enum": [_qualname(type(value)), encode(value.value, d)]}
    if isinstance(value, (int, float)):
        return value
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {_TAG + "bytes": base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, list):
        return [encode(v, d) for v in value]
    if isinstance(value, tuple):
        return {_TAG + "tuple": [encode(v, d) for v in value]}
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise TypeError("dict keys must be strings, not %s" % type(k).__name__)
            if k.startswith(_TAG):
                raise TypeError("dict key %r is reserved" % k)
            out[k] = encode(v, d)
        return out
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {f.name: encode(getattr(value, f.name), d)
                  for f in dataclasses.fields(value)}
        return {_TAG + "dataclass": [_qualname(type(value)), fields]}
    if isinstance(value, BaseException):
        return {_TAG + "exception": {
            "type": _qualname(type(value)),
            "message": str(value),
            "traceback": "".join(traceback.format_exception(value)),
        }}
    raise TypeError(
        "%s cannot cross to the worker: extern function arguments and results are JSON "
        "values, bytes, tuples, dataclasses, enums and exceptions" % type(value).__name__)


def decode(data: object, hint: Any = typing.Any, _depth: int = 0) -> Any:
    """Rebuilds a value from :func:`encode`'s data (in the worker) as ``hint`` declares.
    Raises ValueError for data that does not fit the hint: the value must be of the declared
    class (``_check``), so that an ``int`` or a forged enum never stands where a dataclass is
    declared."""
    origin = typing.get_origin(hint)
    if origin is typing.Union or origin is types.UnionType:
        return _decode(data, hint, _depth)
    return _check(_decode(data, hint, _depth), hint)


def _check(value: object, hint: Any) -> Any:
    """``value`` when it is of the class ``hint`` declares (a generic's origin class: its
    items were checked as they were decoded), else ValueError. Hints that name no class
    (``Any``, type variables, ``NewType``, forward references) take any value; a ``float``
    takes an ``int`` (PEP 484), and any exception class takes a :class:`ChildException` (the
    stand-in for every exception a child sends)."""
    origin = typing.get_origin(hint)
    if origin is typing.Annotated:
        return _check(value, typing.get_args(hint)[0])
    if origin is typing.Literal:
        if any(value == a and type(value) is type(a) for a in typing.get_args(hint)):
            return value
        raise ValueError("the child sent %r where one of %s is declared"
                         % (value, typing.get_args(hint)))
    cls = origin if origin is not None else hint
    if cls is typing.Any or cls is object or not isinstance(cls, type):
        return value
    if isinstance(value, cls):
        return value
    if cls is float and isinstance(value, int):
        return value
    if issubclass(cls, BaseException) and isinstance(value, ChildException):
        return value
    raise ValueError("the child sent %s where %s is declared"
                     % (type(value).__name__, getattr(cls, "__qualname__", cls)))


def _decode(data: object, hint: Any, _depth: int) -> Any:
    if _depth > MAX_DEPTH:
        raise ValueError("a value nested deeper than %d levels" % MAX_DEPTH)
    d = _depth + 1
    origin = typing.get_origin(hint)
    if origin is typing.Union or origin is types.UnionType:
        options = typing.get_args(hint)
        if data is None and type(None) in options:
            return None
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return decode(data, option, _depth)
            except (ValueError, TypeError) as e:
                errors.append(str(e))
        raise ValueError("fits none of %s: %s" % (hint, "; ".join(errors)))
    if isinstance(data, dict) and len(data) == 1 and next(iter(data)).startswith(_TAG):
        (key, body), = data.items()
        return _decode_tagged(key[len(_TAG):], body, hint, d)
    if isinstance(data, list):
        args = typing.get_args(hint)
        elem = args[0] if args and origin in (list, collections.abc.Sequence) else typing.Any
        return [decode(v, elem, d) for v in data]
    if isinstance(data, dict):
        args = typing.get_args(hint)
        value_hint = args[1] if len(args) == 2 else typing.Any
        return {k: decode(v, value_hint, d) for k, v in data.items()}
    if data is None or isinstance(data, (bool, int, float, str)):
        return data
    raise ValueError("not JSON data: %r" % type(data).__name__)


def _decode_tagged(tag: str, body: object, hint: Any, d: int) -> Any:
    if tag == "bytes":
        if not isinstance(body, str):
            raise ValueError("bytes are base64 text")
        return base64.b64decode(body.encode("ascii"), validate=True)
    if tag == "tuple":
        if not isinstance(body, list):
            raise ValueError("a tuple is a list of values")
        args = typing.get_args(hint)
        if args and args[-1] is not Ellipsis and len(args) == len(body):
            return tuple(decode(v, a, d) for v, a in zip(body, args))
        elem = args[0] if args else typing.Any
        return tuple(decode(v, elem, d) for v in body)
    if tag == "exception":
        if not isinstance(body, dict):
            raise ValueError("an exception is an object")
        return ChildException(str(body.get("type", "")), str(body.get("message", "")),
                              str(body.get("traceback", "")))
    if tag == "enum":
        if not (isinstance(body, list) and len(body) == 2 and isinstance(body[0], str)):
            raise ValueError("an enum is [qualname, value]")
        value = decode(body[1], typing.Any, d)
        if isinstance(hint, type) and issubclass(hint, enum.Enum):
            if body[0] != _qualname(hint):
                raise ValueError("the child sent %s where %s is declared"
                                 % (body[0], _qualname(hint)))
            return hint(value)
        return value
    if tag == "dataclass":
        if not (isinstance(body, list) and len(body) == 2 and isinstance(body[0], str)
                and isinstance(body[1], dict)):
            raise ValueError("a dataclass is [qualname, {fields}]")
        name, fields = body
        if isinstance(hint, type) and dataclasses.is_dataclass(hint):
            if name != _qualname(hint):
                raise ValueError("the child sent %s where %s is declared"
                                 % (name, _qualname(hint)))
            try:
                hints = typing.get_type_hints(hint)
            except Exception:  # noqa: BLE001  (unresolvable annotations: decode untyped)
                hints = {}
            known = {f.name: f for f in dataclasses.fields(hint) if f.init}
            unknown = set(fields) - set(known)
            if unknown:
                raise ValueError("%s has no field(s) %s" % (name, ", ".join(sorted(unknown))))
            missing = [n for n, f in known.items() if n not in fields
                       and f.default is dataclasses.MISSING
                       and f.default_factory is dataclasses.MISSING]
            if missing:
                raise ValueError("%s is missing field(s) %s" % (name, ", ".join(missing)))
            return hint(**{k: decode(v, hints.get(k, typing.Any), d)
                           for k, v in fields.items()})
        return {k: decode(v, typing.Any, d) for k, v in fields.items()}
    raise ValueError("unknown tag %r" % tag)


def decode_args(fn: Callable[..., Any], args: list[Any]) -> list[Any]:
    """The positional arguments of a call to ``fn`` (in the worker), each rebuilt as
    ``fn``'s signature declares it."""
    import inspect

    try:
        hints = typing.get_type_hints(fn)
    except Exception:  # noqa: BLE001  (unresolvable annotations: decode untyped)
        hints = {}
    try:
        params = [p for p in inspect.signature(fn).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)]
    except (TypeError, ValueError):
        params = []
    _check_count(args)
    out = []
    for i, a in enumerate(args):
        hint = typing.Any
        if i < len(params):
            p = params[i]
            hint = hints.get(p.name, typing.Any)
        elif params and params[-1].kind == params[-1].VAR_POSITIONAL:
            hint = hints.get(params[-1].name, typing.Any)
        out.append(decode(a, hint))
    return out


def _check_count(data: object) -> None:
    """ValueError when ``data`` (parsed JSON) holds more than MAX_VALUES values; the walk
    stops there."""
    stack, seen = [data], 0
    while stack:
        value = stack.pop()
        seen += 1
        if seen > MAX_VALUES:
            raise ValueError("the arguments hold more than %d values" % MAX_VALUES)
        if isinstance(value, dict):
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
