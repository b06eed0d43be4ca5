"""The model and hardware options: costs estimated for a cluster you do not have.

`costs` writes the estimate (`simulator.estimate`) as a cost file; `simulate`, `sweep`
and `plan` take the same options instead of `--costs FILE`, so one command plans a
cluster (docs/cluster.md). Where a command already has a flag of the same name:

- `--dp D` is data-parallel replicas on every command: the estimate (ZeRO-1's
  sharding, the all-reduce's link) and the simulated step's all-reduce use the same D.
- `--ranks-per-node N` is GPUs per node of the hardware once a model is given: the
  estimate places ranks TP fastest, then DP, then PP, and works out from it which
  pipeline neighbours share a node. It is not also applied to the pipeline's network,
  where it would count pipeline ranks.
- `--recompute` keeps each command's own meaning (simulate, sweep, plan: an R op
  re-running a whole model stage before its backward, which plan tries by itself).
  The estimate's recomputation inside each layer (Megatron-LM's) is `--layer-recompute`
  (`costs` also takes it as `--recompute`); the two are not stacked.
- `--microbatch-size B` is sequences per microbatch: `plan` takes a list (1,2,4) and
  searches a cost estimate per size, ranked in samples per second.

Bad or clashing options are a UsageError (one line, exit status 2).
"""
from __future__ import annotations

import argparse
from dataclasses import replace

from pipesched.simulator.costs import CostError, CostModel
from pipesched.simulator.estimate import ATTENTION, KERNELS, RECOMPUTE, Estimate, EstimateError, Setup, estimate
from pipesched.simulator.hardware import DTYPES, GPU_KINDS, Hardware, HardwareError, hardware, load_hardware
from pipesched.simulator.model_config import PRESETS, ModelConfig, ModelConfigError, load_hf_config, preset

from .. import options
from ..errors import UsageError

DEFAULTS = {"microbatch_size": 1, "dtype": "bf16", "tp": 1, "layer_recompute": "none", "zero": 0,
            "kernels": "fused", "attention": "flash"}
# what describes the estimate beyond the model itself (given without a model: an error)
SETUP_DESTS = ("seq", "dtype", "tp", "sp", "layer_recompute", "zero", "fp32_grads", "kernels", "attention", "gpu",
               "hardware", "efficiency", "memory_efficiency")
# the cost options an estimate replaces: it states them layer by layer
STAGE_FLAGS = {"f": "--f", "b": "--b", "w": "--w", "activation_bytes": "--activation-bytes",
               "activation_memory": "--activation-memory", "weight_memory": "--weight-memory",
               "param_bytes": "--param-bytes"}


