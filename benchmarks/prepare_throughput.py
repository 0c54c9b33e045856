"""`longctx prepare` throughput on SlimPajama-format shards against the tokenizer's own limit.

Launch from the repository root:

    .venv/bin/python benchmarks/prepare_throughput.py [--tokenizer llama3] [--shard-mb 4]
                                                      [--shards 2] [--workers 1 2] [--out DIR]

Writes `--shards` generated `.jsonl.zst` shards of about `--shard-mb` MB of text each
(SlimPajama's line format: {"text": ..., "meta": {"redpajama_set_name": ...}}; the text is
English prose cut from the embedded pydoc pages at log-normal lengths, median ~2K characters)
and measures, side by side in one run:

- limit: the same tokenizer's `encode_batch` on one thread (`RAYON_NUM_THREADS=1`, in a
  subprocess so the setting takes), over the same texts already in memory (no reading,
  decompressing, JSON parsing or writing), in the batches `longctx prepare` uses;
- prepare at each `--workers` count: the whole `prepare_shards` call, wall clock, from
  finding the shards to the manifest (reading, zstd, JSON, tokenising, litdata's chunk
  writing, the read-back of lengths and the checksums included).

Per worker = tokens / seconds / workers; the target is >= 80% of the limit. A run also pays
a fixed cost (litdata's worker start, the bookkeeping, the join: the row of a one-document
shard), which real shards (SlimPajama's hold ~60M tokens each) spread over minutes; the
figures in brackets leave it out. The last rows
project 627B tokens (SlimPajama) per node at the measured per-worker rate.
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

import numpy as np
import report

LIMIT_SCRIPT = """
import json, sys, time
import zstandard
from longctx.data.sharded_prepare import BATCH_CHARS
from longctx.data.tokenizer import load_tokenizer
tokenizer = load_tokenizer(sys.argv[1])
texts = []
for path in sys.argv[2:]:
    data = zstandard.ZstdDecompressor().decompressobj().decompress(open(path, "rb").read())
    texts += [json.loads(line)["text"] for line in data.decode().splitlines()]
batches, batch, size = [], [], 0
for text in texts:
    batch.append(text)
    size += len(text)
    if size >= BATCH_CHARS:
        batches.append(batch)
        batch, size = [], 0
