"""The public API in `pipesched/__init__.py`: the README's Python example runs as written,
inputs are checked, and importing it stays light."""
import re
import subprocess
import sys
from pathlib import Path

import pytest

import pipesched as ps
from pipesched.schedules.registry import build as registry_build
from pipesched.simulator.costs import CostError, StageCost

README = Path(__file__).resolve().parents[1] / "README.md"


def readme_python_example() -> str:
    section = README.read_text().split("\n## Python", 1)[1].split("\n## ", 1)[0]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_the_readme_python_example_runs_as_written(tmp_path):
    done = subprocess.run([sys.executable, "-c", readme_python_example()], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.splitlines()) >= 3 and "bubble" in done.stdout
    assert any(p.suffix == ".png" and p.stat().st_size > 10_000 for p in tmp_path.iterdir())


def test_every_public_name_resolves_and_says_what_it_is():
    for name in ps.__all__:
        obj = getattr(ps, name)
        # a class's own docstring, not one inherited or the signature @dataclass writes in its place
        doc = vars(obj).get("__doc__") if isinstance(obj, type) else obj.__doc__
        assert (doc or "").strip(), f"{name} has no docstring of its own"
        assert not doc.startswith((f"{name}(", f"{obj.__name__}(")), f"{name}'s docstring is its dataclass signature"


def test_importing_pipesched_loads_neither_torch_nor_matplotlib():
    code = ("import sys, pipesched as ps; ps.simulate(ps.build('zb-v', 4, 8), ps.uniform_costs()); "
            "assert not {'torch', 'matplotlib'} & set(sys.modules), 'heavy import'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_build_with_costs_gives_the_order_simulate_uses():
    costs = ps.uniform_costs(2, 3, 1)
    mine = ps.build("zb-v", 4, 8, costs=costs)
    assert mine.programs == registry_build("zb-v", 4, 8, op_time=costs.op_time_for(4)).programs
    assert mine.programs != ps.build("zb-v", 4, 8).programs  # the cost-adapted order differs here


@pytest.mark.parametrize("engine", ["des", "exact"])
def test_simulate_refuses_a_negative_cost(engine):
    bad = ps.CostModel(stages=(StageCost(forward=-5.0),))
    with pytest.raises(CostError, match="forward"):
        ps.simulate(ps.build("1f1b", 2, 4), bad, engine=engine)


def test_simulate_refuses_costs_whose_sums_overflow():
    with pytest.raises(CostError, match="overflow"):
        ps.simulate(ps.build("gpipe", 4, 8), ps.uniform_costs(1e308, 1e308, 1e308))


def test_simulate_refuses_what_is_not_a_cost_model():
    with pytest.raises(CostError, match="CostModel"):
        ps.simulate(ps.build("1f1b", 2, 4), {"f": 1})


def test_metrics_of_a_schedule_include_its_critical_path():
    schedule = ps.build("1f1b", 4, 8)
    m = ps.metrics(ps.simulate(schedule, ps.uniform_costs()), schedule)
    assert m.makespan == pytest.approx((8 + 4 - 1) * 3) and m.critical_path


def test_zb_auto_from_the_api_is_as_fast_as_every_built_in_under_the_same_costs():
    costs = ps.uniform_costs(10e-3, 10e-3, 8e-3, activation_bytes=64 * 2**20, bandwidth=25e9, latency=20e-6)
    makespan = {name: ps.metrics(ps.simulate(ps.build(name, 4, 8, costs=costs), costs)).makespan
                for name in ps.schedule_names() if name != "dualpipe"}  # dualpipe holds two copies of the model
    assert makespan["zb-auto"] <= min(makespan.values()) + 1e-12


def test_a_memory_limit_bounds_zb_auto_and_refuses_what_does_not_fit():
    from pipesched.schedules.activations import peak_activations
    costs = ps.uniform_costs(1, 2, 1)
    assert peak_activations(ps.build("zb-auto", 8, 16, costs=costs, max_activations=4)) <= 4
    with pytest.raises(ValueError, match="does not fit"):
        ps.build("zb-h2", 8, 16, costs=costs, max_activations=4)
