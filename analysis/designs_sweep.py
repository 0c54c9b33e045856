"""The designs sweep's results table (docs/designs.md): one row per arm, read from each
arm's run directory (`train.out_dir`: `metrics.jsonl` and `niah/step-N/niah.json`).

    PYTHONPATH=src python analysis/designs_sweep.py runs/designs --out docs/cpu-results/X
    PYTHONPATH=src python analysis/designs_sweep.py runs/designs --times runs/designs/times.log

Per arm: the steps and tokens trained; the training loss at the last step and its mean
over the last `--tail` logged steps (one step's loss on 3 rows is noisy), and that mean's
difference to the reference arm's, paired step by step (every arm trains the same rows at
each step) with its standard error over those steps; the held-out
answer loss and exact-value rate at its last probe (train/callbacks/answer.py); f(i) of
the full layers (STRING Eq. 2: pairs trained at relative position i; `fi/full_f@...` in a
model with linear layers, `fi/f@...` where every layer is full, the same count) at L/4,
L/2, 3L/4 and L-1; the NIAH effective length at the last probe (STRING §3: the longest
tested length whose pass rate is >= the threshold, 0 when the first fails) with each
tested length's pass rate (all 4 needles found) and recall (the share of needles found);
and the wall time from a `/usr/bin/time -f "NAME wall %e s"`
log, when given. An arm directory without metrics.jsonl is listed as not run.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import report

DISTANCES = ("L/4", "L/2", "3L/4", "L-1")
COLUMNS = [
    "arm",
    "steps",
    "tokens",
    "loss (last)",
    "loss (mean of tail)",
    "tail loss - reference's (se)",
    "answer loss",
    "answer exact",
    *(f"f({d})" for d in DISTANCES),
    "NIAH eff. length",
    "NIAH pass rate / recall by length",
    "wall s",
]


def rows_of(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def last(rows: list[dict], key: str):
    values = [row[key] for row in rows if key in row]
    return values[-1] if values else None


def niah_last_probe(run_dir: Path) -> dict | None:
    """The last NIAH probe's lengths tested with their pass rates and needle recall
    (niah/step-N/niah.json, `per_length`), or None."""
    probes = sorted((run_dir / "niah").glob("step-*/niah.json"))
    if not probes:
        return None
    per_length = json.loads(probes[-1].read_text())["per_length"]
    return {
        "step": int(probes[-1].parent.name.split("-")[1]),
        "lengths": [int(row["length"]) for row in per_length],
        "rate": [float(row["rate"]) for row in per_length],
        "recall": [float(row["recall"]) for row in per_length],
    }


def wall_times(path: Path | None) -> dict[str, float]:
    """NAME -> seconds, summed over the lines `NAME wall S s` (a killed and resumed arm has
    the resumed part only: the killed process wrote none)."""
    times: dict[str, float] = {}
    if path is None or not path.exists():
        return times
    for match in re.finditer(r"^(\S+) wall ([0-9.]+) s$", path.read_text(), re.M):
        times[match.group(1)] = times.get(match.group(1), 0.0) + float(match.group(2))
    return times


def step_losses(run_dir: Path) -> dict[int, float]:
    """step -> training loss (a step logged twice, as after a resume: the later)."""
    return {row["step"]: row["train/loss"] for row in rows_of(run_dir) if "train/loss" in row}


def paired_difference(losses: dict[int, float], reference: dict[int, float], tail: int) -> tuple[float, float]:
    """Mean and standard error over the last `tail` steps of loss - the reference's loss at
    the same step. Every arm trains the same rows at each step, so the pairing removes the
    batch-to-batch swings; the error is over steps within one seed, not between seeds."""
    steps = sorted(set(losses) & set(reference))[-tail:]
    differences = [losses[s] - reference[s] for s in steps]
    mean = sum(differences) / len(differences)
    if len(differences) < 2:
        return mean, float("nan")
    variance = sum((d - mean) ** 2 for d in differences) / (len(differences) - 1)
    return mean, (variance / len(differences)) ** 0.5


def summarise(run_dir: Path, tail: int) -> dict:
    rows = rows_of(run_dir)
    losses = list(step_losses(run_dir).values())
    prefix = "fi/full_f@" if any(k.startswith("fi/full_f@") for row in rows for k in row) else "fi/f@"
    return {
        "steps": last(rows, "step"),
        "tokens": last(rows, "train/tokens_seen"),
        "loss_last": losses[-1] if losses else None,
        "loss_tail_mean": sum(losses[-tail:]) / len(losses[-tail:]) if losses else None,
        "answer_loss": last(rows, "answers/loss"),
        "answer_exact": last(rows, "answers/value_exact"),
        "fi_key": prefix,
        "fi": {d: last(rows, f"{prefix}{d}") for d in DISTANCES},
        "niah_effective_length": last(rows, "niah/effective_length"),
        "niah": niah_last_probe(run_dir),
    }


def niah_cell(probe: dict | None) -> str:
    """`L: rate / recall` for each length of the last probe."""
    if not probe:
        return "-"
    cells = zip(probe["lengths"], probe["rate"], probe["recall"], strict=True)
    return ", ".join(f"{length}: {rate:.2f} / {recall:.2f}" for length, rate, recall in cells)


def cell(value, form: str = "{}") -> str:
    return "-" if value is None else form.format(value)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", type=Path, help="directory with one run directory per arm")
    parser.add_argument("--arms", nargs="*", help="arm directory names in table order (default: all, sorted)")
    parser.add_argument("--times", type=Path, help="a /usr/bin/time log with lines `NAME wall S s`")
    parser.add_argument("--tail", type=int, default=20, help="logged steps in the loss mean")
    parser.add_argument("--reference", help="the arm whose loss the others' is paired with (default: the first)")
    parser.add_argument("--out", help="directory for designs_sweep.{json,md} and designs_sweep_arms.json")
    parser.add_argument("--note", action="append", default=[], help="a line under the table")
    args = parser.parse_args()
    arms = args.arms or sorted(p.name for p in args.root.iterdir() if p.is_dir())
    times = wall_times(args.times)
    present = [arm for arm in arms if (args.root / arm / "metrics.jsonl").exists()]
    reference = args.reference or (present[0] if present else None)
    reference_losses = step_losses(args.root / reference) if reference else {}
    results, rows = {}, []
    for arm in arms:
        run_dir = args.root / arm
        if not (run_dir / "metrics.jsonl").exists():
            rows.append([arm, "not run", *([""] * (len(COLUMNS) - 2))])
            continue
        result = results[arm] = {**summarise(run_dir, args.tail), "wall_s": times.get(arm)}
        difference = paired_difference(step_losses(run_dir), reference_losses, args.tail)
        result["tail_loss_minus_reference"] = {"reference": reference, "mean": difference[0], "se": difference[1]}
        rows.append(
            [
                arm,
                cell(result["steps"]),
                cell(result["tokens"], "{:.0f}"),
                cell(result["loss_last"], "{:.3f}"),
                cell(result["loss_tail_mean"], "{:.3f}"),
                "-" if arm == reference else "{mean:+.3f} ({se:.3f})".format(**result["tail_loss_minus_reference"]),
                cell(result["answer_loss"], "{:.3f}"),
                cell(result["answer_exact"], "{:.2f}"),
                *(cell(result["fi"][d], "{:.0f}") for d in DISTANCES),
                cell(result["niah_effective_length"], "{:.0f}"),
                niah_cell(result["niah"]),
                cell(result["wall_s"], "{:.0f}"),
            ]
        )
    settings = {"root": str(args.root), "tail": args.tail}
    report.write(args.out, "designs_sweep", COLUMNS, rows, settings=settings, notes=args.note)
    if args.out:  # every number of every arm, unrounded
        (Path(args.out) / "designs_sweep_arms.json").write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
