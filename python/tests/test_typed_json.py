"""typed_json: values from a confined child, rebuilt in the worker from the worker's own
type hints (nothing the child names is imported or unpickled)."""

import dataclasses
import enum
import json
import os
import sys
import typing
import unittest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from wfjail import typed_json  # noqa: E402
from wfjail.typed_json import ChildException, decode, decode_args, encode  # noqa: E402


class Kind(enum.Enum):
    INTERNAL = 0
    CLIENT = 3


@dataclasses.dataclass(frozen=True)
class Params:
    # The shape of temporalio's OpenTelemetry _CompletedWorkflowSpanParams.
    context: dict[str, str]
    name: str
    attributes: typing.Optional[typing.Mapping[str, typing.Any]]
    time_ns: int
    link_context: typing.Optional[dict[str, str]]
    exception: typing.Optional[Exception]
    kind: Kind
    parent_missing: bool


@dataclasses.dataclass
class Other:
    name: str


def wire(value):
    """What crosses the pipe: encoded in the child, sent as JSON text."""
    return json.loads(json.dumps(encode(value)))


def failing():
    try:
        raise RuntimeError("boom")
    except RuntimeError as e:
        return e


class TypedJsonTest(unittest.TestCase):
    def test_a_span_parameter_dataclass_is_rebuilt_as_the_worker_declares_it(self):
        p = Params({"traceparent": "00-ab-cd-01"}, "RunWorkflow:W", {"a": 1, "b": [1, 2]},
                   123, None, failing(), Kind.CLIENT, False)

        def completed(params: Params) -> typing.Optional[dict[str, str]]:
            return {"seen": params.name}

        args = decode_args(completed, [wire(p)])
        got = args[0]
        self.assertIsInstance(got, Params)
        self.assertEqual(got.kind, Kind.CLIENT)
        self.assertEqual(got.context, p.context)
        self.assertEqual(got.attributes, {"a": 1, "b": [1, 2]})
        self.assertIsInstance(got.exception, ChildException)
        self.assertEqual(str(got.exception), "builtins.RuntimeError: boom")
        self.assertIn("raise RuntimeError", got.exception.child_traceback)
        self.assertEqual(decode(wire(completed(got))), {"seen": "RunWorkflow:W"})

    def test_the_child_cannot_choose_the_class(self):
        def completed(params: Params):
            return None

        with self.assertRaisesRegex(ValueError, "where .*Params is declared"):
            decode_args(completed, [wire(Other("x"))])
        forged = wire(Other("x"))
        forged["$wfjail:dataclass"][0] = typed_json._qualname(Params)
        with self.assertRaisesRegex(ValueError, "missing field"):
            decode_args(completed, [forged])
        # Without a declared type a dataclass arrives as a plain dict of its fields.
        self.assertEqual(decode_args(lambda x: x, [wire(Other("x"))]), [{"name": "x"}])
        # An enum the worker did not declare arrives as its value.
        self.assertEqual(decode(wire(Kind.CLIENT)), 3)

    def test_an_argument_not_of_the_declared_type_is_refused(self):
        def completed(params: Params):
            return None

        good = wire(Params({}, "n", None, 1, None, None, Kind.CLIENT, False))
        self.assertIsInstance(decode_args(completed, [good])[0], Params)
        # An int, a forged enum, a plain dict or nothing where the dataclass is declared.
        for forged in (5, {"$wfjail:enum": [typed_json._qualname(Kind), 3]},
                       {"$wfjail:enum": ["victim.Span", 1]}, good["$wfjail:dataclass"][1],
                       None, [1]):
            with self.assertRaisesRegex(ValueError, "where .*declared"):
                decode_args(completed, [forged])
        # Inside it, each field as declared: a string for an int, None for a str, a plain
        # value for the enum, a list for a dict.
        for field, value in (("time_ns", "12"), ("name", None), ("kind", 3),
                             ("context", ["a"]), ("parent_missing", "yes")):
            forged = json.loads(json.dumps(good))
            forged["$wfjail:dataclass"][1][field] = value
            with self.assertRaisesRegex(ValueError, "where .*declared"):
                decode_args(completed, [forged])
        # An int is a float (PEP 484); any exception class takes the child's stand-in.
        self.assertEqual(decode(1, float), 1)
        self.assertIsInstance(decode(wire(failing()), ValueError), ChildException)

    def test_bytes_tuples_and_plain_json_round_trip(self):
        v = {"b": b"\x00\xff", "t": (1, "a"), "l": [None, True, 1.5]}
        self.assertEqual(decode(wire(v)), v)

    def test_what_has_no_form_fails_in_the_child(self):
        for bad in (object(), {1: "a"}, {"$wfjail:x": 1}, lambda: 0):
            with self.assertRaises(TypeError):
                encode(bad)
        deep = []
        for _ in range(100):
            deep = [deep]
        with self.assertRaises(TypeError):
            encode(deep)
        with self.assertRaises(ValueError):
            decode({"$wfjail:nope": 1})


if __name__ == "__main__":
    unittest.main()
