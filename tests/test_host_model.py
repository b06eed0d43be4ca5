"""The simulator's model of the machine a schedule runs on: host time outside ops,
serial and overlapped pairs, the first backward of a step, and ranks sharing cores.
Every expectation is worked out by hand from the costs."""
from __future__ import annotations

from dataclasses import replace

import pytest
import simpy

from pipesched.schedules.fileformat import from_dict
from pipesched.schedules.registry import build
from pipesched.simulator.api import simulate
from pipesched.simulator.costs import CostModel, HostOverhead, HostSharing, StageCost, uniform
from pipesched.simulator.metrics import compute_metrics
from pipesched.simulator.sharing import SharedHost


def spans(trace) -> dict[str, tuple[float, float]]:
    return {f"{s.op}{s.mb}@{s.stage}": (round(s.start, 9), round(s.end, 9)) for s in trace.spans(0)}


def both_engines(schedule, costs):
    des, exact = simulate(schedule, costs), simulate(schedule, costs, engine="exact")
    assert spans(des) == spans(exact)
    return des


def test_host_time_around_ops_delays_the_rank_but_is_not_compute():
    # F = B = W = 1, free transfers; 0.05 s to post a receive, 0.1 s of bookkeeping per
    # op, 0.2 s to post a send whose data leaves 0.1 s into its posting
    o = HostOverhead(per_op=0.1, per_send=0.2, per_recv=0.05, send_start=0.1)
    trace = both_engines(build("1f1b", 2, 1), uniform(1, 1, 1, host_overhead=o))
    assert spans(trace) == {
        "F0@0": (0.05, 1.05),   # after posting its gradient receive
        "F0@1": (1.25, 2.25),   # the activation left at 1.05 + 0.1 + 0.1
        "BW0@1": (2.35, 4.35),  # after F's bookkeeping
        "BW0@0": (4.55, 6.55)}  # the gradient left at 4.35 + 0.1 + 0.1
    metrics = compute_metrics(trace)
    assert metrics.makespan == pytest.approx(6.5)
    assert metrics.per_rank[0].busy == pytest.approx(3.0)  # host time is not busy time
    # taking an arrived input costs 0.03 s after it arrives, before the op
    taking = both_engines(build("1f1b", 2, 1), uniform(1, 1, 1, host_overhead=replace(o, per_take=0.03)))
    assert spans(taking)["F0@1"] == (1.28, 2.28) and spans(taking)["BW0@0"] == (4.61, 6.61)


PAIR = {"format": "pipesched.schedule/1", "name": "pair", "ranks": 2, "microbatches": 2,
        "stages": [{"rank": 0, "model_stage": 0}, {"rank": 1, "model_stage": 1}], "paths": [[0, 1]],
        "programs": [[{"op": "F", "mb": 0, "stage": 0},
                      [{"op": "F", "mb": 1, "stage": 0}, {"op": "BW", "mb": 0, "stage": 0}],
                      {"op": "BW", "mb": 1, "stage": 0}],
                     [{"op": "F", "mb": 0, "stage": 1}, {"op": "BW", "mb": 0, "stage": 1},
                      {"op": "F", "mb": 1, "stage": 1}, {"op": "BW", "mb": 1, "stage": 1}]]}


def test_a_serial_pair_runs_its_ops_in_turn_and_the_first_ones_output_leaves_early():
    schedule = from_dict(PAIR)
    # the pair waits for both inputs (BW0@1 ends at 4), then F1 [4, 5] and BW0 [5, 7];
    # F1's activation is there at 5, so rank 1 runs F1 [5, 6] and BW1 [6, 8]
    serial = both_engines(schedule, uniform(1, 1, 1, overlap=0.0))
    assert spans(serial)["F1@0"] == (4, 5) and spans(serial)["BW0@0"] == (5, 7)
    assert spans(serial)["F1@1"] == (5, 6) and spans(serial)["BW1@0"] == (8, 10)
    # perfectly overlapped, both take the pair's 2 s and F1's output leaves at its end
    overlapped = both_engines(schedule, uniform(1, 1, 1, overlap=1.0))
    assert spans(overlapped)["F1@0"] == spans(overlapped)["BW0@0"] == (4, 6)
    assert spans(overlapped)["BW1@0"] == (9, 11)


def test_only_the_first_backward_of_a_stage_in_a_step_saves_the_accumulation():
    stage = StageCost(forward=1, backward_input=1, backward_weight=1, grad_accumulate=0.5)
    trace = both_engines(build("1f1b", 1, 3), CostModel(stages=(stage,)).check())
    durations = sorted(e - s for name, (s, e) in spans(trace).items() if name.startswith("BW"))
    assert durations == [1.5, 2.0, 2.0]
    zb = both_engines(build("zb-h1", 1, 2), CostModel(stages=(stage,)).check())
    assert sorted(e - s for name, (s, e) in spans(zb).items() if name.startswith("W")) == [0.5, 1.0]


