"""One command that measures pipesched on a machine with one CUDA GPU in about ten minutes.

Written for a rented machine (one H100/H200, 16 cores, no internet) that gets a copy of this
working tree: it spends its time measuring, not debugging. Every step runs in a subprocess
with a timeout, records what it measured as soon as it has it, and a failing step is
recorded and passed over.

Steps, in order (the kind in results.jsonl in brackets):

1. [setup] makes `pipesched` importable (`pip install -e . --no-deps --no-build-isolation`,
   timed; nothing when it already imports from this tree). A missing dependency (simpy,
   networkx, numpy, matplotlib, transformers, torch) is installed from local wheels only,
   from `.whl/`, `shared/wheels/`, `wheels/` or `$PIPESCHED_WHEELS` (`pip install
   --no-index --find-links DIR`); nothing is downloaded (the H200 image has no simpy:
   put its wheel in `.whl/` and carry that). Records python, torch, CUDA, the
   device's name, memory and multiprocessors, and `nvidia-smi`'s line.
2. [validate] five schedules in one launch, `pipesched validate A,B,C,D,E -p 2 -m 8
   --backend gloo-cuda --replay --json`, on the example transformer
   (1f1b,zb-h1,zb-v,interleaved-1f1b,dualpipev), hidden 1024, 8 x 512 tokens (float32: a
   block's forward takes about 2-5 ms on an H100, so ops are 2-20 ms). Recorded per
   schedule: predicted and measured makespan, their error, the replay's error (the
   simulator's own share), bubble error, peak-memory error, the measured median F/B/W/BW
   op times, and the ranking. The validate folders (predicted.json, measured.json,
   replay.json, costs.json, validate.png) go into artifacts.tar.gz.
3. [layer] one Llama block (transformers' LlamaConfig, random weights, as
   `executor.hf_models.HFModel` builds it) at five sizes (hidden/seq/microbatch/dtype
   1024/1024/4, 2048/1024/4 and 4096/2048/1 in float32; 4096/4096/2 and 8192/4096/1 in
   bfloat16), in one worker process (`gpu_check.py --layer-worker`): F, B, W and BW times
   (`executor.layer_profile.profile_layers`, CUDA events) and the activation bytes a
   forward saves, from the executor's ledger and from `torch.cuda.memory_allocated` /
   `max_memory_allocated` around one forward (after a warm forward and backward). The
   cluster what-if estimate of the same block (`--estimator MODULE:FUNCTION`, default
   DEFAULT_ESTIMATOR below: `pipesched.simulator.estimate` at its default efficiencies) is
   recorded and printed beside the measurement (`cluster_estimate_hook`).
4. [share] how two processes share the device, as two ranks on one GPU do: one Llama
   block (hidden 1024, 8 x 512 tokens, float32) looped F + BW for 5 s by one process
   alone, then by two at once (`--share-worker`). Recorded: seconds an iteration alone
   and together, their ratio (2.0: fair time slicing, nothing lost) and the capacity it
   implies (2 x alone / together). On an H200 in 2026-11, validate's ops that fully
   overlapped the other rank's took 2.12-2.24x their solo time, which the simulator's
   sharing (capacity 1) does not give.
5. [validate] the same as step 2 on `--model hf-llama` (1f1b,zb-h1,zb-h2,dualpipe,gpipe: a
   transformers model cannot be cut into 2 and 4 model stages in one launch), hidden
   1024, 8 x 512 tokens.
6. [run] schedules of four shapes (1f1b, zb-v, dualpipe, zb-auto with `--max-activations
   2`; `--schedules all` for every built-in, as the registry `pipesched list` reads) at
   p = 2, both ranks sharing the GPU: `pipesched run NAME -p 2 -m 4 --backend gloo-cuda
   --json`, the example transformer (hidden 512, 8 x 256 tokens). The run checks loss and
   gradients against the unpipelined model; recorded: pass/fail, worst gradient error,
   step time, bubble, per-rank peak memory.
7. [torch-runtime] `benchmarks/executor_vs_torch.py` (pipesched's runtime against
   torch.distributed.pipelining's on the same schedules, a launch per case; gloo on the
   CPUs, the benchmark has no GPU backend): step times, their ratio and the host time per
   op the two runtimes differ by; a case torch's runtime fails is recorded as failed.

Budget: `--budget SECONDS` (default 540) counts from the start. Before each step its cost
is estimated (a table per mode; the median of the steps of that kind already run; kinds
not yet run scaled by how slow this machine has proved) and a step is put off when it
would not fit while leaving room for the first step of each later kind not yet tried
(those that fit, in order), so a short budget measures some of everything, earlier kinds
first; steps put off run at the end while time is left, the rest are recorded as
skipped. Each subprocess gets three times its estimate (at least 30 s more), never the
time kept for later kinds nor more than is left. SIGTERM (a time limit) stops the
subprocess in flight, writes a final line and the summary, and exits 143.

`--dry-run` (chosen by itself where torch.cuda.is_available() is False): the same steps on
the CPU with gloo, tiny models, m = 4, two measured steps; about 45 s on 2 idle cores.

Writes, into OUT_DIR (made if missing; four files, so that a device tool returning few files
returns them all):

- results.jsonl: one JSON line per measurement, flushed as it is made: kind, name, status
  (ok, fail, error, timeout, skipped, terminated), seconds, elapsed, and what was measured;
  a final line of kind "end";
- raw.log: every command line with its full stdout and stderr, in order;
- summary.txt: the summary table, also printed at the end;
- artifacts.tar.gz: the validate folders.

Run from the repository root (on the GPU machine `python3` holds torch):

    python3 benchmarks/gpu_check.py "$OUT/gpu" --budget 500
    python benchmarks/gpu_check.py /tmp/gpu-check --dry-run --budget 110   # any machine
"""
from __future__ import annotations

import argparse
import glob
import importlib
import json
import os
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable

# the built-ins (`pipesched list`), when the registry cannot be read
SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b", "looped-bfs", "zb-h1", "zb-h2", "zb-v", "dualpipe",
             "dualpipev", "v-half", "v-min", "zb-auto")
