"""What the executor adds to the compute, measured on the example models.

1. Per op, one process, one thread: T_F, T_BW, T_B and T_W of one middle model stage
   (median over alternating repetitions), the ratio (T_B + T_W) / T_BW of the split
   backward to the fused one, and the cost of the saved-tensor memory accounting
   (T_F with it against a plain forward of the same module).
2. Per op on a running pipeline (gloo, 2 ranks): the runtime's overhead, i.e. the host
   time of a step that is neither inside an op nor blocked on a transfer (bookkeeping,
   posting receives and sends, hand-overs), divided by the number of ops; median over
   steps, for each rank. A tiny model shows the floor, where ops take almost nothing.

    python benchmarks/executor_overhead.py [--json]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from pipesched.executor.launch import launch_local  # noqa: E402
from pipesched.executor.memory import MemoryLedger  # noqa: E402
from pipesched.executor.models import ExampleModel, check_model, mse_loss  # noqa: E402
from pipesched.executor.runtime import RankRuntime  # noqa: E402
from pipesched.executor.stage import StageModule  # noqa: E402
from pipesched.schedules.registry import build  # noqa: E402
from pipesched.schedules.validate import validate  # noqa: E402

MODELS = {
    "mlp": ExampleModel("mlp", hidden=512, layers_per_stage=2, microbatch_size=32),
    "transformer": ExampleModel("transformer", hidden=256, layers_per_stage=2, microbatch_size=8, seq=128),
    "tiny": ExampleModel("mlp", hidden=8, layers_per_stage=1, microbatch_size=2),
}


def op_times(model: ExampleModel, reps: int) -> dict:
    """Median seconds of F, plain forward, BW, B and W on model stage 1 of 3."""
    torch.set_num_threads(1)
    module = model.build_stage(1)
    sm = StageModule(module, 1, 3, mse_loss, 1.0, MemoryLedger(time.perf_counter, module.parameters()))
    x0, _ = model.microbatch(0)
    times: dict[str, list[float]] = {k: [] for k in ("F", "F_plain", "BW", "B", "W")}
    for rep in range(reps + 3):
        for split in ((False, True) if rep % 2 else (True, False)):
            x = x0.clone()
            start = time.perf_counter()
            state, out = sm.forward(0, x, None)
            grad = torch.ones_like(out)
            middle = time.perf_counter()
            if split:
                _, held = sm.backward_input(state, grad)
                after_b = time.perf_counter()
                sm.backward_weight(held)
                end = time.perf_counter()
                if rep >= 3:
                    times["B"].append(after_b - middle)
                    times["W"].append(end - after_b)
            else:
                sm.backward_full(state, grad)
                end = time.perf_counter()
                if rep >= 3:
                    times["BW"].append(end - middle)
            if rep >= 3:
                times["F"].append(middle - start)
        x = x0.clone().requires_grad_()
        start = time.perf_counter()
        y = module(x)
        if rep >= 3:
            times["F_plain"].append(time.perf_counter() - start)
        y.backward(torch.ones_like(y))
    med = {k: statistics.median(v) for k, v in times.items()}
    med["split_ratio"] = (med["B"] + med["W"]) / med["BW"]
    med["accounting_ratio"] = med["F"] / med["F_plain"]
    return med


def overhead_job(ctx, cases: list, steps: int) -> dict | None:
    rows = []
    for name, model_name in cases:
        model = MODELS[model_name]
        schedule = build(name, ctx.world, 8)
        graph = validate(schedule)
        built = model.build(schedule.num_model_stages, schedule.microbatches)
        runtime = RankRuntime(graph, ctx.rank, built, check_model(built, schedule.num_model_stages, 8),
                              "gloo", ctx.device, 120)
        per_op, op_share = [], []
        for i in range(steps + 2):
            dist.barrier()
            rec = runtime.step()
            if i >= 2:
                wall = rec.end - rec.start
                per_op.append((wall - rec.host_op_time - rec.host_wait_time) / len(rec.compute))
                op_share.append(rec.host_op_time / len(rec.compute))
        runtime.close()
        rows.append({"schedule": name, "model": model_name, "rank": ctx.rank,
                     "overhead_per_op_s": statistics.median(per_op), "op_time_s": statistics.median(op_share)})
    gathered: list | None = [None] * ctx.world if ctx.rank == 0 else None
    dist.gather_object(rows, gathered, dst=0)
    return {"rows": [r for rs in gathered for r in rs]} if ctx.rank == 0 else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=30, help="repetitions per op (default 30)")
    ap.add_argument("--steps", type=int, default=10, help="pipeline steps per case (default 10)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    ops = {name: op_times(MODELS[name], args.reps) for name in ("mlp", "transformer")}
    cases = [(s, m) for m in ("mlp", "transformer", "tiny") for s in ("1f1b", "zb-v")]
    pipeline = launch_local(overhead_job, (cases, args.steps), 2, "gloo", 300)["rows"]
    if args.json:
        print(json.dumps({"ops": ops, "pipeline": pipeline}, indent=1))
        return
    print("per op, model stage 1, one thread (median of %d):" % args.reps)
    print(f"{'model':<12} {'T_F':>9} {'plain F':>9} {'T_BW':>9} {'T_B':>9} {'T_W':>9} {'(B+W)/BW':>9} "
          f"{'F/plain F':>10}")
    for name, m in ops.items():
        print(f"{name:<12} " + " ".join(f"{1e3 * m[k]:>7.3f}ms" for k in ("F", "F_plain", "BW", "B", "W"))
              + f" {m['split_ratio']:>9.3f} {m['accounting_ratio']:>10.3f}")
    print("\nruntime overhead per op, gloo, 2 ranks, 8 microbatches (median of %d steps):" % args.steps)
    print(f"{'schedule':<8} {'model':<12} {'rank':>4} {'overhead/op':>12} {'op time':>10}")
    for r in pipeline:
        print(f"{r['schedule']:<8} {r['model']:<12} {r['rank']:>4} {1e6 * r['overhead_per_op_s']:>10.1f}us "
              f"{1e3 * r['op_time_s']:>8.3f}ms")


if __name__ == "__main__":
    main()
