"""How close the simulator's predictions are to measured runs: every built-in schedule at
p = 2 and p = 4, m in {2p, 4p, 8p}, gloo on CPU, the MLP and the transformer examples
(`--backend gloo-cuda`: the ranks compute on one GPU, with larger models).

Each case is `pipesched validate`: calibrate (every rank profiles its model stages alone,
then ping-pong on the links), run (warm-up steps, then measured steps; the step of
median makespan is compared), simulate under the calibrated costs, compare. All cases of
one p and model share one launch of the ranks. Printed: a row per case (makespan error, bubble
error in points, worst rank's peak-memory error, op start-time error p50/p90) and the
median and max of each error over all cases and per p; then the same summaries with
each modelled effect taken out of the simulation again (same calibrations, same runs),
which shows how much each effect moves the error.

    python benchmarks/validation_accuracy.py [--ranks 2,4] [--models mlp,transformer]
        [--schedules 1f1b,zb-v] [--multipliers 2,4,8] [--steps 5] [--backend gloo-cuda]
        [--json OUT.json]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from machine import cpu_name  # noqa: E402
import saved_runs  # noqa: E402

import torch  # noqa: E402

from pipesched.executor.calibrate import CalibrationOptions  # noqa: E402
from pipesched.executor.job import RunOptions  # noqa: E402
from pipesched.executor.launch import launch_local  # noqa: E402
from pipesched.executor.models import ExampleModel  # noqa: E402
from pipesched.executor.validation import assemble, calibrate_and_run, predict  # noqa: E402
from pipesched.schedules.ir import ScheduleError  # noqa: E402
from pipesched.schedules.registry import BUILDERS, build  # noqa: E402
from pipesched.simulator.compare import compare  # noqa: E402
from pipesched.simulator.costs import CostModel, HostOverhead  # noqa: E402
from pipesched.simulator.cost_file import from_dict as costs_from_dict, to_dict  # noqa: E402
from pipesched.simulator.trace import Trace  # noqa: E402

MODELS = {
    "mlp": ExampleModel("mlp", hidden=512, layers_per_stage=2, microbatch_size=32),
    "transformer": ExampleModel("transformer", hidden=128, layers_per_stage=2, microbatch_size=8, seq=64),
}
# on a GPU the CPU sizes are all kernel launches; these give ops of about a millisecond
GPU_MODELS = {
    "mlp": ExampleModel("mlp", hidden=2048, layers_per_stage=2, microbatch_size=64),
    "transformer": ExampleModel("transformer", hidden=512, layers_per_stage=2, microbatch_size=8, seq=256),
}


def run_cases(ctx, cases: list, calibration: CalibrationOptions, options: RunOptions):
    """One launch: calibrate and run every case in turn; rank 0 returns {id: (costs, result)}."""
    out = {}
    for case_id, schedule, model in cases:
        got = calibrate_and_run(ctx, schedule, model, calibration, options)
        if got is not None:
            out[case_id] = got[:2]   # (costs, result); the period run is not compared here
    return out if ctx.rank == 0 else None


def cases_for(p: int, models: list[str], schedules: list[str], multipliers: list[int], sizes: dict) -> list:
    cases = []
    for model in models:
        for name in schedules:
            for k in multipliers:
                m = k * p
                try:
                    schedule = build(name, p, m)
                except ScheduleError as exc:
                    print(f"skipped {name} p={p} m={m}: {exc}", file=sys.stderr)
                    continue
                cases.append(((model, name, p, m), schedule, sizes[model]))
    return cases


def _without_host_time(c: CostModel) -> CostModel:
    return replace(c, host_overhead=HostOverhead())


def _without_interference(c: CostModel) -> CostModel:
    return c if c.host is None else replace(c, host=replace(c.host, interference=0.0))


def _fair_sharing(c: CostModel) -> CostModel:
    return c if c.host is None or not c.host.pinned else replace(c, host=replace(c.host, pinned=False, switching=0.0))


def _without_first_backward(c: CostModel) -> CostModel:
    def strip(stages):
        return None if stages is None else tuple(replace(s, grad_accumulate=0.0) for s in stages)
    return replace(c, stages=strip(c.stages), model_stages=strip(c.model_stages))


def _without_buffers(c: CostModel) -> CostModel:
    return replace(c, comm_buffers=False)


def _host_time_on_the_gpu(c: CostModel) -> CostModel:
    return c if c.host is None or not c.host.gpu else replace(c, host=replace(c.host, gpu=False))


# each modelled effect taken out again, to see how much it moves the error
ABLATIONS = {"no host time outside ops": _without_host_time, "no interference between busy cores": _without_interference,
             "fair sharing instead of pinned cores": _fair_sharing,
             "no cheaper first backward": _without_first_backward, "no communication buffers": _without_buffers,
             "host time competing for a shared GPU": _host_time_on_the_gpu}


def ablations(schedule, costs: CostModel, result, options: RunOptions) -> dict[str, dict[str, float]]:
    """Errors of the prediction with each modelled effect removed."""
    out = {}
    for name, strip in ABLATIONS.items():
        c = compare(predict(schedule, replace(strip(costs), recv_lookahead=options.lookahead)), result.trace)
        out[name] = {"makespan_rel_error": c.makespan_rel_error, "bubble_error_pt": 100 * (c.predicted.bubble_ratio -
                     c.measured.bubble_ratio), "peak_memory_rel_error": c.peak_memory_rel_error,
                     "start_p90": c.start_time_error_p90}
    return out


def summarise(rows: list[dict], label: str) -> str:
    if not rows:
        return f"{label}: no cases"
    mk = [abs(r["makespan_rel_error"]) for r in rows]
    bb = [abs(r["bubble_error_pt"]) for r in rows]
    mem = [abs(r["peak_memory_rel_error"]) for r in rows]
    p90 = [r["start_p90"] for r in rows]
    return (f"{label} ({len(rows)} cases): makespan |error| median {100 * statistics.median(mk):.2f} %, "
            f"max {100 * max(mk):.2f} %; bubble |error| median {statistics.median(bb):.2f} pt, max {max(bb):.2f} pt; "
            f"peak memory |error| median {100 * statistics.median(mem):.2f} %, max {100 * max(mem):.2f} %; "
            f"start-time error p90 median {100 * statistics.median(p90):.2f} %")


@dataclass
class SavedRun:
    """What `assemble` needs of a run, read back from `--save-runs`."""
    trace: Trace
    backend: str


def case_row(model: str, name: str, p: int, m: int, schedule, costs: CostModel, result, options: RunOptions) -> dict:
    """One case's errors (and its ablations), printed as a table row."""
    v = assemble(schedule, costs, result, options)
    c = v.comparison
    row = {"model": model, "schedule": name, "p": p, "m": m, "predicted": c.predicted.makespan,
           "measured": c.measured.makespan, "makespan_rel_error": c.makespan_rel_error,
           "predicted_bubble": c.predicted.bubble_ratio, "measured_bubble": c.measured.bubble_ratio,
           "bubble_error_pt": 100 * (c.predicted.bubble_ratio - c.measured.bubble_ratio),
           "peak_memory_rel_error": c.peak_memory_rel_error, "start_p50": c.start_time_error_p50,
           "start_p90": c.start_time_error_p90, "shared": v.shared,
           "per_op": [o.__dict__ for o in c.per_op],
           "ablations": ablations(schedule, costs, result, options)}
    print(f"{model:<12} {name:<17} {p:>2} {m:>3} {1e3 * row['predicted']:>8.1f}ms {1e3 * row['measured']:>8.1f}ms "
          f"{100 * row['makespan_rel_error']:>+7.2f}% {100 * row['predicted_bubble']:>10.2f}% "
          f"{100 * row['measured_bubble']:>5.1f}% {row['bubble_error_pt']:>+6.2f}pt "
          f"{100 * row['peak_memory_rel_error']:>+7.2f}% {100 * row['start_p50']:>8.2f}% "
          f"{100 * row['start_p90']:>5.2f}% {'yes' if row['shared'] else 'no':>6}", flush=True)
    return row