DRY_SCHEDULES = ("1f1b", "zb-v", "dualpipe", "zb-auto")  # one of each shape: v = 1, V, two directions, searched
EXTRA_ARGS = {"zb-auto": ["--max-activations", "2"]}   # zb-auto builds under a memory limit
# one launch each; the example transformer runs v = 1 and v = 2 schedules side by side, but a
# transformers model (embedding on the first model stage, head on the last) cannot be cut
# both ways at once, so hf-llama validates five schedules of one model stage per rank
VALIDATED = {"transformer": "1f1b,zb-h1,zb-v,interleaved-1f1b,dualpipev",
             "hf-llama": "1f1b,zb-h1,zb-h2,dualpipe,gpipe"}
KINDS = ("setup", "run", "validate", "layer", "share", "torch-runtime")
DEPENDENCIES = {"torch": "torch", "simpy": "simpy", "networkx": "networkx", "numpy": "numpy",
                "matplotlib": "matplotlib", "transformers": "transformers"}
WHEEL_DIRS = (".whl", "shared/wheels", "wheels")
DEFAULT_ESTIMATOR = "gpu_check:estimate_layer"  # this file's, on pipesched.simulator.estimate
RESERVE = 3.0  # seconds kept for the final line and the summary

# ops per rank and step in executor_vs_torch's cases, in units of m: host time per op
OPS_PER_MICROBATCH = {"1f1b": 2, "interleaved-1f1b": 4, "zb-h1": 3, "zb-v": 6}


@dataclass(frozen=True)
class Mode:
    """What each step runs: the GPU sizes, or tiny CPU ones for --dry-run."""

    name: str
    backend: str
    device: str
    run_model: tuple[str, ...]
    run_measure: tuple[str, ...]
    validate_models: tuple[tuple[str, tuple[str, ...]], ...]
    validate_measure: tuple[str, ...]
    layer_sizes: tuple[tuple[int, int, int, str], ...]   # (hidden, seq, microbatch size, dtype)
    layer_vocab: int
    layer_repeats: tuple[int, int]                 # (repeats, warmup)
    torch_args: tuple[str, ...]
    estimates: dict[str, float]                    # seconds per step of each kind
    share_size: tuple[int, int, int, str] = (1024, 512, 8, "float32")   # the block two processes loop
    share_seconds: float = 5.0                     # each loop's length, alone and together


GPU = Mode(
    "gpu", "gloo-cuda", "cuda",
    run_model=("--model", "transformer", "--hidden", "512", "--seq", "256", "--microbatch-size", "8"),
    run_measure=("--steps", "5", "--warmup", "1", "--min-time", "0"),
    validate_models=(
        ("transformer", ("--model", "transformer", "--hidden", "1024", "--seq", "512", "--microbatch-size", "8")),
        ("hf-llama", ("--model", "hf-llama", "--hidden", "1024", "--seq", "512", "--microbatch-size", "8",
                      "--vocab", "8192"))),
    validate_measure=("--steps", "4", "--warmup", "1", "--min-time", "0", "--repeats", "7"),
    layer_sizes=((1024, 1024, 4, "float32"), (2048, 1024, 4, "float32"), (4096, 2048, 1, "float32"),
                 (4096, 4096, 2, "bfloat16"), (8192, 4096, 1, "bfloat16")),
    layer_vocab=2048, layer_repeats=(10, 2),
    torch_args=("--ranks", "2", "--microbatches", "8", "--hidden", "512", "--steps", "10", "--warmup", "2"),
    # an H200 with 16 cores, 2026-11-28: setup 28-32 s, a run 12-21 s, the layers 52 s for five
    # sizes, the transformer's validate 160 s, hf-llama's 225 s
    estimates={"setup": 40, "run": 18, "validate": 200, "layer": 45, "torch-runtime": 60, "share": 45})

DRY = Mode(
    "dry-run", "gloo", "cpu",
    run_model=("--hidden", "32", "--microbatch-size", "4"),
    run_measure=("--steps", "2", "--warmup", "1", "--min-time", "0"),
    validate_models=(
        ("transformer", ("--model", "transformer", "--hidden", "32", "--seq", "16", "--microbatch-size", "2")),
        ("hf-llama", ("--model", "hf-llama", "--hidden", "32", "--seq", "16", "--microbatch-size", "2",
                      "--vocab", "256"))),
    validate_measure=("--steps", "2", "--warmup", "1", "--min-time", "0", "--repeats", "3",
                      "--calibration-warmup", "1"),
    layer_sizes=((32, 16, 2, "float32"), (64, 16, 2, "float32"), (128, 16, 2, "bfloat16")),
    layer_vocab=256, layer_repeats=(3, 1),
    torch_args=("--ranks", "2", "--microbatches", "4", "--hidden", "32", "--microbatch-size", "4",
                "--steps", "2", "--warmup", "1"),
    estimates={"setup": 10, "run": 5, "validate": 12, "layer": 10, "torch-runtime": 20, "share": 30},
    share_size=(32, 16, 2, "float32"), share_seconds=1.0)


# ---------------------------------------------------------------- budget and records


class Budget:
    """Seconds left of `total` since `start` (by `clock`), and per-kind cost estimates. A kind
    already run is estimated by the median of its durations; one not yet run by its default,
    scaled by how much slower than their defaults the kinds already run were (this machine's
    load; at least 1, at most 5; setup not counted)."""

    def __init__(self, total: float, estimates: dict[str, float], clock: Callable[[], float] = time.monotonic):
        self.total, self.defaults, self.clock = float(total), dict(estimates), clock
        self.start = clock()
        self.taken: dict[str, list[float]] = {}

    def elapsed(self) -> float:
        return self.clock() - self.start

    def left(self) -> float:
        return self.total - self.elapsed()

    def slowness(self) -> float:
        ratios = [statistics.median(v) / self.defaults[k] for k, v in self.taken.items()
                  if k != "setup" and self.defaults.get(k)]
        return min(5.0, max(1.0, statistics.median(ratios))) if ratios else 1.0

    def estimate(self, kind: str) -> float:
        seen = self.taken.get(kind)
        return statistics.median(seen) if seen else self.defaults.get(kind, 30.0) * self.slowness()

    def fits(self, kind: str, kept: float = 0.0) -> bool:
        """Whether a step of `kind` fits and leaves `kept` seconds for later ones."""
        return self.estimate(kind) + kept <= self.left() - RESERVE

    def timeout(self, kind: str, kept: float = 0.0) -> float:
        """A subprocess's limit: three times the estimate (at least 30 s more), never into
        the `kept` seconds or past the budget."""
        est = self.estimate(kind)
        return max(1.0, min(max(3 * est, est + 30), self.left() - RESERVE - kept))

    def spent(self, kind: str, seconds: float) -> None:
        self.taken.setdefault(kind, []).append(seconds)


