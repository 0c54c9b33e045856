"""Training on one GPU (`make bench-gpu-train`): the tinyllama-1.1b step
against Hugging Face and litgpt, then `longctx pretrain` end to end with MFU.

    python benchmarks/train_gpu.py --out DIR [--lengths 2048] [--batch 8] [--repeats 10]
    python benchmarks/train_gpu.py --smoke --out DIR      # CPU, tiny sizes: checks the script runs

Writes DIR/train_step.json + .md and DIR/train_e2e.json + .md (benchmarks/report.py).

1. One training step (`train_step` table) of `--preset` tinyllama-1.1b shapes with
   `--vocab` 32,000 at each T (default 2,048) x `--batch` rows, bf16 autocast on CUDA
   (Lightning's `bf16-mixed`: fp32 master weights), fused AdamW, the same seeded weights
   for ours and HF's (exported with `export_hf`), rows from train_step.py's document
   stream:
   - `HF sdpa`: `LlamaForCausalLM(attn_implementation="sdpa")` on plain causal rows;
   - `HF sdpa, packed`: the packed, document-masked rows with restarting position ids and
     a 4D boolean mask [B, 1, T, T] (same document and causal), which transformers >= 5
     uses as given (4.x: position ids only; the table's note says which);
   - `longctx <backend>` and `longctx <backend>, packed`: our model with each of
     `--backends` (default flash, flex) on the same rows;
   - `litgpt compiled`: litgpt's `GPT` (`Config.from_name("tiny-llama-1.1b")`, vocab set
     to `--vocab`) under `torch.compile`, plain rows only: litgpt has no document masking,
     so it is compared with our plain rows, and it starts from its own initialisation
     (its first loss is not checked). Left out when litgpt cannot be imported.
   Step ms = median of `--repeats` (minimum 10 on a GPU; `--smoke` uses 1), CUDA-
   synchronised, implementations taking turns; `vs HF` = HF sdpa's step time / this one on
   the same kind of rows; `vs litgpt` likewise against litgpt's plain-row step. First
   losses of ours must equal HF's to 2e-2 (bf16) or the script stops. `--compile`: our
   blocks under torch.compile, as `train.compile` does; `--loss-chunk-tokens N`: our loss
   chunked as `train.loss_chunk_tokens` (never the full fp32 logits), the row length passed
   as `max_seqlen`, as `longctx pretrain` runs it; `--no-litgpt` leaves litgpt out.
   MFU as in 2.; useful MFU (packed rows) counts only the attention pairs document masking
   keeps: 6 N_matmul + 12 n_layers d_model sum_doc l(l+1)/2 / tokens. Peak GiB = the
   allocator's peak while the implementation ran (weights, AdamW state, activations);
   estimate GiB = train/memory_budget.py's for our step (batch rows of T, bf16-mixed, the loss
   chunk; no CUDA context). `make gpu-check`'s training part: `--backends flash --compile
   --no-litgpt --skip-e2e --loss-chunk-tokens 2048`.
2. `longctx pretrain` end to end (`train_e2e` table): tinyllama-1.1b at T=2,048 on the
   embedded corpus (bpe-8192 tokens in the 32,000-word model), `train.strategy=fsdp`,
   `train.compile=true`, bf16-mixed, attention auto (flash), `--e2e-steps` optimizer steps
   (default 30) of `--e2e-micro-batch` rows x 2 accumulation steps. tokens/s = the median
   of `perf/tokens_per_s` over the steps after the first 5 (compilation); MFU = tokens/s x
   training FLOPs per token (6 N_matmul + 6 n_layers d_model T, train/callbacks/training.py) / peak,
   peak = the device's dense bf16 rate (H100 SXM: 989 TFLOP/s, GPU_PEAK_FLOPS); peak memory
   = `torch.cuda.max_memory_allocated` (perf/peak_memory_gib) next to the estimate of
   train/memory_budget.py for the same run.

Goals: end-to-end MFU >= 50%; step >= 1.5x HF's and >= 1.1x litgpt's with
document masking on.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import device_timing
import report
import torch
import transformers
from attention import stdlib_document_lengths
from train_step import LEARNING_RATE, Batch, Implementation, TrainingStep, rows_for, seeded_llama, token_blocks

from longctx.config import DataConfig, ExperimentConfig, load
from longctx.config.model import ModelConfig
from longctx.data.packing import IGNORE_INDEX
from longctx.model.hf import export_hf
from longctx.train.callbacks.training import peak_flops, training_flops_per_token
from longctx.train.memory_budget import GIB, estimate_memory

MIN_REPEATS = 10
E2E_SKIPPED_STEPS = 5
LITGPT = Implementation("litgpt", "compiled")
STEP_COLUMNS = [
    "T",
    "impl",
    "step ms",
    "tokens/s",
    "vs HF",
    "vs litgpt",
    "MFU",
    "useful MFU",
    "peak GiB",
    "estimate GiB",
]
E2E_COLUMNS = ["T", "rows x accumulation", "steps", "tokens/s", "MFU", "peak GiB", "estimate GiB"]


HF_TAKES_BOOLEAN_4D_MASK = int(transformers.__version__.split(".")[0]) >= 5
"""transformers 5 passes a 4D mask to sdpa as given (bool: True = attend); 4.x inverts a
0/1 mask arithmetically, which a bool tensor refuses: there the packed rows keep only
their restarting position ids (train_step.py's packed HF rows), and the table says so."""


def document_mask_4d(document_ids: torch.Tensor) -> torch.Tensor:
    """[B, 1, T, T] bool: query i sees key j iff same document and j <= i."""
    same = document_ids[:, :, None] == document_ids[:, None, :]
    causal = torch.ones(same.shape[-2:], dtype=torch.bool, device=same.device).tril()
    return (same & causal)[:, None]


class DeviceStep(TrainingStep):
    """TrainingStep on a device under bf16 autocast (CUDA); HF packed rows get a 4D mask.
    Ours as `longctx pretrain` runs it: blocks compiled with `compile` (train/module.py's
    per-block `torch.compile`), the chunked loss with `loss_chunk_tokens` > 0 (never the
    full fp32 logits) and the row length as `max_seqlen` (no device read for it)."""

    def __init__(
        self,
        implementation: Implementation,
        config: ModelConfig,
        hf_dir: Path,
        device: torch.device,
        compile: bool = False,
        loss_chunk_tokens: int = 0,
    ):
        super().__init__(implementation, config, hf_dir)
        self.model.to(device)
        if compile and implementation.library == "longctx":
            for block in self.model.blocks:
                block.compile()
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=LEARNING_RATE, fused=True)
        self.device = device
        self.loss_chunk_tokens = loss_chunk_tokens if implementation.library == "longctx" else 0

    def logits(self, batch: Batch) -> torch.Tensor:
        if self.implementation.library == "hf" and self.implementation.packed and HF_TAKES_BOOLEAN_4D_MASK:
            mask = document_mask_4d(batch["document_ids"])
            return self.model(
                input_ids=batch["input_ids"], position_ids=batch["position_ids"], attention_mask=mask, use_cache=False
            ).logits
        return super().logits(batch)

    def __call__(self, batch: Batch) -> float:
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.device.type == "cuda"):
            if not self.loss_chunk_tokens:
                return super().__call__(batch)
            self.optimizer.zero_grad(set_to_none=True)
            ids = (batch["input_ids"], batch["position_ids"], batch["document_ids"])
            summed = self.model(
                *ids,
                attention_backend=self.implementation.attention,
                labels=batch["labels"],
                loss_chunk_tokens=self.loss_chunk_tokens,
                max_seqlen=batch["input_ids"].shape[1],
            )
            loss = summed / (batch["labels"] != IGNORE_INDEX).sum()
            loss.backward()
            self.optimizer.step()
            return loss.item()


