"""A GPU cluster described by numbers: what one GPU computes and moves, and the links
inside and between nodes. No device is touched; the cost estimate (`simulator.estimate`)
turns a model and these figures into a cost file.

Peak figures are the vendors' datasheets (dense, without the 2:4 sparsity the headline
numbers assume):

- `a100-80gb` (A100 SXM4 80GB): BF16/FP16 tensor core 312 TFLOP/s, FP32 19.5 TFLOP/s,
  HBM2e 2,039 GB/s, 80 GB (81,920 MiB as nvidia-smi shows it); NVLink 3 600 GB/s
  (both directions together: 300 GB/s each way); a DGX A100 has one 200 Gb/s HDR
  InfiniBand port per GPU. NVIDIA A100 Tensor Core GPU datasheet (2021); DGX A100 user
  guide.
- `h100-sxm` (H100 SXM5 80GB): BF16/FP16 989.5 TFLOP/s (1,979 with sparsity), FP32
  67 TFLOP/s, HBM3 3.35 TB/s, 80 GB (81,559 MiB); NVLink 4 900 GB/s (450 GB/s each
  way); DGX H100: one 400 Gb/s NDR InfiniBand port (ConnectX-7) per GPU. NVIDIA H100
  Tensor Core GPU datasheet (2023); DGX H100 user guide.
- `h200` (H200 SXM 141GB): the H100's compute (BF16 989.5 TFLOP/s dense, FP32 67), HBM3e
  4.8 TB/s, 141 GB (143,771 MiB); NVLink 900 GB/s; 400 Gb/s InfiniBand per GPU. NVIDIA
  H200 Tensor Core GPU datasheet (2024).

FP32 is the plain FP32 rate (PyTorch does not use TF32 for FP32 matmuls by default).
Link latencies are not on datasheets: 5 us inside a node and 10 us between nodes are
this module's assumptions (the order of NCCL's small-message latencies).

**Achieved efficiency.** Two figures per GPU kind, the same for every model and never
adjusted to fit one:

- `efficiency` = 0.75: the share of the peak FLOP/s a matrix multiplication (a weight
  GEMM, attention's products) reaches. A GEMM alone reaches that share, not the 52 % of
  peak that Megatron-LM reports for a whole training step (Narayanan et al. 2021, which
  counts everything else in the step too). On one H200 in 2026-11 the weight-gradient op
  of five Llama blocks, which is GEMMs alone, ran at 0.62-0.76 of the datasheet peak (the
  workplace's own note of that machine gives 0.80 for an 8192^3 bf16 product).
- `memory_efficiency` = 0.3: the share of the HBM bandwidth that memory-bound work (norms,
  activations, residual adds, rotary embeddings) reaches over the bytes the estimate
  counts. This is far below a streaming copy's share, because such ops run as many short
  kernels and move more than the bytes counted (casts, temporaries). It also stands for the
  per-op rate this project measures on a CPU (14.5 GB/s against a streaming add's 86).

Both were read off the one GPU measurement there is: five Llama blocks on an H200
(`benchmarks/results/2026-11-28-gpu-validate.md`). Attention and GEMMs share
`efficiency`, the rounded figures fit all fifteen F, B and W times with a median error
of 4 %, and the zero-bubble paper's A100 times stay out of it as the held-out check. For
the A100 and the H100 they are assumptions. Override them with `efficiency` and
`memory_efficiency` in a hardware file, or with `--efficiency` and
`--memory-efficiency`. GEMMs' own bytes and the links move at their full bandwidth.

A hardware file (TOML, or JSON) overrides any of these (units as in cost files):

    gpu = "h100-sxm"                 # the kind to start from (default: --gpu)
    name = "h100-lowclock"
    efficiency = 0.7
    memory_efficiency = 0.4
    hbm_bandwidth = "3.35TB/s"
    memory = "80GiB"
    ranks_per_node = 8
    [peak_flops]                     # per dtype, FLOP/s ("989TFLOP/s" or 9.89e14)
    bf16 = "800TFLOP/s"
    [intra_node]                     # NVLink, per GPU and direction
    bandwidth = "450GB/s"
    latency = "5us"
    [inter_node]                     # between nodes, per GPU
    bandwidth = "400Gbit/s"
    latency = "10us"
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from pipesched.schedules.documents import read_document
from pipesched.schedules.numbers import is_int, is_real

from .costs import Link
from .units import UnitError, parse_bandwidth, parse_bytes, parse_seconds

__all__ = ["GpuKind", "Hardware", "HardwareError", "GPU_KINDS", "DEFAULT_EFFICIENCY", "DEFAULT_MEMORY_EFFICIENCY",
           "hardware", "load_hardware", "parse_flops", "DTYPES"]

DTYPES = ("bf16", "fp16", "fp32")
DEFAULT_EFFICIENCY = 0.75
DEFAULT_MEMORY_EFFICIENCY = 0.3
MAX_FILE_BYTES = 2 ** 20
_T = 1e12


class HardwareError(ValueError):
    """A hardware description that cannot be used; the message names the field."""


@dataclass(frozen=True)
class GpuKind:
    """One accelerator: dense peak FLOP/s per dtype, HBM bandwidth (bytes/s), memory
    (bytes), the achieved share of peak for matmuls, where the figures come from, and the
    achieved share of the HBM bandwidth for memory-bound work."""

    name: str
    peak_flops: dict[str, float]
    hbm_bandwidth: float
    memory: float
    efficiency: float = DEFAULT_EFFICIENCY
    source: str = ""
    memory_efficiency: float = DEFAULT_MEMORY_EFFICIENCY

    def flops(self, dtype: str) -> float:
        """Achieved matmul FLOP/s in `dtype`: peak times efficiency."""
        if dtype not in self.peak_flops:
            raise HardwareError(f"{self.name} has no peak FLOP/s for {dtype}; it gives "
                                f"{', '.join(self.peak_flops)}")
        return self.peak_flops[dtype] * self.efficiency

    @property
    def memory_rate(self) -> float:
        """Achieved bytes/s of memory-bound work: HBM bandwidth times memory_efficiency."""
        return self.hbm_bandwidth * self.memory_efficiency


@dataclass(frozen=True)
class Hardware:
    """GPUs of one kind, `ranks_per_node` to a node, joined by `intra` (NVLink, per GPU
    and direction) inside a node and `inter` (per GPU) between nodes."""

    gpu: GpuKind
    intra: Link
    inter: Link
    ranks_per_node: int = 8
    overrides: dict[str, Any] = field(default_factory=dict, compare=False)

    def check(self) -> "Hardware":
        g = self.gpu
        for dtype, rate in g.peak_flops.items():
            if dtype not in DTYPES:
                raise HardwareError(f"peak_flops.{dtype}: unknown dtype; dtypes are {', '.join(DTYPES)}")
            _positive(rate, f"peak_flops.{dtype}", "FLOP/s", 1e18)
        _positive(g.hbm_bandwidth, "hbm_bandwidth", "bytes/s", 1e15)
        _positive(g.memory, "memory", "bytes", 2.0 ** 50)
        if not is_real(g.efficiency) or not 0 < g.efficiency <= 1:
            raise HardwareError(f"efficiency must be a number in (0, 1] (share of peak FLOP/s), got {g.efficiency!r}")
        if not is_real(g.memory_efficiency) or not 0 < g.memory_efficiency <= 1:
            raise HardwareError("memory_efficiency must be a number in (0, 1] (share of the HBM bandwidth), "
                                f"got {g.memory_efficiency!r}")
        for where, link in (("intra_node", self.intra), ("inter_node", self.inter)):
            _positive(link.bandwidth, f"{where}.bandwidth", "bytes/s", 1e15)
            if not is_real(link.latency) or not 0 <= link.latency <= 1:
                raise HardwareError(f"{where}.latency must be between 0 and 1 s, got {link.latency!r}")
        if not is_int(self.ranks_per_node) or not 1 <= self.ranks_per_node <= 1024:
            raise HardwareError(f"ranks_per_node must be an integer in 1..1024, got {self.ranks_per_node!r}")
        return self

    def describe(self) -> str:
        g = self.gpu
        peaks = ", ".join(f"{k} {v / _T:g} TFLOP/s" for k, v in g.peak_flops.items())
        return (f"{g.name}: {peaks} peak, matmuls at {g.efficiency:g} of it; HBM {g.hbm_bandwidth / 1e9:g} GB/s "
                f"(memory-bound work at {g.memory_efficiency:g} of it), "
                f"{g.memory / 2 ** 30:.4g} GiB; {self.ranks_per_node} per node, links {self.intra.bandwidth / 1e9:g} GB/s "
                f"inside a node, {self.inter.bandwidth / 1e9:g} GB/s between nodes")


def _positive(value: Any, where: str, unit: str, bound: float) -> None:
    if not is_real(value) or not math.isfinite(value) or not 0 < value <= bound:
        raise HardwareError(f"{where} must be a number of {unit} in (0, {bound:g}], got {value!r}")


def _kind(name: str, bf16: float, fp32: float, hbm: float, memory_mib: int, source: str) -> GpuKind:
    return GpuKind(name, {"bf16": bf16 * _T, "fp16": bf16 * _T, "fp32": fp32 * _T}, hbm, memory_mib * 2.0 ** 20,
                   DEFAULT_EFFICIENCY, source)


GPU_KINDS: dict[str, tuple[GpuKind, Link, Link]] = {
    "a100-80gb": (_kind("a100-80gb", 312, 19.5, 2039e9, 81920, "NVIDIA A100 Tensor Core GPU datasheet (2021)"),
                  Link(5e-6, 300e9), Link(10e-6, 200e9 / 8)),
    "h100-sxm": (_kind("h100-sxm", 989.5, 67, 3.35e12, 81559, "NVIDIA H100 Tensor Core GPU datasheet (2023)"),
                 Link(5e-6, 450e9), Link(10e-6, 400e9 / 8)),
    "h200": (_kind("h200", 989.5, 67, 4.8e12, 143771, "NVIDIA H200 Tensor Core GPU datasheet (2024)"),
             Link(5e-6, 450e9), Link(10e-6, 400e9 / 8)),
}


def hardware(kind: str, ranks_per_node: int = 8) -> Hardware:
    """The named GPU kind with its links (HardwareError naming the kinds otherwise)."""
    key = kind.strip().lower()
    if key not in GPU_KINDS:
        raise HardwareError(f"unknown GPU kind {kind!r}; kinds are {', '.join(GPU_KINDS)} (or a --hardware file)")
    gpu, intra, inter = GPU_KINDS[key]
    return Hardware(gpu, intra, inter, ranks_per_node).check()


_FLOPS = re.compile(r"(?i)^\s*([+-]?(?:\d+\.?\d*|\.\d+)(?:e[+-]?\d+)?)\s*([kmgtpe]?)(?:flop/?s|flops)?\s*$")
_PREFIX = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12, "p": 1e15, "e": 1e18}


def parse_flops(value: Any, where: str = "peak_flops") -> float:
    """"989TFLOP/s", "9.89e14" or a number -> FLOP/s."""
    if is_real(value):
        return float(value)
    match = _FLOPS.match(value) if isinstance(value, str) else None
    if not match:
        raise HardwareError(f"{where}: expected a rate such as 989TFLOP/s or 9.89e14, got {value!r}")
    return float(match.group(1)) * _PREFIX[match.group(2).lower()]


_FIELDS = {"gpu", "name", "peak_flops", "hbm_bandwidth", "memory", "efficiency", "memory_efficiency",
           "ranks_per_node", "intra_node", "inter_node", "source"}


def _link(base: Link, data: Any, where: str) -> Link:
    if not isinstance(data, dict) or set(data) - {"bandwidth", "latency"}:
        raise HardwareError(f"{where} must be an object with bandwidth and latency")
    try:
        bandwidth = parse_bandwidth(data["bandwidth"]) if "bandwidth" in data else base.bandwidth
        latency = parse_seconds(data["latency"]) if "latency" in data else base.latency
    except UnitError as exc:
        raise HardwareError(f"{where}: {exc}") from None
    return Link(latency, bandwidth)


def with_overrides(base: Hardware | None, data: Any, where: str = "hardware") -> Hardware:
    """`base` (or the kind `data["gpu"]` names) with the fields of a hardware document
    applied over it; HardwareError for unknown fields and bad values."""
    if not isinstance(data, dict):
        raise HardwareError(f"{where} must hold an object of hardware fields")
    unknown = sorted(set(data) - _FIELDS)
    if unknown:
        raise HardwareError(f"{where} has unknown field {unknown[0]!r}; fields are {', '.join(sorted(_FIELDS))}")
    if "gpu" in data:
        if not isinstance(data["gpu"], str):
            raise HardwareError(f"{where}: gpu must name a GPU kind ({', '.join(GPU_KINDS)})")
        base = hardware(data["gpu"], base.ranks_per_node if base is not None else 8)
    if base is None:
        raise HardwareError(f"{where} names no gpu kind to start from; give gpu = \"h100-sxm\" (or --gpu)")
    gpu = base.gpu
    try:
        peaks = dict(gpu.peak_flops)
        if "peak_flops" in data:
            if not isinstance(data["peak_flops"], dict):
                raise HardwareError(f"{where}: peak_flops must be a table of dtype = FLOP/s")
            peaks.update({k: parse_flops(v, f"peak_flops.{k}") for k, v in data["peak_flops"].items()})
        gpu = replace(gpu, name=str(data.get("name", gpu.name if "peak_flops" not in data else gpu.name + "*")),
                      peak_flops=peaks,
                      hbm_bandwidth=parse_bandwidth(data.get("hbm_bandwidth", gpu.hbm_bandwidth)),
                      memory=parse_bytes(data.get("memory", gpu.memory)),
                      efficiency=data.get("efficiency", gpu.efficiency),
                      memory_efficiency=data.get("memory_efficiency", gpu.memory_efficiency),
                      source=str(data.get("source", gpu.source)))
    except UnitError as exc:
        raise HardwareError(f"{where}: {exc}") from None
    hw = Hardware(gpu, _link(base.intra, data.get("intra_node", {}), f"{where}.intra_node"),
                  _link(base.inter, data.get("inter_node", {}), f"{where}.inter_node"),
                  data.get("ranks_per_node", base.ranks_per_node), {**base.overrides, **data})
    return hw.check()


def load_hardware(path: str | Path, base: Hardware | None = None) -> Hardware:
    """A hardware file (TOML when the name ends in .toml, else JSON) over `base`."""
    data = read_document(path, "hardware file", HardwareError, MAX_FILE_BYTES)
    return with_overrides(base, data, f"hardware file {Path(path).name}")