class Recorder:
    """results.jsonl (a line per measurement, flushed), raw.log and the records for the summary."""

    def __init__(self, out: Path, budget: Budget):
        self.out, self.budget = out, budget
        out.mkdir(parents=True, exist_ok=True)
        self.results = open(out / "results.jsonl", "a", buffering=1)
        self.raw = open(out / "raw.log", "a", buffering=1)
        self.records: list[dict] = []

    def write(self, kind: str, name: str, status: str, **data: Any) -> dict:
        line = {"kind": kind, "name": name, "status": status, "elapsed": round(self.budget.elapsed(), 2), **data}
        self.records.append(line)
        self.results.write(json.dumps(line, default=str) + "\n")
        self.results.flush()
        return line

    def log(self, text: str) -> None:
        self.raw.write(text)
        self.raw.flush()

    def close(self) -> None:
        self.results.close()
        self.raw.close()


@dataclass
class Step:
    kind: str
    name: str
    action: Callable[["Check", float], None]   # (check, timeout): records its own lines


@dataclass
class Command:
    rc: int | None          # None: timed out
    stdout: str
    stderr: str
    seconds: float


@dataclass
class Check:
    """The whole run: mode, budget, recorder, and the subprocess in flight (for SIGTERM)."""

    mode: Mode
    budget: Budget
    rec: Recorder
    work: Path
    env: dict[str, str] = field(default_factory=dict)
    estimator: str = DEFAULT_ESTIMATOR
    current: subprocess.Popen | None = None
    current_files: tuple[Path, Path, str] | None = None
    commands: int = 0
    step_now: tuple[str, str] | None = None   # (kind, name) of the step in flight
    artifacts: list[Path] = field(default_factory=list)

    def command(self, argv: list[str], timeout: float) -> Command:
        """Run argv from the repository root in its own process group; its output goes to raw.log."""
        self.commands += 1
        tag = f"{self.commands:02d}"
        out_path, err_path = self.work / f"{tag}.out", self.work / f"{tag}.err"
        line = " ".join(shlex.quote(a) for a in argv)
        start = time.monotonic()
        with open(out_path, "w") as out, open(err_path, "w") as err:
            self.current = subprocess.Popen(argv, cwd=ROOT, stdout=out, stderr=err, env=self.env,
                                            start_new_session=True)
            self.current_files = (out_path, err_path, line)
            try:
                rc: int | None = self.current.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                stop_group(self.current)
                rc = None
            finally:
                self.current = None
        seconds = time.monotonic() - start
        self.current_files = None
        stdout, stderr = out_path.read_text(errors="replace"), err_path.read_text(errors="replace")
        status = "timed out" if rc is None else f"exit {rc}"
        self.rec.log(f"=== [{tag}] $ {line}\n=== {status} after {seconds:.1f} s (limit {timeout:.0f} s)\n"
                     f"--- stdout\n{stdout}\n--- stderr\n{stderr}\n")
        return Command(rc, stdout, stderr, seconds)

    def python(self, args: list[str], timeout: float) -> Command:
        return self.command([PY, *args], timeout)

    def pipesched(self, args: list[str], timeout: float) -> Command:
        return self.command([PY, "-m", "pipesched", *args], timeout)


def stop_group(proc: subprocess.Popen) -> None:
    """End the process group this script started for `proc` (its ranks too): SIGTERM, and
    SIGKILL to whatever of the group is left 5 s later."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            return
        try:
            proc.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            pass
        if sig == signal.SIGTERM:
            time.sleep(0.5 if proc.returncode is not None else 0.0)  # its ranks stop after it


def run_steps(check: Check, steps: list[Step]) -> None:
    """The steps in order, each only if it fits the budget and leaves room for the first step
    of the later kinds not yet tried (those that fit, taken in order: so a short budget
    measures some of everything, earlier kinds first, rather than all of the first kinds);
    then, while time is left, the steps that were put off, by the same rule; what still
    does not fit is recorded as skipped."""
    tried: set[str] = set()
    deferred = _pass(check, steps, tried)
    while deferred:
        again = _pass(check, deferred, tried)
        if len(again) == len(deferred):
            break
        deferred = again
    for step in deferred:
        check.rec.write(step.kind, step.name, "skipped", estimate=round(check.budget.estimate(step.kind), 1),
                        left=round(check.budget.left(), 1))


def kept_for_later(budget: Budget, steps: list[Step], i: int, tried: set[str]) -> float:
    """Seconds to keep for the kinds of steps[i:] not yet tried, other than steps[i]'s: their
    estimates, taken in order while the running sum (steps[i]'s own kind counted first
    where untried) still fits in what is left."""
    room, total, kept = budget.left() - RESERVE, 0.0, 0.0
    for kind in dict.fromkeys(s.kind for s in steps[i:] if s.kind not in tried):
        est = budget.estimate(kind)
        if total + est <= room:
            total += est
            kept += est if kind != steps[i].kind else 0.0
    return kept


def _pass(check: Check, steps: list[Step], tried: set[str]) -> list[Step]:
    budget = check.budget
    deferred = []
    for i, step in enumerate(steps):
        kept = kept_for_later(budget, steps, i, tried)
        if not budget.fits(step.kind, kept):
            deferred.append(step)
            continue
        tried.add(step.kind)
        timeout = budget.timeout(step.kind, kept)
        start = budget.clock()
        check.step_now = (step.kind, step.name)
        try:
            step.action(check, timeout)
        except Exception as exc:  # a broken step is recorded, the others still run
            check.rec.write(step.kind, step.name, "error", error=f"{type(exc).__name__}: {exc}")
        check.step_now = None
        budget.spent(step.kind, budget.clock() - start)
    return deferred


def parse_json(text: str) -> Any:
    """The JSON document in `text` (the first '{' to the end), or None."""
    start = text.find("{")
    if start < 0:
        return None
    try:
        return json.loads(text[start:])
    except ValueError:
        return None


def failed(cmd: Command) -> tuple[str, dict]:
    status = "timeout" if cmd.rc is None else "fail"
    tail = cmd.stderr.strip().splitlines()[-3:]
    return status, {"rc": cmd.rc, "seconds": round(cmd.seconds, 2), "stderr_tail": tail}


# ---------------------------------------------------------------- steps

PROBE = r"""
import importlib, json, platform, sys
d = {"python": platform.python_version(), "executable": sys.executable, "modules": {}}
for name in %r:
    try:
        d["modules"][name] = getattr(importlib.import_module(name), "__version__", "?")
    except Exception as exc:
        d["modules"][name] = None