class LitGPTStep(DeviceStep):
    """litgpt's compiled GPT with the same shapes (its own initialisation, plain rows)."""

    def __init__(self, config: ModelConfig, seq_len: int, device: torch.device):
        from litgpt.config import Config as LitConfig
        from litgpt.model import GPT

        self.implementation = LITGPT
        lit = LitConfig.from_name(
            "tiny-llama-1.1b", block_size=seq_len, vocab_size=config.vocab_size, padded_vocab_size=config.vocab_size
        )
        if (lit.n_layer, lit.n_embd, lit.intermediate_size) != (config.n_layers, config.d_model, config.d_ff):
            raise SystemExit(f"litgpt's tiny-llama-1.1b differs from {config}: compare tinyllama-1.1b only")
        torch.manual_seed(0)
        self.network = GPT(lit).to(device)
        self.model = torch.compile(self.network)
        self.optimizer = torch.optim.AdamW(self.network.parameters(), lr=LEARNING_RATE, fused=True)
        self.device = device

    def logits(self, batch: Batch) -> torch.Tensor:
        return self.model(batch["input_ids"])


def litgpt_available() -> bool:
    try:
        import litgpt.model  # noqa: F401
    except ImportError:
        return False
    return True


def useful_flops_per_token(config: ModelConfig, document_ids: torch.Tensor) -> float:
    """Training FLOPs per token counting only the attention pairs document masking keeps:
    6 N_matmul + 12 n_layers d_model P / tokens, P = sum over documents of l (l + 1) / 2
    (for one document per row of T tokens: the MFU formula's 6 n_layers d_model T, up to T+1)."""
    experiment = ExperimentConfig(model=config)  # the default window: only N_matmul is read off
    matmul = training_flops_per_token(experiment) - 6 * config.n_layers * config.d_model * experiment.data.window
    lengths = torch.cat([row.unique_consecutive(return_counts=True)[1] for row in document_ids.cpu()]).double()
    pairs = (lengths * (lengths + 1) / 2).sum().item()
    return matmul + 12 * config.n_layers * config.d_model * pairs / document_ids.numel()


