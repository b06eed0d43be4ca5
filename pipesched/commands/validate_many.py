"""`pipesched validate A,B,C`: which of several schedules wins on this model, predicted
from one calibration and measured in one launch.

The ranks calibrate once (as `validate A` would), then run every named schedule on the
same network (an example model is split for each: v = 2 schedules get half the blocks
per model stage), a step of each in turn, so a host whose speed drifts slows them all
alike. Printed per schedule: predicted and measured makespan, the error, the replay's
error and how far the run's even and odd steps are apart (the measurement against
itself); then the predicted and the measured fastest, how far the predicted pick
measured from the fastest, and how sure the pick was (`simulator.confidence`: the
predicted lead against the error known for those schedules, and which to measure when it
is within it). With --step-barrier none each schedule's steps also run back to back on
their own, the period is compared beside the makespan, and the schedules are ranked by
period (the throughput of steps without a barrier). Each schedule's files go to
--out/NAME/; --json prints {"schedules": [validate's document per schedule], "ranking": {...}}.
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from ..errors import UsageError
from ..executor_args import (calibration_options, check_launchable_ranks, import_executor, model_from_args,
                             prepare_checked, run_options)
from ..formatting import fmt_rel, fmt_seconds, json_text
from ..options import schedule_from_args
from ..tables import print_costs
from ..terminal import printable, wrote
from .validate_out import check_out_folder, make_out_folder, run_into, write_results


def is_list(text: str) -> bool:
    """Whether a SCHEDULE argument names several schedules (comma-separated), not a file."""
    return "," in text and not Path(text).exists()


def run_many(args: argparse.Namespace) -> int:
    """The `validate` command for a comma-separated list of schedules (module docstring)."""
    items = [item.strip() for item in args.schedule.split(",")]
    if any(not item for item in items) or len(set(items)) != len(items):
        raise UsageError(f"SCHEDULE: expected distinct names or files separated by commas, got {args.schedule!r}")
    if args.dp and args.dp > 1:
        raise UsageError("several schedules are validated without --dp: validate one schedule with --dp")
    schedules = [schedule_from_args(argparse.Namespace(**{**vars(args), "schedule": item})) for item in items]
    folders = [_folder_name(s.name, i) for i, s in enumerate(schedules)]
    if len(set(folders)) != len(folders):  # two files holding schedules of one name
        folders = [f"{i + 1}-{name}" for i, name in enumerate(folders)]
    if args.out is not None:
        for item, name in zip(items, folders):
            check_out_folder(str(Path(args.out) / name), item)
    import_executor("validate")
    from pipesched.executor.validation import network_for, validate_schedules

    options = run_options(args)
    check_launchable_ranks(args.ranks, options.dp)
    model = model_from_args(args, schedules[0])
    for schedule in schedules:
        try:
            prepare_checked(schedule, network_for(model, schedules[0], schedule), args.backend)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    calibration = calibration_options(args)
    out = make_out_folder(args.out)  # the last check before the long work
    results, status = run_into(out, lambda: validate_schedules(schedules, model, options, calibration, args.backend))
    if status:
        return status
    summaries = []
    for result, name in zip(results, folders):
        (out / name).mkdir(exist_ok=True)
        summary = write_results(result, out / name, args.replay)
        summaries.append(summary)
        for warning in summary["warnings"]:
            print(f"pipesched: warning: {printable(result.measured.schedule)}: {warning}", file=sys.stderr)
    ranking = ranking_of(summaries, results[0].shared, results[0].costs.host is not None and results[0].costs.host.gpu)
    if args.json:
        print(json_text({"schedules": summaries, "ranking": ranking}))
        wrote(out, ", ".join(f"{name}/" for name in folders), to_stderr=True)
    else:
        print_costs(results[0].costs)
        print_table(summaries, ranking)
        wrote(out, ", ".join(f"{name}/" for name in folders))
    checks = [r.run.check for r in results]
    return 1 if any(c is not None and not (c.loss_matches and c.grads_match) for c in checks) else 0


def ranking_of(summaries: list[dict], shared_cores: bool = False, gpu: bool = False, known: dict | None = None) -> dict:
    """The schedules fastest first by prediction and by measurement, how much longer
    (relative) the predicted fastest measured than the measured fastest, and how sure the
    pick was from the prediction alone (`confidence`; None on GPUs, where this predictor's
    error per schedule has no record). Ranked by makespan, or by period where every
    schedule's period was measured (steps without a barrier: "by" says which). By makespan,
    the launch's own repeatability is the floor under the known errors: how far each
    calibration schedule's run was from the calibration's run of it (`measured_again`) and
    how far each run's even steps were from its odd ones (`measured_halves`), the largest.
    `known`: another record of errors per schedule than `simulator.confidence.KNOWN_ERROR`."""
    from pipesched.simulator.confidence import pick_confidence

    by = "period" if summaries and all((s.get("period") or {}).get("measured") for s in summaries) else "makespan"

    def time_of(s: dict, side: str) -> float:
        return s["period"][side] if by == "period" else s[side]["makespan"]

    def order(side: str) -> list[str]:
        return [s["schedule"] for s in sorted(summaries, key=lambda s: time_of(s, side))]

    measured = {s["schedule"]: time_of(s, "measured") for s in summaries}
    predicted = {s["schedule"]: time_of(s, "predicted") for s in summaries}
    predicted_order, measured_order = order("predicted"), order("measured")
    again = {s["schedule"]: s["calibration_run_apart"] for s in summaries
             if by == "makespan" and s.get("calibration_run_apart") is not None}
    halves = {s["schedule"]: s["measured_halves_apart"] for s in summaries
              if by == "makespan" and s.get("measured_halves_apart") is not None}
    floor = max([abs(v) for v in again.values()] + list(halves.values()), default=0.0)
    confidence = None if gpu else pick_confidence(predicted, shared_cores, floor, known).to_dict()
    return {"predicted": predicted_order, "measured": measured_order,
            "predicted_fastest": predicted_order[0], "measured_fastest": measured_order[0],
            "pick_over_fastest": measured[predicted_order[0]] / measured[measured_order[0]] - 1,
            "confidence": confidence, "shared_cores": shared_cores, "by": by, "measured_again": again,
            "measured_halves": halves}


def floor_source(ranking: dict) -> str:
    """What set the launch's floor under the known errors (`ranking_of`): two runs of one
    schedule (`measured_again`) or the two halves of one run's steps (`measured_halves`)."""
    floor = (ranking.get("confidence") or {}).get("floor", 0.0)
    again = ranking.get("measured_again") or {}
    return ("two runs of one schedule" if any(abs(v) >= floor for v in again.values())
            else "the two halves of one run's steps")


