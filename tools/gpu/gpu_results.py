"""GPU tables into the docs as measured: copied from the result files, never typed.

    python tools/gpu/gpu_results.py sync docs/benchmarks.md      # rewrite the blocks
    python tools/gpu/gpu_results.py sync --check docs/benchmarks.md

A GPU run's tables come back as files (`<table>.md` with a header line and the table, and
`<table>.json` with its rows), committed under docs/gpu-results/<device>-<date>/. A doc shows
them through marked blocks, which `sync` fills and `--check` (tests/tools/test_gpu_results.py)
compares:

    <!-- gpu-table docs/gpu-results/h100-2026-11-27/run1/train_step.md -->
    (the file's header line, its table, its notes)
    <!-- /gpu-table -->

    <!-- gpu-targets docs/gpu-results/h100-2026-11-27/run1 -->
    (where it was measured: device, torch, CUDA and commit; then one row per documented
    target and measured row: the number and met / missed)
    <!-- /gpu-targets -->

A target is met only by a row measured on a GPU, so a targets block names the device and
the torch and CUDA versions its tables recorded and the commit of the checklist record
(tools/gpu/gpu_steps.toml) whose results folder holds them.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[2]
BLOCK = re.compile(r"(<!-- gpu-(table|targets) (\S+) -->\n)(.*?)(<!-- /gpu-\2 -->)", re.DOTALL)


@dataclass(frozen=True)
class Target:
    """A documented goal read off one table: every row whose `key` column is in `rows`."""

    goal: str
    table: str
    key: str
    rows: tuple[str, ...]
    measure: Callable[[dict[str, str], list[str]], float | None]
    """The row (column -> cell; a repeated column name keeps its first cell) and the raw
    cells -> the measured number, None where the row has none."""
    meets: Callable[[float], bool]
    shown: str
    """Format of the measured number."""


def cell(column: str, index: int = 0) -> Callable[[dict[str, str], list[str]], float | None]:
    """The number in `column` (its index-th occurrence), '%' and 'x' stripped."""

    def read(row: dict[str, str], raw: list[str]) -> float | None:
        text = raw[index] if index else row[column]
        number = re.match(r"^[\d.]+", text.strip())
        return float(number.group()) if number else None

    return read


def estimate_over_peak(row: dict[str, str], raw: list[str]) -> float | None:
    peak, estimate = cell("peak GiB")(row, raw), cell("estimate GiB")(row, raw)
    return estimate / peak if peak and estimate else None


OURS = ("longctx flash", "longctx flash, packed")
TARGETS = (
    Target("train step MFU >= 50%", "train_step", "impl", OURS, cell("MFU"), lambda m: m >= 50, "{:.1f}%"),
    Target("train step >= 1.5x HF sdpa", "train_step", "impl", OURS, cell("vs HF"), lambda m: m >= 1.5, "{:.2f}x"),
    Target(
        "StRing prefill <= 1.3x RoPE at 32K and 128K",
        "positions_tinyllama-1.1b",
        "method",
        ("string",),
        cell("vs rope"),
        lambda m: m <= 1.3,
        "{:.2f}x",
    ),
    Target(
        "Llama-3.1-8B shapes, StRing prefill at 128K fits 80 GB",
        "positions_llama3.1-8b",
        "method",
        ("string",),
        cell("peak GiB"),
        lambda m: m <= 80,
        "{:.1f} GiB",
    ),
    Target(
        "memory estimate within 25% above the measured peak",
        "train_step",
        "impl",
        OURS,
        estimate_over_peak,
        lambda m: 1.0 <= m <= 1.25,
        "{:.2f}x",
    ),
)


def read_table(path: Path) -> dict:
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such result file")
    return json.loads(path.read_text())


def target_rows(results: Path) -> list[list[str]]:
    """[goal, table: row, measured, verdict] for every target whose table `results` holds."""
    out = []
    for target in TARGETS:
        path = results / f"{target.table}.json"
        if not path.exists():
            continue
        table = read_table(path)
        columns = table["columns"]
        for raw in table["rows"]:
            row = dict(reversed(list(zip(columns, raw, strict=True))))  # first occurrence wins
            if row[target.key] not in target.rows:
                continue
            measured = target.measure(row, raw)
            if measured is None:
                continue
            where = f"{target.table}: {row.get('T', '')} {row[target.key]}".replace(":  ", ": ")
            verdict = "met" if target.meets(measured) else "missed"
            out.append([target.goal, where, target.shown.format(measured), verdict])
    return out


def provenance(results: Path) -> str:
    """'measured on DEVICE, torch T, CUDA C, commit X' for a results folder: the versions its
    first target table recorded, the commit of the checklist record that holds the folder."""
    tables = [results / f"{target.table}.json" for target in TARGETS]
    settings: dict = next((read_table(path)["settings"] for path in tables if path.exists()), {})
    relative = str(results.relative_to(REPOSITORY)) if results.is_relative_to(REPOSITORY) else str(results)
    steps = tomllib.loads((REPOSITORY / "tools" / "gpu" / "gpu_steps.toml").read_text())["step"]
    records = [record for step in steps for record in step.get("done", [])]
    commit = next((r["commit"] for r in records if relative.startswith(r["results"])), "not recorded")
    versions = ", ".join(
        f"{name} {settings.get(key, 'not recorded')}" for key, name in (("torch", "torch"), ("cuda", "CUDA"))
    )
    return f"measured on {settings.get('device', 'an unrecorded device')}, {versions}, commit {commit}"


def render_targets(results: Path) -> str:
    lines = [provenance(results), "", "| target | row | measured | verdict |", "| --- | --- | ---: | --- |"]
    lines += ["| " + " | ".join(row) + " |" for row in target_rows(results)]
    return "\n".join(lines) + "\n"


def render_table(path: Path) -> str:
    """The .md as the script wrote it, its blank lines kept, without a trailing blank."""
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such result file")
    return path.read_text().strip("\n") + "\n"


def sync(doc: Path) -> tuple[str, str]:
    """(the doc as it is, the doc with every block refilled)."""
    text = doc.read_text()

    def fill(match: re.Match) -> str:
        kind, source = match.group(2), REPOSITORY / match.group(3)
        body = render_table(source) if kind == "table" else render_targets(source)
        return match.group(1) + body + match.group(5)

    return text, BLOCK.sub(fill, text)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    sync_parser = commands.add_parser("sync")
    sync_parser.add_argument("doc", type=Path)
    sync_parser.add_argument("--check", action="store_true", help="exit 1 if a block differs from its files")
    args = parser.parse_args()
    before, after = sync(args.doc)
    if args.check:
        if before != after:
            print(f"{args.doc}: a gpu-table or gpu-targets block differs from its result files; run sync")
        return int(before != after)
    if before != after:
        args.doc.write_text(after)
    print(f"{args.doc}: {len(BLOCK.findall(after))} blocks, {'rewritten' if before != after else 'in sync'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