def step_estimate_gib(config: ModelConfig, seq_len: int, args: argparse.Namespace) -> float:
    """train/memory_budget.py's estimate for our step: `--batch` rows of T, bf16-mixed, one device,
    `--loss-chunk-tokens` (0: the full logits), without the CUDA context (the allocator's
    peak does not hold it)."""
    overrides = [
        f"model.preset={config.preset}",
        f"model.vocab_size={config.vocab_size}",
        f"model.max_position={seq_len}",
        f"data.window={seq_len}",
        f"train.micro_batch_size={args.batch}",
        f"train.global_batch_tokens={args.batch * seq_len}",
        f"train.loss_chunk_tokens={args.loss_chunk_tokens}",
    ]
    return estimate_memory(load([], overrides), 1, "bf16-mixed", cuda=False).total / GIB


def step_rows(seq_len: int, args: argparse.Namespace) -> list[list[str]]:
    device = torch.device(args.device)
    config = ModelConfig.from_preset(args.preset, vocab_size=args.vocab, max_position=seq_len)
    implementations = [Implementation("hf", "sdpa"), *(Implementation("longctx", b) for b in args.backends)]
    implementations += [
        Implementation("hf", "sdpa", packed=True),
        *(Implementation("longctx", b, packed=True) for b in args.backends),
    ]
    with_litgpt = args.litgpt and args.preset == "tinyllama-1.1b" and litgpt_available()
    if with_litgpt:
        implementations.append(LITGPT)
    blocks = token_blocks(stdlib_document_lengths(), args.batch, seq_len, config.vocab_size)
    batches = {impl: {k: v.to(device) for k, v in rows_for(impl, blocks).items()} for impl in implementations}
    experiment = ExperimentConfig(model=config, data=DataConfig(window=seq_len))
    flops_per_token, peak = training_flops_per_token(experiment), peak_flops(device)
    results: dict[Implementation, tuple[float, float, float] | None] = {}
    with tempfile.TemporaryDirectory(prefix="hf-llama-") as hf_dir:
        export_hf(seeded_llama(config), hf_dir)
        for impl in implementations:  # one model on the device at a time
            step: DeviceStep | None = None
            try:
                step = (
                    LitGPTStep(config, seq_len, device)
                    if impl == LITGPT
                    else DeviceStep(impl, config, Path(hf_dir), device, args.compile, args.loss_chunk_tokens)
                )
                run = functools.partial(step, batches[impl])
                loss = run()
                ms = device_timing.interleaved_median_ms({"step": run}, args.repeats, device)["step"]
                results[impl] = (loss, ms, device_timing.peak_total_gib(device))
            except torch.OutOfMemoryError:
                results[impl] = None
            finally:
                del step
                if device.type == "cuda":
                    torch.cuda.empty_cache()
                    torch.cuda.reset_peak_memory_stats(device)
    litgpt_ms = results[LITGPT][1] if results.get(LITGPT) else None
    estimate_gib = step_estimate_gib(config, seq_len, args)
    rows = []
    for impl in implementations:
        result = results[impl]
        if result is None:
            rows.append([str(seq_len), impl.name, "out of memory", *[""] * (len(STEP_COLUMNS) - 3)])
            continue
        loss, ms, peak_gib = result
        hf = results.get(Implementation("hf", "sdpa", packed=impl.packed))
        if impl != LITGPT and hf is not None and abs(loss - hf[0]) > 2e-2:
            raise SystemExit(f"{impl.name}: first loss {loss:.4f} differs from HF's {hf[0]:.4f}")
        tokens_per_s = args.batch * seq_len / (ms / 1e3)
        useful = useful_flops_per_token(config, batches[impl]["document_ids"]) if impl.packed else flops_per_token
        ours = impl.library == "longctx"
        rows.append(
            [
                str(seq_len),
                impl.name,
                f"{ms:.0f}",
                f"{tokens_per_s:.0f}",
                "" if hf is None or impl == LITGPT else f"{hf[1] / ms:.2f}x",
                "" if litgpt_ms is None or impl == LITGPT else f"{litgpt_ms / ms:.2f}x",
                "n/a" if peak is None else f"{tokens_per_s * flops_per_token / peak:.1%}",
                "n/a" if peak is None or impl == LITGPT else f"{tokens_per_s * useful / peak:.1%}",
                "n/a" if math.isnan(peak_gib) else f"{peak_gib:.1f}",
                f"{estimate_gib:.1f}" if ours else "",
            ]
        )
    if not with_litgpt:
        why = "not asked (--no-litgpt)" if not args.litgpt else "not measured (litgpt not importable)"
        rows.append([str(seq_len), "litgpt compiled", why, *[""] * (len(STEP_COLUMNS) - 3)])
    return rows