try:
    import torch
    d["torch"] = torch.__version__
    d["torch_cuda"] = torch.version.cuda
    d["cuda_available"] = torch.cuda.is_available()
    d["threads"] = torch.get_num_threads()
    if d["cuda_available"]:
        p = torch.cuda.get_device_properties(0)
        free, total = torch.cuda.mem_get_info(0)
        d.update(device=p.name, device_memory=p.total_memory, device_free=free, capability=f"{p.major}.{p.minor}",
                 multiprocessors=p.multi_processor_count, devices=torch.cuda.device_count())
except Exception as exc:
    d["torch_error"] = repr(exc)
try:
    import importlib.util
    spec = importlib.util.find_spec("pipesched.executor")
    d["pipesched"] = spec.origin if spec else None
except Exception as exc:
    d["pipesched"] = None
try:
    from pipesched.schedules.registry import BUILDERS
    d["schedules"] = list(BUILDERS)
except Exception:
    pass
try:
    import pipesched.executor.job, pipesched.simulator.sharing
    d["pipesched_imports"] = True
except Exception as exc:
    d["pipesched_imports"] = False
    d["pipesched_error"] = repr(exc)
print(json.dumps(d))
"""


def probe(check: Check, timeout: float) -> dict:
    cmd = check.python(["-c", PROBE % (tuple(DEPENDENCIES),)], timeout)
    return parse_json(cmd.stdout) or {"probe_error": cmd.stderr.strip().splitlines()[-1:]}


def wheel_dirs() -> list[Path]:
    dirs = [ROOT / d for d in WHEEL_DIRS]
    if os.environ.get("PIPESCHED_WHEELS"):
        dirs.insert(0, Path(os.environ["PIPESCHED_WHEELS"]))
    return [d for d in dirs if d.is_dir() and glob.glob(str(d / "*.whl"))]


def importable_here(info: dict) -> bool:
    where = info.get("pipesched")
    return bool(where) and Path(where).resolve().is_relative_to(ROOT)


def setup(check: Check, timeout: float) -> dict:
    """Make pipesched and its dependencies importable (local wheels only); record the machine."""
    start = time.monotonic()
    info = probe(check, min(timeout, 120))
    missing = [m for m, v in info.get("modules", {}).items() if v is None]
    wheels: dict[str, Any] = {}
    if missing:
        dirs = wheel_dirs()
        for mod in missing:
            dist = DEPENDENCIES[mod]
            if not dirs:
                wheels[dist] = "no local wheels (.whl/, shared/wheels/, wheels/, $PIPESCHED_WHEELS)"
                continue
            args = ["-m", "pip", "install", "-q", "--no-index", "--no-input"]
            for d in dirs:
                args += ["--find-links", str(d)]
            cmd = check.python(args + [dist], max(1.0, timeout - (time.monotonic() - start)))
            wheels[dist] = "installed" if cmd.rc == 0 else f"failed (rc {cmd.rc})"
    install_s, how = 0.0, "already importable from this tree"
    if "installed" in wheels.values():
        info = probe(check, min(timeout, 120))
    if not importable_here(info):
        cmd = check.python(["-m", "pip", "install", "-q", "-e", ".", "--no-deps", "--no-build-isolation"],
                           max(1.0, timeout - (time.monotonic() - start)))
        install_s, how = cmd.seconds, f"pip install -e . (rc {cmd.rc})"
        info = probe(check, min(timeout, 120))
        if not importable_here(info) and not info.get("pipesched"):
            # without an install, the package-dir mapping of pyproject.toml made by links
            for sub in ("schedules", "simulator", "executor"):
                link = ROOT / "pipesched" / sub
                if not link.exists():
                    link.symlink_to(Path("..") / sub)
            how += "; pipesched/{schedules,simulator,executor} linked"
            info = probe(check, min(timeout, 120))
    smi = None
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm",
                              "--format=csv,noheader"], capture_output=True, text=True, timeout=20).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        pass
    status = "ok" if info.get("pipesched_imports") and info.get("torch") else "fail"
    line = check.rec.write("setup", "environment", status, seconds=round(time.monotonic() - start, 2),
                           install=how, install_s=round(install_s, 2), wheels=wheels, nvidia_smi=smi,
                           cpus=os.cpu_count(), budget=check.budget.total, **info)
    return line


def run_schedule(name: str) -> Callable[[Check, float], None]:
    def action(check: Check, timeout: float) -> None:
        mode = check.mode
        args = ["run", name, "-p", "2", "-m", "4", "--backend", mode.backend, "--json", *mode.run_model,
                *mode.run_measure, "--timeout", str(int(max(30, timeout))), *EXTRA_ARGS.get(name, [])]
        cmd = check.pipesched(args, timeout)
        out = parse_json(cmd.stdout)
        if cmd.rc is None or not isinstance(out, dict):
            status, extra = failed(cmd)
            check.rec.write("run", name, status, **extra)
            return
        passed = bool(out.get("loss_matches_reference")) and bool(out.get("grads_match_reference", True))
        check.rec.write(
            "run", name, "ok" if cmd.rc == 0 and passed else "fail", seconds=round(cmd.seconds, 2),
            backend=out.get("backend"), model_stages=out.get("model_stages"),
            loss_matches_reference=out.get("loss_matches_reference"),
            grads_match_reference=out.get("grads_match_reference"), max_grad_rel_error=out.get("max_grad_rel_error"),
            loss_rel_error=out.get("loss_rel_error"), step_time_median=out.get("step_time_median"),
            steps=out.get("steps"), makespan=out.get("makespan"), bubble_ratio=out.get("bubble_ratio"),
            peak_memory_bytes=[r.get("peak_memory_bytes") for r in out.get("per_rank", [])],
            overhead_per_op=[r.get("overhead_per_op") for r in out.get("per_rank", [])])
    return action


def validate_model(label: str, model_args: tuple[str, ...]) -> Callable[[Check, float], None]:
    def action(check: Check, timeout: float) -> None:
        mode = check.mode
        folder = check.work / f"validate-{label}"
        args = ["validate", VALIDATED[label], "-p", "2", "-m", "8" if mode is GPU else "4", "--backend", mode.backend,
                "--replay", "--json", "--out", str(folder), *model_args, *mode.validate_measure,
                "--timeout", str(int(max(30, timeout)))]
        cmd = check.pipesched(args, timeout)
        if folder.is_dir():
            check.artifacts.append(folder)
            write_artifacts(check)
        out = parse_json(cmd.stdout)
        if cmd.rc is None or not isinstance(out, dict) or not out.get("schedules"):
            status, extra = failed(cmd)
            check.rec.write("validate", label, status, **extra)
            return
        for s in out["schedules"]:
            ops = {o["op"]: o.get("measured_median") for o in s.get("per_op", [])}
            replay = s.get("replay") or {}
            check.rec.write(
                "validate", f"{label}/{s['schedule']}", "ok" if s.get("loss_matches_reference", True) else "fail",
                model=label, schedule=s["schedule"], launch_seconds=round(cmd.seconds, 2), backend=s.get("backend"),
                shared_compute=s.get("shared_compute"),
                predicted_makespan=(s.get("predicted") or {}).get("makespan"),
                measured_makespan=(s.get("measured") or {}).get("makespan"),
                makespan_rel_error=s.get("makespan_rel_error"),
                replay_makespan=replay.get("makespan"), replay_makespan_rel_error=s.get("replay_makespan_rel_error"),
                bubble_abs_error=s.get("bubble_abs_error"), peak_memory_rel_error=s.get("peak_memory_rel_error"),
                measured_steps_spread=s.get("measured_steps_spread"), max_grad_rel_error=s.get("max_grad_rel_error"),
                loss_matches_reference=s.get("loss_matches_reference"), op_median_s=ops,
                warnings=s.get("warnings"))
        check.rec.write("validate", f"{label}/ranking", "ok", model=label, **(out.get("ranking") or {}))
    return action


def layer_names(mode: Mode) -> list[str]:
    return [layer_name(h, s, b, d) for h, s, b, d in mode.layer_sizes]


def layer_name(hidden: int, seq: int, microbatch_size: int, dtype: str) -> str:
    return f"llama h{hidden} s{seq} b{microbatch_size} {dtype}"


def layers(check: Check, timeout: float) -> None:
    """One worker process profiles every size in turn, a JSON line each as it is measured
    (one process: torch, transformers and CUDA start once); a size it did not reach is
    recorded with the worker's failure."""
    mode = check.mode
    cfg = {"sizes": mode.layer_sizes, "vocab": mode.layer_vocab, "device": mode.device,
           "repeats": mode.layer_repeats[0], "warmup": mode.layer_repeats[1], "estimator": check.estimator}
    cmd = check.python([str(Path(__file__).resolve()), "--layer-worker", json.dumps(cfg)], timeout)
    measured = {}
    for text in cmd.stdout.splitlines():
        out = parse_json(text)
        if isinstance(out, dict) and "hidden" in out:
            measured[layer_name(out["hidden"], out["seq"], out["microbatch_size"], out.get("dtype", "float32"))] = out
    for name in layer_names(mode):
        if name in measured:
            got = measured[name]
            check.rec.write("layer", name, "error" if "error" in got else "ok", worker_seconds=round(cmd.seconds, 2),
                            **got)
        else:
            status, extra = failed(cmd)
            check.rec.write("layer", name, status, **extra)