def finish_times(sharing: HostSharing, work: dict[int, float], ranks: int = 4) -> dict[int, float]:
    env = simpy.Environment()
    host = SharedHost(env, ranks, sharing)
    done = {}
    for r, seconds in work.items():
        host.compute(r, seconds).callbacks.append(lambda _, r=r: done.__setitem__(r, env.now))
    for r in set(range(ranks)) - set(work):
        host.set_state(r, 2)  # DONE: asks for no core
    env.run()
    return {r: round(t, 9) for r, t in sorted(done.items())}


def test_fair_sharing_against_ranks_pinned_to_cores():
    work = {0: 1.0, 1: 1.0, 2: 1.0}  # three ranks, two cores
    assert finish_times(HostSharing(capacity=2), work) == {0: 1.5, 1: 1.5, 2: 1.5}
    # pinned round-robin: ranks 0 and 2 share core 0, rank 1 has core 1
    assert finish_times(HostSharing(capacity=2, pinned=True), work) == {0: 2.0, 1: 1.0, 2: 2.0}


def test_interference_and_switching_slow_compute_down():
    # two busy cores cost 20 %; time-sharing a core 10 % beyond the fair half: rank 1
    # ends at 1.2; ranks 0 and 2 get 1 / (2 x 1.1 x 1.2) until then and 1 / 2.2 after
    sharing = HostSharing(capacity=2, pinned=True, interference=0.2, switching=0.1)
    assert finish_times(sharing, {0: 1.0, 1: 1.0, 2: 1.0}) == pytest.approx({0: 2.4, 1: 1.2, 2: 2.4})
    assert finish_times(HostSharing(capacity=2, interference=0.1), {0: 1.0, 1: 1.0}) == {0: 1.1, 1: 1.1}
    assert finish_times(HostSharing(capacity=2, interference=0.1), {0: 1.0}) == {0: 1.0}


def test_a_cost_file_round_trips_the_machine_model():
    from pipesched.simulator.cost_file import from_dict as costs_from_dict, to_dict
    costs = uniform(1, 2, 1, grad_accumulate=0.1, host=HostSharing(2, interference=0.1, pinned=True, switching=0.05),
                    host_overhead=HostOverhead(1e-5, 3e-4, 2e-4, 1e-4))
    assert costs_from_dict(to_dict(costs)) == costs


def test_ranks_sharing_a_gpu_share_only_their_ops_not_their_host_time():
    # F = B = W = 1 (BW = 2), 0.5 s of host bookkeeping after each op (sends leave after
    # it), both ranks on one GPU. Host time runs on each rank's own CPU, so a rank's
    # bookkeeping never slows the other's op: BW0@1 runs alone [4, 6] while rank 0 waits,
    # then F1@1 and BW0@0 share the GPU from 6.5, F1@1 ends at 8.5, BW0@0 runs alone
    # during rank 1's bookkeeping [8.5, 9] and shares with BW1@1 until it ends at 10.
    host_time = HostOverhead(per_op=0.5)
    gpu = simulate(build("1f1b", 2, 2), uniform(1, 1, 1, host=HostSharing(1, gpu=True), host_overhead=host_time))
    assert spans(gpu) == {"F0@0": (0, 1), "F0@1": (1.5, 3.5), "F1@0": (1.5, 3.5), "BW0@1": (4, 6),
                          "F1@1": (6.5, 8.5), "BW0@0": (6.5, 10), "BW1@1": (9, 11.5), "BW1@0": (12, 14)}
    # ranks sharing CPU cores share their host time as well: both bookkeep [3.5, 4.5] at half speed
    cores = simulate(build("1f1b", 2, 2), uniform(1, 1, 1, host=HostSharing(1), host_overhead=host_time))
    assert spans(cores)["BW0@1"] == (4.5, 6.5) and compute_metrics(cores).makespan == pytest.approx(15.5)


def test_a_shared_gpu_is_not_pinned_and_round_trips():
    from pipesched.simulator.costs import CostError
    from pipesched.simulator.cost_file import from_dict as costs_from_dict, to_dict
    with pytest.raises(CostError, match="pinned"):
        HostSharing(1, pinned=True, gpu=True).check()
    with pytest.raises(CostError, match="gpu must be true or false"):
        HostSharing(1, gpu=1).check()
    costs = uniform(1, 2, 1, host=HostSharing(1, gpu=True))
    assert costs_from_dict(to_dict(costs)) == costs
