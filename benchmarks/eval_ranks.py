"""Evaluation throughput on 1 rank vs several (torchrun): samples per second of one grid.

Launch from the repository root:

    .venv/bin/python benchmarks/eval_ranks.py [--ranks 2] [--tests 16] [--preset tiny] [--out DIR]
    .venv/bin/python benchmarks/eval_ranks.py --device cuda --out DIR   # 1 GPU vs every GPU of the node

What it measures: the NIAH table's grid (eval/niah/table.py; bpe-8192, the Paul Graham
haystack, `paper` prompts, a random-init `--preset` model at max_position `--lengths[-1]`)
run by `run_grid` in fresh processes, once by one process and once by `--ranks` torchrun
ranks (gloo on CPU with one thread per rank, so 1 rank uses 1 core and 2 ranks 2 cores;
nccl and one GPU per rank on CUDA, `--ranks` default: every GPU), side by side in one run:

- `whole cells`: rope and string at each of `--lengths`, more cells than ranks, so each
  rank runs whole cells (eval/ranks.py's rule);
- `one cell, spread`: string at the longest length alone, its batches dealt to the ranks.

Each row: the ranks, the samples decoded, the wall time of `run_grid` on rank 0 (after
every rank has loaded the model and tokenised the haystack; start-up not counted),
samples/s, and the ratio to the 1-rank row of the same grid. Each process writes its cells
to a fresh directory, so every sample is decoded. `--smoke`: the `debug` model, 2 lengths of
128/256 tokens and 4 tests, on CPU.

The host's load average is printed with the table: on a 2-core machine shared with other
work the 2-rank ratio says more about the load than about the code.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import report
import torch

from longctx.config import ExperimentConfig
from longctx.config.model import ModelConfig
from longctx.config.position_methods import PositionMethodConfig, StringConfig
from longctx.data.tokenizer import load_tokenizer
from longctx.eval.cells import Decoding, run_grid
from longctx.eval.niah.haystack import Haystack
from longctx.eval.niah.table import niah_grid
from longctx.eval.ranks import Ranks
from longctx.model.llama import Llama

GRIDS = ("whole cells", "one cell, spread")


def worker(args: argparse.Namespace) -> None:
    """One rank: build the model and haystack, then time `run_grid` (rank 0 prints JSON)."""
    device = torch.device(f"cuda:{os.environ.get('LOCAL_RANK', '0')}" if args.device == "cuda" else "cpu")
    torch.set_num_threads(1 if args.device == "cpu" else torch.get_num_threads())
    with Ranks.joined(device) as ranks:
        torch.manual_seed(0)
        model = Llama(ModelConfig.from_preset(args.preset, max_position=max(args.lengths))).to(device).eval()
        tokenizer = load_tokenizer("bpe-8192")
        haystack = Haystack.paul_graham(tokenizer)
        config = ExperimentConfig()
        config.eval.niah.tests_per_length = args.tests
        config.eval.niah.max_new_tokens = args.new_tokens
        string = PositionMethodConfig(name="string", string=StringConfig(local_window=min(args.lengths) // 8))
        arms = {"rope": PositionMethodConfig(name="rope"), "string": string}
        if args.grid == GRIDS[1]:
            grid = niah_grid({"m": model}, {"string": string}, config, haystack, [max(args.lengths)])
        else:
            grid = niah_grid({"m": model}, arms, config, haystack, list(args.lengths))
        ranks.barrier()
        start = time.perf_counter()
        results = run_grid(grid, tokenizer, args.cells, Decoding(batch_tokens=args.batch_tokens), ranks=ranks)
        ranks.barrier()
        seconds = time.perf_counter() - start
        if ranks.lead:
            samples = sum(result.decoded for result in results)
            print("RESULT " + json.dumps({"samples": samples, "seconds": seconds, "cells": len(results)}))


def launch(args: argparse.Namespace, grid: str, ranks: int, cells: Path) -> dict:
    """One measurement in fresh processes: python for 1 rank, torchrun for more."""
    options = [
        "--worker",
        "--grid",
        grid,
        "--cells",
        str(cells),
        "--device",
        args.device,
        "--preset",
        args.preset,
        "--tests",
        str(args.tests),
        "--new-tokens",
        str(args.new_tokens),
        "--batch-tokens",
        str(args.batch_tokens),
        "--lengths",
        *map(str, args.lengths),
    ]
    script = str(Path(__file__).resolve())
    if ranks == 1:
        command = [sys.executable, script, *options]
    else:
        command = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={ranks}", script, *options]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return json.loads(lines[0].removeprefix("RESULT "))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--ranks", type=int, default=0, help="ranks to compare with 1 (0: 2 on CPU, every GPU)")
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--lengths", type=int, nargs="+", default=[256, 512])
    parser.add_argument("--tests", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--batch-tokens", type=int, default=1024)
    parser.add_argument("--out", default="")
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--grid", default=GRIDS[0], help=argparse.SUPPRESS)
    parser.add_argument("--cells", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.smoke:
        args.device, args.preset, args.lengths, args.tests, args.new_tokens = "cpu", "debug", [128, 256], 4, 4
    if args.worker:
        worker(args)
        return
    ranks = args.ranks or (torch.cuda.device_count() if args.device == "cuda" else 2)
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for grid in GRIDS:
            base = None
            for world in sorted({1, ranks}):
                measured = launch(args, grid, world, Path(scratch) / f"{grid}-{world}".replace(" ", "_"))
                rate = measured["samples"] / measured["seconds"]
                base = base or rate
                rows.append(
                    [
                        grid,
                        str(world),
                        str(measured["samples"]),
                        f"{measured['seconds']:.1f}",
                        f"{rate:.2f}",
                        f"{rate / base:.2f}x",
                    ]
                )
    notes = [f"load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}"]
    if ranks == 1:
        notes.append("one device only: no multi-rank row (run on a machine with several GPUs)")
    settings = {
        "preset": args.preset,
        "lengths": args.lengths,
        "tests": args.tests,
        "new_tokens": args.new_tokens,
        "threads per rank": 1 if args.device == "cpu" else "default",
    }
    if args.device == "cpu":
        settings["device"] = "CPU"
    columns = ["grid", "ranks", "samples", "seconds", "samples/s", "vs 1 rank"]
    report.write(args.out or None, "eval_ranks", columns, rows, settings=settings, notes=notes)


if __name__ == "__main__":
    main()
