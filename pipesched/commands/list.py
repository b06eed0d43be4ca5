"""`pipesched list`: the built-in schedules and their constraints."""
from __future__ import annotations

import argparse

from pipesched.schedules.registry import BUILDERS

from ..formatting import json_text


def add_parser(sub) -> None:
    p = sub.add_parser("list", help="built-in schedules and their constraints")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    rows = [{"name": b.name, "chunks": "v" if b.chunks is None else b.chunks,
             "model_stages": b.model_stages, "constraints": b.constraints,
             "adapts_to_costs": b.adapts_to_costs, "summary": b.summary} for b in BUILDERS.values()]
    if args.json:
        print(json_text(rows))
        return 0
    width = max(len(r["name"]) for r in rows)
    print(f"{'schedule':<{width}}  {'v':<2} {'stages':<6}  constraints; description")
    for r in rows:
        tuned = " Orders its ops for the given costs." if r["adapts_to_costs"] else ""
        print(f"{r['name']:<{width}}  {str(r['chunks']):<2} {r['model_stages']:<6}  {r['constraints']}; "
              f"{r['summary']}.{tuned}")
    print("\nAlso: a schedule file (pipesched.schedule/1 JSON), a torch CSV dump, or torch:NAME "
          "for torch.distributed.pipelining's own (needs torch).")
    return 0