def share(check: Check, timeout: float) -> None:
    """How two processes share the device, as two ranks on one GPU do: one worker process
    starts one process that loops a block's F + BW alone, then two that loop it at once
    (`share_worker`). Recorded: seconds an iteration alone and together, their ratio (2.0
    is fair time slicing with nothing lost) and the capacity it implies (2 x alone /
    together: the share of the device two processes get together)."""
    hidden, seq, mbs, dtype = check.mode.share_size
    cfg = {"hidden": hidden, "seq": seq, "microbatch_size": mbs, "dtype": dtype, "vocab": check.mode.layer_vocab,
           "device": check.mode.device, "seconds": check.mode.share_seconds}
    name = layer_name(hidden, seq, mbs, dtype)
    cmd = check.python([str(Path(__file__).resolve()), "--share-worker", json.dumps(cfg)], timeout)
    out = parse_json(cmd.stdout.strip().splitlines()[-1]) if cmd.stdout.strip() else None
    if cmd.rc != 0 or not isinstance(out, dict) or "ratio" not in out:
        status, extra = failed(cmd)
        check.rec.write("share", name, status, **extra)
        return
    check.rec.write("share", name, "ok", worker_seconds=round(cmd.seconds, 2), **out)


def torch_runtime(check: Check, timeout: float) -> None:
    cmd = check.python(["benchmarks/executor_vs_torch.py", "--json", *check.mode.torch_args], timeout)
    out = parse_json(cmd.stdout)
    if cmd.rc != 0 or not isinstance(out, dict) or not out.get("rows"):
        status, extra = failed(cmd)
        check.rec.write("torch-runtime", "executor_vs_torch", status, **extra)
        return
    m = out.get("config", {}).get("microbatches", 1)
    for r in out["rows"]:
        if "error" in r:   # torch's runtime could not run this case (the others still ran)
            check.rec.write("torch-runtime", r["schedule"], "fail", device="cpu", torch_class=r.get("torch"),
                            error=r["error"], config=out.get("config"))
            continue
        ops = OPS_PER_MICROBATCH.get(r["schedule"], 0) * m
        diff = (r["ours_s"] - r["torch_s"]) / ops if ops else None
        check.rec.write("torch-runtime", r["schedule"], "ok", device="cpu", torch_class=r.get("torch"),
                        ours_s=r.get("ours_s"), torch_s=r.get("torch_s"), ratio=r.get("ratio"),
                        ours_torch_order_s=r.get("ours(torch order)_s"), ops_per_rank=ops,
                        host_diff_per_op_s=diff, max_grad_diff=r.get("max_grad_diff"),
                        note=r.get("torch_order_note"), config=out.get("config"))


