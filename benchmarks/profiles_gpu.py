"""torch.profiler summaries on a GPU: one training step and one layer's StRing prefill.

    python3 benchmarks/profiles_gpu.py --out DIR [--train-length 2048] [--train-batch 8] [--compile]
        [--prefill-length 32768]
    PYTHONPATH=src python benchmarks/profiles_gpu.py --smoke --out /tmp/profiles   # CPU, tiny sizes

Where the time of the two long-running GPU paths goes, op by op:

1. `profile_train_step.md`: one training step of tinyllama-1.1b (vocabulary 32,000) on
   `--train-batch` packed, document-masked rows of `--train-length` tokens, as train_gpu.py
   builds its `longctx flash, packed` row (`library_steps`: the seeded model, fused AdamW,
   `DeviceStep` under bf16 autocast, the loss chunked per row length as `longctx pretrain`
   runs it; blocks under torch.compile with `--compile`). Two unprofiled steps first (AdamW's
   state, compilation), then one profiled step.
2. `profile_string_prefill.md`: a one-layer tinyllama-1.1b model (bf16, `fuse_projections_`,
   attention backend auto: flash on a GPU) prefilling one `--prefill-length` prompt into a
   fresh KV cache with `last_logits_only`, as position_methods.py's device table times it
   (`model_ops`; training length = the prompt length, so StRing has S = T/3, W = 128), for
   StRing and, for comparison, plain RoPE. One unprofiled prefill first.

Each summary is `key_averages()`'s table, the top 30 ops by self device time on CUDA (self
CPU time elsewhere), in a code block under the settings and the profiled call's
synchronised wall time (profiling adds to it: use train_gpu.py and position_methods.py for
times). Writes also profiles_gpu.md and .json (benchmarks/report.py): one row per profile,
its wall time and its three costliest ops.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path

import report
import torch
from attention import stdlib_document_lengths
from position_methods import build, model_ops
from train_gpu import library_steps, release
from train_step import Implementation, rows_for, token_blocks

from longctx.config.model import ModelConfig
from longctx.model.llama import Llama

SEED = 0
ROWS = 30
COLUMNS = ["profile", "shape", "profiled ms", "top ops (self time)"]


def activities(device: torch.device) -> list:
    from torch.profiler import ProfilerActivity

    return [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])


def sort_key(device: torch.device) -> str:
    return "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def profiled(call: Callable[[], object], device: torch.device):
    """(key averages, synchronised wall ms) of one call under torch.profiler."""
    from torch.profiler import profile

    synchronize(device)
    with profile(activities=activities(device)) as prof:
        start = time.perf_counter()
        call()
        synchronize(device)
        ms = (time.perf_counter() - start) * 1e3
    return prof.key_averages(), ms


def top_ops(averages, device: torch.device, count: int = 3) -> str:
    """The `count` ops with the largest self time, with their share of all self time."""
    attribute = sort_key(device)
    total = sum(getattr(event, attribute) for event in averages) or 1.0
    ranked = sorted(averages, key=lambda event: getattr(event, attribute), reverse=True)[:count]
    return ", ".join(f"{event.key} {getattr(event, attribute) / total:.0%}" for event in ranked)


def section(title: str, averages, ms: float, device: torch.device) -> list[str]:
    table = averages.table(sort_by=sort_key(device), row_limit=ROWS)
    return [f"## {title}", "", f"profiled call: {ms:.1f} ms (synchronised wall time)", "", "```", table, "```", ""]


def train_step_profile(args, device: torch.device) -> tuple[list[str], list[list[str]]]:
    """One packed training step (module docstring, 1.)."""
    config = ModelConfig.from_preset(args.preset, vocab_size=args.vocab, max_position=args.train_length)
    implementation = Implementation("longctx", args.backend, packed=True)
    options = argparse.Namespace(device=device.type, compile=args.compile, loss_chunk_tokens=args.train_length)
    step = library_steps([implementation], config, args.train_length, options)[implementation]
    blocks = token_blocks(stdlib_document_lengths(), args.train_batch, args.train_length, config.vocab_size)
    batch = {key: value.to(device) for key, value in rows_for(implementation, blocks).items()}
    for _ in range(2):  # AdamW's state, compilation
        step(batch)
    averages, ms = profiled(lambda: step(batch), device)
    shape = f"{args.train_batch} x {args.train_length}"
    title = f"{config.preset} training step, {implementation.name}, {shape} tokens" + (
        ", compiled" if args.compile else ""
    )
    lines = [f"# {title}", "", settings_line(args, device), "", *section("training step", averages, ms, device)]
    return lines, [["train step", shape, f"{ms:.1f}", top_ops(averages, device)]]


def prefill_profile(args, device: torch.device) -> tuple[list[str], list[list[str]]]:
    """One layer's prefill of one prompt, StRing and plain RoPE (module docstring, 2.)."""
    length = args.prefill_length
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    config = ModelConfig.from_preset(args.preset, max_position=length, n_layers=1)
    torch.manual_seed(SEED)
    with torch.device(device):
        model = Llama(config)
    model = model.to(dtype).eval().fuse_projections_()
    generator = torch.Generator().manual_seed(SEED)
    input_ids = torch.randint(0, config.vocab_size, (1, length), generator=generator).to(device)
    lines = [f"# {config.preset}, one layer: prefill of {length} tokens", "", settings_line(args, device), ""]
    rows = []
    with torch.no_grad():
        for name in ("string", "rope"):
            method = build(name, length, args.preset).to(device)
            prefill, _ = model_ops(model, method, input_ids, prepare_decode=False)
            prefill()  # kernels, the method's tables
            averages, ms = profiled(prefill, device)
            params = ", ".join(f"{key}={value}" for key, value in method.params.items())
            lines += section(f"{name} ({params or 'no parameters'})", averages, ms, device)
            rows.append([f"{name} prefill, 1 layer", f"1 x {length}", f"{ms:.1f}", top_ops(averages, device)])
    return lines, rows


