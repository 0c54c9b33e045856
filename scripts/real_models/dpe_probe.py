"""DPE on SmolLM2-135M-Instruct: the authors' probing of the per-group scales, then NIAH of
rope, string-repo and dpe with the probed scales (a driver: its JSON and tables are results).

    python3 scripts/real_models/dpe_probe.py probe MODEL_DIR --length 8192 --tests 4 --out DIR [--budget-s S]
    python3 scripts/real_models/dpe_probe.py compare MODEL_DIR --length 8192 --tests 4 --out DIR [--budget-s S]
    python3 scripts/real_models/dpe_probe.py both MODEL_DIR --length 16384 --tests 20 --compare-tests 100 \
        --out $OUT --budget-s 480 [--resume-from CELLS.tar.xz]
    python3 scripts/real_models/dpe_probe.py smoke --out DIR          # `both` on CPU, tiny model, resumed

- `probe`: every entry of `probing_grid` (longctx/config/methods/dpe.py, the authors'
  run_niah_detect.sh: group g at factor f, the others at 2 x length / L) as an arm of
  `longctx niah-table` on experiments/real/smollm2_table1.yaml at `--length`, `--tests` tests
  each, group by group, as a child stopped at `--budget-s` (the cells resume on a rerun).
  Each entry's score is the authors' (the share of the 4 needles found, averaged over the
  tests); per group the best factor is kept (ties: the hold value, then the smaller
  factor); a group without all its entries keeps the hold value and is listed as unprobed.
  Writes DIR/dpe_probe-L<length>.json (scores, chosen scales, seconds) and .md.
- `compare`: rope, string-repo and dpe (the scales of DIR/dpe_probe-L<length>.json, or
  `--scales`) at `--length`, `--tests` each: DIR/dpe_compare-L<length>.md.
- `both`: `probe`, then `compare` with `--compare-tests` once every group is probed, in one
  budget; for device calls: the cells are packed into DIR/cells.tar.xz at the end of every
  call and `--resume-from` that archive unpacks them first, so calls continue each other.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tarfile
import time
from pathlib import Path

from longctx.config.methods.dpe import probing_grid
from longctx.eval.cells import Cell, read_records

ROOT = Path(__file__).resolve().parents[2]

TABLE = "experiments/real/smollm2_table1.yaml"
TASK = "niah-paper"
WINDOW = 1024
"""W: the authors' local window for every released model."""


def training_length(model: Path) -> int:
    """L: the model's max_position_embeddings (SmolLM2: 8,192)."""
    return int(json.loads((model / "config.json").read_text())["max_position_embeddings"])


SETTINGS: list[str] = []
"""More eval.* overrides of every niah-table call (the smoke's short answers)."""


def arm_name(scales: str) -> str:
    return f"dpe-{scales}"


def arms_yaml(grid: dict, path: Path) -> None:
    """An overlay giving each distinct scale set of the grid an arm of its own."""
    lines = ["eval:", "  arms:"]
    for scales in dict.fromkeys(grid.values()):
        lines.append(
            f'    {arm_name(scales)}: {{name: dpe, dpe: {{local_window: {WINDOW}, scale_factors: "{scales}"}}}}'
        )
    path.write_text("\n".join(lines) + "\n")


def niah_table(
    model: Path, length: int, tests: int, work: Path, arms: list[str], extra: list[str], budget_s: float
) -> int:
    """`longctx niah-table` as a child on `arms`, stopped at the budget (-9); cells under work/cells."""
    argv = [sys.executable, "-m", "longctx", "niah-table", str(model), TABLE, *extra, "--lengths", str(length)]
    argv += [f"eval.niah.tests_per_length={tests}", "eval.niah.prefill_chunk_tokens=0", *SETTINGS]
    argv += ["--arms", ",".join(arms)]
    argv += ["--cells", str(work / "cells"), "--out", str(work / f"table-L{length}.md"), "--quiet"]
    try:
        return subprocess.run(argv, timeout=max(budget_s, 1.0), cwd=ROOT).returncode
    except subprocess.TimeoutExpired:
        return -9


def recall(work: Path, model: Path, arm: str, length: int, tests: int) -> float | None:
    """The authors' score of an arm: needles found / needles, averaged over its tests; None
    until it has `tests` records."""
    records = read_records(Cell(model.name, arm, TASK, length).directory(work / "cells") / "samples.jsonl")
    if len(records) < tests:
        return None
    found = [hit for record in records[:tests] for hit in record["found"]]
    return sum(found) / len(found)


def choose(grid: dict, scores: dict, hold: int, groups: int) -> tuple[list[int], list[int]]:
    """(s_g per group, the groups left at the hold value for want of scores)."""
    chosen, unprobed = [], []
    for group in range(1, groups + 1):
        entries = {f: scores.get(s) for (g, f), s in grid.items() if g == group}
        if any(score is None for score in entries.values()):
            chosen.append(hold)
            unprobed.append(group)
            continue
        chosen.append(max(entries, key=lambda f: (entries[f], f == hold, -f)))
    return chosen, unprobed


