"""What crosses from the worker to a child when a run's session opens, both ends: the recipe
(``recipe``: class paths and the details that are plain data, pickled: the child unpickles
what the worker sends, never the other way round) and the details rebuilt from it
(``details``)."""

from __future__ import annotations

import base64
import importlib
import pickle
from typing import Any, Callable, Iterable, Mapping

import temporalio.converter
import temporalio.worker
from temporalio.api.common.v1 import Payloads
from temporalio.api.failure.v1 import Failure

from . import main_script, sdk
from .relays import LOCAL_EXTERN

# A recipe: a JSON object (the session's init).
Recipe = dict[str, Any]


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


def load(path: str) -> Any:
    """The object at ``module:qualname`` (``class_path``), imported."""
    module, _, qualname = path.partition(":")
    if module == main_script.MAIN_ALIAS:
        main_script.import_main()
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def recipe(det: temporalio.worker.WorkflowInstanceDetails, failure_types: Iterable[str],
           ) -> Recipe:
    """What a child needs to rebuild the instance: class paths, and the details that are plain
    data (pickled: the child unpickles what the worker sends, never the other way round)."""
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
        "payload_converter": (class_path(converter_class, "payload converter class")
                              if converter_class is not None else None),
        "failure_converter": class_path(det.failure_converter_class, "failure converter class"),
        "interceptors": [class_path(c, "interceptor class") for c in det.interceptor_classes],
        # Extern functions run in the worker: the child gets proxies by name (upcalls).
        "extern": sorted(n for n in det.extern_functions if n not in LOCAL_EXTERN),
        "patch_callback": det.patch_activation_callback is not None,
        "failure_types": list(failure_types),
        "data": base64.b64encode(pickle.dumps(data)).decode("ascii"),
    }


def details(recipe: Recipe, extern_functions: Mapping[str, Callable[..., Any]],
            patch_activation_callback: Callable[[temporalio.worker.PatchActivationInput], bool]
            | None) -> temporalio.worker.WorkflowInstanceDetails:
    """(In the child.) The run's details rebuilt from ``recipe``, with the child's own
    extern functions and patch activation callback (proxies of the worker's)."""
    data = pickle.loads(base64.b64decode(recipe["data"]))
    defn = sdk.definition(load(recipe["workflow"]))
    converter_class = (load(recipe["payload_converter"]) if recipe.get("payload_converter")
                       else temporalio.converter.DefaultPayloadConverter)
    converter = temporalio.converter.DataConverter(payload_converter_class=converter_class)
    last_failure = None
    if data["last_failure"] is not None:
        last_failure = Failure.FromString(data["last_failure"])
    return temporalio.worker.WorkflowInstanceDetails(
        payload_converter_factory=sdk.payload_converter_factory(converter),
        failure_converter_class=load(recipe["failure_converter"]),
        interceptor_classes=[load(p) for p in recipe["interceptors"]],
        defn=defn,
        info=data["info"],
        randomness_seed=data["randomness_seed"],
        extern_functions=extern_functions,
        disable_eager_activity_execution=data["disable_eager_activity_execution"],
        worker_level_failure_exception_types=[load(p) for p in recipe["failure_types"]],
        patch_activation_callback=patch_activation_callback,
        last_completion_result=Payloads.FromString(data["last_completion_result"]),
        last_failure=last_failure,
        default_workflow_logic_flags=data["default_workflow_logic_flags"],
    )
