"""`longctx config` (the resolved, validated config) and `longctx sweep` (a W&B sweep's grid
or random search run here, without a server)."""

from __future__ import annotations

import argparse
import sys

from longctx import config as config_module
from longctx.cli.common import split_overrides


def cmd_config(args: argparse.Namespace) -> int:
    paths, overrides = split_overrides(args.items)
    cfg = config_module.load(paths, overrides)
    sys.stdout.write(config_module.to_yaml(cfg))
    return 0


def cmd_sweep(args: argparse.Namespace) -> int:
    import shlex

    from longctx.sweep import load_sweep, plan, run

    sweep = load_sweep(args.sweep)
    for note in sweep.notes:
        print(f"longctx sweep: note: {note}", file=sys.stderr)
    points = plan(sweep, args.count, args.seed)
    if args.dry_run:
        for point in points:
            print(f"[{point.index}] {shlex.join(point.command)}")
        return 0
    return run(sweep, points, args.summary or sweep.default_summary(), keep_going=args.keep_going, jobs=args.jobs)


def register(commands: argparse._SubParsersAction) -> None:
    config = commands.add_parser("config", help="print the resolved, validated config as YAML")
    config.add_argument(
        "items", nargs="*", metavar="CFG.yaml|key=value", help="YAML files and overrides, merged in order"
    )
    config.set_defaults(run=cmd_config)
    sweep = commands.add_parser("sweep", help="run a W&B sweep YAML's grid or random search here, without a W&B server")
    sweep.add_argument("sweep", metavar="SWEEP.yaml", help="a W&B sweep file (sweeps/*.yaml)")
    sweep.add_argument("--count", type=int, help="run at most N points (required for method: random)")
    sweep.add_argument("--seed", type=int, default=0, help="random search seed")
    sweep.add_argument("--dry-run", action="store_true", help="print the numbered commands, run nothing")
    sweep.add_argument("--keep-going", action="store_true", help="run the remaining points after a failure")
    sweep.add_argument(
        "--jobs", type=int, default=1, help="run N points at a time, each with 1/N of the CPUs (logs beside --summary)"
    )
    sweep.add_argument("--summary", default="", help="JSON-lines results (default runs/sweeps/NAME/summary.jsonl)")
    sweep.set_defaults(run=cmd_sweep)
