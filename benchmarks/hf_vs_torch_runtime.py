"""Step time of pipesched's runtime against torch's, on a transformers language model.

The same schedule runs on both runtimes: pipesched's executor (`executor.job.launch`)
and torch.distributed.pipelining's `_PipelineScheduleRuntime` loading the schedule's
CSV export (`executor.torch_runtime.run_on_torch_runtime`), so the op order is the same
and the difference is the runtime alone. Same model (a tiny hf-llama or hf-gpt2 preset,
random weights), same microbatches, gloo on CPU, one launch per runtime and schedule,
alternated `--rounds` times; step time = first start to last end over ranks, the
median over every measured step of the rounds. ratio = ours / torch (< 1: pipesched is
faster). Both runs are checked against the unpipelined model.

    python benchmarks/hf_vs_torch_runtime.py --model hf-llama --ranks 2 --microbatches 8
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipesched.executor.hf_models import HF_PRESETS, HFModel  # noqa: E402
from pipesched.executor.job import RunOptions, launch  # noqa: E402
from pipesched.executor.placement import threads_per_rank  # noqa: E402
from pipesched.executor.torch_runtime import run_on_torch_runtime  # noqa: E402
from pipesched.schedules.registry import build  # noqa: E402


def measure(name: str, args: argparse.Namespace, spec: HFModel) -> dict:
    schedule = build(name, args.ranks, args.microbatches)
    model = spec.build(schedule.num_model_stages, schedule.microbatches)
    ours, theirs, checks = [], [], []
    for _ in range(args.rounds):
        run = launch(schedule, model, RunOptions(steps=args.steps, warmup=args.warmup))
        ours += run.step_times
        checks.append(run.check.max_grad_rel_error)
        (torch_run,) = run_on_torch_runtime([schedule], model, steps=args.steps, warmup=args.warmup, verbose=False)
        theirs += torch_run.step_times
        checks.append(torch_run.reference.max_grad_rel_error)
    a, b = statistics.median(ours), statistics.median(theirs)
    return {"schedule": name, "model_stages": schedule.num_model_stages, "ours_s": a, "torch_s": b,
            "ratio": a / b, "max_grad_rel_error": max(checks), "ours_steps": ours, "torch_steps": theirs}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=HF_PRESETS, default="hf-llama")
    ap.add_argument("--schedules", default="1f1b,zb-v", help="comma-separated built-in names")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--microbatches", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--layers-per-stage", type=int, default=2)
    ap.add_argument("--microbatch-size", type=int, default=4)
    ap.add_argument("--seq", type=int, default=32)
    ap.add_argument("--vocab", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=2, help="launches per runtime, alternated (default 2)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    spec = HFModel(args.model, args.hidden, args.layers_per_stage, args.microbatch_size, args.seq, args.vocab).check()
    names = args.schedules.split(",")
    if args.json:
        print(json.dumps({"config": vars(args), "rows": [measure(name, args, spec) for name in names]}, indent=1))
        return
    print(f"gloo, {args.ranks} ranks x {threads_per_rank(args.ranks)} threads, {args.model} hidden {args.hidden}, "
          f"vocab {args.vocab}, {args.layers_per_stage} blocks per model stage, {args.microbatches} microbatches of "
          f"{args.microbatch_size} x {args.seq} tokens; median of {args.rounds} x {args.steps} steps per runtime")
    print(f"{'schedule':<18} {'stages':>6} {'ours':>10} {'torch':>10} {'ratio':>6} {'max grad rel err':>17}", flush=True)
    for name in names:  # a row as soon as it is measured
        r = measure(name, args, spec)
        print(f"{r['schedule']:<18} {r['model_stages']:>6} {1e3 * r['ours_s']:>8.2f}ms {1e3 * r['torch_s']:>8.2f}ms "
              f"{r['ratio']:>6.3f} {r['max_grad_rel_error']:>17.2g}", flush=True)


if __name__ == "__main__":
    main()
