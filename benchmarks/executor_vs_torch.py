"""Step time of pipesched's executor against torch.distributed.pipelining's runtime.

Same model pieces (the example stage modules, same seeds), same microbatches, gloo on
CPU, same thread settings, one launch per case (a case torch's runtime cannot run is
recorded with its error and the others still run): every rank alternates a step of each
runtime (barrier, step, barrier) and the medians are compared. For each case three runs:
  ours       pipesched's built-in schedule of that name, on pipesched's runtime;
  ours(torch order)  torch's own op order (imported with executor.torch_schedules) on
             pipesched's runtime, so the difference to torch is the runtime alone;
  torch      torch's PipelineStage + its schedule class.
ratio = ours / torch (< 1: pipesched is faster). Also printed: the largest gradient
difference between the two runtimes after one step (both must compute the same thing).

    python benchmarks/executor_vs_torch.py --ranks 2 --microbatches 8 --model mlp --hidden 512
"""
from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from pipesched.executor.comm import ExecutorError  # noqa: E402
from pipesched.executor.launch import launch_local  # noqa: E402
from pipesched.executor.placement import threads_per_rank  # noqa: E402
from pipesched.executor.models import ExampleModel, check_model  # noqa: E402
from pipesched.executor.runtime import RankRuntime  # noqa: E402
from pipesched.executor.torch_schedules import torch_schedule  # noqa: E402
from pipesched.schedules.registry import build  # noqa: E402
from pipesched.schedules.validate import validate  # noqa: E402

# (pipesched name, torch name, torch class name, stages per rank)
CASES = (("1f1b", "1F1B", "Schedule1F1B", 1),
         ("interleaved-1f1b", "Interleaved1F1B", "ScheduleInterleaved1F1B", 2),
         ("zb-h1", "InterleavedZeroBubble", "ScheduleInterleavedZeroBubble", 1),
         ("zb-v", "ZBVZeroBubble", "ScheduleZBVZeroBubble", 2))


def _timed(ctx, fn) -> float:
    dist.barrier()
    start = time.perf_counter()
    fn()
    dist.barrier()
    return time.perf_counter() - start


def _ours(ctx, schedule, spec: ExampleModel):
    graph = validate(schedule)
    model = spec.build(schedule.num_model_stages, schedule.microbatches)
    runtime = RankRuntime(graph, ctx.rank, model, check_model(model, schedule.num_model_stages,
                                                              schedule.microbatches), "gloo", ctx.device, 120)
    return runtime


def _torch(ctx, schedule, cls_name: str, spec: ExampleModel):
    from torch.distributed import pipelining
    num = schedule.num_model_stages
    model = spec.build(num, schedule.microbatches)
    mine = [k for k in range(num) if any(st.model_stage == k and st.rank == ctx.rank for st in schedule.stages)]
    stages = [pipelining.PipelineStage(copy.deepcopy(model.stages[k]), k, num, ctx.device) for k in mine]
    cls = getattr(pipelining, cls_name)
    sched = cls(stages if len(stages) > 1 or cls_name not in ("Schedule1F1B",) else stages[0],
                n_microbatches=schedule.microbatches, loss_fn=model.loss_fn)
    x = torch.cat(model.inputs)
    y = torch.cat(model.targets)
    first, last = 0 in mine, num - 1 in mine

    def step():
        for st in stages:
            st.submod.zero_grad(set_to_none=True)
        args = (x,) if first else ()
        sched.step(*args, target=y if last else None, losses=[] if last else None)

    return step, {k: st.submod for k, st in zip(mine, stages)}


