"""How far each schedule's prediction misses, signed, on launches already measured: the
record behind `simulator.confidence.KNOWN_ERROR`.

Reads the roots `validate_many.py --out` keeps (one folder per model and launch,
`pP-modelI[-launchK]`, a subfolder per schedule with predicted.json, measured.json and
costs.json), takes each run's makespan error (predicted / measured - 1, as `validate`
prints it) and prints per p, ranks sharing cores or not, and schedule: the number of runs,
the median and the low and high quantiles of the signed error (a schedule predicted short
has a negative one), and the 75th percentile of |error|, the form the table had before it
was signed; then per side the median |error| with and without each schedule's median
taken out (the most a correction per schedule could gain).

With --check DIR ... the table fitted from the first roots (the quantiles printed) is held
against launches it was not fitted on: every kept launch under the --check roots is
ranked again as `validate` ranks it (`simulator.confidence.pick_confidence`, the launch's
own floor included), once with today's `KNOWN_ERROR` and once with the fitted table, and
per p it prints how many picks were called settled, the worst loss of a settled pick
against the measured fastest, the loss of a user who follows the command (the pick where
settled, else the fastest measured of the schedules it named) and how many it named.

With --by-seed every launch is held against a table fitted on the launches of the other
seeds (a root's seed is the number in its name; the same models launched again share one),
so every launch counts as one the table was not fitted on.

    python benchmarks/known_errors.py DIR [DIR ...] [--quantile 0.05] [--check DIR [DIR ...] | --by-seed]
"""
from __future__ import annotations

import argparse
import re
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from validate_many import KEPT, advised_loss, kept_doc  # noqa: E402

from pipesched.commands.validate_many import ranking_of  # noqa: E402
from pipesched.simulator.confidence import KNOWN_ERROR, known_error  # noqa: E402


def kept_docs(roots: list[Path]) -> list[tuple[int, dict]]:
    """(p, the launch's document as `validate_many.kept_doc` reads it) of every kept
    folder under `roots`."""
    return [(p, doc) for p, doc, _ in _docs_with_seed(roots)]


def _docs_with_seed(roots: list[Path]) -> list[tuple[int, dict, str]]:
    """(p, document, the root's seed: the first number in its name, else its name)."""
    out = []
    for root in roots:
        seed = re.search(r"\d+", root.name)
        for folder in sorted(root.iterdir()) if root.is_dir() else []:
            if KEPT.fullmatch(folder.name):
                out.append((int(KEPT.fullmatch(folder.name)[1]), kept_doc(folder), seed[0] if seed else root.name))
    return out


def signed_errors(docs: list[tuple[int, dict]]) -> dict[tuple[bool, str], list[float]]:
    """(ranks share cores, schedule) -> the makespan errors of every run in `docs`."""
    out: dict[tuple[bool, str], list[float]] = defaultdict(list)
    for _, doc in docs:
        for s in doc["schedules"]:
            out[(doc["ranking"]["shared_cores"], s["schedule"])].append(s["makespan_rel_error"])
    return out


def bias_ceiling(errors: dict[str, list[float]]) -> tuple[float, float]:
    """(the median |error| over every run in `errors`, schedule -> signed errors; the same
    with each schedule's median subtracted from its runs): how much of the error a
    correction per schedule could remove at most."""
    values = [np.asarray(v, dtype=float) for v in errors.values() if len(v)]
    if not values:
        return 0.0, 0.0
    whole = np.concatenate(values)
    centred = np.concatenate([v - np.median(v) for v in values])
    return float(np.median(np.abs(whole))), float(np.median(np.abs(centred)))


def fitted_table(errors: dict[tuple[bool, str], list[float]], q: float) -> dict:
    """A `KNOWN_ERROR` of the quantiles q and 1 - q of `errors`; today's entry where a
    schedule has no run on one side (own or shared cores)."""
    table = {}
    for name in sorted({n for _, n in errors} | set(KNOWN_ERROR)):
        sides = []
        for shared in (False, True):
            values = errors.get((shared, name))
            sides.append(tuple(float(x) for x in np.quantile(values, [q, 1 - q])) if values
                         else known_error(name, shared))
        table[name] = tuple(sides)
    return table


def followed(doc: dict, known: dict | None) -> tuple[bool, float, int]:
    """(whether `validate` ranking with `known` calls the launch's pick settled, the loss
    of a user who follows it against the measured fastest, how many schedules it names)."""
    ranking = ranking_of(doc["schedules"], doc["ranking"]["shared_cores"], known=known)
    settled, loss = advised_loss({"schedules": doc["schedules"], "ranking": ranking})
    return settled, loss, len(ranking["confidence"]["to_measure"])