def settings_line(args, device: torch.device) -> str:
    return "; ".join(f"{key} {value}" for key, value in {**report.environment(), "smoke": args.smoke}.items())


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--preset", default="tinyllama-1.1b")
    parser.add_argument("--vocab", type=int, default=32000, help="training step: the vocabulary size")
    parser.add_argument("--train-length", type=int, default=2048)
    parser.add_argument("--train-batch", type=int, default=8)
    parser.add_argument("--compile", action="store_true", help="training step: blocks under torch.compile")
    parser.add_argument("--prefill-length", type=int, default=32768)
    parser.add_argument("--smoke", action="store_true", help="debug model, tiny sizes, CPU")
    args = parser.parse_args()
    args.backend = "flash"
    if args.smoke or not torch.cuda.is_available():
        args.backend = "varlen"  # the CPU kernel
    if args.smoke:
        args.preset, args.vocab, args.train_length, args.train_batch = "debug", 512, 64, 2
        args.prefill_length = 512  # StRing needs W = 128 < S = T/3
    return args


def main() -> None:
    args = parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() and not args.smoke else "cpu")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for name, profile in (("profile_train_step", train_step_profile), ("profile_string_prefill", prefill_profile)):
        lines, profile_rows = profile(args, device)
        (out / f"{name}.md").write_text("\n".join(lines))
        rows += profile_rows
        print(f"profiles_gpu: wrote {out / name}.md", flush=True)
        release(device)  # the step's model and compiled blocks (a reference cycle), the allocator's cache
    settings = {"preset": args.preset, "smoke": args.smoke, "compile": args.compile}
    notes = [f"share of all self {'device' if device.type == 'cuda' else 'CPU'} time in the profiled call"]
    report.write(args.out, "profiles_gpu", COLUMNS, rows, settings=settings, notes=notes)


if __name__ == "__main__":
    main()
