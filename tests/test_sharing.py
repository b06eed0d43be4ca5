"""Ranks sharing compute: processor sharing in the DES."""
import pytest

from pipesched.schedules.registry import BUILDERS, build
from pipesched.schedules.validate import validate
from pipesched.simulator import cost_file as cost_files
from pipesched.simulator.api import simulate
from pipesched.simulator.costs import CostError, HostSharing, uniform
from pipesched.simulator.stochastic import sample_makespans

from helpers import close, makespan, run


@pytest.mark.parametrize("name", BUILDERS)
def test_one_processor_serialises_all_work(name):
    schedule = build(name, 4, 8)
    total = 4 * 8 * 3  # every rank does m(F+B+W) = 24 s of dedicated work
    assert close(makespan(schedule, uniform(1, 1, 1, host=HostSharing(1)), "des"), total)


@pytest.mark.parametrize("name", BUILDERS)
def test_enough_processors_change_nothing(name):
    schedule = build(name, 4, 8)
    assert close(makespan(schedule, uniform(1, 1, 1, host=HostSharing(4)), "des"), makespan(schedule))


def test_fewer_processors_and_polling_waiters_only_slow_down():
    schedule = build("1f1b", 4, 8)
    times = [makespan(schedule, uniform(1, 1, 1, host=h), "des") for h in
             (None, HostSharing(3), HostSharing(2), HostSharing(2, wait_demand=0.5), HostSharing(2, wait_demand=1.0))]
    assert times == sorted(times) and times[0] < times[-1]
    # two ranks on two cores, one thread each: no slow-down at all
    assert close(makespan(build("1f1b", 2, 8), uniform(1, 1, 1, host=HostSharing(2)), "des"),
                 makespan(build("1f1b", 2, 8)))


def test_two_threads_per_rank_on_two_cores_halve_the_speed_when_both_compute():
    # gpipe p=2: rank 1 computes F0 alone (full speed) while rank 0 runs F1 alongside
    trace = simulate(build("gpipe", 2, 2), uniform(1, 1, 1, host=HostSharing(2, compute_demand=2)))
    spans = {(s.rank, s.op, s.mb): (s.start, s.end) for s in trace.spans(lane=0)}
    assert spans[(0, "F", 0)] == (0.0, 1.0)  # alone: full speed
    assert close(spans[(0, "F", 1)][1] - spans[(0, "F", 1)][0], 2.0)  # shares with rank 1's F0


def test_busy_time_under_sharing_is_the_stretched_compute():
    alone = run(build("gpipe", 4, 4), uniform(1, 1, 1), engine="des")
    shared = run(build("gpipe", 4, 4), uniform(1, 1, 1, host=HostSharing(1)), engine="des")
    # ops that run side by side on one processor take longer each: busy only grows
    for a, b in zip(alone.per_rank, shared.per_rank):
        assert close(a.busy, 12) and b.busy >= 12 - 1e-9
    assert sum(r.busy for r in shared.per_rank) > sum(r.busy for r in alone.per_rank)


def test_sharing_needs_the_des_and_the_stochastic_mode_uses_it():
    graph = validate(build("1f1b", 4, 8))
    costs = uniform(1, 1, 1, host=HostSharing(2))
    with pytest.raises(ValueError, match="exact engine cannot model"):
        simulate(graph, costs, engine="exact")
    runs = sample_makespans(graph, costs, runs=3, cv=0.0)
    assert all(close(x, makespan(build("1f1b", 4, 8), costs, "des")) for x in runs)


def test_host_in_cost_files(tmp_path):
    model = uniform(1, 1, 1, host=HostSharing(2, 1, 0.25))
    cost_files.save(model, tmp_path / "c.json")
    assert cost_files.load(tmp_path / "c.json").host == HostSharing(2, 1, 0.25)
    with pytest.raises(CostError, match="host.capacity and host.compute_demand must be at least 1e-06 cores"):
        cost_files.from_dict({"host": {"capacity": 0}})
    with pytest.raises(CostError, match="host has unknown field 'cores'"):
        cost_files.from_dict({"host": {"capacity": 2, "cores": 2}})