def job(ctx, args, case: tuple) -> dict | None:
    spec = ExampleModel(args.model, args.hidden, args.layers_per_stage, args.microbatch_size, args.seq, args.dtype)
    p, m = ctx.world, args.microbatches
    rows = []
    for name, torch_name, cls_name, v in (case,):
        ours = _ours(ctx, build(name, p, m, v if name == "interleaved-1f1b" else None), spec)
        try:
            ours_torch_order = _ours(ctx, torch_schedule(torch_name, p, m, v), spec)
        except ValueError as exc:  # the import refuses some of torch's action lists
            ours_torch_order, note = None, str(exc)
        torch_step, torch_modules = _torch(ctx, ours.graph.schedule, cls_name, spec)
        runs = {"ours": ours.step, "ours(torch order)": ours_torch_order and ours_torch_order.step,
                "torch": torch_step}
        runs = {k: f for k, f in runs.items() if f is not None}
        for _ in range(args.warmup):
            for f in runs.values():
                f()
        # same computation: compare gradients after one step of each
        ours.step()
        torch_step()
        diff = max((float((p.grad - q.grad).abs().max()) for k, mod in torch_modules.items()
                    for p, q in zip(ours.modules[k].params, mod.parameters())), default=0.0)
        times: dict[str, list[float]] = {k: [] for k in runs}
        for _ in range(args.steps):
            for k, f in runs.items():
                times[k].append(_timed(ctx, f))
        for r in (ours, ours_torch_order):
            if r is not None:
                r.close()
        med = {k: statistics.median(v) for k, v in times.items()}
        rows.append({"schedule": name, "torch": cls_name, **{f"{k}_s": x for k, x in med.items()},
                     "ratio": med["ours"] / med["torch"],
                     "ratio_torch_order": med["ours(torch order)"] / med["torch"] if ours_torch_order else None,
                     "torch_order_note": None if ours_torch_order else note, "max_grad_diff": diff})
    diffs: list = [None] * ctx.world if ctx.rank == 0 else None
    dist.gather_object(max(r["max_grad_diff"] for r in rows), diffs, dst=0)
    if ctx.rank == 0:
        for r in rows:
            r["max_grad_diff"] = max(diffs)
        return {"rows": rows}
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--microbatches", type=int, default=8)
    ap.add_argument("--model", choices=("mlp", "transformer"), default="mlp")
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--layers-per-stage", type=int, default=2)
    ap.add_argument("--microbatch-size", type=int, default=32)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    out: dict = {"rows": []}
    for case in CASES:
        try:
            out["rows"] += launch_local(job, (args, case), args.ranks, "gloo", 300)["rows"]
        except ExecutorError as exc:  # e.g. torch 2.11's ZBV schedule on gloo sends to its own rank
            out["rows"].append({"schedule": case[0], "torch": case[2], "error": str(exc).splitlines()[0]})
    out["config"] = vars(args) | {"threads_per_rank": threads_per_rank(args.ranks)}
    if args.json:
        print(json.dumps(out, indent=1))
        return
    print(f"gloo, {args.ranks} ranks x {threads_per_rank(args.ranks)} threads, {args.microbatches} microbatches, "
          f"{args.model} hidden {args.hidden}, {args.layers_per_stage} layers/stage, microbatch {args.microbatch_size}"
          + (f", seq {args.seq}" if args.model == "transformer" else "") + f", {args.steps} steps (median)")
    print(f"{'schedule':<18} {'torch class':<30} {'ours':>9} {'ours(torch order)':>18} {'torch':>9} "
          f"{'ratio':>6} {'ratio(torch order)':>19}")
    for r in out["rows"]:
        if "error" in r:
            print(f"{r['schedule']:<18} {r['torch']:<30} failed: {r['error']}")
            continue
        torch_order = r.get("ours(torch order)_s")
        cells = (f"{1e3 * torch_order:>16.2f}ms", f"{r['ratio_torch_order']:>19.3f}") if torch_order else \
            (f"{'n/a':>18}", f"{'n/a':>19}")
        print(f"{r['schedule']:<18} {r['torch']:<30} {1e3 * r['ours_s']:>7.2f}ms {cells[0]} "
              f"{1e3 * r['torch_s']:>7.2f}ms {r['ratio']:>6.3f} {cells[1]}")
    for r in out["rows"]:
        if r.get("torch_order_note"):
            print(f"{r['schedule']}: torch's order not importable: {r['torch_order_note']}")
    diffs = [r["max_grad_diff"] for r in out["rows"] if "error" not in r]
    if diffs:
        print(f"largest gradient difference between the runtimes: {max(diffs):.3g}")


if __name__ == "__main__":
    main()