def write_artifacts(check: Check) -> None:
    target = check.rec.out / "artifacts.tar.gz"
    partial = target.with_suffix(".partial")
    with tarfile.open(partial, "w:gz") as tar:
        for folder in check.artifacts:
            tar.add(folder, arcname=folder.name)
    partial.replace(target)


def plan(mode: Mode, schedules: tuple[str, ...]) -> list[Step]:
    """The steps, what a GPU has measured least first: the first validate (predicted against
    measured), the layers, how two processes share the device, the other validates, the
    runs, torch's runtime."""
    validates = [Step("validate", label, validate_model(label, args)) for label, args in mode.validate_models]
    steps = validates[:1] + [Step("layer", " + ".join(layer_names(mode)), layers),
                             Step("share", layer_name(*mode.share_size), share)]
    steps += validates[1:]
    steps += [Step("run", name, run_schedule(name)) for name in schedules]
    return steps + [Step("torch-runtime", "executor_vs_torch", torch_runtime)]


# ---------------------------------------------------------------- the layer worker (a subprocess)


def estimate_layer(hidden: int, seq: int, microbatch_size: int, dtype: str, device_name: str) -> dict:
    """The cluster what-if estimate (`pipesched.simulator.estimate`) of the Llama block
    profiled here (hf-llama's shapes: FFN 4 x hidden, heads of 32, eager kernels, and
    transformers' default SDPA attention, which keeps no score matrix: the estimator's
    "flash") on the GPU kind named like `device_name`: F, B, W seconds and the bytes F
    keeps, at the default efficiencies (read off this block on an H200 in 2026-11: on an
    H200 the comparison shows drift, not a held-out error)."""
    from pipesched.simulator.estimate import Setup, estimate
    from pipesched.simulator.hardware import hardware
    from pipesched.simulator.model_config import from_hf_dict

    name = device_name.lower()
    kind = "h200" if "h200" in name else "a100-80gb" if "a100" in name else "h100-sxm"
    from pipesched.executor.hf_models import HFModel

    heads = HFModel("hf-llama", hidden).heads   # the block profiled is built with these
    config = from_hf_dict({"model_type": "llama", "num_hidden_layers": 1, "hidden_size": hidden,
                           "intermediate_size": 4 * hidden, "num_attention_heads": heads,
                           "num_key_value_heads": heads, "vocab_size": 8192, "tie_word_embeddings": False,
                           "max_position_embeddings": max(seq, 16)}, "hf-llama block")
    dtypes = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}
    setup = Setup(seq=seq, microbatch_size=microbatch_size, dtype=dtypes.get(dtype, dtype), kernels="eager",
                  attention="flash")
    layer = estimate(config, setup, hardware(kind)).layer
    return {"gpu_kind": kind, "F": layer.forward.total, "B": layer.backward_input.total,
            "W": layer.backward_weight.total, "saved_bytes": sum(layer.saved.values()),
            "activation_memory": layer.activation_memory}


def cluster_estimate_hook(spec: str, measured: dict) -> dict | None:
    """Where a cluster what-if estimate would be printed beside the measurements: `spec` is
    MODULE:FUNCTION, called with the block's sizes, dtype and device name when MODULE imports;
    None otherwise (no estimator exists yet; none is made up here)."""
    module_name, _, func_name = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        return None
    func = getattr(module, func_name or "estimate_layer", None)
    if func is None:
        return None
    try:
        return dict(func(**{k: measured[k] for k in ("hidden", "seq", "microbatch_size", "dtype", "device_name")}))
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}


def layer_worker(cfg: dict) -> None:
    """Every size in cfg["sizes"] profiled, a JSON line each (printed as soon as measured)."""
    for hidden, seq, mbs, dtype in cfg["sizes"]:
        try:
            out = profile_block(dict(cfg, hidden=hidden, seq=seq, microbatch_size=mbs, dtype=dtype))
        except Exception as exc:  # out of memory, say: the next size still runs
            out = {"hidden": hidden, "seq": seq, "microbatch_size": mbs, "dtype": dtype,
                   "error": f"{type(exc).__name__}: {exc}"}
        _free_cuda()
        print(json.dumps(out, default=float), flush=True)


def llama_model(cfg: dict):
    """hf-llama with one block at cfg's sizes (a PipelineModel of one model stage); in
    bfloat16 cast after building, as the executor builds float32/64 (exact gradients)."""
    import torch

    from pipesched.executor.hf_models import HFModel

    low = cfg["dtype"] == "bfloat16"
    model = HFModel("hf-llama", cfg["hidden"], 1, cfg["microbatch_size"], cfg["seq"], cfg["vocab"],
                    "float32" if low else cfg["dtype"]).check().build(1, 1)
    if low:
        for stage in model.stages:
            stage.to(torch.bfloat16)
    return model


