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