batches.append(batch)
tokenizer.encode_batch(batches[0][:8])  # warm-up
start = time.perf_counter()
tokens = sum(len(ids) + 1 for batch in batches for ids in tokenizer.encode_batch(batch))
print(json.dumps({"tokens": tokens, "seconds": time.perf_counter() - start}))
"""


def write_shards(directory: Path, shards: int, megabytes: float, seed: int = 0) -> list[Path]:
    from pydoc_data.topics import topics

    import zstandard

    prose = "\n\n".join(topics[name] for name in sorted(topics))
    rng = np.random.default_rng(seed)
    sets = ["RedPajamaCommonCrawl", "RedPajamaC4", "RedPajamaWikipedia", "RedPajamaBook", "RedPajamaArXiv"]
    paths = []
    for shard in range(shards):
        lines, size = [], 0
        while size < megabytes * 1e6:
            length = int(min(rng.lognormal(np.log(2000), 1.0), len(prose) - 1))
            start = int(rng.integers(0, len(prose) - length))
            text = prose[start : start + length]
            lines.append(json.dumps({"text": text, "meta": {"redpajama_set_name": sets[len(lines) % len(sets)]}}))
            size += len(text)
        path = directory / "train" / f"chunk{shard + 1}" / f"example_train_{shard}.jsonl.zst"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(zstandard.ZstdCompressor(level=3).compress(("\n".join(lines) + "\n").encode()))
        paths.append(path)
    return paths


def limit(tokenizer: str, paths: list[Path]) -> tuple[int, float]:
    env = {**os.environ, "RAYON_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
    result = subprocess.run(
        [sys.executable, "-c", LIMIT_SCRIPT, tokenizer, *map(str, paths)],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    record = json.loads(result.stdout.strip().splitlines()[-1])
    return record["tokens"], record["seconds"]


def fixed_cost(root: Path, tokenizer: str) -> float:
    """Seconds of a whole `prepare_shards` run over one one-line shard: finding shards,
    starting litdata's workers, the round's bookkeeping, the join; what a run pays once
    (and a round once per `--workers` shards), apart from the per-token work."""
    from longctx.data.sharded_prepare import prepare_shards

    (root / "one").mkdir()
    (root / "one" / "a.jsonl").write_text(json.dumps({"text": "one short document"}) + "\n")
    start = time.perf_counter()
    prepare_shards([str(root / "one")], root / "out-one", tokenizer, verbose=False)
    return time.perf_counter() - start


def main() -> None:
    from longctx.data.sharded_prepare import prepare_shards

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokenizer", default="llama3")
    parser.add_argument("--shard-mb", type=float, default=4.0)
    parser.add_argument("--shards", type=int, default=2)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--out", default=None, help="write prepare_throughput.{json,md} here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="longctx-bench-") as scratch:
        root = Path(scratch)
        paths = write_shards(root / "corpus", args.shards, args.shard_mb)
        limit_tokens, limit_seconds = limit(args.tokenizer, paths)
        limit_rate = limit_tokens / limit_seconds
        rows = [["encode_batch, 1 thread, texts in memory (limit)", "1", f"{limit_tokens:,}", f"{limit_seconds:.1f}",
                 f"{limit_rate / 1e3:,.0f}K", f"{limit_rate / 1e3:,.0f}K", "100%"]]  # fmt: skip
        fixed = fixed_cost(root, args.tokenizer)
        rows.append(
            ["longctx prepare of a one-document shard (fixed cost per run)", "1", "-", f"{fixed:.1f}", "-", "-", "-"]
        )
        per_worker = {}
        for workers in args.workers:
            start = time.perf_counter()
            manifest = prepare_shards(
                [str(root / "corpus")], root / f"out-{workers}", args.tokenizer, num_workers=workers, verbose=False
            )
            seconds = time.perf_counter() - start
            if manifest["tokens"] != limit_tokens:
                raise SystemExit(f"prepare wrote {manifest['tokens']} tokens, encode_batch counted {limit_tokens}")
            rate = manifest["tokens"] / seconds
            per_worker[workers] = rate / workers
            steady = manifest["tokens"] / max(seconds - fixed, 1e-9) / workers
            rows.append(
                [f"longctx prepare, {workers} worker(s)", str(workers), f"{manifest['tokens']:,}", f"{seconds:.1f}",
                 f"{rate / 1e3:,.0f}K", f"{rate / workers / 1e3:,.0f}K ({steady / 1e3:,.0f}K less the fixed cost)",
                 f"{100 * rate / workers / limit_rate:.0f}% ({100 * steady / limit_rate:.0f}%)"]
            )  # fmt: skip
    slimpajama = 627e9
    best = max(per_worker.values())
    for workers in (16, 64):
        hours = slimpajama / (best * workers) / 3600
        rows.append([f"627B tokens on one node, {workers} workers (projected)", str(workers), "627B", f"{hours:,.0f} h",
                     f"{best * workers / 1e6:,.1f}M", f"{best / 1e3:,.0f}K", "-"])  # fmt: skip
    cores = os.cpu_count()
    load = os.getloadavg()[0]
    report.write(
        args.out,
        "prepare_throughput",
        ["run", "workers", "tokens", "seconds", "tokens/s", "tokens/s per worker", "of the limit"],
        rows,
        settings={
            "tokenizer": args.tokenizer,
            "shards": args.shards,
            "shard_mb": args.shard_mb,
            "cores": cores,
            "load_before": round(load, 2),
        },
        notes=[
            "Projection rows: the best measured per-worker rate times the workers, i.e. one core per worker "
            "and no other bottleneck (disk, the output store) assumed."
        ],
    )


if __name__ == "__main__":
    main()