def add_model_args(parser: argparse.ArgumentParser, *, own: bool = False, microbatch_size: bool = True) -> None:
    """The model, training and hardware options. `own` (the `costs` command): the model
    is required, defaults apply, and --dp, --ranks-per-node and --recompute (the layer
    recomputation) are added here; elsewhere the cost options bring --dp and
    --ranks-per-node. `microbatch_size`: add --microbatch-size (plan has its own list)."""
    m = parser.add_argument_group("model (estimate the costs instead of --costs; docs/cluster.md)")
    which = m.add_mutually_exclusive_group(required=own)
    which.add_argument("--model-config", metavar="CONFIG.json", help="a Hugging Face decoder-only config.json")
    which.add_argument("--model-preset", metavar="NAME", help=f"a preset: {', '.join(PRESETS)}")
    t = parser.add_argument_group("training (with a model)")
    t.add_argument("--seq", type=int, required=own, help="tokens per sequence")
    if microbatch_size:
        t.add_argument("--microbatch-size", type=int, metavar="B", default=1 if own else None,
                       help="sequences per microbatch (default 1)")
    t.add_argument("--dtype", choices=DTYPES, help="weights and activations (default bf16)")
    t.add_argument("--tp", type=int, help="tensor-parallel ranks (inside a node; default 1)")
    t.add_argument("--sp", action="store_true", help="sequence parallelism with TP (Korthikanti et al. 2022)")
    flags = ("--recompute", "--layer-recompute") if own else ("--layer-recompute",)
    t.add_argument(*flags, dest="layer_recompute", choices=RECOMPUTE,
                   help="activation recomputation inside each layer's backward, Megatron-LM's (default none)")
    if own:
        t.add_argument("--dp", type=int, default=1, metavar="D", help="data-parallel replicas (default 1)")
    t.add_argument("--zero", type=int, choices=(0, 1), help="1: shard optimizer states over the --dp replicas (ZeRO-1)")
    t.add_argument("--fp32-grads", action="store_true", help="keep gradients in fp32 under bf16/fp16 (4 bytes, not 2)")
    t.add_argument("--kernels", choices=KERNELS,
                   help="fused: Megatron/Transformer Engine kernels (default); eager: PyTorch ops as written (e.g. "
                        "transformers' modules)")
    t.add_argument("--attention", choices=ATTENTION,
                   help="flash: FlashAttention/SDPA, no scores stored (default); math: softmax scores stored")
    h = parser.add_argument_group("hardware (with a model)")
    h.add_argument("--gpu", metavar="KIND", help=f"GPU kind: {', '.join(GPU_KINDS)} (or gpu in --hardware)")
    h.add_argument("--hardware", metavar="FILE", help="hardware file (TOML/JSON) overriding the GPU kind's figures")
    h.add_argument("--efficiency", type=float, metavar="X",
                   help="share of peak FLOP/s matmuls reach (default: the GPU kind's, 0.75)")
    h.add_argument("--memory-efficiency", type=float, metavar="X",
                   help="share of the HBM bandwidth memory-bound ops reach (default: the GPU kind's, 0.3)")
    if own:
        h.add_argument("--ranks-per-node", type=int, metavar="N", help="GPUs per node (default 8)")


def model_given(args: argparse.Namespace) -> bool:
    """Whether the costs are to be estimated (--model-preset or --model-config)."""
    return getattr(args, "model_preset", None) is not None or getattr(args, "model_config", None) is not None


def check_model_args(args: argparse.Namespace, recompute_flag: bool = True) -> None:
    """UsageError where the model options clash with the others or lack what the
    estimate needs. `recompute_flag`: the command has a pipeline-level --recompute."""
    if not model_given(args):
        given = [d for d in SETUP_DESTS if getattr(args, d, None) not in (None, False)]
        if given:
            flag = "--" + given[0].replace("_", "-")
            raise UsageError(f"{flag} describes a model to estimate costs for; give --model-preset NAME or "
                             "--model-config CONFIG.json with it (or leave it out)")
        return
    if getattr(args, "costs", None):
        raise UsageError("give the costs either as --costs FILE or estimated from --model-preset/--model-config, "
                         "not both")
    stage = [flag for dest, flag in STAGE_FLAGS.items() if getattr(args, dest, None) is not None]
    if stage:
        raise UsageError(f"{stage[0]} does not apply with a model: the estimate gives every layer's times and "
                         "memory (change them through --gpu, --efficiency, --memory-efficiency, --seq, ...)")
    if args.seq is None:
        raise UsageError("the estimate needs --seq N (tokens per sequence)")
    if args.gpu is None and args.hardware is None:
        raise UsageError(f"the estimate needs --gpu KIND ({', '.join(GPU_KINDS)}) or --hardware FILE")
    layered = (args.layer_recompute or "none") != "none"
    stacked = getattr(args, "recompute", None) in (True, "on", "both") if recompute_flag else False
    if layered and stacked:
        raise UsageError(f"--layer-recompute {args.layer_recompute} already recomputes inside every layer; "
                         "--recompute would re-run each stage's forward again: give one of them")


def model_from_args(args: argparse.Namespace) -> ModelConfig:
    """The model --model-config or --model-preset names."""
    try:
        return load_hf_config(args.model_config) if args.model_config else preset(args.model_preset)
    except ModelConfigError as exc:
        raise UsageError(str(exc)) from None


