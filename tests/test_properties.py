"""Property tests: any arguments or input give a valid graph or the documented error."""
import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipesched.schedules import fileformat
from pipesched.schedules.ir import ScheduleError
from pipesched.schedules.registry import BUILDERS, build
from pipesched.schedules.validate import validate
from pipesched.simulator import cost_file as cost_files
from pipesched.simulator.api import simulate
from pipesched.simulator.costs import CostError, Link, Network, uniform

from helpers import close

FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
ints = st.one_of(st.integers(-2, 9), st.just(True), st.none(), st.text(max_size=2))


@FAST
@given(name=st.sampled_from(sorted(BUILDERS)), p=ints, m=st.one_of(ints, st.integers(10, 30)), v=ints)
def test_builders_give_a_valid_graph_or_a_schedule_error(name, p, m, v):
    try:
        schedule = build(name, p, m, v)
    except ScheduleError:
        return
    graph = validate(schedule)
    assert {t.mb for t in graph.tasks} == set(range(m))


@FAST
@given(name=st.sampled_from(sorted(BUILDERS)), p=st.integers(1, 4), m=st.integers(1, 8), seed=st.integers(0, 10**6))
def test_shuffled_programs_validate_or_report_a_deadlock(name, p, m, seed):
    try:
        schedule = build(name, p, m)
    except ScheduleError:
        return
    rng = random.Random(seed)
    for program in schedule.programs:
        i, j = rng.randrange(len(program)), rng.randrange(len(program))
        program[i], program[j] = program[j], program[i]
    try:
        graph = validate(schedule)
    except ScheduleError as exc:
        assert "deadlocks" in str(exc)
        return
    costs = uniform(1, 2, 1, activation_bytes=1e6, network=Network(Link(0.1, 1e7)))
    a = simulate(graph, costs, engine="exact").end.max()
    b = simulate(graph, costs, engine="des").end.max()
    assert close(a, b)


json_values = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(-3, 5), st.text(max_size=3)),
                           lambda children: st.one_of(st.lists(children, max_size=4),
                                                      st.dictionaries(st.text(max_size=6), children, max_size=4)),
                           max_leaves=20)


@FAST
@given(doc=json_values, base=st.sampled_from(["1f1b", "zb-v", "dualpipe"]), key=st.sampled_from(
    ["ranks", "microbatches", "stages", "paths", "microbatch_paths", "programs", "name"]))
def test_any_schedule_document_loads_validly_or_names_the_problem(doc, base, key):
    data = fileformat.to_dict(build(base, 2, 4))
    data[key] = doc
    try:
        validate(fileformat.from_dict(data))
    except ScheduleError as exc:
        assert "\n" not in str(exc)


@FAST
@given(field=st.sampled_from(["forward", "backward_input", "activation_bytes", "param_bytes"]),
       value=st.one_of(st.floats(allow_nan=True), st.integers(-5, 5), st.text(max_size=2), st.none(), st.booleans()))
def test_any_cost_value_loads_or_names_the_field(field, value):
    try:
        model = cost_files.from_dict({"format": "pipesched.costs/1", "stage": {field: value}})
    except (CostError, TypeError) as exc:
        assert isinstance(exc, CostError) and field in str(exc)
        return
    if isinstance(value, str):  # a quantity written by hand: "12ms", "128MiB", "3"
        from pipesched.simulator.units import parse_bytes, parse_seconds
        value = (parse_seconds if field in ("forward", "backward_input") else parse_bytes)(value)
    assert getattr(model.stages[0], field) == value