def e2e_overrides(args: argparse.Namespace, out_dir: Path) -> list[str]:
    rows = args.e2e_micro_batch
    return [
        f"model.preset={args.preset}",
        f"model.max_position={args.e2e_window}",
        "model.attention_backend=auto",
        f"data.window={args.e2e_window}",
        "data.tokenizer=bpe-8192",
        f"train.micro_batch_size={rows}",
        f"train.global_batch_tokens={rows * args.e2e_window * 2}",
        f"train.max_steps={args.e2e_steps}",
        "train.warmup_steps=2",
        f"train.strategy={'fsdp' if args.device == 'cuda' else 'auto'}",
        f"train.compile={str(args.device == 'cuda').lower()}",
        f"train.precision={'bf16-mixed' if args.device == 'cuda' else '32-true'}",
        f"train.loss_chunk_tokens={args.e2e_window}",
        f"train.checkpoint_every_steps={args.e2e_steps}",
        f"train.out_dir={out_dir}",
        "probe.fi=false",
        "log.wandb_mode=disabled",
        "log.every_steps=1",
    ]


def e2e_rows(args: argparse.Namespace) -> list[list[str]]:
    with tempfile.TemporaryDirectory(prefix="e2e-") as scratch:
        out_dir = Path(scratch) / "run"
        overrides = e2e_overrides(args, out_dir)
        command = [sys.executable, "-m", "longctx", "pretrain", "experiments/pretrain/tiny_512.yaml", *overrides]
        subprocess.run(command, check=True)
        metrics = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in metrics if "perf/tokens_per_s" in m]
    timed = steps[E2E_SKIPPED_STEPS:] or steps
    tokens_per_s = statistics.median(m["perf/tokens_per_s"] for m in timed)
    mfu = [m["perf/mfu"] for m in timed if "perf/mfu" in m]
    peak_gib = max((m.get("perf/peak_memory_gib", float("nan")) for m in steps), default=float("nan"))
    precision = "bf16-mixed" if args.device == "cuda" else "32-true"
    estimate = estimate_memory(load(["experiments/pretrain/tiny_512.yaml"], overrides), 1, precision, cuda=False)
    return [
        [
            str(args.e2e_window),
            f"{args.e2e_micro_batch} x 2",
            f"{len(timed)} of {len(steps)}",
            f"{tokens_per_s:.0f}",
            f"{statistics.median(mfu):.1%}" if mfu else "n/a",
            "n/a" if math.isnan(peak_gib) else f"{peak_gib:.1f}",
            f"{estimate.total / GIB:.1f}",
        ]
    ]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="directory for train_step.{json,md} and train_e2e.{json,md}")
    parser.add_argument("--smoke", action="store_true", help="CPU, debug shapes, 1 repeat: checks the script runs")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cuda")
    parser.add_argument("--preset", default="tinyllama-1.1b")
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--backends", nargs="+", default=["flash", "flex"])
    parser.add_argument("--lengths", type=int, nargs="+", default=[2048])
    parser.add_argument("--batch", type=int, default=8, help="rows per step")
    parser.add_argument("--repeats", type=int, default=MIN_REPEATS, help=f"timed steps (>= {MIN_REPEATS} on a GPU)")
    parser.add_argument("--e2e-window", type=int, default=2048)
    parser.add_argument("--e2e-micro-batch", type=int, default=8)
    parser.add_argument("--e2e-steps", type=int, default=30)
    parser.add_argument("--skip-e2e", action="store_true")
    parser.add_argument("--compile", action="store_true", help="our blocks under torch.compile (as train.compile)")
    parser.add_argument("--no-litgpt", dest="litgpt", action="store_false", help="leave out the litgpt row")
    parser.add_argument(
        "--loss-chunk-tokens", type=int, default=0, help="ours: the chunked loss (train.loss_chunk_tokens); 0 = logits"
    )
    args = parser.parse_args()
    if args.smoke:
        args.device, args.preset, args.vocab, args.backends = "cpu", "debug", 512, ["varlen"]
        args.lengths, args.batch, args.repeats = [64], 2, 1
        args.e2e_window, args.e2e_micro_batch, args.e2e_steps = 64, 2, 2
    elif args.repeats < MIN_REPEATS:
        parser.error(f"--repeats must be at least {MIN_REPEATS} (the stated minimum; --smoke for a quick check)")
    return args


def main() -> None:
    args = parse_args()
    device = torch.device(args.device)
    settings = {"preset": args.preset, "vocab": args.vocab, "batch": args.batch, "repeats": args.repeats}
    rows = [row for seq_len in args.lengths for row in step_rows(seq_len, args)]
    notes = [
        "litgpt runs without document masking (it has none): compare it with the plain rows.",
        "HF packed rows: "
        + (
            "a 4D boolean document mask." if HF_TAKES_BOOLEAN_4D_MASK else "restarting position ids (transformers 4.x)."
        ),
    ]
    report.write(
        args.out,
        "train_step",
        STEP_COLUMNS,
        rows,
        {**settings, "device_name": device_timing.device_name(device)},
        notes,
    )
    if not args.skip_e2e:
        e2e_notes = [
            "MFU = tokens/s x (6 N_matmul + 6 n_layers d_model T) / dense bf16 peak (H100 SXM: 989 TFLOP/s); "
            f"the first {E2E_SKIPPED_STEPS} steps (compilation) are not timed."
        ]
        report.write(args.out, "train_e2e", E2E_COLUMNS, e2e_rows(args), {"preset": args.preset}, e2e_notes)


if __name__ == "__main__":
    main()