def measured_cases(args, options: RunOptions, sizes: dict):
    """Run the cases, one launch per p and model; yields (p, [(model, name, p, m, schedule,
    costs, result)])."""
    calibration = CalibrationOptions(repeats=args.repeats, timeout=600)
    for p in [int(x) for x in args.ranks.split(",")]:
        for model in args.models.split(","):
            cases = cases_for(p, [model], args.schedules.split(","),
                              [int(x) for x in args.multipliers.split(",")], sizes)
            results = launch_local(run_cases, (cases, calibration, options), p, backend=args.backend, timeout=600)
            yield p, [(*key, schedule, *results[key]) for key, schedule, _ in cases]


def saved_cases(doc: dict):
    """The cases of a `--save-runs` document, to predict again under the current simulator."""
    for p in sorted({r["p"] for r in doc["runs"]}):
        yield p, [(r["model"], r["schedule"], r["p"], r["m"], build(r["schedule"], r["p"], r["m"]),
                   costs_from_dict(r["costs"]), SavedRun(Trace.from_dict(r["measured"]), r["backend"]))
                  for r in doc["runs"] if r["p"] == p]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", default="2,4")
    ap.add_argument("--models", default="mlp,transformer")
    ap.add_argument("--schedules", default=",".join(BUILDERS))
    ap.add_argument("--multipliers", default="2,4,8", help="m = k * p for each k")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=15, help="calibration repetitions")
    ap.add_argument("--recv-lookahead", type=int, default=2, help="receives posted this many ops ahead (-1: all)")
    ap.add_argument("--backend", choices=("gloo", "gloo-cuda"), default="gloo",
                    help="gloo-cuda: every rank computes on the one GPU (needs CUDA)")
    ap.add_argument("--json", metavar="OUT.json")
    ap.add_argument("--save-runs", metavar="RUNS.npz",
                    help="also write every case's calibrated costs and measured trace (benchmarks/saved_runs.py)")
    ap.add_argument("--from-runs", metavar="RUNS.npz",
                    help="run nothing: predict the cases of a --save-runs file again and compare")
    args = ap.parse_args()
    if args.backend == "gloo-cuda" and not torch.cuda.is_available() and not args.from_runs:
        ap.error("--backend gloo-cuda needs a CUDA device")
    options = RunOptions(steps=args.steps, warmup=args.warmup, timeout=600, check=False, lookahead=args.recv_lookahead)
    sizes = GPU_MODELS if args.backend == "gloo-cuda" else MODELS
    if args.from_runs:
        doc = saved_runs.read(args.from_runs)
        header = {"machine": doc["machine"], "models": doc["models"]}
    else:
        where = f"gloo, compute on {torch.cuda.get_device_name()}" if args.backend == "gloo-cuda" else "gloo on CPU"
        header = {"machine": f"machine: {platform.machine()}, {os.cpu_count()} cores ({cpu_name()}), "
                             f"torch {torch.__version__}, {where}",
                  "models": "models: " + "; ".join(repr(sizes[m]) for m in args.models.split(",") if m in sizes)}
    print(header["machine"])
    print(header["models"])
    print(f"{'model':<12} {'schedule':<17} {'p':>2} {'m':>3} {'predicted':>10} {'measured':>10} {'error':>8} "
          f"{'bubble pred':>11} {'meas':>6} {'diff':>7} {'mem err':>8} {'start p50':>9} {'p90':>6} {'shared':>6}")
    rows, saved = [], []
    started = time.perf_counter()
    cases = saved_cases(doc) if args.from_runs else measured_cases(args, options, sizes)
    for _, batch in cases:
        for model, name, pp, m, schedule, costs, result in batch:
            rows.append(case_row(model, name, pp, m, schedule, costs, result, options))
            saved.append({"model": model, "schedule": name, "p": pp, "m": m, "backend": result.backend,
                          "costs": to_dict(costs), "measured": result.trace.to_dict()})
        if args.json:  # after every p, so a run cut short keeps what it measured
            Path(args.json).write_text(json.dumps(rows, indent=1))
        if args.save_runs:
            saved_runs.write(args.save_runs, {**header, "runs": saved})
    print()
    for p in sorted({r["p"] for r in rows}):
        print(summarise([r for r in rows if r["p"] == p], f"p={p}"))
    for model in sorted({r["model"] for r in rows}):
        print(summarise([r for r in rows if r["model"] == model], model))
    print(summarise(rows, "all"))
    print("\nwith one modelled effect removed (same calibrations, same runs):")
    for name in ABLATIONS:
        stripped = [{**r, **r["ablations"][name]} for r in rows]
        for p in sorted({r["p"] for r in rows}):
            print(summarise([r for r in stripped if r["p"] == p], f"  {name}, p={p}"))
    print(f"took {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
