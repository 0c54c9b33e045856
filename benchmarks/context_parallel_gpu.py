"""Context parallelism on GPUs: the flex path under a sequence shard against the flash path
at 64K on one GPU, and CP scaling over the GPUs of one machine.

    python benchmarks/context_parallel_gpu.py --out DIR            # one GPU: table cp_single
    python -m torch.distributed.run --nproc-per-node 8 --standalone \\
        benchmarks/context_parallel_gpu.py --cp --out DIR          # CP = every rank: table cp_scaling
    python benchmarks/context_parallel_gpu.py --smoke --out DIR    # CPU, tiny: checks the script runs

One training micro-step (forward with the chunked loss, backward; no optimizer) of
tinyllama-1.1b shapes (`--layers` of them, vocabulary 32,000) on one `--length`-token row
(default 65,536) packed with documents of seeded lengths (positions reset per document),
bf16 autocast and activation checkpointing as `longctx pretrain` runs it. Median of
`--repeats` steps after a warm-up (compilation), CUDA-synchronised; tokens/s = row tokens
/ step time; peak = `torch.cuda.max_memory_allocated` during the timed steps.

`cp_single` rows: `flash` (the varlen kernel, the row unsharded), `flex` (the document
BlockMask, unsharded) and `flex, shard of 1` (the same row through the context-parallel
path on a one-rank group: balancer, shard, K/V all-gather, the shard's BlockMask), whose
ratio to `flex` is the machinery's cost. `cp_scaling` (under torchrun, N = world): each
rank its 1/N of the row (head_tail), model replicated (the parameters' FSDP sharding is
not what is timed); tokens/s of the whole row and every rank's peak. `--smoke` runs on CPU
with the dense sdpa backend in place of flash and flex (CPU has no flex backward).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import report
import torch
import torch.distributed as dist

from longctx.config.model import ModelConfig
from longctx.model.llama import Llama
from longctx.model.sequence_shard import SequenceShard
from longctx.train.context_parallel import context_parallel_mesh, shard_batch


def packed_row(length: int, vocab: int, device: torch.device) -> dict[str, torch.Tensor]:
    """One row of documents of seeded lengths (mean ~length / 12), positions per document."""
    generator = torch.Generator().manual_seed(0)
    lengths, left = [], length
    while left:
        size = min(left, int(torch.randint(length // 64 + 1, length // 6 + 2, (1,), generator=generator)))
        lengths.append(size)
        left -= size
    documents = torch.cat([torch.full((n,), i) for i, n in enumerate(lengths)])[None]
    positions = torch.cat([torch.arange(n) for n in lengths])[None]
    tokens = torch.randint(0, vocab, (1, length + 1), generator=generator)
    batch = {"input_ids": tokens[:, :-1], "labels": tokens[:, 1:], "position_ids": positions, "document_ids": documents}
    return {key: value.to(device) for key, value in batch.items()}


def step(model: Llama, batch: dict[str, torch.Tensor], backend: str, shard: SequenceShard | None) -> None:
    ids = (batch["input_ids"], batch["position_ids"], batch["document_ids"])
    kwargs = {"sequence_shard": shard} if shard is not None else {"max_seqlen": batch["input_ids"].shape[1]}
    device_type = batch["input_ids"].device.type
    with torch.autocast(device_type, torch.bfloat16, enabled=device_type == "cuda"):
        loss = model(*ids, labels=batch["labels"], loss_chunk_tokens=4096, attention_backend=backend, **kwargs)
    loss.backward()


def timed(model: Llama, batch, backend: str, shard, repeats: int, device: torch.device) -> tuple[float, float]:
    """(median seconds of a step, peak GiB) after one warm-up step."""
    step(model, batch, backend, shard)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    seconds = []
    for _ in range(repeats):
        model.zero_grad(set_to_none=True)
        start = time.perf_counter()
        step(model, batch, backend, shard)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        seconds.append(time.perf_counter() - start)
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else float("nan")
    return statistics.median(seconds), peak


def build_model(args: argparse.Namespace, device: torch.device) -> Llama:
    shape = {"d_model": 64, "n_heads": 4, "n_kv_heads": 2, "d_ff": 128} if args.smoke else {}
    config = ModelConfig.from_preset(
        "tinyllama-1.1b", vocab_size=32000, n_layers=args.layers, max_position=args.length, **shape
    )
    torch.manual_seed(0)
    model = Llama(config).to(device)
    model.activation_checkpointing = True
    return model


def single(args: argparse.Namespace, device: torch.device) -> None:
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=0, world_size=1)
    model = build_model(args, device)
    batch = packed_row(args.length, 32000, device)
    flash, flex = ("sdpa", "sdpa") if args.smoke else ("flash", "flex")
    local, shard, _ = shard_batch(batch, context_parallel_mesh(1, 1, device.type)["context_parallel"])
    rows = []
    for name, backend, rows_in, sequence_shard in (
        ("flash", flash, batch, None),
        ("flex", flex, batch, None),
        ("flex, shard of 1", flex, local, shard),
    ):
        seconds, peak = timed(model, rows_in, backend, sequence_shard, args.repeats, device)
        rows.append([name, backend, f"{args.length:,}", f"{args.length / seconds:,.0f}", f"{peak:.1f}"])
    settings = {"layers": args.layers, "length": args.length, "repeats": args.repeats}
    columns = ["path", "backend", "row tokens", "tokens/s", "peak GiB"]
    report.write(args.out, "cp_single", columns, rows, settings)
    dist.destroy_process_group()


def scaling(args: argparse.Namespace, device: torch.device) -> None:
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    size, rank = dist.get_world_size(), dist.get_rank()
    if device.type == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    model = build_model(args, device)
    mesh = context_parallel_mesh(1, size, device.type)["context_parallel"]
    local, shard, work = shard_batch(packed_row(args.length, 32000, device), mesh)
    seconds, peak = timed(model, local, "sdpa" if args.smoke else "flex", shard, args.repeats, device)
    peaks = [torch.zeros(1, device=device) for _ in range(size)]
    dist.all_gather(peaks, torch.tensor([peak], device=device))
    if rank == 0:
        imbalance = float(work.max() / work.mean())
        row = [str(size), f"{args.length:,}", f"{args.length / seconds:,.0f}", f"{imbalance:.3f}"]
        row.append(" / ".join(f"{float(p):.1f}" for p in peaks))
        settings = {"layers": args.layers, "length": args.length, "repeats": args.repeats}
        columns = ["CP", "row tokens", "tokens/s", "work max/mean", "peak GiB per rank"]
        report.write(args.out, "cp_scaling", columns, [row], settings)
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="directory for the tables")
    parser.add_argument("--smoke", action="store_true", help="CPU, tiny shapes, sdpa: checks the script runs")
    parser.add_argument("--cp", action="store_true", help="under torchrun: CP over every rank")
    parser.add_argument("--length", type=int, default=65536)
    parser.add_argument("--layers", type=int, default=22)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    if args.smoke:
        args.length, args.layers, args.repeats = 512, 2, 1
    if not args.cp:  # a one-rank group of this process
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(29700 + os.getpid() % 200))
    device = torch.device("cpu" if args.smoke else "cuda")
    scaling(args, device) if args.cp else single(args, device)


if __name__ == "__main__":
    main()
