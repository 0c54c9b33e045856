"""Training throughput on CPU: our Llama against Hugging Face `LlamaForCausalLM`, same weights.

Launch from the repository root:

    .venv/bin/python benchmarks/train_step.py [--layers 4 6] [--lengths 1024] [--batch 4]
                                              [--warmup 1] [--repeats 5] [--threads N]
                                              [--hf-attention sdpa eager] [--skip-packed]
                                              [--skip-memory]

What it measures, for each model (`tiny`, 8.1M parameters, and `tiny` with 6 layers,
10.1M) and each sequence length T:

- one training step: forward, next-token cross-entropy (logits upcast to fp32, mean over
  labelled tokens), backward, `torch.optim.AdamW(fused=True)` step (what `longctx
  pretrain` uses, and transformers' Trainer default `adamw_torch_fused` with torch >=
  2.8); float32, CPU, torch's default thread count unless `--threads`, gradients set to
  None before each step; glibc malloc tuned as `longctx` does it (`runtime.py`), which
  speeds up both libraries alike;
- the implementations, all starting from the same weights (ours seeded, exported with
  `export_hf`, loaded by transformers) on the same rows:
  `HF <attn>`       `LlamaForCausalLM.from_pretrained(attn_implementation=<attn>)`,
                    `use_cache=False`; `sdpa` (default; HF's fastest on CPU) runs torch's
                    fused kernel with `is_causal=True` and no mask, `eager` materialises
                    softmax(QK^T)V (measured 0.6x of `sdpa`'s tokens/s, 1.6x its memory);
  `longctx sdpa`    our model, dense boolean mask into `scaled_dot_product_attention`;
  `longctx varlen`  our model, the CPU training default (block-sparse document masking);
  `..., packed`     the same on document-masked packed rows (`data.doc_mask=true`, the
                    default workload): HF gets the rows' restarting position ids and no
                    attention mask, from which transformers' masking_utils builds the
                    block-diagonal causal mask (as with its `DataCollatorWithFlattening`);
- rows: B x (T + 1) tokens of one stream of documents whose lengths follow the embedded
  corpus (a random stdlib `.py` file's size in bytes / 3.5 chars per token, at least 16;
  random token ids, EOS after each document; fixed seed), cut into rows by the training
  pipeline's `contract_from_blocks`, read two ways: plain causal rows (`doc_mask=false`:
  one document per row as far as attention knows, positions 0..T-1) and `packed` rows of
  the same tokens (`doc_mask=true`: positions restart and attention stays inside each
  document, labels -100 on EOS). Stdlib files average ~5000 tokens, so at T=1024 most
  packed rows hold one or two documents;
- tokens/s = B * T / step time, the median of `--repeats` steps after `--warmup` steps;
  the implementations take turns step by step (ABCABC...) so that other load on the
  machine slows all alike; min and max are printed too. `vs HF` divides by the fastest HF
  attention's tokens/s at the same model, T and kind of rows (plain or packed);
- MFU = tokens/s * FLOPs per token / roofline, FLOPs per token = 6 * N_matmul +
  6 * n_layers * d_model * T (`training_flops_per_token`: every weight but the input
  embedding and the norms; causal attention over the full window, also for packed rows,
  so MFU there is tokens/s on the same scale, not the attention FLOPs actually done);
  roofline = the best fp32 1024^3 GEMM rate of this CPU at the same thread count
  (`measure_cpu_gemm_flops`), sampled at the start and after every round of steps; the
  best sample is kept, since load only lowers it;
- peak MiB: the peak resident memory of one step above the model and its AdamW state
  (activations, logits, gradients, optimizer temporaries), in a fresh spawned process
  per implementation (torch's default threads) that first runs a step on 64-token rows
  (loading kernels, creating the optimizer state); `cpu_memory.py` has the method and
  its caveats.

Before timing, the first step's loss of every implementation must equal HF's on the same
kind of rows to 1e-5, or the script aborts (same weights, same rows, same loss).

The GPU table (tinyllama-1.1b shapes in bf16 against HF and litgpt, and `longctx
pretrain` end to end) is benchmarks/train_gpu.py, which reuses this script's rows and
training step.

Caveats: on a machine shared with other work, torch's multi-threaded kernels wait for
descheduled threads: with 2 threads and a load average of ~4 on 2 CPUs, fill/copy/mul on
0.5-64 MiB tensors ran 2-20x slower than with 1 thread, and steps made of many small
kernels (`varlen`'s block loop) suffer most. The load average is printed; `--threads 1`
gives steadier numbers there. The roofline varies too (268-319 GFLOP/s best samples on 2
threads in different runs), so compare MFU within one run. Runtime with the defaults:
2 min 45 s on 2 cores at a load average of 1.3.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import cpu_memory
import torch
import torch.nn.functional as F
import transformers
from attention import stdlib_document_lengths

from longctx.config import DataConfig, ExperimentConfig, TrainConfig
from longctx.config.model import ModelConfig
from longctx.data.packing import IGNORE_INDEX, contract_from_blocks
from longctx.model.hf import export_hf
from longctx.model.llama import Llama
from longctx.runtime import tune_cpu_allocator
from longctx.train.flops import measure_cpu_gemm_flops, training_flops_per_token

PRESET = "tiny"
EOS_ID = 0
SEED = 0
LEARNING_RATE = 1e-4
LOSS_TOLERANCE = 1e-5
WARMUP_TOKENS = 64  # row length of the memory child's warm-up step

Batch = dict[str, torch.Tensor]


@dataclasses.dataclass(frozen=True)
class Implementation:
    library: str
    """`hf` (transformers LlamaForCausalLM) or `longctx` (our Llama)."""
    attention: str
    """HF attn_implementation, or our attention backend."""
    packed: bool = False
    """Document-masked packed rows instead of plain causal rows."""

    @property
    def name(self) -> str:
        library = "HF" if self.library == "hf" else "longctx"
        return f"{library} {self.attention}" + (", packed" if self.packed else "")


# --- rows -----------------------------------------------------------------------------


def token_blocks(document_lengths: list[int], batch: int, seq_len: int, vocab_size: int) -> torch.Tensor:
    """[batch, seq_len + 1] consecutive tokens of a stream of random documents, each ended by EOS."""
    rng = random.Random(SEED)
    generator = torch.Generator().manual_seed(SEED)
    stream: list[torch.Tensor] = []
    needed = batch * (seq_len + 1)
    while sum(map(len, stream)) < needed:
        body = torch.randint(EOS_ID + 1, vocab_size, (rng.choice(document_lengths) - 1,), generator=generator)
        stream += [body, torch.tensor([EOS_ID])]
    return torch.cat(stream)[:needed].view(batch, seq_len + 1)


def describe_documents(batch: Batch) -> str:
    document_ids = batch["document_ids"]
    per_row = (document_ids[:, -1] - document_ids[:, 0] + 1).float().mean().item()
    pieces = torch.cat([row.unique_consecutive(return_counts=True)[1] for row in document_ids])
    return f"packed rows: {per_row:.2f} documents/row, length median {pieces.median().item()}, mean {pieces.float().mean():.0f}"


# --- one training step ----------------------------------------------------------------


class TrainingStep:
    """A model and its AdamW; calling it runs one step on a batch and returns the loss."""

    def __init__(self, implementation: Implementation, config: ModelConfig, hf_dir: Path):
        self.implementation = implementation
        if implementation.library == "hf":
            transformers.logging.set_verbosity_error()
            transformers.utils.logging.disable_progress_bar()  # also in the memory child
            self.model = transformers.LlamaForCausalLM.from_pretrained(
                hf_dir, attn_implementation=implementation.attention
            )
        else:
            self.model = seeded_llama(config)
        self.model.train()
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=LEARNING_RATE, fused=True)

    def logits(self, batch: Batch) -> torch.Tensor:
        if self.implementation.library == "hf":
            # Packed rows: position ids restart at each document and no attention mask is
            # given, so transformers' masking_utils builds the block-diagonal causal mask.
            position_ids = batch["position_ids"] if self.implementation.packed else None
            return self.model(input_ids=batch["input_ids"], position_ids=position_ids, use_cache=False).logits
        return self.model(
            batch["input_ids"],
            batch["position_ids"],
            batch["document_ids"],
            attention_backend=self.implementation.attention,
        )

    def __call__(self, batch: Batch) -> float:
        self.optimizer.zero_grad(set_to_none=True)
        logits = self.logits(batch)
        loss = F.cross_entropy(logits.float().flatten(0, 1), batch["labels"].flatten(), ignore_index=IGNORE_INDEX)
        loss.backward()
        self.optimizer.step()
        return loss.item()


def seeded_llama(config: ModelConfig) -> Llama:
    torch.manual_seed(SEED)
    return Llama(config)


def rows_for(implementation: Implementation, blocks: torch.Tensor) -> Batch:
    return contract_from_blocks(blocks, EOS_ID, doc_mask=implementation.packed)


def _prepare_step(
    implementation: Implementation, config: ModelConfig, hf_dir: Path, blocks: torch.Tensor
) -> Callable[[], float]:
    """In the memory child: a warm-up step on 64-token rows, then the step to measure."""
    tune_cpu_allocator()
    step = TrainingStep(implementation, config, hf_dir)
    step(rows_for(implementation, blocks[:, : WARMUP_TOKENS + 1]))
    return functools.partial(step, rows_for(implementation, blocks))


# --- one model at one length ----------------------------------------------------------


@dataclasses.dataclass
class Result:
    config: str
    seq_len: int
    implementation: Implementation
    step_seconds: list[float]
    tokens_per_step: int
    flops_per_token: float
    peak_mib: float | None

    @property
    def tokens_per_s(self) -> float:
        return self.tokens_per_step / statistics.median(self.step_seconds)


def interleaved_step_seconds(
    steps: dict[Implementation, Callable[[], float]], repeats: int, roofline_samples: list[float]
) -> dict[Implementation, list[float]]:
    """Seconds of every step; the implementations take turns (ABCABC...) so background load
    hits all alike, and the GEMM roofline is sampled after every round, under the same load."""
    seconds: dict[Implementation, list[float]] = {impl: [] for impl in steps}
    for _ in range(repeats):
        for impl, step in steps.items():
            start = time.perf_counter()
            step()
            seconds[impl].append(time.perf_counter() - start)
        roofline_samples.append(measure_cpu_gemm_flops.__wrapped__())  # uncached: a new sample
    return seconds


def require_same_loss(first_losses: dict[Implementation, float]) -> None:
    """Every implementation's first loss equals HF's on the same kind of rows."""
    for impl, loss in first_losses.items():
        reference = next(
            (other, value)
            for other, value in first_losses.items()
            if other.library == "hf" and other.packed == impl.packed
        )
        if abs(loss - reference[1]) > LOSS_TOLERANCE:
            raise SystemExit(
                f"{impl.name}: first loss {loss:.7f} differs from {reference[0].name}'s {reference[1]:.7f}"
            )


def measure(
    config: ModelConfig,
    label: str,
    seq_len: int,
    implementations: list[Implementation],
    document_lengths: list[int],
    roofline_samples: list[float],
    args: argparse.Namespace,
) -> list[Result]:
    """Step times and peak memory of every implementation for one model at one T."""
    config = dataclasses.replace(config, max_position=max(config.max_position, seq_len))
    blocks = token_blocks(document_lengths, args.batch, seq_len, config.vocab_size)
    batches = {impl: rows_for(impl, blocks) for impl in implementations}
    print(f"{label}, T={seq_len}", flush=True)
    if any(impl.packed for impl in implementations):
        print(f"  {describe_documents(next(batch for impl, batch in batches.items() if impl.packed))}")
    with tempfile.TemporaryDirectory(prefix="hf-llama-") as hf_dir:
        export_hf(seeded_llama(config), hf_dir)
        steps = {impl: TrainingStep(impl, config, Path(hf_dir)) for impl in implementations}
        require_same_loss({impl: step(batches[impl]) for impl, step in steps.items()})
        for _ in range(args.warmup - 1):
            for impl, step in steps.items():
                step(batches[impl])
        runs = {impl: functools.partial(step, batches[impl]) for impl, step in steps.items()}
        seconds = interleaved_step_seconds(runs, args.repeats, roofline_samples)
        del steps, runs  # free the models before the memory children start
        peaks = {
            impl: None
            if args.skip_memory
            else cpu_memory.peak_extra_mib(_prepare_step, impl, config, Path(hf_dir), blocks)
            for impl in implementations
        }
    experiment = ExperimentConfig(
        model=config,
        data=DataConfig(window=seq_len),
        train=TrainConfig(micro_batch_size=args.batch, global_batch_tokens=args.batch * seq_len),
    )
    results = [
        Result(
            label, seq_len, impl, seconds[impl], args.batch * seq_len, training_flops_per_token(experiment), peaks[impl]
        )
        for impl in implementations
    ]
    for result in results:
        times = sorted(result.step_seconds)
        print(
            f"  {result.implementation.name:24s} step ms: median {statistics.median(times) * 1e3:6.0f}, "
            f"min {times[0] * 1e3:6.0f}, max {times[-1] * 1e3:6.0f}",
            flush=True,
        )
    return results


# --- report ---------------------------------------------------------------------------

COLUMNS = ("config", "T", "impl", "step ms", "tokens/s", "vs HF", "MFU", "peak MiB")


def table_rows(results: list[Result], roofline: float) -> list[list[str]]:
    rows = []
    for result in results:
        hf_best = max(
            other.tokens_per_s
            for other in results
            if other.implementation.library == "hf"
            and other.implementation.packed == result.implementation.packed
            and (other.config, other.seq_len) == (result.config, result.seq_len)
        )
        rows.append(
            [
                result.config,
                str(result.seq_len),
                result.implementation.name,
                f"{statistics.median(result.step_seconds) * 1e3:.0f}",
                f"{result.tokens_per_s:.0f}",
                f"{result.tokens_per_s / hf_best:.2f}x",
                f"{result.tokens_per_s * result.flops_per_token / roofline:.1%}",
                "" if result.peak_mib is None else f"{result.peak_mib:.0f}",
            ]
        )
    return rows


def markdown_table(rows: list[list[str]]) -> str:
    lines = [COLUMNS, ("---", "---:", "---", *("---:",) * (len(COLUMNS) - 3)), *rows]
    return "\n".join("| " + " | ".join(cells) + " |" for cells in lines)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, nargs="+", default=[4, 6], help="n_layers of the `tiny` models compared")
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024], help="sequence lengths T")
    parser.add_argument("--batch", type=int, default=4, help="rows per step")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps first (the first checks the losses)")
    parser.add_argument("--repeats", type=int, default=5, help="timed steps per implementation (median reported)")
    parser.add_argument(
        "--hf-attention", nargs="+", default=["sdpa"], choices=["sdpa", "eager"], help="HF attn_implementation(s)"
    )
    parser.add_argument("--skip-packed", action="store_true", help="leave out the packed, document-masked rows")
    parser.add_argument("--skip-memory", action="store_true", help="do not measure peak memory")
    parser.add_argument(
        "--threads", type=int, default=0, help="torch threads for the timed steps (0 = torch's default)"
    )
    args = parser.parse_args()
    if args.warmup < 1 or args.repeats < 1:
        parser.error("--warmup and --repeats must be at least 1")
    return args


def main() -> None:
    args = parse_args()
    tune_cpu_allocator()  # as `longctx pretrain` does; every implementation runs in this process
    if args.threads:
        torch.set_num_threads(args.threads)
    implementations = [Implementation("hf", attention) for attention in args.hf_attention]
    implementations += [Implementation("longctx", "sdpa"), Implementation("longctx", "varlen")]
    if not args.skip_packed:
        implementations += [Implementation("hf", "sdpa", packed=True), Implementation("longctx", "varlen", packed=True)]
    document_lengths = stdlib_document_lengths()
    load_at_start = os.getloadavg()[0]  # other work on the machine skews the times
    roofline_samples = [measure_cpu_gemm_flops()]
    print(
        f"batch {args.batch}, float32, {torch.get_num_threads()} threads, {args.warmup} warm-up + {args.repeats} timed "
        f"steps, load average {load_at_start:.2f} ({os.cpu_count()} CPUs)",
        flush=True,
    )
    results = []
    for n_layers in args.layers:
        config = ModelConfig.from_preset(PRESET, n_layers=n_layers)
        label = f"{PRESET} {n_layers}L ({config.num_parameters() / 1e6:.1f}M)"
        for seq_len in args.lengths:
            results += measure(config, label, seq_len, implementations, document_lengths, roofline_samples, args)
    roofline = max(roofline_samples)
    load_at_end = os.getloadavg()[0]
    print(
        f"\nload average (1 min): {load_at_start:.2f} at start, {load_at_end:.2f} at end, {os.cpu_count()} CPUs; "
        f"fp32 GEMM roofline (1024^3, {torch.get_num_threads()} threads): best {roofline / 1e9:.1f} GFLOP/s, "
        f"worst {min(roofline_samples) / 1e9:.1f} over {len(roofline_samples)} samples\n"
    )
    print(markdown_table(table_rows(results, roofline)))


if __name__ == "__main__":
    main()
