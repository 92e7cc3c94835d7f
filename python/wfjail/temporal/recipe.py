"""What crosses from the worker to a child when a run's session opens, both ends: the recipe
(``recipe``: class paths, classes and callbacks made inside a function by value, and the
details that are plain data, pickled: the child unpickles what the worker sends, never the
other way round) and the details rebuilt from it (``details``)."""

from __future__ import annotations

import base64
import importlib
import io
import logging
import pickle
import weakref
from typing import Any, Callable, Iterable, Mapping, Union

import temporalio.converter
import temporalio.worker
from temporalio.api.common.v1 import Payloads
from temporalio.api.failure.v1 import Failure

from . import main_script, sdk, spans
from .relays import LOCAL_EXTERN

_log = logging.getLogger("wfjail.temporal")

# A recipe: a JSON object (the session's init).
Recipe = dict[str, Any]
# How the recipe names a class: its path ("module:qualname", ``class_path``), or the class
# itself by value ({"by_value": base64 of its cloudpickle}, ``by_value``).
ClassRef = Union[str, dict[str, str]]
# A session's init is at most 32 KiB of JSON (the server's bound): what goes by value must
# leave room for the rest of the recipe.
MAX_BY_VALUE = 24 * 1024


def class_path(cls: Any, what: str) -> str:
    """``module:qualname`` of ``cls``, which a fresh interpreter must be able to import."""
    module, qualname = getattr(cls, "__module__", None), getattr(cls, "__qualname__", "")
    if module == "__main__" and "<locals>" not in qualname:
        return main_script.class_path(cls, what)
    if not module or module == "__main__" or "<locals>" in qualname:
        raise ValueError(
            "%s %r cannot run in a confined process: it is defined in %s; move it to a "
            "module the worker imports (JailedWorkflowRunner rebuilds it there by its path)"
            % (what, cls, "the script run as __main__" if module == "__main__" else
               "a function (<locals>)"))
    return "%s:%s" % (module, qualname)


def class_ref(cls: Any, what: str) -> ClassRef:
    """How ``cls`` crosses to a child: by its path when a fresh interpreter can import it
    (cheaper, and the zygote preloads its module), by value when it was made inside a
    function (``<locals>`` in its qualname: ``temporalio.contrib``'s plugins make their
    workflow interceptor classes so, with attributes from the plugin's instance)."""
    if "<locals>" in getattr(cls, "__qualname__", ""):
        return {"by_value": by_value(cls, what)}
    return class_path(cls, what)


# What ``by_value`` made of each object, by identity: a worker pickles its interceptor
# classes and callbacks once, not once per run.
_pickled: "weakref.WeakKeyDictionary[Any, str]" = weakref.WeakKeyDictionary()


def by_value(obj: Any, what: str) -> str:
    """``obj`` pickled by value with cloudpickle (what it refers to that is importable goes by
    reference), base64: the child unpickles it (``load_ref``). Raises ValueError naming
    ``obj``, cloudpickle's reason and what to do when it cannot be pickled, or when it is
    too large for a session's init."""
    try:
        return _pickled[obj]
    except (KeyError, TypeError):  # TypeError: not weakly referenceable, never cached
        pass
    try:
        import cloudpickle  # type: ignore[import-untyped]
    except ImportError:
        raise ValueError(
            "%s %r is defined in a function (<locals>): JailedWorkflowRunner sends such "
            "objects to the confined process by value, with cloudpickle, which is not "
            "installed (pip install 'wfjail[temporal]', or cloudpickle); or move it to a "
            "module the worker imports" % (what, obj)) from None
    try:
        out = io.BytesIO()
        _pickler(cloudpickle)(out).dump(obj)
        text = base64.b64encode(out.getvalue()).decode("ascii")
    except Exception as e:  # noqa: BLE001  (anything an object's reduction raises)
        raise ValueError(
            "%s %r cannot run in a confined process: it is defined in a function "
            "(<locals>), so JailedWorkflowRunner sends it by value, and cloudpickle cannot "
            "pickle it: %s: %s. Make what it refers to picklable (a lock, a thread, a "
            "client's connection are not: create them lazily), or define it in a module the "
            "worker imports (it is then rebuilt there by its path)"
            % (what, obj, type(e).__name__, e)) from None
    if len(text) > MAX_BY_VALUE:
        raise ValueError(
            "%s %r cannot run in a confined process: it is defined in a function "
            "(<locals>), and pickled by value it is %d bytes (base64), over the %d a "
            "session's init carries; keep large data out of what it refers to, or define it "
            "in a module the worker imports" % (what, obj, len(text), MAX_BY_VALUE))
    try:
        _pickled[obj] = text
    except TypeError:
        pass
    return text


