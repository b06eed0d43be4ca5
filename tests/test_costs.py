"""Cost files and the per-model-stage scaling rule."""
import json
import math

import pytest

from pipesched.simulator import cost_file as cost_files
from pipesched.simulator.costs import CostError, CostModel, StageCost, uniform


def test_json_and_toml_cost_files_give_the_same_model(tmp_path):
    doc = {"format": "pipesched.costs/1", "stage": {"forward": 2e-3, "backward_input": 3e-3,
                                                    "backward_weight": 1e-3, "activation_bytes": 4096},
           "network": {"latency": 1e-5, "bandwidth": 1e10, "ranks_per_node": 2,
                       "inter_node": {"latency": 5e-5, "bandwidth": 1e9}},
           "overlap": "perfect"}
    (tmp_path / "c.json").write_text(json.dumps(doc))
    (tmp_path / "c.toml").write_text('''format = "pipesched.costs/1"
overlap = "perfect"
[stage]
forward = 2e-3
backward_input = 3e-3
backward_weight = 1e-3
activation_bytes = 4096
[network]
latency = 1e-5
bandwidth = 1e10
ranks_per_node = 2
[network.inter_node]
latency = 5e-5
bandwidth = 1e9
''')
    a, b = cost_files.load(tmp_path / "c.json"), cost_files.load(tmp_path / "c.toml")
    assert a == b
    assert a.overlap == 1.0 and a.network.link(0, 1).bandwidth == 1e10 and a.network.link(1, 2).bandwidth == 1e9


def test_cost_files_round_trip(tmp_path):
    model = CostModel(stages=(StageCost(1, 2, 3, activation_bytes=10, activation_memory=5, weight_memory=2),
                              StageCost(4, 5, 6, param_bytes=7)), overlap=0.25, blocking_sends=True)
    cost_files.save(model, tmp_path / "m.json")
    assert cost_files.load(tmp_path / "m.json") == model


def test_the_calibrated_gradient_sum_round_trips_and_older_files_load_without_it(tmp_path):
    from pipesched.simulator.costs import GradientSum
    model = CostModel(stages=(StageCost(1, 2, 3, param_bytes=7),), gradient_sum=GradientSum(2e-3, 4.5e-9))
    cost_files.save(model, tmp_path / "m.json")
    assert cost_files.load(tmp_path / "m.json") == model
    assert json.loads((tmp_path / "m.json").read_text())["gradient_sum"] == {"fixed": 2e-3, "per_byte": 4.5e-9}
    assert "gradient_sum" not in cost_files.to_dict(CostModel())  # absent: priced by the links
    assert cost_files.from_dict({"stage": {}}).gradient_sum is None
    assert cost_files.from_dict({"gradient_sum": {"fixed": "3ms"}}).gradient_sum == GradientSum(3e-3, 0.0)
    with pytest.raises(CostError, match="gradient_sum.per_byte"):
        cost_files.from_dict({"gradient_sum": {"fixed": 0.0, "per_byte": -1.0}})
    with pytest.raises(CostError, match="gradient_sum must be an object"):
        cost_files.from_dict({"gradient_sum": {"fixed": 0.0, "latency": 1.0}})


def test_stage_costs_scale_with_the_number_of_model_stages():
    model = CostModel(stages=(StageCost(forward=4, backward_input=8, backward_weight=2, activation_bytes=100,
                                        activation_memory=40, param_bytes=1000),) * 2)
    per_model = model.model_stage_costs(ranks=2, num_model_stages=4)  # v = 2
    assert [s.forward for s in per_model] == [2, 2, 2, 2]
    assert per_model[0].op_time("BW") == 5
    assert per_model[0].activation_bytes == 100  # boundary sizes do not shrink
    assert per_model[0].activation_memory == 20 and per_model[0].param_bytes == 500


def test_explicit_model_stage_costs_win_and_must_match_the_schedule():
    own = tuple(StageCost(forward=k + 1, activation_bytes=10 * (k + 1), activation_memory=100, param_bytes=7)
                for k in range(4))
    model = CostModel(stages=(StageCost(),), model_stages=own)
    assert [s.forward for s in model.model_stage_costs(2, 4)] == [1, 2, 3, 4]
    # the same model calibrated for 4 stages, predicted for 2 (v = 1 instead of 2): pairs merge exactly
    coarse = model.model_stage_costs(2, 2)
    assert [s.forward for s in coarse] == [3, 7] and [s.op_time("BW") for s in coarse] == [4, 4]
    assert [s.activation_bytes for s in coarse] == [20, 40]  # what crosses the merged stage's last boundary
    assert [s.activation_memory for s in coarse] == [200, 200] and coarse[0].param_bytes == 14
    # and for 8 (v = 4): each cut in two equal halves
    assert [s.forward for s in model.model_stage_costs(2, 8)] == [0.5, 0.5, 1, 1, 1.5, 1.5, 2, 2]
    with pytest.raises(CostError, match="model_stages for 4 model stages but the schedule has 6"):
        model.model_stage_costs(2, 6)  # silently using `stages` would predict another model