def confidence_line(ranking: dict) -> str:
    """One line: how sure the predicted pick is, and what to measure when it is not."""
    c = ranking["confidence"]
    if c is None:
        return "how sure: this predictor's error per schedule has no record on GPUs: measure the leaders"
    if c["runner_up"] is None:
        return "how sure: one schedule, nothing to choose"
    where = "ranks sharing cores" if ranking["shared_cores"] else "a core per rank"
    if c["by_floor"]:
        miss = (f"{floor_source(ranking)} in this launch were {100 * c['floor']:.1f} % apart, more than the lead "
                f"the known errors ask for ({where})")
    else:
        miss = (f"it needs a lead of {100 * c['error']:.1f} % to be measured ahead with the pick predicted as short "
                f"and {printable(c['runner_up'])} as long as their records say (5th and 95th percentile of the "
                f"error, CPUs, {where})")
    head = (f"how sure: {printable(c['pick'])} predicted {100 * c['gap']:.1f} % ahead of "
            f"{printable(c['runner_up'])}; {miss}")
    if c["settled"]:
        return head + ": the prediction settles it"
    return head + ": not settled by the prediction; measure " + ", ".join(printable(n) for n in c["to_measure"])


def print_table(summaries: list[dict], ranking: dict) -> None:
    periods = ranking.get("by") == "period"
    print(f"{'schedule':<20}{'predicted':>12}{'measured':>12}{'error':>10}{'replay':>10}{'halves apart':>14}"
          + (f"{'period pred':>13}{'measured':>12}{'error':>10}" if periods else ""))
    for s in summaries:
        halves = s.get("measured_halves_apart")
        period = s.get("period") or {}
        print(f"{printable(s['schedule']):<20}{fmt_seconds(s['predicted']['makespan']):>12}"
              f"{fmt_seconds(s['measured']['makespan']):>12}{fmt_rel(s['makespan_rel_error']):>10}"
              f"{fmt_rel(s['replay_makespan_rel_error']):>10}"
              f"{'n/a' if halves is None else f'{100 * halves:.1f} %':>14}"
              + (f"{fmt_seconds(period['predicted']):>13}{fmt_seconds(period['measured']):>12}"
                 f"{fmt_rel(period['rel_error']):>10}" if periods else ""))
    pick, best = ranking["predicted_fastest"], ranking["measured_fastest"]
    if periods:
        print("ranked by period: each schedule's steps back to back, no barrier between them")
    print(f"fastest predicted: {printable(pick)}; measured: {printable(best)}"
          + ("" if pick == best else f" (the predicted pick measured {100 * ranking['pick_over_fastest']:.1f} % longer)"))
    print(confidence_line(ranking))
    again = ranking.get("measured_again") or {}
    if again:
        print("measured again: " + ", ".join(f"{printable(n)} {fmt_rel(v)}" for n, v in again.items())
              + " against the calibration's own run of it in this launch (two runs of one schedule)")
    print("note: two schedules whose measured makespans differ by less than their runs' halves do, or than "
          "two runs of one schedule do, are within this machine's noise")


def _folder_name(name: str, index: int) -> str:
    return name if re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}", name) else f"schedule-{index + 1}"