def hardware_from_args(args: argparse.Namespace) -> Hardware:
    """The GPU kind, with a hardware file, --efficiency and --ranks-per-node over it."""
    try:
        base = None if args.gpu is None else hardware(args.gpu)
        if args.hardware is not None:
            hw = load_hardware(args.hardware, base)
        elif base is None:
            raise UsageError(f"give --gpu KIND ({', '.join(GPU_KINDS)}) or --hardware FILE")
        else:
            hw = base
        if args.ranks_per_node is not None:
            hw = replace(hw, ranks_per_node=args.ranks_per_node)
        if args.efficiency is not None:
            hw = replace(hw, gpu=replace(hw.gpu, efficiency=args.efficiency))
        if args.memory_efficiency is not None:
            hw = replace(hw, gpu=replace(hw.gpu, memory_efficiency=args.memory_efficiency))
        return hw.check()
    except HardwareError as exc:
        raise UsageError(str(exc)) from None


def setup_from_args(args: argparse.Namespace, microbatch_size: int | None = None) -> Setup:
    """How the model is trained, from the options (their defaults where not given);
    `microbatch_size` (sequences) instead of --microbatch-size where given."""
    def given(dest: str):
        value = getattr(args, dest, None)
        return DEFAULTS[dest] if value is None else value

    size = microbatch_size if microbatch_size is not None else given("microbatch_size")
    return Setup(seq=args.seq, microbatch_size=size, dtype=given("dtype"), tp=given("tp"), sp=args.sp,
                 recompute=given("layer_recompute"), dp=getattr(args, "dp", None) or 1, zero=given("zero"),
                 fp32_grads=args.fp32_grads, kernels=given("kernels"), attention=given("attention"))


def estimate_from_args(args: argparse.Namespace, microbatch_size: int | None = None) -> Estimate:
    """The estimate the options describe (at `microbatch_size` sequences per microbatch
    where given); UsageError naming the option for bad input."""
    model, hw = model_from_args(args), hardware_from_args(args)
    try:
        return estimate(model, setup_from_args(args, microbatch_size), hw)
    except (EstimateError, CostError) as exc:
        raise UsageError(str(exc)) from None


def costs_from_args(args: argparse.Namespace, microbatch_size: int | None = None) -> CostModel:
    """The cost model of a command taking both the cost and the model options: the
    estimate (a layers section) when a model is given, with the cost options that still
    apply (links, --partition, --dp-*, ...) over it; else the cost file and flags as
    before (`options.costs_from_args`)."""
    check_model_args(args)
    if not model_given(args):
        return options.costs_from_args(args)
    estimated = estimate_from_args(args, microbatch_size).cost_model()
    # --ranks-per-node went into the hardware (GPUs per node); the estimate's network
    # already says how many pipeline ranks share a node
    return options.costs_from_args(argparse.Namespace(**{**vars(args), "ranks_per_node": None}), base=estimated)


def model_words(args: argparse.Namespace, microbatch_size: int | None = None) -> list[str]:
    """The model options given, as flags to repeat in a suggested command (with
    `microbatch_size` for --microbatch-size where given; --ranks-per-node is among the
    cost options')."""
    words: list[str] = []
    for flag, value in (("--model-config", args.model_config), ("--model-preset", args.model_preset),
                        ("--seq", args.seq), ("--microbatch-size", microbatch_size),
                        ("--dtype", args.dtype), ("--tp", args.tp), ("--sp", args.sp),
                        ("--layer-recompute", args.layer_recompute), ("--dp", args.dp), ("--zero", args.zero),
                        ("--fp32-grads", args.fp32_grads), ("--kernels", args.kernels),
                        ("--attention", args.attention), ("--gpu", args.gpu), ("--hardware", args.hardware),
                        ("--efficiency", args.efficiency), ("--memory-efficiency", args.memory_efficiency)):
        if value is None or value is False:
            continue
        words += [flag] if value is True else [flag, str(value)]
    return words