def _module_dict(name: str) -> dict[str, Any]:
    """(In the child.) The globals of module ``name``, imported."""
    return importlib.import_module(name).__dict__


class _ModuleGlobals:
    """Pickles as the globals of an importable module (``_module_dict``), by name."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return _module_dict, (self.name,)


def _pickler(cloudpickle: Any) -> Any:
    """cloudpickle's Pickler, except that a function made inside a function of an importable
    module keeps that module's globals in the child, where cloudpickle gives it a copy of
    those it uses: LangGraph's plugin registers each run's graphs in a module-level dict
    from its interceptor class (made in a method), and its own ``graph()`` reads them from
    that dict. (Uses cloudpickle's ``_make_function`` and ``_function_getstate``/
    ``_function_setstate``, as its own ``_dynamic_function_reduce`` does: cloudpickle 3.1.)"""
    import sys

    from cloudpickle import cloudpickle as impl

    class Pickler(cloudpickle.Pickler):  # type: ignore[misc]
        def _dynamic_function_reduce(self, func: Any) -> Any:
            name = func.__globals__.get("__name__")
            module = sys.modules.get(name) if isinstance(name, str) else None
            if (name == "__main__" or module is None
                    or getattr(module, "__dict__", None) is not func.__globals__):
                return super()._dynamic_function_reduce(func)
            code, _, fname, argdefs, closure = self._function_getnewargs(func)
            state, slotstate = impl._function_getstate(func)
            slotstate["__globals__"] = {}  # the module's own, as imported in the child
            return (impl._make_function, (code, _ModuleGlobals(name), fname, argdefs, closure),
                    (state, slotstate), None, None, impl._function_setstate)

    return Pickler


def load_ref(ref: ClassRef) -> Any:
    """(In the child.) The object ``ref`` names: imported by its path, or unpickled (what the
    worker pickled by value: the worker never unpickles what a child sends)."""
    if isinstance(ref, dict):
        return pickle.loads(base64.b64decode(ref["by_value"]))
    return load(ref)


def load(path: str) -> Any:
    """The object at ``module:qualname`` (``class_path``), imported."""
    module, _, qualname = path.partition(":")
    if module == main_script.MAIN_ALIAS:
        main_script.import_main()
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def patch_callback_ref(callback: Callable[..., Any] | None, in_child: bool = False,
                       ) -> ClassRef | None:
    """Where the worker's ``patch_activation_callback`` runs. By default ``"worker"``: the
    child's proxy asks the worker, which calls it (it sees and changes the worker's own
    state, as in process, but outside the workflow's read-only context). With
    ``in_child``, by value: the SDK's instance in the child calls a copy as in process
    (in the read-only context, its result checked to be a bool), or, when it cannot be
    pickled, in the worker after all (said once, as a warning on ``wfjail.temporal``)."""
    if callback is None:
        return None
    if not in_child:
        return "worker"
    try:
        return _patch_refs[callback]
    except (KeyError, TypeError):
        pass
    ref: ClassRef
    try:
        ref = {"by_value": by_value(callback, "patch activation callback")}
    except ValueError as e:
        _log.warning("%s. It runs in the worker instead, outside the workflow's read-only "
                     "context", e)
        ref = "worker"
    try:
        _patch_refs[callback] = ref
    except TypeError:
        pass
    return ref


# How each patch activation callback went (``patch_callback_ref``), by identity.
_patch_refs: "weakref.WeakKeyDictionary[Any, ClassRef]" = weakref.WeakKeyDictionary()


def recipe(det: temporalio.worker.WorkflowInstanceDetails, failure_types: Iterable[ClassRef],
           patch_callback_in_child: bool = False) -> Recipe:
    """What a child needs to rebuild the instance: class paths (or classes made inside a
    function, by value), and the details that are plain data (pickled: the child unpickles
    what the worker sends, never the other way round)."""
    converter_class = sdk.payload_converter_class(det.payload_converter_factory)
    data = {
        "info": det.info,
        "randomness_seed": det.randomness_seed,
        "disable_eager_activity_execution": det.disable_eager_activity_execution,
        "last_completion_result": det.last_completion_result.SerializeToString(),
        "last_failure": (det.last_failure.SerializeToString()
                         if det.last_failure is not None else None),
        "default_workflow_logic_flags": det.default_workflow_logic_flags,
    }
    return {
        "workflow": class_path(det.defn.cls, "workflow class"),
        "payload_converter": (class_ref(converter_class, "payload converter class")
                              if converter_class is not None else None),
        "failure_converter": class_ref(det.failure_converter_class, "failure converter class"),
        "interceptors": [class_ref(c, "interceptor class") for c in det.interceptor_classes],
        # Extern functions run in the worker: the child gets proxies by name (upcalls).
        "extern": sorted(n for n in det.extern_functions if n not in LOCAL_EXTERN),
        "patch_callback": patch_callback_ref(det.patch_activation_callback,
                                             patch_callback_in_child),
        "failure_types": list(failure_types),
        # The worker's tracer provider is the OpenTelemetry plugin's: the child makes its
        # spans with one of its own and sends them back (``spans``).
        "otel_spans": spans.worker_provider() is not None,
        "data": base64.b64encode(pickle.dumps(data)).decode("ascii"),
    }


def details(recipe: Recipe, extern_functions: Mapping[str, Callable[..., Any]],
            patch_proxy: Callable[[temporalio.worker.PatchActivationInput], Any],
            ) -> temporalio.worker.WorkflowInstanceDetails:
    """(In the child.) The run's details rebuilt from ``recipe``, with the child's own
    extern functions (proxies of the worker's) and the worker's patch activation callback:
    its copy, or ``patch_proxy`` when it runs in the worker."""
    data = pickle.loads(base64.b64decode(recipe["data"]))
    defn = sdk.definition(load(recipe["workflow"]))
    converter_class = (load_ref(recipe["payload_converter"]) if recipe.get("payload_converter")
                       else temporalio.converter.DefaultPayloadConverter)
    patch = recipe.get("patch_callback")
    patch_callback = load_ref(patch) if isinstance(patch, dict) else (
        patch_proxy if patch else None)
    converter = temporalio.converter.DataConverter(payload_converter_class=converter_class)
    last_failure = None
    if data["last_failure"] is not None:
        last_failure = Failure.FromString(data["last_failure"])
    return temporalio.worker.WorkflowInstanceDetails(
        payload_converter_factory=sdk.payload_converter_factory(converter),
        failure_converter_class=load_ref(recipe["failure_converter"]),
        interceptor_classes=[load_ref(p) for p in recipe["interceptors"]],
        defn=defn,
        info=data["info"],
        randomness_seed=data["randomness_seed"],
        extern_functions=extern_functions,
        disable_eager_activity_execution=data["disable_eager_activity_execution"],
        worker_level_failure_exception_types=[load_ref(p) for p in recipe["failure_types"]],
        patch_activation_callback=patch_callback,
        last_completion_result=Payloads.FromString(data["last_completion_result"]),
        last_failure=last_failure,
        default_workflow_logic_flags=data["default_workflow_logic_flags"],
    )
