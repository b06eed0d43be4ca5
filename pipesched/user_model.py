"""`--model package.module:function`: a user's own model on the command line.

The function is called as `function(num_stages, microbatches)` (the schedule's number
of model stages and microbatches, both ints) and returns a
`pipesched.executor.models.PipelineModel`: the stage modules, the loss and the
microbatches (inputs and targets). The module is imported as Python would import it
from the current directory; the ranks unpickle the model, so its classes and loss must
be importable module-level names. Every problem is a one-line UsageError.

The user's code runs under the same rules as the rest of the command (`guarded`):
importing the module, calling the function, pickling and unpickling what it returned
(as the ranks will) and checking the model run in a worker thread that the command
waits for in short slices, so an exception of any kind, `sys.exit` or
KeyboardInterrupt in it is one line naming the function (exit 2), --timeout cuts a
hang, and SIGTERM or Ctrl-C stop the command at once.
"""
from __future__ import annotations

import importlib
import math
import os
import pickle
import re
import sys
import threading
import time
from typing import Any, Callable

from .errors import UsageError

SPEC = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*$")
SIGNATURE = "function(num_stages: int, microbatches: int) -> PipelineModel"
WAIT_SLICE_S = 0.05  # how often the waiting thread wakes, so signal handlers run
MESSAGE_CHARS = 300  # the most of an exception's text a message quotes


def is_spec(text: str) -> bool:
    """Whether `text` looks like package.module:function (rather than a preset name)."""
    return ":" in text


class UserCodeError(UsageError):
    """The user's code raised, exited or hung (the message says which and where)."""


def _text(exc: BaseException) -> str:
    """An exception as `Type: message`, on one line and at most MESSAGE_CHARS long."""
    text = " ".join(str(exc).split())
    text = text if len(text) <= MESSAGE_CHARS else text[:MESSAGE_CHARS - 3] + "..."
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def describe(exc: BaseException) -> str:
    """What the user's code did, for a message: raised X, exited, was interrupted."""
    if isinstance(exc, SystemExit):
        return f"called sys.exit({exc.code!r})" if exc.code is not None else "called sys.exit()"
    if isinstance(exc, KeyboardInterrupt):
        return "raised KeyboardInterrupt"
    return f"failed: {_text(exc)}"


def guarded(function: Callable[..., Any], *args: Any, what: str, timeout: float | None = None,
            ours: tuple[type[BaseException], ...] = (UsageError,)) -> Any:
    """`function(*args)` run in a daemon thread while this thread waits in slices of
    WAIT_SLICE_S (so SIGTERM, SIGHUP and Ctrl-C are handled at once, and the command can
    exit while it still runs). Returns its value; re-raises the errors of types `ours`
    (pipesched's own checks' one-line errors); any other exception, SystemExit or
    KeyboardInterrupt from it is a UserCodeError "`what` ...", and so is running past
    `timeout` seconds."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = function(*args)
        except BaseException as exc:  # noqa: BLE001 - the user's code: every kind is reported
            box["error"] = exc

    worker = threading.Thread(target=target, name="pipesched-user-code", daemon=True)
    worker.start()
    deadline = None if timeout is None else time.monotonic() + timeout
    while worker.is_alive():
        left = WAIT_SLICE_S if deadline is None else min(WAIT_SLICE_S, deadline - time.monotonic())
        if left <= 0:
            raise UserCodeError(f"{what} did not finish within --timeout {timeout:g} s")
        worker.join(left)
    if "error" in box:
        exc = box.pop("error")
        if isinstance(exc, ours):
            raise exc
        raise UserCodeError(f"{what} {describe(exc)}") from None
    return box.get("value")


def load_function(spec: str, timeout: float | None = None):
    """The callable named by `spec` ("package.module:function")."""
    if not SPEC.match(spec):
        raise UsageError(f"--model {spec!r} is not package.module:function")
    module_name, function_name = spec.split(":")
    if os.getcwd() not in sys.path and "" not in sys.path:  # as `python -m` would find ./module.py
        sys.path.insert(0, os.getcwd())

    def load():
        try:
            return importlib.import_module(module_name)
        except ImportError as exc:
            raise UsageError(f"--model {spec}: cannot import {module_name}: {' '.join(str(exc).split())}") from None

    module = guarded(load, what=f"--model {spec}: importing {module_name}", timeout=timeout)
    function = getattr(module, function_name, None)
    if function is None:
        raise UsageError(f"--model {spec}: module {module_name} has no {function_name}")
    if not callable(function):
        raise UsageError(f"--model {spec}: {function_name} is a {type(function).__name__}, not a function")
    return function


def check_fields(model, spec: str) -> None:
    """UsageError naming the field when a PipelineModel's fields are not what the ranks
    need: a list of modules, a callable loss, lists of tensors, a finite loss scale."""
    import torch
    from torch import nn

    def bad(what: str) -> UsageError:
        return UsageError(f"--model {spec} returned a PipelineModel whose {what}")

    for name in ("stages", "inputs", "targets"):
        value = getattr(model, name)
        if not isinstance(value, (list, tuple)) or not value:
            raise bad(f"{name} is {type(value).__name__}, not a non-empty list")
    kinds = (("stages", nn.Module, "an nn.Module"), ("inputs", torch.Tensor, "a tensor"),
             ("targets", torch.Tensor, "a tensor"))
    for name, cls, what in kinds:
        wrong = next((i for i, x in enumerate(getattr(model, name)) if not isinstance(x, cls)), None)
        if wrong is not None:
            raise bad(f"{name}[{wrong}] is {type(getattr(model, name)[wrong]).__name__}, not {what}")
    if not callable(model.loss_fn):
        raise bad(f"loss_fn is {type(model.loss_fn).__name__}, not a function")
    scale = model.loss_scale
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, (int, float))
                              or not math.isfinite(scale)):
        raise bad(f"loss_scale is {scale!r}, not None or a finite number")
    if not isinstance(model.name, str):
        raise bad(f"name is {type(model.name).__name__}, not a string")
    model.stages, model.inputs, model.targets = list(model.stages), list(model.inputs), list(model.targets)


def build_user_model(spec: str, num_stages: int, microbatches: int, timeout: float | None = None):
    """Call the user's function and check that it returned a PipelineModel that the
    ranks can unpickle. `timeout`: seconds each step of the user's code may take."""
    from pipesched.executor.models import PipelineModel

    function = load_function(spec, timeout)
    name = getattr(function, "__qualname__", spec)
    model = guarded(function, num_stages, microbatches, what=f"--model {spec}: {name}(num_stages, microbatches)",
                    timeout=timeout)
    if not isinstance(model, PipelineModel):
        raise UsageError(f"--model {spec} returned {type(model).__name__}; it must be {SIGNATURE} "
                         "(pipesched.executor.models.PipelineModel)")
    check_fields(model, spec)

    def round_trip():  # what the ranks do with it: a __reduce__ or __setstate__ that fails, fails here
        try:
            data = pickle.dumps(model)
        except Exception as exc:  # noqa: BLE001 - pickle raises several types
            raise UsageError(f"--model {spec} returned a model that cannot be pickled (use module-level classes "
                             f"and loss functions): {_text(exc)}") from None
        try:
            pickle.loads(data)
        except Exception as exc:  # noqa: BLE001
            raise UsageError(f"--model {spec} returned a model that cannot be unpickled, as the ranks must: "
                             f"{_text(exc)}") from None

    guarded(round_trip, what=f"--model {spec}: pickling the model", timeout=timeout)
    if not model.name:
        model.name = spec
    return model
