"""The package's promise that simulating stays light: schedules/ and simulator/ import,
and `pipesched simulate` runs, without torch (the executor's dependency alone); the
facade loads nothing until used; imports run one way between the layers, and no files
import each other in a circle."""
import pkgutil
import subprocess
import sys

from pipesched import schedules
from pipesched import simulator


def modules(package) -> list[str]:
    return [f"{package.__name__}.{m.name}" for m in pkgutil.iter_modules(package.__path__)]


def test_every_schedules_and_simulator_module_imports_without_torch():
    names = modules(schedules) + modules(simulator)
    assert "pipesched.schedules.validate" in names and "pipesched.simulator.des" in names
    code = (f"import importlib, sys\nfor name in {names!r}:\n    importlib.import_module(name)\n"
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_simulate_on_the_command_line_loads_neither_torch_nor_matplotlib():
    code = ("import sys; from pipesched.cli import main; "
            "assert main(['simulate', 'zb-v', '-p', '4', '-m', '8', '--json']) == 0; "
            "assert not {'torch', 'matplotlib'} & set(sys.modules), 'heavy import'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120, stdout=subprocess.DEVNULL)


ROOT = __import__("pathlib").Path(__file__).resolve().parents[1]
# what each layer may import from the others: schedules <- simulator <- executor <- CLI/plots
LAYERS = {"schedules": {"schedules"}, "simulator": {"schedules", "simulator"},
          "executor": {"schedules", "simulator", "executor"}}
CLI = ("pipesched.cli", "pipesched.commands", "pipesched.options", "pipesched.executor_args",
       "pipesched.figure_options", "pipesched.tables")


def _imports(path):
    """Absolute module names a file imports (relative ones resolved against its package)."""
    import ast
    package = ["pipesched", path.parent.name] if path.parent.name in LAYERS else \
        ["pipesched", *path.parent.relative_to(ROOT).parts[1:]]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            yield ".".join(base + ([node.module] if node.module else []))


def test_imports_run_one_way():
    bad = []
    for layer, allowed in LAYERS.items():
        for path in sorted((ROOT / layer).glob("*.py")):
            for name in _imports(path):
                parts = name.split(".")
                if parts[0] == "pipesched" and len(parts) > 1 and parts[1] not in allowed:
                    bad.append(f"{layer}/{path.name} imports {name}")
    for path in sorted((ROOT / "pipesched" / "plots").glob("*.py")):
        bad += [f"plots/{path.name} imports {name}" for name in _imports(path) if name.startswith(CLI)]
    assert not bad, bad


def test_the_facade_loads_lazily_so_schedules_load_nothing_heavy():
    # importing a subpackage runs pipesched/__init__.py first: it must import none of them
    heavy = "{'simpy', 'matplotlib', 'torch'}"
    for statement in ("import pipesched.schedules.ir", "import pipesched.schedules", "import pipesched",
                      "from pipesched.schedules.registry import build; build('zb-v', 4, 8)"):
        code = f"import sys\n{statement}\nassert not {heavy} & set(sys.modules), sorted({heavy} & set(sys.modules))"
        subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
    code = ("import sys, pipesched as ps\n"
            "assert set(ps.__all__) <= set(dir(ps)), set(ps.__all__) - set(dir(ps))\n"
            "assert 'simpy' not in sys.modules\n"
            "for name in ps.__all__:\n    exec(f'from pipesched import {name}')\n"
            "try:\n    ps.no_such_name\nexcept AttributeError:\n    pass\nelse:\n    raise AssertionError('no error')")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300)


# the package's folders and the module names their files have
PACKAGE_DIRS = {"schedules": "pipesched.schedules", "simulator": "pipesched.simulator",
                "executor": "pipesched.executor", "pipesched": "pipesched",
                "pipesched/commands": "pipesched.commands", "pipesched/plots": "pipesched.plots"}


def _module_files() -> dict:
    """Module name -> file, for every file of the package (a folder's __init__.py is the folder's name)."""
    files = {}
    for folder, package in PACKAGE_DIRS.items():
        for path in sorted((ROOT / folder).glob("*.py")):
            files[package if path.stem == "__init__" else f"{package}.{path.stem}"] = path
    return files


def _file_imports(path, files: dict) -> set:
    """The package modules a file imports anywhere in it (in functions and under
    TYPE_CHECKING too): `from A import b` is A.b where that is a module, else A; an
    import reaches the module itself, not the packages above it."""
    import ast
    found = set()
    package = ["pipesched", path.parent.name] if path.parent.name in LAYERS else \
        ["pipesched", *path.parent.relative_to(ROOT).parts[1:]]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = ".".join((package[:len(package) - node.level + 1] if node.level else [])
                            + ([node.module] if node.module else []))
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in files else base for a in node.names]
        else:
            continue
        for name in names:
            while name and name not in files:  # pipesched.simulator.costs.CostModel -> pipesched.simulator.costs
                name = name.rpartition(".")[0]
            if name:
                found.add(name)
    return found


def test_no_files_import_each_other_in_a_circle():
    import networkx as nx

    files = _module_files()
    assert {"pipesched", "pipesched.schedules.ir", "pipesched.commands.plan", "pipesched.plots.rows",
            "pipesched.executor.calibrate"} <= set(files)
    graph = nx.DiGraph()
    graph.add_nodes_from(files)
    for module, path in files.items():
        graph.add_edges_from((module, target) for target in _file_imports(path, files) if target != module)
    assert ("pipesched.simulator.sweep", "pipesched.simulator.planner") in graph.edges  # the walk sees imports
    cycles = sorted(sorted(c) for c in nx.simple_cycles(graph))
    assert not cycles, "import cycles: " + "; ".join(" <-> ".join(c) for c in cycles)