def check(docs: list[tuple[int, dict]], tables: dict[str, dict | None]) -> None:
    """Per p and table: the picks called settled, their worst loss, following the command."""
    for p in sorted({p for p, _ in docs}):
        mine = [doc for q, doc in docs if q == p]
        for label, known in tables.items():
            print_outcome(f"p={p} {label}", [followed(doc, known) for doc in mine])


def print_outcome(label: str, rows: list[tuple[bool, float, int]]) -> None:
    """One line over `followed` rows."""
    settled = [loss for sure, loss, _ in rows if sure]
    named = [n for sure, _, n in rows if not sure]
    losses = [loss for _, loss, _ in rows]
    print(f"{label}: settled {len(settled)}/{len(rows)}, their loss worst {100 * max(settled, default=0.0):.2f} %; "
          f"following the command: loss median {100 * float(np.median(losses)):.2f} %, worst "
          f"{100 * max(losses):.2f} %, over 2 % in {sum(x > 0.02 for x in losses)}; the unsettled named a median "
          f"{float(np.median(named)) if named else 0:g} schedules")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("roots", nargs="+", type=Path, help="folders validate_many.py --out kept")
    parser.add_argument("--quantile", type=float, default=0.05,
                        help="the low quantile printed; the high one is 1 minus it (default 0.05, as KNOWN_ERROR)")
    parser.add_argument("--check", nargs="+", type=Path, default=[],
                        help="kept folders to rank with today's table and the fitted one")
    parser.add_argument("--by-seed", action="store_true",
                        help="rank every launch with a table fitted on the other seeds' launches")
    args = parser.parse_args()
    if not 0 < args.quantile < 0.5:
        print(f"known_errors: --quantile must be between 0 and 0.5, got {args.quantile}", file=sys.stderr)
        return 2
    try:
        seeded = _docs_with_seed(args.roots)
        checked = kept_docs(args.check)
    except (OSError, ValueError, KeyError) as exc:
        print(f"known_errors: a kept folder could not be read: {exc}", file=sys.stderr)
        return 2
    found = signed_errors([(p, doc) for p, doc, _ in seeded])
    if not found:
        print("known_errors: no kept folders (pP-modelI[-launchK]) under " + ", ".join(map(str, args.roots)),
              file=sys.stderr)
        return 2
    q = args.quantile
    print(f"makespan error, predicted / measured - 1, %: median, quantiles {q:g} and {1 - q:g}, "
          "and the 75th percentile of |error|")
    for shared in sorted({s for s, _ in found}):
        print(f"## {'two ranks a core' if shared else 'a core per rank'}")
        print(f"{'schedule':<18}{'runs':>6}{'median':>9}{'low':>9}{'high':>9}{'|p75|':>9}")
        for (where, name), values in sorted(found.items()):
            if where != shared:
                continue
            v = np.asarray(values)
            lo, mid, hi = np.quantile(v, [q, 0.5, 1 - q])
            print(f"{name:<18}{len(v):>6}{100 * mid:>+9.2f}{100 * lo:>+9.2f}{100 * hi:>+9.2f}"
                  f"{100 * np.quantile(np.abs(v), 0.75):>9.2f}")
        whole, centred = bias_ceiling({name: v for (where, name), v in found.items() if where == shared})
        print(f"median |error| {100 * whole:.2f} %; with each schedule's median taken out {100 * centred:.2f} % "
              "(the most a correction per schedule could take off)")
    if args.check:
        docs = checked
        if not docs:
            print("known_errors: no kept folders under --check " + ", ".join(map(str, args.check)), file=sys.stderr)
            return 2
        print(f"## held against {len(docs)} launches under " + ", ".join(map(str, args.check)))
        check(docs, {"today's table": None, f"fitted ({q:g}, {1 - q:g})": fitted_table(found, q)})
    if args.by_seed:
        by_seed(seeded, q)
    return 0


def by_seed(docs: list[tuple[int, dict, str]], q: float) -> None:
    """--by-seed: per p, every launch ranked with the table fitted on the other seeds'
    launches."""
    print(f"## every launch held against the table fitted on the other seeds' ({len({s for *_, s in docs})} seeds)")
    for p in sorted({p for p, *_ in docs}):
        held = []
        for seed in sorted({s for q_, _, s in docs if q_ == p}):
            table = fitted_table(signed_errors([(p_, d) for p_, d, s in docs if s != seed]), q)
            for p_, doc, s in docs:
                if p_ == p and s == seed:
                    held.append(followed(doc, table))
        print_outcome(f"p={p} fitted on the other seeds ({q:g}, {1 - q:g})", held)


if __name__ == "__main__":
    sys.exit(main())
