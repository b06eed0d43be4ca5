"""Tables that several commands print."""
from __future__ import annotations

import math

from pipesched.simulator.costs import CostModel

from .formatting import fmt_bytes, fmt_seconds


def print_costs(costs: CostModel) -> None:
    """A table of calibrated costs: per model stage, the links, shared compute."""
    print(f"{'stage':>5}  {'T_F':>9}  {'T_B':>9}  {'T_W':>9}  {'T_BW':>9}  {'sends':>10}  {'saved per F':>11}  "
          f"{'kept B->W':>10}  {'parameters':>10}")
    stages = costs.model_stages or costs.stages
    if costs.layers is not None and not isinstance(costs.layers.partition, str):  # as calibrated
        stages = costs.layers.stage_costs(costs.layers.partition)
    for k, s in enumerate(stages):
        print(f"{k:>5}  {fmt_seconds(s.forward):>9}  {fmt_seconds(s.backward_input):>9}  "
              f"{fmt_seconds(s.backward_weight):>9}  {fmt_seconds(s.op_time('BW')):>9}  "
              f"{fmt_bytes(s.activation_bytes):>10}  {fmt_bytes(s.activation_memory):>11}  "
              f"{fmt_bytes(s.weight_memory):>10}  {fmt_bytes(s.param_bytes):>10}")
    runs = costs.meta.get("from_runs") if isinstance(costs.meta, dict) else None
    if runs:
        how = ("dedicated work: the cores' sharing undone, and simulated again" if runs.get("dedicated")
               else "compute sharing is in them")
        print(f"op times: means of {runs['samples']} ops measured in runs of {', '.join(runs['schedules'])} "
              f"(interquartile range up to {100 * runs['spread']:.0f} % of the median); {how}")
        k = runs.get("residual", 1.0)
        if k != 1.0:
            over = ("the runs' mean steps over their prediction" if costs.data_parallel.degree > 1
                    else "the runs' steps over the same steps simulated with their own mean op times (median)")
            print(f"op and host times x {k:.3f}: the step residual, {over}")
    fixed = costs.fixed_op_times
    if fixed.any:
        print(f"fixed time per op, kept whole when a stage is cut for another split: F {fmt_seconds(fixed.forward)}, "
              f"B {fmt_seconds(fixed.backward_input)}, W {fmt_seconds(fixed.backward_weight)}, "
              f"BW {fmt_seconds(fixed.backward_full)}")
    switch = costs.stage_switch
    if switch.any:
        print(f"an op right after another stage's op on its rank runs longer (at the calibrated split: "
              f"DualPipe's replicas): F {100 * switch.forward:.1f} %, backward {100 * switch.backward:.1f} %; "
              f"the op after it, of the same stage: F {100 * switch.forward_second:.1f} %, "
              f"backward {100 * switch.backward_second:.1f} %")
    net = costs.network
    for name, link in (("link", net.intra), ("inter-node link", net.inter)):
        if link is not None:
            bw = "unlimited" if math.isinf(link.bandwidth) else f"{link.bandwidth / 1e9:.3g} GB/s"
            print(f"{name}: latency {fmt_seconds(link.latency)}, bandwidth {bw}")
    if costs.gradient_sum is not None:  # DualPipe's replicas sum their gradients at each step's end
        g = costs.gradient_sum
        print(f"shared-gradient sum (ranks holding the same stage): {fmt_seconds(g.fixed)} + "
              f"{fmt_seconds(g.per_byte * 2**20)} per MiB, timed end to end")
    dp = costs.data_parallel
    if dp.degree > 1:
        bw = "unlimited" if math.isinf(dp.bandwidth) else f"{dp.bandwidth / 1e9:.3g} GB/s"
        calibrated = costs.meta.get("data_parallel_calibrated", {})
        slow = calibrated.get("replica_slowdown", {})
        use = (" (the replicas are simulated sharing the cores, below)" if costs.host is not None and costs.host.pinned
               else " (op times scaled by it)")
        factors = ""
        if calibrated.get("runs"):
            factors = f"; op times from runs of every replica ({', '.join(calibrated['runs'])})"
            slower = calibrated.get("allreduce_slower_in_runs", 1.0)
            if slower != 1.0:
                factors += f"; the link x {slower:.2f} slower, as their all-reduces of this split's bucket size ran"
        elif slow:
            factors = (f"; free-running with every replica computing, ops ran x "
                       f"{', '.join(f'{v:.2f}' for v in slow.values())} per stage{use}")
        print(f"data parallel: {dp.degree} replicas, all-reduce latency {fmt_seconds(dp.latency)} per ring step, "
              f"bandwidth {bw}; optimizer "
              f"{', '.join(fmt_seconds(s.optimizer_time) for s in costs.model_stages or costs.stages)}{factors}")
    o = costs.host_overhead
    if o.any:
        print(f"runtime host time: {fmt_seconds(o.per_op)} per op, {fmt_seconds(o.per_send)} to post a send "
              f"(its data leaves after {fmt_seconds(o.send_leaves)}), {fmt_seconds(o.per_recv)} to post a receive, "
              f"{fmt_seconds(o.per_take)} to take one"
              + (f" (fitted to {fitted['gaps']} gaps between ops in the runs)"
                 if isinstance(fitted := costs.meta.get("host_from_run"), dict) and "gaps" in fitted else ""))
    if costs.host is not None and costs.host.gpu:
        print(f"one host: {costs.host.capacity:g} GPUs time-sliced between the ranks' ops; host time per rank")
    elif costs.host is not None:
        h = costs.host
        shared = f"; ranks pinned round-robin, {100 * h.switching:.1f} % below a fair share of a shared core" \
            if h.pinned else ""
        first = "; host time outside ops runs first" if h.host_time_first else ""
        print(f"one host: {h.capacity:g} cores, {h.compute_demand:g} threads per rank; compute "
              f"{100 * h.interference:.1f} % slower with every core busy{shared}{first}")
