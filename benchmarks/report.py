"""Benchmark tables written where `make bench-gpu-*` collects them: DIR/<name>.json and
DIR/<name>.md (the Markdown rows pasted into docs/benchmarks.md), plus stdout.

    report.write(args.out, "train", columns, rows, device=..., notes=[...], settings={...})

The JSON holds the columns, the rows (as printed) and the settings (device, torch and
CUDA versions, repeats), so a table can be traced to the command that made it.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch


def environment() -> dict[str, str]:
    """torch, CUDA and device names of this process."""
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU"
    return {"device": device, "torch": torch.__version__, "cuda": str(torch.version.cuda)}


def markdown(columns: list[str], rows: list[list[str]]) -> str:
    lines = [columns, ["---:"] * len(columns), *rows]
    return "\n".join("| " + " | ".join(str(cell) for cell in cells) + " |" for cells in lines)


def write(
    out: str | None,
    name: str,
    columns: list[str],
    rows: list[list[str]],
    settings: dict | None = None,
    notes: tuple[str, ...] | list[str] = (),
) -> str:
    """Print the table; with `out`, also write out/<name>.json and out/<name>.md."""
    for row in rows:
        if len(row) != len(columns):
            raise ValueError(f"{name}: row {row} has {len(row)} cells for {len(columns)} columns {columns}")
    settings = {**environment(), **(settings or {})}
    header = "; ".join(f"{key} {value}" for key, value in settings.items())
    text = "\n\n".join([header, markdown(columns, rows), *notes]) + "\n"
    print(text, flush=True)
    if out:
        directory = Path(out)
        directory.mkdir(parents=True, exist_ok=True)
        record = {"name": name, "settings": settings, "columns": columns, "rows": rows, "notes": list(notes)}
        (directory / f"{name}.json").write_text(json.dumps(record, indent=1) + "\n")
        (directory / f"{name}.md").write_text(text)
    return text