def block_and_input(model, cfg: dict, dev):
    """(the transformer block of `model` on `dev`, a random input to it that wants a gradient)."""
    import torch

    from pipesched.executor.causal_lm import Blocks
    from pipesched.executor.layer_profile import layer_pieces

    pieces, _ = layer_pieces(model)
    blk = next(p for p in pieces if isinstance(p, Blocks)).to(dev)
    x = torch.randn(cfg["microbatch_size"], cfg["seq"], cfg["hidden"], device=dev, requires_grad=True,
                    dtype=next(blk.parameters()).dtype)
    return blk, x


def share_worker(cfg: dict) -> None:
    """Prints one JSON line: seconds an iteration of F + BW of one Llama block, looped for
    cfg["seconds"] by one process alone and then by two at once (each process its own CUDA
    context, as gloo-cuda ranks are), started together at a barrier once built and warm."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    out: dict[str, Any] = {"seconds": cfg["seconds"], "device": cfg["device"]}
    for label, n in (("alone", 1), ("together", 2)):
        barrier, queue = ctx.Barrier(n + 1), ctx.Queue()
        procs = [ctx.Process(target=_share_loop, args=(cfg, barrier, queue), daemon=True) for _ in range(n)]
        for proc in procs:
            proc.start()
        barrier.wait(timeout=300)
        loops = [queue.get(timeout=300 + 10 * cfg["seconds"]) for _ in procs]
        for proc in procs:
            proc.join(timeout=60)
        errors = [x["error"] for x in loops if "error" in x]
        if errors:
            raise RuntimeError(errors[0])
        out[label] = loops
        out[f"{label}_s"] = statistics.fmean(x["per_iteration_s"] for x in loops)
    out["ratio"] = out["together_s"] / out["alone_s"]
    out["capacity"] = 2.0 / out["ratio"]
    print(json.dumps(out), flush=True)


def _share_loop(cfg: dict, barrier: Any, queue: Any) -> None:
    """One process of `share_worker`: builds and warms the block, waits at `barrier`, loops."""
    try:
        import torch

        dev = torch.device(cfg["device"])
        if dev.type == "cpu":
            torch.set_num_threads(1)
        blk, x = block_and_input(llama_model(cfg), cfg, dev)

        def iteration() -> None:
            y = blk(x)
            y.backward(torch.ones_like(y))
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
        for _ in range(3):
            iteration()
    except Exception as exc:
        barrier.abort()
        queue.put({"error": f"{type(exc).__name__}: {exc}"})
        return
    barrier.wait()
    start, n = time.perf_counter(), 0
    while time.perf_counter() - start < cfg["seconds"]:
        iteration()
        n += 1
    elapsed = time.perf_counter() - start
    queue.put({"iterations": n, "elapsed_s": elapsed, "per_iteration_s": elapsed / n})


def _free_cuda() -> None:
    import gc

    import torch
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def profile_block(cfg: dict) -> dict:
    """One Llama block profiled on cfg["device"]: F, B, W, BW and what a forward saves."""
    import torch

    from pipesched.executor.layer_profile import profile_layers

    dev = torch.device(cfg["device"])
    if dev.type == "cpu":
        torch.set_num_threads(1)  # tiny ops: more threads only wait for each other
    model = llama_model(cfg)
    layers, _ = profile_layers(model, dev, repeats=cfg["repeats"], warmup=cfg["warmup"])
    block = layers.layers[0]
    out: dict[str, Any] = {
        "hidden": cfg["hidden"], "seq": cfg["seq"], "microbatch_size": cfg["microbatch_size"], "dtype": cfg["dtype"],
        "device_name": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
        "forward_s": block.forward, "backward_input_s": block.backward_input,
        "backward_weight_s": block.backward_weight, "backward_full_s": block.backward_full,
        "activation_memory_bytes": block.activation_memory, "weight_memory_bytes": block.weight_memory,
        "param_bytes": block.param_bytes, "output_bytes": block.activation_bytes,
        "embedding_fbw_s": None if layers.embedding is None else
        [layers.embedding.forward, layers.embedding.backward_input, layers.embedding.backward_weight],
        "head_fbw_s": None if layers.head is None else
        [layers.head.forward, layers.head.backward_input, layers.head.backward_weight],
        "cuda_saved_bytes": None, "cuda_forward_peak_bytes": None}
    if dev.type == "cuda":
        blk, x = block_and_input(model, cfg, dev)
        y = blk(x)   # warm: workspaces and lazily made buffers are allocated before measuring
        y.backward(torch.ones_like(y))
        del y
        for p in blk.parameters():
            p.grad = None
        x.grad = None
        torch.cuda.synchronize(dev)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(dev)
        base = torch.cuda.memory_allocated(dev)
        y = blk(x)
        torch.cuda.synchronize(dev)
        after, peak = torch.cuda.memory_allocated(dev), torch.cuda.max_memory_allocated(dev)
        out["cuda_saved_bytes"] = after - base - y.numel() * y.element_size()   # held for the backward
        out["cuda_forward_peak_bytes"] = peak - base
    out["estimate"] = cluster_estimate_hook(cfg.get("estimator") or DEFAULT_ESTIMATOR, out)
    return out


# ---------------------------------------------------------------- summary and main


def _ms(x: Any) -> str:
    return f"{1e3 * x:.2f}" if isinstance(x, (int, float)) else "-"


def _pct(x: Any) -> str:
    return f"{100 * x:+.1f}%" if isinstance(x, (int, float)) else "-"


def _g(x: Any) -> str:
    return f"{x:.3g}" if isinstance(x, (int, float)) else "-"


def _mib(x: Any) -> str:
    return f"{x / 2 ** 20:.1f}" if isinstance(x, (int, float)) else "-"


def summary(records: list[dict]) -> str:
    rows = []
    for r in records:
        kind, st = r["kind"], r["status"]
        if kind == "setup":
            what = (f"torch {r.get('torch', '-')} cuda {r.get('torch_cuda', '-')} {r.get('device', 'no GPU')}"
                    f" {_mib(r.get('device_memory'))} MiB; install {r.get('install_s', 0):.1f} s ({r.get('install')})")
        elif kind == "run" and "step_time_median" in r:
            what = (f"step {_ms(r['step_time_median'])} ms, grad err {_g(r.get('max_grad_rel_error'))}, "
                    f"bubble {_pct(r.get('bubble_ratio'))}")
        elif kind == "validate" and "predicted_makespan" in r:
            ops = r.get("op_median_s") or {}
            what = (f"pred {_ms(r['predicted_makespan'])} meas {_ms(r['measured_makespan'])} ms, err "
                    f"{_pct(r.get('makespan_rel_error'))}, replay {_pct(r.get('replay_makespan_rel_error'))}; ops ms "
                    + " ".join(f"{k} {_ms(v)}" for k, v in ops.items()))
        elif kind == "validate" and "predicted_fastest" in r:
            what = f"fastest predicted {r.get('predicted_fastest')}, measured {r.get('measured_fastest')}"
        elif kind == "layer" and "forward_s" in r:
            what = (f"F {_ms(r['forward_s'])} B {_ms(r['backward_input_s'])} W {_ms(r['backward_weight_s'])} ms, "
                    f"saved {_mib(r.get('activation_memory_bytes'))} MiB (cuda {_mib(r.get('cuda_saved_bytes'))})")
            if r.get("estimate"):
                what += f"; estimate {json.dumps(r['estimate'], default=str)}"
        elif kind == "share" and "ratio" in r:
            what = (f"F+BW alone {_ms(r['alone_s'])} ms, two at once {_ms(r['together_s'])} ms each: "
                    f"{r['ratio']:.2f}x (2.00 = fair sharing), capacity {r['capacity']:.2f}")
        elif kind == "torch-runtime" and "ours_s" in r:
            what = (f"ours {_ms(r['ours_s'])} torch {_ms(r['torch_s'])} ms, ratio {_g(r.get('ratio'))}, "
                    f"host diff/op {_ms(r.get('host_diff_per_op_s'))} ms (cpu)")
        elif kind == "end":
            what = f"{r.get('mode')}: {r.get('reason', '')} after {r.get('elapsed_s')} s; {r.get('counts', '')}"
        elif st == "skipped":
            what = f"estimate {r.get('estimate')} s, left {r.get('left')} s"
        else:
            what = "; ".join(r.get("stderr_tail") or [r.get("error") or f"rc {r.get('rc')}"])[:160]
        rows.append(f"{kind:<14} {r['name'][:30]:<30} {st:<10} {what}")
    return "\n".join([f"{'kind':<14} {'name':<30} {'status':<10} measured", *rows])


def finish(check: Check, reason: str) -> None:
    if reason == "SIGTERM" and check.step_now:
        check.rec.write(*check.step_now, "terminated")
    counts: dict[str, int] = {}
    for r in check.rec.records:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    check.rec.write("end", "gpu_check", "terminated" if reason == "SIGTERM" else "ok", reason=reason,
                    mode=check.mode.name, counts=counts, elapsed_s=round(check.budget.elapsed(), 1))
    text = summary(check.rec.records)
    (check.rec.out / "summary.txt").write_text(text + "\n")
    print(text, flush=True)
    check.rec.close()
    shutil.rmtree(check.work, ignore_errors=True)  # the validate folders are in artifacts.tar.gz


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--layer-worker"]:
        layer_worker(json.loads(argv[1]))
        return 0
    if argv[:1] == ["--share-worker"]:
        share_worker(json.loads(argv[1]))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out_dir", metavar="OUT_DIR", help="folder for results.jsonl, raw.log, summary.txt, artifacts")
    ap.add_argument("--budget", type=float, default=540.0, help="seconds for everything (default 540)")
    ap.add_argument("--dry-run", action="store_true", help="tiny CPU sizes with gloo (also without CUDA)")
    ap.add_argument("--estimator", default=DEFAULT_ESTIMATOR,
                    help=f"MODULE:FUNCTION printed beside the layer measurements when it imports "
                         f"(default {DEFAULT_ESTIMATOR})")
    ap.add_argument("--schedules", help="comma-separated schedules for the run step, or all (default: "
                                        f"{','.join(DRY_SCHEDULES)}, one of each shape)")
    args = ap.parse_args(argv)

    out = Path(args.out_dir).resolve()
    work = Path(tempfile.mkdtemp(prefix="gpu-check-"))
    env = dict(os.environ, PYTHONUNBUFFERED="1", MPLBACKEND="Agg")
    budget = Budget(args.budget, GPU.estimates)
    check = Check(GPU, budget, Recorder(out, budget), work, env, args.estimator)

    def on_term(signum, frame):  # a time limit: stop the subprocess, keep what was measured
        if check.current is not None:
            stop_group(check.current)
            if check.current_files:
                o, e, line = check.current_files
                check.rec.log(f"=== $ {line}\n=== stopped by SIGTERM\n--- stdout\n{o.read_text(errors='replace')}\n"
                              f"--- stderr\n{e.read_text(errors='replace')}\n")
        finish(check, "SIGTERM")
        os._exit(143)

    signal.signal(signal.SIGTERM, on_term)
    print(f"gpu_check: writing {out}/results.jsonl (budget {args.budget:.0f} s)", flush=True)
    start = time.monotonic()
    try:
        info = setup(check, budget.timeout("setup"))
    except Exception as exc:
        info = check.rec.write("setup", "environment", "error", error=f"{type(exc).__name__}: {exc}")
    budget.spent("setup", time.monotonic() - start)
    mode = DRY if args.dry_run or not info.get("cuda_available") else GPU
    if mode is DRY and not args.dry_run:
        print("gpu_check: torch sees no CUDA device: running the dry run (gloo on CPU, tiny sizes)", flush=True)
    check.mode = mode
    budget.defaults = dict(mode.estimates)
    builtins = tuple(info.get("schedules") or SCHEDULES)
    names = args.schedules.split(",") if args.schedules else None
    if names == ["all"]:
        names = list(builtins)
    run_steps(check, plan(mode, tuple(names or DRY_SCHEDULES)))
    finish(check, "done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
