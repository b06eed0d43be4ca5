"""Cost files: the `pipesched.costs/1` format of a cost model, in JSON or TOML.

`from_dict` and `to_dict` convert between a document and a `CostModel` (`simulator.cost_model`)
(round trip); `load` and `save` read and write files. A hand-written file may give
times, sizes and bandwidths with units ("12ms", "128MiB", "50GB/s"; `simulator.units`);
plain numbers are seconds, bytes and bytes per second. Any problem is a CostError
naming the field.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

from pipesched.schedules.documents import read_document
from pipesched.schedules.numbers import is_int
from pipesched.schedules.outputs import write_text

from .cost_model import (CostError, CostModel, DataParallel, FixedOpTimes, GradientSum, HostOverhead, HostSharing,
                         Link, Network, StageCost, StageSwitch)
from .layers import LayerCosts
from .partition import MAX_LAYERS
from .units import UnitError, parse_bandwidth, parse_bytes, parse_seconds


FORMAT = "pipesched.costs/1"

_OVERLAP_WORDS = {"serial": 0.0, "perfect": 1.0}
# fields a hand-written file may give with a unit ("12ms", "128MiB", "50GB/s")
_SECONDS = {"forward", "backward_input", "backward_weight", "backward_full", "grad_accumulate", "latency",
            "optimizer_time", "op_overhead", "per_op", "per_send", "per_recv", "send_start", "per_take", "fixed"}
_BYTES = {"activation_bytes", "gradient_bytes", "activation_memory", "weight_memory", "param_bytes",
          "weight_grad_bytes", "bucket_bytes", "recompute_memory"}


def _units(data: Any, where: str) -> Any:
    """`data` with every string in a time, size or bandwidth field read as a quantity."""
    if not isinstance(data, dict):
        return data
    out = dict(data)
    for key, value in data.items():
        if not isinstance(value, str):
            continue
        parse = (parse_seconds if key in _SECONDS else parse_bytes if key in _BYTES
                 else parse_bandwidth if key == "bandwidth" else None)
        if parse is not None:
            try:
                out[key] = parse(value)
            except UnitError as exc:
                raise CostError(f"{where}.{key}: {exc}") from None
    return out


def _stage(data: Any, where: str) -> StageCost:
    if not isinstance(data, dict):
        raise CostError(f"{where} must be an object of stage costs, got {type(data).__name__}")
    data = _units(data, where)
    known = {f.name for f in fields(StageCost)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise CostError(f"{where} has unknown field {unknown[0]!r}; fields are {', '.join(sorted(known))}")
    stage = StageCost(**data)
    stage.check(where)
    return stage


def _link(data: Any, where: str) -> Link:
    if not isinstance(data, dict):
        raise CostError(f"{where} must be an object with latency and bandwidth")
    data = _units(data, where)
    unknown = sorted(set(data) - {"latency", "bandwidth"})
    if unknown:
        raise CostError(f"{where} has unknown field {unknown[0]!r}; fields are latency, bandwidth")
    link = Link(latency=data.get("latency", 0.0), bandwidth=data.get("bandwidth", math.inf))
    link.check(where)
    return link


def from_dict(data: Any) -> CostModel:
    """Parse a `pipesched.costs/1` document (already loaded from JSON or TOML)."""
    if not isinstance(data, dict):
        raise CostError("cost file must hold an object at the top level")
    fmt = data.get("format", FORMAT)
    if fmt != FORMAT:
        raise CostError(f"cost file format is {fmt!r}, expected {FORMAT!r}")
    allowed = {"format", "stage", "stages", "model_stages", "overlap", "network", "contention",
               "blocking_sends", "op_overhead", "host", "host_overhead", "comm_buffers", "recv_lookahead",
               "data_parallel", "layers", "fixed_op_times", "stage_switch", "gradient_sum", "meta"}
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise CostError(f"cost file has unknown field {unknown[0]!r}; fields are {', '.join(sorted(allowed))}")
    default = _stage(data.get("stage", {}), "stage")
    base = {k: v for k, v in data.get("stage", {}).items()}
    stages: tuple[StageCost, ...] = (default,)
    if "stages" in data:
        if not isinstance(data["stages"], list) or not data["stages"]:
            raise CostError("stages must be a non-empty list of stage costs")
        stages = tuple(_stage({**base, **s} if isinstance(s, dict) else s, f"stages[{i}]")
                       for i, s in enumerate(data["stages"]))
    model_stages = None
    if "model_stages" in data:
        if not isinstance(data["model_stages"], list) or not data["model_stages"]:
            raise CostError("model_stages must be a non-empty list of stage costs")
        model_stages = tuple(_stage(s, f"model_stages[{i}]") for i, s in enumerate(data["model_stages"]))
    overlap = data.get("overlap", 0.0)
    if isinstance(overlap, str):
        if overlap not in _OVERLAP_WORDS:
            raise CostError(f"overlap must be 'serial', 'perfect' or a number in [0, 1], got {overlap!r}")
        overlap = _OVERLAP_WORDS[overlap]
    net = data.get("network", {})
    if not isinstance(net, dict):
        raise CostError("network must be an object")
    unknown = sorted(set(net) - {"latency", "bandwidth", "ranks_per_node", "inter_node"})
    if unknown:
        raise CostError(f"network has unknown field {unknown[0]!r}; fields are latency, bandwidth, ranks_per_node, inter_node")
    network = Network(
        intra=_link({k: net[k] for k in ("latency", "bandwidth") if k in net}, "network"),
        inter=_link(net["inter_node"], "network.inter_node") if "inter_node" in net else None,
        ranks_per_node=net.get("ranks_per_node"))
    for flag in ("contention", "blocking_sends", "comm_buffers"):
        if flag in data and not isinstance(data[flag], bool):
            raise CostError(f"{flag} must be true or false, got {data[flag]!r}")
    meta = data.get("meta", {})
    if not isinstance(meta, dict):
        raise CostError("meta must be an object")
    host = data.get("host")
    if host is not None:
        if not isinstance(host, dict) or "capacity" not in host:
            raise CostError("host must be an object with capacity (and compute_demand, wait_demand)")
        fields_ = {"capacity", "compute_demand", "wait_demand", "interference", "pinned", "switching", "gpu",
                   "host_time_first"}
        unknown = sorted(set(host) - fields_)
        if unknown:
            raise CostError(f"host has unknown field {unknown[0]!r}; fields are {', '.join(sorted(fields_))}")
        host = HostSharing(**host)
    overhead = data.get("host_overhead", {})
    if not isinstance(overhead, dict):
        raise CostError("host_overhead must be an object with per_op, per_send and per_recv (seconds)")
    unknown = sorted(set(overhead) - {"per_op", "per_send", "per_recv", "send_start", "per_take"})
    if unknown:
        raise CostError(f"host_overhead has unknown field {unknown[0]!r}; fields are per_op, per_send, per_recv, "
                        "send_start, per_take")
    host_overhead = HostOverhead(**_units(overhead, "host_overhead"))
    dp = data.get("data_parallel", {})
    if not isinstance(dp, dict):
        raise CostError("data_parallel must be an object with degree, latency, bandwidth and bucket_bytes")
    dp_fields = {"degree", "latency", "bandwidth", "bucket_bytes"}
    unknown = sorted(set(dp) - dp_fields)
    if unknown:
        raise CostError(f"data_parallel has unknown field {unknown[0]!r}; fields are {', '.join(sorted(dp_fields))}")
    data_parallel = DataParallel(**_units(dp, "data_parallel"))
    fixed_op_times = FixedOpTimes(**_units(_fields_of(data, "fixed_op_times", FixedOpTimes, "seconds"),
                                           "fixed_op_times"))
    stage_switch = StageSwitch(**_fields_of(data, "stage_switch", StageSwitch, "fractions"))
    gradient_sum = None
    if "gradient_sum" in data:  # absent in older files: the sum is priced by the links
        gradient_sum = GradientSum(**_units(_fields_of(data, "gradient_sum", GradientSum,
                                                       "seconds, seconds per byte"), "gradient_sum"))
    layers = None
    if "layers" in data:
        both = next((k for k in ("stage", "stages", "model_stages") if k in data), None)
        if both:
            raise CostError(f"give the model either layer by layer (layers) or per stage ({both}), not both")
        layers = layers_from_dict(data["layers"])
    return CostModel(stages=stages, model_stages=model_stages, overlap=overlap, network=network,
                     contention=data.get("contention", True), blocking_sends=data.get("blocking_sends", False),
                     op_overhead=_units(data, "cost file").get("op_overhead", 0.0), host=host, host_overhead=host_overhead,
                     comm_buffers=data.get("comm_buffers", True), recv_lookahead=data.get("recv_lookahead", 2),
                     data_parallel=data_parallel, layers=layers, fixed_op_times=fixed_op_times,
                     stage_switch=stage_switch, gradient_sum=gradient_sum, meta=meta).check()


def _fields_of(data: dict, name: str, cls, unit: str) -> dict:
    """The object `data[name]` (empty where absent), CostError unless its keys are fields
    of the dataclass `cls`."""
    value = data.get(name, {})
    names = {f.name for f in fields(cls)}
    if not isinstance(value, dict) or set(value) - names:
        raise CostError(f"{name} must be an object with {', '.join(sorted(names))} ({unit})")
    return value


def to_dict(model: CostModel) -> dict:
    """The `pipesched.costs/1` document of a cost model (round-trips through from_dict)."""
    defaults = StageCost()

    def stage(s: StageCost) -> dict:
        # the recompute options only when set, so files of models without them stay as they were
        return {f.name: getattr(s, f.name) for f in fields(StageCost) if getattr(s, f.name) is not None
                and not (f.name.startswith("recompute") and getattr(s, f.name) == getattr(defaults, f.name))}

    def link(l: Link) -> dict:
        d = {"latency": l.latency}
        if not math.isinf(l.bandwidth):
            d["bandwidth"] = l.bandwidth
        return d

    net: dict[str, Any] = link(model.network.intra)
    if model.network.ranks_per_node is not None:
        net["ranks_per_node"] = model.network.ranks_per_node
    if model.network.inter is not None:
        net["inter_node"] = link(model.network.inter)
    doc: dict[str, Any] = {"format": FORMAT}
    if model.layers is None:  # layers replace the per-stage costs
        doc["stages"] = [stage(s) for s in model.stages]
    if model.model_stages is not None:
        doc["model_stages"] = [stage(s) for s in model.model_stages]
    doc.update(overlap=model.overlap, network=net, contention=model.contention,
               blocking_sends=model.blocking_sends, op_overhead=model.op_overhead,
               comm_buffers=model.comm_buffers, recv_lookahead=model.recv_lookahead)
    if model.host is not None:
        doc["host"] = {"capacity": model.host.capacity, "compute_demand": model.host.compute_demand,
                       "wait_demand": model.host.wait_demand, "interference": model.host.interference,
                       "pinned": model.host.pinned, "switching": model.host.switching, "gpu": model.host.gpu}
        if model.host.host_time_first:
            doc["host"]["host_time_first"] = True
    if model.fixed_op_times.any:
        doc["fixed_op_times"] = asdict(model.fixed_op_times)
    if model.stage_switch.any:  # the second op's fractions only where set, so older files stay as they were
        doc["stage_switch"] = {k: v for k, v in asdict(model.stage_switch).items()
                               if v or k in ("forward", "backward")}
    if model.gradient_sum is not None:
        doc["gradient_sum"] = asdict(model.gradient_sum)
    if model.host_overhead.any:
        o = model.host_overhead
        doc["host_overhead"] = {"per_op": o.per_op, "per_send": o.per_send, "per_recv": o.per_recv,
                                "per_take": o.per_take}
        if o.send_start is not None:
            doc["host_overhead"]["send_start"] = o.send_start
    if model.data_parallel != DataParallel():
        dp = model.data_parallel
        doc["data_parallel"] = {"degree": dp.degree, "latency": dp.latency}
        if not math.isinf(dp.bandwidth):
            doc["data_parallel"]["bandwidth"] = dp.bandwidth
        if dp.bucket_bytes is not None:
            doc["data_parallel"]["bucket_bytes"] = dp.bucket_bytes
    if model.layers is not None:
        doc["layers"] = layers_to_dict(model.layers)
    if model.meta:
        doc["meta"] = model.meta
    return doc


def load(path: str | Path) -> CostModel:
    """Read a cost file: JSON, or TOML when the name ends in .toml."""
    data = read_document(path, "cost file", CostError)
    try:
        return from_dict(data)
    except TypeError as exc:  # e.g. a stage given as a list
        raise CostError(f"cost file {str(path)!r}: {exc}") from None


def save(model: CostModel, path: str | Path) -> None:
    """Write the cost file (JSON) atomically."""
    write_text(path, json.dumps(to_dict(model), indent=2) + "\n")


# --- the layers section ---------------------------------------------------------------

_FIELDS = {"layer", "count", "list", "embedding", "head", "partition", "objective"}
_ZERO_TIMES = {"forward": 0.0, "backward_input": 0.0, "backward_weight": 0.0}


def _piece(data: Any, where: str) -> StageCost:
    """One layer or extra; times it does not give are 0 (not the 1 s of a `stage`)."""
    if not isinstance(data, dict):
        raise CostError(f"{where} must be an object of layer costs, got {type(data).__name__}")
    return _stage({**_ZERO_TIMES, **data}, where)


def layers_from_dict(data: Any) -> LayerCosts:
    """The `layers` section of a cost file: `layer` (defaults for every layer), `count`
    copies of it or a `list` of layers (each over those defaults), optional `embedding`
    and `head`, `partition` and `objective`. Times a piece does not give are 0 s."""
    if not isinstance(data, dict):
        raise CostError("layers must be an object with layer/count or list, embedding, head, partition")
    unknown = sorted(set(data) - _FIELDS)
    if unknown:
        raise CostError(f"layers has unknown field {unknown[0]!r}; fields are {', '.join(sorted(_FIELDS))}")
    base = data.get("layer", {})
    if not isinstance(base, dict):
        raise CostError("layers.layer must be an object of layer costs")
    count = data.get("count")
    if count is not None and (not is_int(count) or count < 1):
        raise CostError(f"layers.count must be an integer >= 1, got {_short(count)}")
    if count is not None and count > MAX_LAYERS:  # before `count` copies are made
        raise CostError(f"layers.count is {_short(count)}; a model has at most {MAX_LAYERS:,} layers")
    if "list" in data:
        items = data["list"]
        if not isinstance(items, list) or not items:
            raise CostError("layers.list must be a non-empty list of layer costs")
        if len(items) > MAX_LAYERS:
            raise CostError(f"layers.list has {len(items):,} layers; a model has at most {MAX_LAYERS:,} layers")
        if count is not None and count != len(items):
            raise CostError(f"layers.count is {count} but layers.list has {len(items)} layers")
        layers = tuple(_piece({**base, **item} if isinstance(item, dict) else item, f"layers.list[{i}]")
                       for i, item in enumerate(items))
    elif count is not None:
        layers = (_piece(base, "layers.layer"),) * count
    else:
        raise CostError("layers needs count (copies of layers.layer) or list (one entry per layer)")
    extras = {name: _piece(data[name], f"layers.{name}") for name in ("embedding", "head") if name in data}
    partition = data.get("partition", "balanced")
    if isinstance(partition, list):
        partition = tuple(partition)
    return LayerCosts(layers, extras.get("embedding"), extras.get("head"), partition,
                      data.get("objective", "fbw")).check()


def _short(value: Any) -> str:
    """`value` for a message, an integer of many digits shortened to its length."""
    text = repr(value) if not is_int(value) or abs(value) < 10 ** 30 else f"an integer of {len(str(abs(value)))} digits"
    return text if len(text) <= 60 else text[:57] + "..."


def layers_to_dict(model: LayerCosts) -> dict:
    """The `layers` section of `model` (round-trips through layers_from_dict)."""
    def stage(s: StageCost) -> dict:
        return {f.name: getattr(s, f.name) for f in fields(StageCost) if getattr(s, f.name) is not None}

    doc: dict[str, Any] = {}
    if len(set(model.layers)) == 1:
        doc.update(layer=stage(model.layers[0]), count=len(model.layers))
    else:
        doc["list"] = [stage(s) for s in model.layers]
    for name in ("embedding", "head"):
        if getattr(model, name) is not None:
            doc[name] = stage(getattr(model, name))
    doc["partition"] = model.partition if isinstance(model.partition, str) else list(model.partition)
    doc["objective"] = model.objective
    return doc