def test_later_parts_of_the_first_stage_get_an_input_backward():
    # calibrated at v = 1: the first stage's B has no input gradient to compute, its W does
    # the whole backward; the later stage's split backward costs 1.25x its fused BW
    model = CostModel(stages=(StageCost(),), model_stages=(
        StageCost(forward=4, backward_input=0.2, backward_weight=7.8, backward_full=8),
        StageCost(forward=4, backward_input=4, backward_weight=6, backward_full=8)))
    first, second, third, fourth = model.model_stage_costs(2, 4)  # v = 2
    assert (first.backward_input, first.backward_weight) == (0.1, 3.9)  # still the start of the model
    assert math.isclose(second.backward_input, 2) and math.isclose(second.backward_weight, 3)  # 4 x 1.25, 2:3
    assert second.op_time("BW") == 4 and second.forward == 2
    assert (third.backward_input, third.backward_weight) == (fourth.backward_input, fourth.backward_weight) == (2, 3)

@pytest.mark.parametrize("doc,message", [
    ({"stage": {"forward": -1}}, "stage.forward must be finite and >= 0"),
    ({"stage": {"forward": "fast"}}, "stage.forward: expected a time such as 12ms"),
    ({"stage": {"forward": [1]}}, "stage.forward must be a number"),
    ({"stage": {"forward": math.inf}}, "stage.forward must be finite"),
    ({"stage": {"speed": 1}}, "unknown field 'speed'"),
    ({"network": {"bandwidth": 0}}, "network.bandwidth must be > 0"),
    ({"network": {"latency": -1e-6}}, "network.latency must be finite and >= 0"),
    ({"overlap": 2}, "overlap must be between 0"),
    ({"overlap": "some"}, "overlap must be 'serial', 'perfect'"),
    ({"stages": []}, "stages must be a non-empty list"),
    ({"format": "other/1"}, "format is 'other/1'"),
    ({"network": {"ranks_per_node": 0}}, "ranks_per_node must be an integer >= 1"),
    ({"contention": "yes"}, "contention must be true or false"),
])
def test_bad_cost_documents_name_the_field(doc, message):
    with pytest.raises(CostError, match=message):
        cost_files.from_dict({"format": "pipesched.costs/1", **doc})


def test_unreadable_cost_files(tmp_path):
    with pytest.raises(CostError, match="cannot read cost file"):
        cost_files.load(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(CostError, match="not valid JSON"):
        cost_files.load(tmp_path / "bad.json")
    (tmp_path / "bad.toml").write_text("= =")
    with pytest.raises(CostError, match="not valid TOML"):
        cost_files.load(tmp_path / "bad.toml")


def test_stage_count_must_match_the_ranks():
    with pytest.raises(CostError, match="gives 3 pipeline stages but the schedule has 2 ranks"):
        CostModel(stages=(StageCost(),) * 3).model_stage_costs(2, 2)


def test_pair_time_interpolates_between_serial_and_perfect():
    assert uniform(overlap=0.0).pair_time(1, 2) == 3
    assert uniform(overlap=1.0).pair_time(1, 2) == 2
    assert uniform(overlap=0.5).pair_time(1, 2) == 2.5


def test_a_slower_cost_model_stretches_op_and_host_times_only():
    from pipesched.simulator.costs import FixedOpTimes, HostOverhead
    from pipesched.simulator.layers import LayerCosts

    layer = StageCost(1.0, 2.0, 3.0, activation_bytes=8.0, activation_memory=100.0, optimizer_time=0.5)
    base = CostModel(stages=(layer,), model_stages=(layer, layer), op_overhead=0.1,
                     host_overhead=HostOverhead(per_op=1.0, per_send=2.0, per_recv=3.0, per_take=4.0),
                     fixed_op_times=FixedOpTimes(forward=0.25))
    got = base.slower(2.0).check()
    by_layer = CostModel(layers=LayerCosts(layers=(layer,) * 2, embedding=layer)).slower(2.0).check()
    for s in got.stages + got.model_stages + by_layer.layers.layers + (by_layer.layers.embedding,):
        assert (s.forward, s.backward_input, s.backward_weight) == (2.0, 4.0, 6.0)
        assert (s.activation_bytes, s.activation_memory, s.optimizer_time) == (8.0, 100.0, 0.5)
    assert by_layer.layers.head is None and got.op_overhead == 0.2 and got.fixed_op_times.forward == 0.5
    assert got.host_overhead == HostOverhead(per_op=2.0, per_send=4.0, per_recv=6.0, per_take=8.0)
    assert got.network == base.network
