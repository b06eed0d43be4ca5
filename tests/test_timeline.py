"""The free-transfer timeline builders use, the auto engine, and the one-way imports."""
import subprocess
import sys

import numpy as np
import pytest

from pipesched.schedules.registry import build
from pipesched.schedules.timeline import OrderTimer, free_transfer_times
from pipesched.schedules.validate import validate
from pipesched.simulator.api import simulate
from pipesched.simulator.costs import HostSharing, Link, Network, uniform

CASES = [("zb-v", 4, 9, None), ("dualpipe", 4, 8, None), ("interleaved-1f1b", 3, 6, 2), ("zb-h2", 4, 3, None),
         ("dualpipev", 2, 4, None)]


@pytest.mark.parametrize("name,p,m,v", CASES)
def test_free_transfer_timeline_is_the_exact_engine_with_free_transfers(name, p, m, v):
    graph = validate(build(name, p, m, v))
    costs = uniform(1.0, 2.0, 0.5, comm_buffers=False)  # serial pairs, transfers free
    trace = simulate(graph, costs, engine="exact")
    task_time = np.asarray([costs.stages[0].scaled(p / graph.schedule.num_model_stages).op_time(t.op)
                            for t in graph.tasks])
    start, end = free_transfer_times(graph, task_time)
    assert end.max() == pytest.approx(trace.end.max(), rel=1e-12)
    first = [members[0] for members in graph.units]
    assert np.allclose(start, trace.start[first], rtol=1e-12, atol=0)


@pytest.mark.parametrize("name,p,m,v", CASES)
def test_order_timer_gives_the_makespan_of_a_simulation_with_free_transfers(name, p, m, v):
    schedule = build(name, p, m, v)
    costs = uniform(1.0, 2.0, 0.5, comm_buffers=False)
    timer = OrderTimer(schedule, costs.op_time_for(p))
    assert timer.makespan(schedule) == pytest.approx(simulate(schedule, costs, engine="exact").end.max(), rel=1e-12)


def test_auto_runs_the_exact_engine_unless_ranks_share_compute_and_says_so():
    graph = validate(build("zb-v", 3, 6))
    alone = uniform(1, 1, 1, network=Network(Link(0.1, 1e6)), activation_bytes=1e4)
    auto, des = simulate(graph, alone, engine="auto"), simulate(graph, alone, engine="des")
    assert auto.meta["engine"] == "exact" and "no ranks share compute" in auto.meta["engine_choice"]
    assert np.allclose(auto.start, des.start, rtol=1e-9, atol=1e-12)
    shared = uniform(1, 1, 1, host=HostSharing(1))
    assert simulate(graph, shared, engine="auto").meta["engine"] == "des"


def test_simulate_command_names_the_engine_that_ran():
    def engine(*extra):
        out = subprocess.run([sys.executable, "-m", "pipesched", "simulate", "1f1b", "-p", "2", "-m", "2", "--json",
                              *extra], capture_output=True, text=True, check=True).stdout
        doc = __import__("json").loads(out)
        return doc["engine"], doc.get("engine_choice", "")

    assert engine() == ("exact", "auto: no ranks share compute; the DES gives the same timeline")
    assert engine("--engine", "des") == ("des", "")
    assert engine("--shared-compute", "1") == ("des", "auto: ranks share compute")
