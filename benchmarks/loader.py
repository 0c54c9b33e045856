"""Training-loader throughput: tokens/s the packed-row loader hands the trainer, one process.

Launch from the repository root:

    .venv/bin/python benchmarks/loader.py [--config experiments/replicate/gpu_base.yaml]
                                          [--windows 1024 2048 4096] [--seconds 20]

The trainer iterates `PackedRows` in its main process (`DataLoader(num_workers=0)`),
which costs nothing only while the loader outruns the model; this script measures the
loader alone for a config, to compare with the run's own `perf/tokens_per_s`. The
config's sources are prepared first (cached, as `longctx pretrain` does); the default
config mixes in the GPU twin's Debian prose, which `make twin-data` builds. Current
figures: docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import time

import torch

from longctx import config as config_module
from longctx.data.dataset_sources import prepared_sources
from longctx.data.pipeline import packed_rows
from longctx.data.tokenizer import load_tokenizer


def tokens_per_second(config_path: str, window: int, seconds: float) -> float:
    config = config_module.load([config_path], [f"data.window={window}"])
    tokenizer = load_tokenizer(config.data.tokenizer)
    sources = prepared_sources(config, tokenizer)
    rows = packed_rows(config.data, sources, tokenizer.eos_id)
    batches = iter(torch.utils.data.DataLoader(rows, batch_size=config.train.micro_batch_size, num_workers=0))
    next(batches)  # the first batch builds the epoch's tables
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        next(batches)
        count += 1
    return count * config.train.micro_batch_size * window / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="experiments/replicate/gpu_base.yaml")
    parser.add_argument("--windows", type=int, nargs="+", default=[1024, 2048, 4096])
    parser.add_argument("--seconds", type=float, default=20.0)
    args = parser.parse_args()
    print(f"| window | loader tokens/s ({args.config}) |\n|---|---|")
    for window in args.windows:
        print(f"| {window} | {tokens_per_second(args.config, window, args.seconds) / 1e3:,.0f}K |", flush=True)


if __name__ == "__main__":
    main()
