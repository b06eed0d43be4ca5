"""The built-in schedules by name, with their constraints."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable

from .dualpipe import build_dualpipe
from .dualpipev import build_dualpipev
from .gpipe import build_gpipe
from .greedy import OpTime
from .interleaved import build_interleaved_1f1b
from .ir import Schedule, ScheduleError
from .looped_bfs import build_looped_bfs
from .one_f_one_b import build_1f1b
from .zb_h1 import build_zb_h1
from .zb_h2 import build_zb_h2
from .v_half import build_v_half
from .v_min import build_v_min
from .zb_auto import Score, build_zb_auto, one_copy
from .zb_v import build_zb_v
from .numbers import is_int


@dataclass(frozen=True)
class Builder:
    name: str
    build: Callable[..., Schedule]
    summary: str
    constraints: str
    chunks: int | None = 1          # fixed chunks per rank; None: takes -v
    default_chunks: int = 2         # when chunks is None
    adapts_to_costs: bool = False   # takes op durations and orders ops for them
    model_stages: str = "p"         # how many model stages it cuts the model into
    searches: bool = False          # builds for a memory limit and a score (zb-auto)


BUILDERS: dict[str, Builder] = {b.name: b for b in (
    Builder("gpipe", build_gpipe, "all forwards, then all backwards", "p >= 1, m >= 1"),
    Builder("1f1b", build_1f1b, "one forward, one backward (PipeDream-Flush)", "p >= 1, m >= 1"),
    Builder("interleaved-1f1b", build_interleaved_1f1b, "Megatron's interleaved 1F1B, v chunks per rank",
            "p >= 1, m >= 1, v >= 1 (default 2); bubble (p-1)/v when p divides m", chunks=None,
            model_stages="p*v"),
    Builder("looped-bfs", build_looped_bfs, "breadth-first over v looped chunks per rank",
            "p >= 1, m >= 1, v >= 1 (default 2)", chunks=None, model_stages="p*v"),
    Builder("zb-h1", build_zb_h1, "zero bubble H1: split backward, 1F1B memory", "p >= 1, m >= 1"),
    Builder("zb-h2", build_zb_h2, "zero bubble H2: no bubble past the start skew, 2p-1 activations",
            "p >= 1, m >= 1; zero bubble needs m >= p", adapts_to_costs=True),
    Builder("zb-v", build_zb_v, "zero bubble V: two chunks per rank in a V, 1F1B memory",
            "p >= 1, m >= 1, v = 2; zero bubble needs m >= 2p-1", chunks=2, adapts_to_costs=True,
            model_stages="2p"),
    Builder("dualpipe", build_dualpipe, "DeepSeek DualPipe: two directions, two replicas per rank",
            "p even, m even; DeepSeek's bubble needs m >= 2p", model_stages="p"),
    Builder("dualpipev", build_dualpipev, "DeepSeek DualPipeV: DualPipe folded into a V, one copy",
            "p >= 1, m >= 1, v = 2; DeepSeek's bubble needs m >= 2p", chunks=2, model_stages="2p"),
    Builder("v-half", build_v_half, "V-shape at half of 1F1B's memory: (p+2)//2 activations",
            "p >= 1, m >= 1, v = 2; bubble about p/2m", chunks=2,
            adapts_to_costs=True, model_stages="2p"),
    Builder("v-min", build_v_min, "V-shape at a third of 1F1B's memory: (p+4)//3 activations",
            "p >= 1, m >= 1, v = 2; published bubble 2p/3m, larger here at m > 2p",
            chunks=2, adapts_to_costs=True, model_stages="2p"),
    Builder("zb-auto", build_zb_auto, "fastest order found for the costs under a memory limit",
            "p >= 1, m >= 1, v in {1, 2} (default: both); --max-activations / --memory-limit",
            chunks=None, adapts_to_costs=True, model_stages="p*v", searches=True),
)}


MAX_OPS = 10_000_000
"""The most ops a schedule may have. The simulator needs about 1.4 kB and 25 us per op
(benchmarks/simulator_speed.py), so this is ~14 GB and minutes; a typo such as -m 10**9
is refused at once instead of exhausting memory."""


def check_size(name: str, ops: int) -> None:
    """ScheduleError when a schedule of `ops` ops is too large to build and simulate."""
    if ops > MAX_OPS:
        raise ScheduleError(f"{name} would have {ops:,} ops, more than the {MAX_OPS:,} pipesched "
                            f"builds and simulates (about 1.4 kB of memory each); use fewer ranks, "
                            f"microbatches or chunks")


def _is_count(x: object) -> bool:
    return is_int(x)


def check_known(name: str) -> None:
    """ScheduleError naming the built-ins unless `name` is one of them."""
    if name not in BUILDERS:
        raise ScheduleError(f"unknown schedule {name!r}; built-in schedules are {', '.join(BUILDERS)}")


def build(name: str, ranks: int, microbatches: int, chunks: int | None = None,
          op_time: OpTime | None = None, max_activations: float | None = None,
          score: Score | None = None, builtins: list[Schedule] | None = None,
          step_barrier: str = "all", weight_share: float = 1.0) -> Schedule:
    """Build a named schedule. `chunks` is v (chunks per rank) for schedules that take it;
    `op_time(op, model_stage, num_model_stages)` (seconds) lets cost-adaptive builders
    order ops for those durations. `max_activations` (microbatches of one pipeline
    stage), `score`, `builtins`, `step_barrier` ("all": minimize the makespan, "none":
    the period of steps back to back) and `weight_share` (what a B leaves held until
    its W) are for searching builders (zb-auto, see
    schedules.zb_auto); the others ignore them (callers check their memory)."""
    check_known(name)
    builder = BUILDERS[name]
    kwargs: dict = {"op_time": op_time} if builder.adapts_to_costs else {}
    if builder.searches:
        if all(_is_count(x) and x > 0 for x in (ranks, microbatches)):
            check_size(name, 3 * microbatches * ranks * 2)  # at most two chunks per rank
        return builder.build(ranks, microbatches, chunks, op_time=op_time, max_activations=max_activations,
                             score=score, builtins=builtins, candidates=builtin_candidates,
                             step_barrier=step_barrier, weight_share=weight_share)
    if builder.chunks is not None and chunks is not None and chunks != builder.chunks:
        raise ScheduleError(f"{name} has {builder.chunks} chunk{'s' if builder.chunks > 1 else ''} per rank, got -v {chunks}")
    v = builder.chunks if builder.chunks is not None else builder.default_chunks if chunks is None else chunks
    if all(_is_count(x) and x > 0 for x in (ranks, microbatches, v)):
        # every microbatch runs F, B and W (at most) on each of the p*v model stages
        check_size(name, 3 * microbatches * ranks * v)
    if builder.chunks is None:
        return builder.build(ranks, microbatches, v, **kwargs)
    return builder.build(ranks, microbatches, **kwargs)


def builtin_candidates(ranks: int, microbatches: int, chunks: Iterable[int],
                       op_time: OpTime | None, built: dict | None = None) -> list[Schedule]:
    """Every other built-in with these v that can be built for p and m and keeps one
    copy of each model stage. `built`: what the caller already built for these p, m and
    durations, by (name, chunks as given to `registry.build`), a Schedule or the
    ScheduleError building raised; used instead of building again."""
    built = {} if built is None else built
    out = []
    for name, builder in BUILDERS.items():
        if builder.searches:
            continue
        for v in chunks:
            if builder.chunks is not None and builder.chunks != v:
                continue
            arg = None if builder.chunks else v
            s = built.get((name, arg))
            if s is None:
                try:
                    s = build(name, ranks, microbatches, arg, op_time)
                except ScheduleError:
                    continue  # e.g. dualpipe needs p and m even
            if isinstance(s, Schedule) and one_copy(s):
                out.append(s)
    return out
