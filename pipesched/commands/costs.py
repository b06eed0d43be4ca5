"""`pipesched costs`: estimate a cost file for a cluster you do not have.

From a model (a Hugging Face config.json or a preset) and a GPU kind (or a hardware file),
per tensor-parallel rank: each layer's F, B, W and R from FLOPs and bytes, what it holds,
the embedding and head as layers of their own (`simulator.estimate`). Writes an ordinary
cost file with a `layers` section, so `simulate`, `sweep` and `plan` take it with
`--costs` and `--partition balanced` splits it; prints a per-stage summary for -p ranks.
"""
from __future__ import annotations

import argparse
import json

from pipesched.simulator.cost_file import save, to_dict
from pipesched.simulator.costs import CostError

from ..errors import UsageError
from ..formatting import fmt_bytes, fmt_seconds
from ..terminal import check_outputs, wrote
from .model_options import add_model_args, estimate_from_args

GIB = 2.0 ** 30


def add_parser(sub) -> None:
    p = sub.add_parser("costs", help="estimate a cost file from a model and a GPU description (no GPU needed)",
                       description="Estimate per-layer costs (F, B, W, R, memory) of a transformer on a GPU cluster "
                                   "and write them as a cost file with a layers section (docs/cluster.md). "
                                   "simulate, sweep and plan take the same options directly.")
    add_model_args(p, own=True)
    p.add_argument("-p", "--ranks", type=int, help="pipeline ranks for the per-stage summary (balanced split)")
    p.add_argument("-o", "--output", metavar="COSTS.json", help="write the cost file here")
    p.add_argument("--json", action="store_true", help="print the cost file instead of the summary")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    check_outputs({"-o": args.output}, {"--model-config": args.model_config, "--hardware": args.hardware})
    if args.ranks is not None and args.ranks < 1:
        raise UsageError(f"-p must be >= 1, got {args.ranks}")
    est = estimate_from_args(args)
    try:
        costs = est.cost_model()
        counts = costs.layers.split(args.ranks) if args.ranks else None
    except CostError as exc:
        raise UsageError(str(exc)) from None
    if args.output:
        save(costs, args.output)
    if args.json:
        print(json.dumps(to_dict(costs), indent=1))
    else:
        print_summary(est, costs, counts)
    if args.output:
        wrote(args.output, "pipesched.costs/1 with a layers section (simulate/plan --costs, --partition balanced)",
              to_stderr=args.json)
    return 0


def _ms(x: float) -> str:
    return f"{x * 1e3:.3f}"


def print_summary(est, costs, counts) -> None:
    st, hw, layer = est.setup, est.hardware, est.layer
    print(est.model.describe())
    print(hw.describe())
    tp = f"TP {st.tp}{' + SP' if st.sp else ''}"
    dp = f"DP {st.dp}{' (ZeRO-1)' if st.zero else ''}"
    print(f"seq {st.seq}, microbatch {st.microbatch_size}, {st.dtype}, {tp}, {dp}, recompute {st.recompute}, "
          f"{st.kernels} kernels, {st.attention} attention; all figures per GPU (one TP rank), per microbatch")
    print(f"per layer: F {fmt_seconds(layer.forward.total)}, B {fmt_seconds(layer.backward_input.total)}, "
          f"W {fmt_seconds(layer.backward_weight.total)}, R {fmt_seconds(layer.recompute)}"
          f"{' (in B)' if st.recompute != 'none' else ''}; saves {fmt_bytes(layer.activation_memory)} F->B, "
          f"keeps {fmt_bytes(layer.weight_memory)} B->W; parameters+grads+optimizer {fmt_bytes(layer.param_bytes)}; "
          f"sends {fmt_bytes(layer.activation_bytes)}")
    if st.recompute == "selective" and st.attention == "flash":
        print("  (selective recomputation drops the attention scores, which flash attention never stores: no change)")
    emb, head = est.embedding, est.head
    print(f"embedding: F {fmt_seconds(emb.forward.total)}, W {fmt_seconds(emb.backward_weight.total)}, "
          f"{fmt_bytes(emb.param_bytes)}; head+loss: F {fmt_seconds(head.forward.total)}, "
          f"B {fmt_seconds(head.backward_input.total)}, W {fmt_seconds(head.backward_weight.total)}, "
          f"logits {fmt_bytes(head.saved['logits'])}, {fmt_bytes(head.param_bytes)}")
    if counts is None:
        return
    p = len(counts)
    stages = costs.layers.stage_costs(counts)
    print(f"p={p}, layers per stage {','.join(map(str, counts))} (balanced F+B+W); GiB per GPU "
          f"(memory {hw.gpu.memory / GIB:.4g} GiB):")
    print(f"{'stage':>5} {'layers':>8} {'F ms':>9} {'B ms':>9} {'W ms':>9} {'params+opt':>11} {'activ./mb':>10} "
          f"{'1F1B peak':>10}")
    for r, (c, s) in enumerate(zip(counts, stages)):
        label = ("E+" if r == 0 else "") + str(c) + ("+H" if r == p - 1 else "")
        peak = s.param_bytes + (p - r) * s.activation_memory
        print(f"{r:>5} {label:>8} {_ms(s.forward):>9} {_ms(s.backward_input):>9} {_ms(s.backward_weight):>9} "
              f"{s.param_bytes / GIB:>11.2f} {s.activation_memory / GIB:>10.2f} {peak / GIB:>10.2f}")
    print("E: embedding, H: final norm + LM head + cross-entropy; 1F1B peak: parameters + (p - stage) microbatches "
          "of activations (buffers and the framework's own memory not counted)")
