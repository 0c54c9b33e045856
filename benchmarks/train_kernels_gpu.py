"""Training MFU by loss kernel and batch shape on one GPU: the tinyllama-1.1b step with
each `train.loss_kernel`, at batch 8, 2 x 8 accumulated and batch 16.

    python benchmarks/train_kernels_gpu.py --out DIR [--kernels chunked compiled liger]
    python benchmarks/train_kernels_gpu.py --smoke --out DIR   # CPU, tiny sizes: checks the script runs

Writes DIR/train_kernels.json + .md (benchmarks/report.py). One model (train_gpu.py's
seeded tinyllama-1.1b with `--vocab` 32,000, blocks under torch.compile as
`train.compile`, attention `--backend` flash), one fused AdamW, plain rows of T (default
2,048) from train_step.py's document stream, bf16 autocast on CUDA. Each row is an arm:
- loss kernel (model/loss.py): `chunked` (eager chunks of `--loss-chunk-tokens`),
  `compiled` (each chunk under torch.compile), `liger` (Liger-Kernel's fused linear
  cross-entropy; a note instead of a row where liger_kernel is not importable or there is
  no CUDA);
- shape `rows x accumulation`: 8 x 1 (the existing train_step row), 8 x 2 (two micro-batches,
  one optimizer step, the loss of each divided by 2, as Lightning accumulates) and 16 x 1.
First every arm's loss at the seeded weights (forward and backward, no update; this also
compiles), each within 2e-2 of the first kernel's at the same shape or the script stops; then
per arm one warm-up and the median of `--repeats` optimizer steps, CUDA-synchronised. tokens/s = rows x
accumulation x T / step time; MFU = tokens/s x (6 N_matmul + 6 n_layers d_model T) / the
device's dense bf16 peak (train/flops.py, H100 SXM 989 TFLOP/s); peak GiB = the allocator's
peak while the arm was timed; an arm that runs out of memory says so.

Fused QKV and gate/up projections for training are not measured: `Llama.fuse_projections_`
is an inference layout (no gradients), and fusing them for training would change the
model's parameters (checkpoints, FSDP wrapping, HF export).
"""

from __future__ import annotations

import argparse
import functools

import device_timing
import report
import torch
from attention import stdlib_document_lengths
from train_gpu import release, reset_peak, seeded_model
from train_step import LEARNING_RATE, Batch, Implementation, rows_for, token_blocks

from longctx.config import DataConfig, ExperimentConfig
from longctx.config.model import ModelConfig
from longctx.config.train import LOSS_KERNELS
from longctx.data.packing import IGNORE_INDEX
from longctx.model.llama import Llama
from longctx.train.flops import peak_flops, training_flops_per_token

MIN_REPEATS = 10
SHAPES = ((8, 1), (8, 2), (16, 1))
"""(rows per micro-batch, micro-batches per optimizer step) at full scale."""
COLUMNS = ["T", "loss kernel", "rows x accumulation", "first loss", "step ms", "tokens/s", "MFU", "peak GiB"]


def liger_missing(device: torch.device) -> str:
    """Why the liger arm cannot run here ('' when it can)."""
    if device.type != "cuda":
        return "liger: not measured (Liger-Kernel's Triton kernel needs CUDA)"
    try:
        import liger_kernel.transformers  # noqa: F401
    except ImportError:
        return "liger: not measured (liger_kernel not importable; `make device` stages it)"
    return ""


def loss_step(model: Llama, micro_batches: list[Batch], kernel: str, args: argparse.Namespace, update: bool) -> float:
    """One optimizer step over `micro_batches` (each one's mean loss / their count, summed
    gradients, as Lightning's accumulation); the summed loss before the update."""
    device = next(model.parameters()).device
    total = 0.0
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
        model.optimizer.zero_grad(set_to_none=True)
        for batch in micro_batches:
            labels = batch["labels"]
            summed = model(
                batch["input_ids"],
                batch["position_ids"],
                batch["document_ids"],
                attention_backend=args.backend,
                labels=labels,
                loss_chunk_tokens=args.loss_chunk_tokens,
                loss_kernel=kernel,
                max_seqlen=labels.shape[1],
            )
            loss = summed / (labels != IGNORE_INDEX).sum() / len(micro_batches)
            loss.backward()
            total += loss.item()
        if update:
            model.optimizer.step()
        model.optimizer.zero_grad(set_to_none=True)
    return total


def micro_batches(batches: list[Batch], shape: tuple[int, int]) -> list[Batch]:
    rows, accumulation = shape
    return [{k: v[:rows] for k, v in batch.items()} for batch in batches[:accumulation]]


def first_loss(model: Llama, batches: list[Batch], kernel: str, shape: tuple[int, int], args) -> float | None:
    """The arm's loss at the current weights (no update; compiles its shapes); None on OOM."""
    try:
        return loss_step(model, micro_batches(batches, shape), kernel, args, update=False)
    except torch.OutOfMemoryError:
        release(torch.device(args.device))
        return None