def run_probe(args: argparse.Namespace) -> int:
    start, out, model = time.monotonic(), Path(args.out), Path(args.model)
    out.mkdir(parents=True, exist_ok=True)
    grid = probing_grid(args.length, training_length(model))
    overlay = out / "dpe_probe_arms.yaml"
    arms_yaml(grid, overlay)
    ordered = [arm_name(s) for s in dict.fromkeys(grid.values())]  # group 1's factors first
    code = niah_table(model, args.length, args.tests, out, ordered, [str(overlay.resolve())], args.budget_s)
    scores = {s: recall(out, model, arm_name(s), args.length, args.tests) for s in set(grid.values())}
    hold = 2 * args.length // training_length(model)
    groups = len(next(iter(grid.values())).split("-"))
    chosen, unprobed = choose(grid, scores, hold, groups)
    result = {
        "length": args.length,
        "tests": args.tests,
        "window": WINDOW,
        "hold": hold,
        "scores": {f"g{g}-s{f}": scores[s] for (g, f), s in grid.items()},
        "scale_factors": "-".join(str(s) for s in chosen),
        "unprobed_groups": unprobed,
        "seconds": round(time.monotonic() - start, 1),
        "niah_table_exit": code,
    }
    (out / f"dpe_probe-L{args.length}.json").write_text(json.dumps(result, indent=1) + "\n")
    factors = sorted({f for _, f in grid})
    rows = [f"| group | {' | '.join(f's={f}' for f in factors)} |", "|---|" + "---|" * len(factors)]
    for group in range(1, groups + 1):
        cells = [scores[grid[group, f]] for f in factors]
        rows.append(f"| {group} | " + " | ".join("-" if c is None else f"{c:.2f}" for c in cells) + " |")
    summary = f"chosen scale_factors {result['scale_factors']} (unprobed groups: {unprobed or 'none'})"
    (out / f"dpe_probe-L{args.length}.md").write_text("\n".join([*rows, "", summary, ""]))
    print("\n".join([*rows, summary]))
    return 0 if not unprobed else 3


def run_compare(args: argparse.Namespace) -> int:
    out, model = Path(args.out), Path(args.model)
    scales = args.scales or json.loads((out / f"dpe_probe-L{args.length}.json").read_text())["scale_factors"]
    extra = [f"eval.arms.dpe.dpe.scale_factors={scales}", f"eval.arms.dpe.dpe.local_window={WINDOW}"]
    start = time.monotonic()
    code = niah_table(model, args.length, args.tests, out, ["rope", "string-repo", "dpe"], extra, args.budget_s)
    table = out / f"table-L{args.length}.md"
    if code == 0 and table.exists():
        text = table.read_text() + f"\ndpe scale_factors {scales}; {time.monotonic() - start:.0f} s\n"
        (out / f"dpe_compare-L{args.length}.md").write_text(text)
    return 0 if code == 0 else 3


def run_both(args: argparse.Namespace) -> int:
    start, out = time.monotonic(), Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.resume_from and Path(args.resume_from).is_file():
        with tarfile.open(args.resume_from, "r:xz") as tar:
            tar.extractall(out, filter="data")
    try:
        code = run_probe(args)
        if code == 0:
            left = args.budget_s - (time.monotonic() - start)
            code = run_compare(argparse.Namespace(**{**vars(args), "tests": args.compare_tests, "budget_s": left}))
    finally:
        if (out / "cells").is_dir():
            with tarfile.open(out / "cells.tar.xz", "w:xz") as tar:
                tar.add(out / "cells", arcname="cells")
    return code


def run_smoke(args: argparse.Namespace) -> int:
    """`both` on a tiny random Llama (L = 1,024) at 2,048 tokens, 1 test an entry, in two
    calls: the second from the first's archive only, as on a fresh machine."""
    import tempfile

    from real_table1 import tiny_model

    SETTINGS.append("eval.niah.max_new_tokens=8")
    out = Path(args.out)
    with tempfile.TemporaryDirectory(prefix="dpe_probe_smoke_") as scratch:
        model = tiny_model(Path(scratch) / "tiny", 1024)
        common = dict(model=str(model), length=2048, tests=1, compare_tests=1, scales="")
        first = argparse.Namespace(**common, out=str(out / "first"), budget_s=600.0, resume_from="")
        if run_both(first) != 0:
            return 1
        archive = str(out / "first" / "cells.tar.xz")
        again = argparse.Namespace(**common, out=str(out / "second"), budget_s=600.0, resume_from=archive)
        return run_both(again)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    modes = parser.add_subparsers(dest="mode", required=True)
    for name, run in (("probe", run_probe), ("compare", run_compare), ("both", run_both)):
        mode = modes.add_parser(name)
        mode.add_argument("model", help="the HF directory of SmolLM2-135M-Instruct")
        mode.add_argument("--length", type=int, default=8192, help="test length (SmolLM2: its training length first)")
        mode.add_argument("--tests", type=int, default=4)
        mode.add_argument("--out", required=True)
        mode.add_argument("--budget-s", type=float, default=3600.0)
        mode.add_argument("--scales", default="", help="compare: s_g joined by '-' (default: the probe's choice)")
        mode.add_argument("--compare-tests", type=int, default=100, help="both: tests per arm of the comparison")
        mode.add_argument("--resume-from", default="", help="both: a cells.tar.xz of an earlier call")
        mode.add_argument("--batch-tokens", type=int, default=0, help="eval.niah.batch_tokens (0: the YAML's)")
        mode.set_defaults(run=run)
    smoke = modes.add_parser("smoke", help="`both` twice on CPU with a tiny random model, the second resumed")
    smoke.add_argument("--out", required=True)
    smoke.set_defaults(run=run_smoke)
    args = parser.parse_args(argv)
    if getattr(args, "batch_tokens", 0):
        SETTINGS.append(f"eval.niah.batch_tokens={args.batch_tokens}")
    return args.run(args)


if __name__ == "__main__":
    raise SystemExit(main())
