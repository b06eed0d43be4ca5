"""Validation of hand-written schedules: structure errors and deadlocks."""
import copy

import networkx as nx
import pytest

from pipesched.schedules import fileformat
from pipesched.schedules.graph import to_networkx
from pipesched.schedules.ir import BW, F, Overlap, Schedule, ScheduleError, Task, VirtualStage
from pipesched.schedules.registry import build
from pipesched.schedules.validate import validate


def two_rank(programs, name="hand"):
    stages = [VirtualStage(0, 0), VirtualStage(1, 1)]
    return Schedule(name, 2, 2, stages, [[0, 1]], [0, 0], programs)


GOOD = [[Task(F, 0, 0), Task(F, 1, 0), Task(BW, 0, 0), Task(BW, 1, 0)],
        [Task(F, 0, 1), Task(BW, 0, 1), Task(F, 1, 1), Task(BW, 1, 1)]]


def test_a_hand_written_schedule_validates():
    graph = validate(two_rank(copy.deepcopy(GOOD)))
    assert len(graph.tasks) == 8
    assert sum(e.kind != 0 for e in graph.edges) == 4  # 2 activations + 2 gradients cross ranks


def test_a_deadlock_is_rejected_with_its_cycle_as_ops_per_rank():
    # rank 0 waits for BW0's gradient before sending F1; rank 1 waits for F1 before BW0
    deadlock = [[Task(F, 0, 0), Task(BW, 0, 0), Task(F, 1, 0), Task(BW, 1, 0)],
                [Task(F, 0, 1), Task(F, 1, 1), Task(BW, 0, 1), Task(BW, 1, 1)]]
    # this one is fine (rank 1 can run F1 after F0); make it deadlock by swapping rank 1
    deadlock[1] = [Task(F, 1, 1), Task(F, 0, 1), Task(BW, 0, 1), Task(BW, 1, 1)]
    deadlock[0] = [Task(F, 0, 0), Task(BW, 0, 0), Task(F, 1, 0), Task(BW, 1, 0)]
    with pytest.raises(ScheduleError) as info:
        validate(two_rank(deadlock))
    message = str(info.value)
    assert "deadlocks" in message
    assert "rank 0: BW0@0" in message and "rank 1: F1@1" in message
    assert "\n" not in message


def test_a_deadlock_in_a_file_is_rejected(tmp_path):
    path = tmp_path / "deadlock.json"
    bad = [[Task(F, 0, 0), Task(BW, 0, 0), Task(F, 1, 0), Task(BW, 1, 0)],
           [Task(F, 1, 1), Task(F, 0, 1), Task(BW, 0, 1), Task(BW, 1, 1)]]
    fileformat.save(two_rank(bad), path)
    with pytest.raises(ScheduleError, match="deadlocks"):
        validate(fileformat.load(path))


def test_an_overlapped_pair_that_depends_on_itself_deadlocks():
    programs = copy.deepcopy(GOOD)
    programs[1] = [Overlap(Task(F, 0, 1), Task(BW, 0, 1)), Task(F, 1, 1), Task(BW, 1, 1)]
    with pytest.raises(ScheduleError, match="deadlocks"):
        validate(two_rank(programs))


@pytest.mark.parametrize("mutate,message", [
    (lambda p: p[0].pop(), "has no BW, or B and W"),
    (lambda p: p[0].append(Task(F, 0, 0)), "appears more than once"),
    (lambda p: p[0].append(Task(F, 0, 1)), "placed on rank 1"),
    (lambda p: p[0].append(Task("X", 0, 0)), "unknown op 'X'"),
    (lambda p: p[0].append(Task(F, 5, 0)), "microbatch outside 0..1"),
    (lambda p: p[0].append(Task(F, 0, 7)), "virtual stage outside 0..1"),
    (lambda p: p[1].append(Task("W", 0, 1)), "both BW and B/W"),
    (lambda p: p[1].__setitem__(1, Task("B", 0, 1)), "has no W"),
    (lambda p: p.pop(), "one program per rank"),
])
def test_structural_errors_name_the_problem(mutate, message):
    programs = copy.deepcopy(GOOD)
    mutate(programs)
    with pytest.raises(ScheduleError, match=message):
        validate(two_rank(programs))


def test_paths_must_run_the_model_in_order():
    s = two_rank(copy.deepcopy(GOOD))
    s.paths = [[1, 0]]
    with pytest.raises(ScheduleError, match="must run model stages 0..1 in order"):
        validate(s)


def test_task_graph_as_networkx_has_data_and_program_edges():
    graph = validate(build("zb-v", 2, 3))
    g = to_networkx(graph)
    assert nx.is_directed_acyclic_graph(g)
    kinds = {d["kind"] for _, _, d in g.edges(data=True)}
    assert kinds == {"local", "activation", "gradient", "program"}
    assert g.number_of_nodes() == len(graph.tasks)
    # the V turn (model stage 1 -> 2 on rank 1) is local, not a transfer
    turn = g.edges[Task(F, 0, 1), Task(F, 0, 2)]
    assert turn["kind"] == "local"


def test_dualpipe_replicas_follow_two_paths():
    s = build("dualpipe", 4, 8)
    graph = validate(s)
    assert len(s.paths) == 2 and [st.model_stage for st in s.stages].count(0) == 2
    for path in s.paths:
        assert [s.stages[i].model_stage for i in path] == [0, 1, 2, 3]
    assert {s.stages[path[0]].rank for path in s.paths} == {0, 3}
    assert len(graph.tasks) == 8 * 4 * 2 + sum(1 for t in graph.tasks if t.op == "W")