def arm_row(model: Llama, batches: list[Batch], kernel: str, shape: tuple[int, int], first, args) -> list[str]:
    """The arm timed (columns as COLUMNS; module docstring)."""
    device = torch.device(args.device)
    rows, accumulation = shape
    label = f"{rows} x {accumulation}"
    if first is None:
        return [str(args.length), kernel, label, "", "out of memory", "", "", ""]
    try:
        reset_peak(device)
        run = functools.partial(loss_step, model, micro_batches(batches, shape), kernel, args, True)
        ms = device_timing.interleaved_median_ms({"step": run}, args.repeats, device)["step"]
        peak_gib = device_timing.peak_total_gib(device)
    except torch.OutOfMemoryError:
        release(device)
        return [str(args.length), kernel, label, f"{first:.4f}", "out of memory", "", "", ""]
    config = model.config
    experiment = ExperimentConfig(model=config, data=DataConfig(window=args.length))
    tokens_per_s = rows * accumulation * args.length / (ms / 1e3)
    peak = peak_flops(device)
    mfu = "n/a" if peak is None else f"{tokens_per_s * training_flops_per_token(experiment) / peak:.1%}"
    return [
        str(args.length),
        kernel,
        label,
        f"{first:.4f}",
        f"{ms:.0f}",
        f"{tokens_per_s:.0f}",
        mfu,
        "n/a" if peak_gib != peak_gib else f"{peak_gib:.1f}",
    ]


def measure(args: argparse.Namespace) -> tuple[list[list[str]], list[str]]:
    device = torch.device(args.device)
    config = ModelConfig.from_preset(args.preset, vocab_size=args.vocab, max_position=args.length)
    max_rows = max(rows for rows, _ in args.shapes)
    max_accumulation = max(accumulation for _, accumulation in args.shapes)
    plain = Implementation("longctx", args.backend, False)
    blocks = token_blocks(stdlib_document_lengths(), max_rows * max_accumulation, args.length, config.vocab_size)
    stream = {k: v.to(device) for k, v in rows_for(plain, blocks).items()}
    batches = [{k: v[i * max_rows : (i + 1) * max_rows] for k, v in stream.items()} for i in range(max_accumulation)]
    model = seeded_model(config, device)
    if args.compile:
        for block in model.blocks:
            block.compile()
    model.optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE, fused=device.type == "cuda")
    notes = []
    kernels = list(args.kernels)
    if "liger" in kernels and (why := liger_missing(device)):
        kernels.remove("liger")
        notes.append(why)
    arms = [(kernel, shape) for kernel in kernels for shape in args.shapes]
    first = {arm: first_loss(model, batches, *arm, args) for arm in arms}  # all at the seeded weights
    for (kernel, shape), loss in first.items():
        want = first[kernels[0], shape]
        if loss is not None and want is not None and abs(loss - want) > 2e-2:
            raise SystemExit(f"{kernel} {shape}: first loss {loss:.4f} differs from {kernels[0]}'s {want:.4f}")
    return [arm_row(model, batches, *arm, first[arm], args) for arm in arms], notes


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="directory for train_kernels.{json,md}")
    parser.add_argument("--smoke", action="store_true", help="CPU, debug shapes, 1 repeat: checks the script runs")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cuda")
    parser.add_argument("--preset", default="tinyllama-1.1b")
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--backend", default="flash")
    parser.add_argument("--length", type=int, default=2048)
    parser.add_argument("--kernels", nargs="+", choices=LOSS_KERNELS, default=list(LOSS_KERNELS))
    parser.add_argument("--loss-chunk-tokens", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=MIN_REPEATS, help=f"timed steps (>= {MIN_REPEATS} on a GPU)")
    parser.add_argument("--no-compile", dest="compile", action="store_false", help="our blocks eager")
    args = parser.parse_args()
    args.shapes = SHAPES
    if args.smoke:
        args.device, args.preset, args.vocab, args.backend = "cpu", "debug", 512, "varlen"
        args.length, args.repeats, args.loss_chunk_tokens, args.compile = 64, 1, 48, False
        args.shapes = ((2, 1), (2, 2), (4, 1))
    elif args.repeats < MIN_REPEATS:
        parser.error(f"--repeats must be at least {MIN_REPEATS} (the stated minimum; --smoke for a quick check)")
    return args


def main() -> None:
    args = parse_args()
    device = torch.device(args.device)
    rows, notes = measure(args)
    notes.append("MFU = tokens/s x (6 N_matmul + 6 n_layers d_model T) / dense bf16 peak; plain rows, blocks compiled.")
    notes.append("Fused QKV / gate-up projections for training: not measured (the fused layout is inference-only).")
    settings = {"preset": args.preset, "vocab": args.vocab, "backend": args.backend, "repeats": args.repeats}
    report.write(
        args.out, "train_kernels", COLUMNS, rows, {**settings, "device_name": device_timing.device_name(device)}, notes
    )


if __name__ == "__main__":
    main()
