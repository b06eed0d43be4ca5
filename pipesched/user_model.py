"""`--model package.module:function`: a user's own model on the command line.

The function is called as `function(num_stages, microbatches)` (the schedule's number
of model stages and microbatches, both ints) and returns a
`pipesched.executor.models.PipelineModel`: the stage modules, the loss and the
microbatches (inputs and targets). The module is imported as Python would import it
from the current directory; the ranks unpickle the model, so its classes and loss must
be importable module-level names. Every problem is a one-line UsageError.
"""
from __future__ import annotations

import importlib
import os
import pickle
import re
import sys

from .errors import UsageError

SPEC = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*$")
SIGNATURE = "function(num_stages: int, microbatches: int) -> PipelineModel"


def is_spec(text: str) -> bool:
    """Whether `text` looks like package.module:function (rather than a preset name)."""
    return ":" in text


def load_function(spec: str):
    """The callable named by `spec` ("package.module:function")."""
    if not SPEC.match(spec):
        raise UsageError(f"--model {spec!r} is not package.module:function")
    module_name, function_name = spec.split(":")
    if os.getcwd() not in sys.path and "" not in sys.path:  # as `python -m` would find ./module.py
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise UsageError(f"--model {spec}: cannot import {module_name}: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - the user's module failed while importing
        raise UsageError(f"--model {spec}: importing {module_name} failed: {type(exc).__name__}: {exc}") from None
    function = getattr(module, function_name, None)
    if function is None:
        raise UsageError(f"--model {spec}: module {module_name} has no {function_name}")
    if not callable(function):
        raise UsageError(f"--model {spec}: {function_name} is a {type(function).__name__}, not a function")
    return function


def build_user_model(spec: str, num_stages: int, microbatches: int):
    """Call the user's function and check that it returned a PipelineModel."""
    from pipesched.executor.models import PipelineModel

    function = load_function(spec)
    try:
        model = function(num_stages, microbatches)
    except Exception as exc:  # noqa: BLE001 - the user's code, reported in one line
        raise UsageError(f"--model {spec} failed: {type(exc).__name__}: {exc}") from None
    if not isinstance(model, PipelineModel):
        raise UsageError(f"--model {spec} returned {type(model).__name__}; it must be {SIGNATURE} "
                         "(pipesched.executor.models.PipelineModel)")
    try:  # the ranks get the model by pickle: a lambda or a local class fails here, not in a child
        pickle.dumps(model)
    except Exception as exc:  # noqa: BLE001 - pickle raises several types
        raise UsageError(f"--model {spec} returned a model that cannot be pickled (use module-level classes and "
                         f"loss functions): {type(exc).__name__}: {exc}") from None
    if not model.name:
        model.name = spec
    return model
