"""The package's promise that simulating stays light: schedules/ and simulator/ import,
and `pipesched simulate` runs, without torch (the executor's dependency alone)."""
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
