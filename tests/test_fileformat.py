"""The schedule file format round-trips exactly and rejects malformed files."""
import json

import pytest

from pipesched.schedules import fileformat, torch_format
from pipesched.schedules.ir import ScheduleError
from pipesched.schedules.registry import BUILDERS, build


@pytest.mark.parametrize("name", BUILDERS)
def test_every_builtin_round_trips_exactly(name, tmp_path):
    schedule = build(name, 4, 8)
    path = tmp_path / f"{name}.json"
    fileformat.save(schedule, path)
    again = fileformat.load(path)
    assert again == schedule
    assert path.read_text() == fileformat.dumps(again)
    assert json.loads(path.read_text())["format"] == "pipesched.schedule/1"


def test_microbatch_paths_default_to_path_zero():
    doc = fileformat.to_dict(build("1f1b", 2, 3))
    del doc["microbatch_paths"]
    assert fileformat.from_dict(doc).microbatch_paths == [0, 0, 0]


@pytest.mark.parametrize("edit,message", [
    (lambda d: d.update(format="x"), "format is 'x'"),
    (lambda d: d.pop("programs"), "lacks 'programs'"),
    (lambda d: d.update(extra=1), "unknown field 'extra'"),
    (lambda d: d.update(ranks="2"), "ranks must be an integer"),
    (lambda d: d["programs"][0].append([{"op": "F", "mb": 0, "stage": 0}]), "group of 1 ops"),
    (lambda d: d["programs"][0].append({"op": "F", "mb": 0}), "exactly op, mb and stage"),
    (lambda d: d["stages"].append({"rank": 0}), "exactly rank and model_stage"),
    (lambda d: d.update(paths={}), "paths must be a list"),
])
def test_malformed_files_are_refused_with_one_line(edit, message):
    doc = fileformat.to_dict(build("1f1b", 2, 2))
    edit(doc)
    with pytest.raises(ScheduleError, match=message) as info:
        fileformat.from_dict(doc)
    assert "\n" not in str(info.value)


def test_not_json_and_missing_files():
    with pytest.raises(ScheduleError, match="not valid JSON"):
        fileformat.loads("{nope")
    with pytest.raises(ScheduleError, match="cannot read schedule file"):
        fileformat.load("/nonexistent/s.json")


@pytest.mark.parametrize("name", ["1f1b", "zb-v", "dualpipev", "interleaved-1f1b"])
def test_torch_csv_round_trip(name, tmp_path):
    schedule = build(name, 4, 8)
    path = tmp_path / "s.csv"
    torch_format.write_csv(schedule, path)
    again = torch_format.read_csv(path, name=name)
    assert again.programs == schedule.programs
    assert [s.rank for s in again.stages] == [s.rank for s in sorted(schedule.stages, key=lambda s: s.model_stage)]


def test_torch_csv_refuses_replicated_stages():
    with pytest.raises(ScheduleError, match="more than one rank"):
        torch_format.to_rows(build("dualpipe", 2, 4))


def test_torch_actions_parse():
    assert torch_format.parse_action("2I3") == (("B", 2, 3),)
    assert torch_format.parse_action("0B1") == (("BW", 0, 1),)
    assert torch_format.parse_action("1SEND_F0") is None
    assert torch_format.parse_action("(0F2;3B1)OVERLAP_F_B") == (("F", 0, 2), ("BW", 3, 1))
    with pytest.raises(ScheduleError, match="not a torch pipelining action"):
        torch_format.parse_action("2Q3")
