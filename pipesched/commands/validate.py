"""`pipesched validate`: calibrate, simulate, execute and compare one schedule.

Prints predicted and measured makespan and their relative error, per-rank bubble ratio
(predicted, measured, difference), the median and p90 of per-op start-time error
divided by the makespan, how well the measured steps repeat (their spread, and how far
the even steps' median is from the odd ones': an error within that is within the
machine's noise), and peak memory per rank predicted vs measured; writes both
traces and the predicted-vs-measured figure into --out. Every report carries the replay
error (the run simulated again with its own measured durations: the simulator's share of
the error); --replay adds the replay per rank and writes replay.json.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..executor_args import (add_calibration_args, add_executor_args, add_measurement_args, calibration_options,
                             check_launchable_ranks, import_executor, model_from_args, model_label, prepare_checked,
                             run_options)
from ..errors import UsageError
from ..formatting import fmt_bytes, fmt_rel, fmt_seconds, json_text
from ..options import add_schedule_args, add_step_args, schedule_from_args
from ..tables import print_costs
from ..terminal import printable, wrote
from .validate_many import is_list, run_many
from .validate_out import check_out_folder, make_out_folder, probe_out_folder, run_into, write_results


def add_parser(sub) -> None:
    p = sub.add_parser("validate", help="calibrate, simulate, run and compare predicted with measured",
                       description="Calibrate, simulate, run and compare predicted with measured. SCHEDULE may "
                                   "be a comma-separated list (e.g. 1f1b,zb-h1,dualpipe): one calibration "
                                   "predicts them all, their runs take their steps in turn on the same network, "
                                   "and the predicted and measured fastest are compared.")
    add_schedule_args(p)
    add_executor_args(p)
    add_calibration_args(p)
    # ten steps: a data-parallel step takes ~0.6 s here and the host's speed drifts within
    # seconds, so five steps' median step is a poor measure of the next five's (docs/data_parallel.md)
    add_measurement_args(p, warmup=2, steps=10)
    add_step_args(p, steps=False)
    p.add_argument("--out", metavar="DIR",
                   help="write predicted.json, measured.json, costs.json and validate.png here "
                        "(default: a new folder pipesched-validate-* in the temporary directory)")
    p.add_argument("--replay", action="store_true",
                   help="also show the replay (the run simulated with its measured op and transfer times) "
                        "per rank, and write replay.json")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    if is_list(args.schedule):
        return run_many(args)
    if args.out is not None:  # before torch is imported: refused at once
        check_out_folder(args.out, args.schedule)
    import_executor("validate")
    from pipesched.executor.validation import check_period_options, validate_schedule

    options = run_options(args)
    check_launchable_ranks(args.ranks, options.dp)
    try:
        check_period_options(options)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    schedule = schedule_from_args(args)
    model = model_from_args(args, schedule)
    prepare_checked(schedule, model, args.backend, options.dp, args.timeout, model_label(args))
    calibration = calibration_options(args)
    # the folder is made once there is something to write into it (probed here, the last
    # check before the long work): a run stopped or killed on the way leaves no empty --out
    probe_out_folder(args.out)
    result, status = run_into(None, lambda: validate_schedule(schedule, model, options, calibration, args.backend))
    if status:
        return status
    if result is None:  # a rank other than 0 under torchrun
        return 0
    out = make_out_folder(args.out)
    summary = write_results(result, out, args.replay)
    for warning in summary["warnings"]:
        print(f"pipesched: warning: {warning}", file=sys.stderr)
    if args.json:
        print(json_text(summary))
        wrote(out, ", ".join(Path(f).name for f in summary["files"]), to_stderr=True)
    else:
        print_report(summary, result.costs, args.replay)
    check = result.run.check
    return 1 if check is not None and not (check.loss_matches and check.grads_match) else 0


def print_report(s: dict, costs, replay: bool = False) -> None:
    print(f"{printable(s['schedule'])}: {s['ranks']} ranks, {s['microbatches']} microbatches ({s['backend']}; {s['model']})")
    print_costs(costs)
    if s["shared_compute"]:
        h = s["host"]
        what = f"{h['capacity']:g} GPUs" if h.get("gpu") else f"{h['capacity']:g} cores"
        demand = "" if h.get("gpu") else f" x {h['compute_demand']:g} threads"
        print(f"note: this run shared compute ({s['ranks']} ranks{demand} on {what}); the prediction models "
              "the sharing, timings on dedicated hardware will differ")
    if s.get("data_parallel"):
        d = s["data_parallel"]
        print(f"data parallel: {d['degree']} replicas; the whole step is compared (all-reduce and optimizer "
              f"included; measured: the mean over the steps, the timeline the step nearest it): "
              f"all-reduce exposed {fmt_seconds(d['predicted_exposed'])} predicted, "
              f"{fmt_seconds(d['measured_exposed'])} measured")
    p, m = s["predicted"], s["measured"]
    print(f"{'':<24}{'predicted':>12}{'measured':>12}{'error':>12}")
    print(f"{'makespan':<24}{fmt_seconds(p['makespan']):>12}{fmt_seconds(m['makespan']):>12}"
          f"{fmt_rel(s['makespan_rel_error']):>12}")
    print(f"{'bubble ratio':<24}{100 * p['bubble_ratio']:>10.2f} %{100 * m['bubble_ratio']:>10.2f} %"
          f"{100 * (p['bubble_ratio'] - m['bubble_ratio']):>+9.2f} pt")
    rp = s["replay"]
    print(f"{'replay':<24}{fmt_seconds(rp['makespan']):>12}{fmt_seconds(m.get('step_makespan', m['makespan'])):>12}"
          f"{fmt_rel(s['replay_makespan_rel_error']):>12}   (measured durations: the simulator's own error)")
    if s.get("period"):
        q = s["period"]
        print(f"{'period (no barrier)':<24}{fmt_seconds(q['predicted']):>12}{fmt_seconds(q['measured']):>12}"
              f"{fmt_rel(q['rel_error']):>12}   ({q['steps']} steps back to back, run after the comparison above)")
    print(f"op start-time error / makespan: p50 {100 * s['start_time_error_p50']:.2f} %, "
          f"p90 {100 * s['start_time_error_p90']:.2f} %")
    if s.get("measured_halves_apart") is not None:
        print(f"measured over {len(s['measured_makespans'])} steps: spread {100 * s['measured_steps_spread']:.1f} % "
              f"(IQR / median); even and odd steps' {'means' if s.get('data_parallel') else 'medians'} "
              f"{100 * s['measured_halves_apart']:.1f} % apart (the measurement against itself)")
    if s.get("calibration_run_apart") is not None:
        print(f"measured again: calibration ran {printable(s['schedule'])} too; this run's step "
              f"{fmt_rel(s['calibration_run_apart'])} against that run's (two runs of one schedule)")
    print(f"{'rank':>4}  {'bubble pred':>11}  {'meas':>7}  {'diff':>8}  {'peak mem pred':>13}  {'meas':>10}  "
          f"{'error':>9}  {'params pred':>11}  {'meas':>10}")
    for r in s["per_rank"]:
        print(f"{r['rank']:>4}  {100 * r['predicted_bubble']:>9.2f} %  {100 * r['measured_bubble']:>5.2f} %  "
              f"{100 * r['bubble_error']:>+5.2f} pt  {fmt_bytes(r['predicted_peak_memory']):>13}  "
              f"{fmt_bytes(r['measured_peak_memory']):>10}  {fmt_rel(r['peak_memory_rel_error']):>9}  "
              f"{fmt_bytes(r['predicted_param_bytes']):>11}  {fmt_bytes(r['measured_param_bytes']):>10}")
    if replay:
        print(f"{'rank':>4}  {'finish pred':>11}  {'replay':>9}  {'meas':>9}  {'pred err':>9}  {'replay err':>10}")
        for a, b in zip(s["per_rank"], rp["per_rank"]):
            print(f"{a['rank']:>4}  {fmt_seconds(a['predicted_finish']):>11}  {fmt_seconds(b['finish']):>9}  "
                  f"{fmt_seconds(a['measured_finish']):>9}  {fmt_rel(a['finish_rel_error']):>9}  "
                  f"{fmt_rel(b['finish_rel_error']):>10}")
        if not rp["transfers_replayed"]:
            print("note: the trace does not say when receives were taken; the replay kept the modelled link times")
    ops = ", ".join(f"{o['op']} {fmt_seconds(o['predicted_median'])} vs {fmt_seconds(o['measured_median'])}"
                    for o in s["per_op"])
    print(f"median op time, predicted vs measured: {ops}")
    if s["loss_matches_reference"] is not None:
        print(f"gradients: max relative error {s['max_grad_rel_error']:.2g} against the unpipelined model")
    print("wrote " + ", ".join(printable(f) for f in s["files"]))
