"""Training on one GPU (`make bench-gpu-train`): the tinyllama-1.1b step
against Hugging Face and litgpt, then `longctx pretrain` end to end with MFU.

    python benchmarks/train_gpu.py --out DIR [--lengths 2048] [--batch 8] [--repeats 10]
    python benchmarks/train_gpu.py --smoke --out DIR      # CPU, tiny sizes: checks the script runs

Writes DIR/train_step.json + .md and DIR/train_e2e.json + .md (benchmarks/report.py).

1. One training step (`train_step` table) of `--preset` tinyllama-1.1b shapes with
   `--vocab` 32,000 at each T (default 2,048) x `--batch` rows, bf16 autocast on CUDA
   (Lightning's `bf16-mixed`: fp32 master weights), fused AdamW, the same seeded weights
   for ours and HF's (initialised on the device; HF's under model/hf.py's config and names,
   as `export_hf` writes them), rows from train_step.py's document stream:
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
   One model on the device at a time, built once per library for its plain and packed
   rows: first the loss of each kind at the seeded weights (forward and backward without
   an update; this compiles both), then each kind timed: one warm-up step and the median
   of `--repeats` (minimum 10 on a GPU; `--smoke` uses 1), CUDA-synchronised. Between
   libraries the previous model is freed (its compiled blocks sit in a reference cycle:
   collected, the allocator's cache emptied). `vs HF` = HF sdpa's step time / this one on
   the same kind of rows; `vs litgpt` likewise against litgpt's plain-row step. First
   losses of ours must equal HF's to 2e-2 (bf16) or the script stops. `--compile`: our
   blocks under torch.compile, as `train.compile` does; `--loss-chunk-tokens N`: our loss
   chunked as `train.loss_chunk_tokens` (never the full fp32 logits), the row length passed
   as `max_seqlen`, as `longctx pretrain` runs it; `--no-litgpt` leaves litgpt out.
   MFU as in 2.; useful MFU (packed rows) counts only the attention pairs document masking
   keeps: 6 N_matmul + 12 n_layers d_model sum_doc l(l+1)/2 / tokens. Peak GiB = the
   allocator's peak while that kind of rows was timed (weights, AdamW state, activations);
   estimate GiB = train/memory_budget.py's for our step (batch rows of T, bf16-mixed, the
   row's backend, compiled with `--compile`, the loss chunk, gradients freed before each
   forward as here; no CUDA context). `make gpu-check`'s training part: `--backends flash
   --compile --no-litgpt --skip-e2e --loss-chunk-tokens 2048`.
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
import gc
import json
import math
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import device_timing
import report
import torch
import torch.nn.functional as F
import transformers
from attention import stdlib_document_lengths
from train_step import LEARNING_RATE, SEED, Batch, Implementation, TrainingStep, rows_for, token_blocks

from longctx.config import DataConfig, ExperimentConfig, load
from longctx.config.model import ModelConfig
from longctx.data.packing import IGNORE_INDEX
from longctx.model.hf import hf_name
from longctx.model.hf_config import hf_config
from longctx.model.llama import Llama
from longctx.model.materialize import weights
from longctx.train.flops import peak_flops, training_flops_per_token
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
    One model and its AdamW serve the plain and the packed rows (a step object per kind).
    Ours as `longctx pretrain` runs it: blocks compiled by the caller (train/module.py's
    per-block `torch.compile`), the chunked loss with `loss_chunk_tokens` > 0 (never the
    full fp32 logits) and the row length as `max_seqlen` (no device read for it)."""

    def __init__(
        self,
        implementation: Implementation,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        loss_chunk_tokens: int = 0,
    ):
        # Not TrainingStep.__init__, which builds a model per implementation on the CPU.
        self.implementation = implementation
        self.model = model
        self.optimizer = optimizer
        self.device = next(model.parameters()).device
        self.loss_chunk_tokens = loss_chunk_tokens if implementation.library == "longctx" else 0

    def logits(self, batch: Batch) -> torch.Tensor:
        if self.implementation.library == "hf" and self.implementation.packed and HF_TAKES_BOOLEAN_4D_MASK:
            mask = document_mask_4d(batch["document_ids"])
            return self.model(
                input_ids=batch["input_ids"], position_ids=batch["position_ids"], attention_mask=mask, use_cache=False
            ).logits
        return super().logits(batch)

    def loss(self, batch: Batch) -> torch.Tensor:
        """Mean next-token cross-entropy over the labelled tokens: over the fp32 logits as
        train_step.py computes it, or our chunked loss."""
        labels = batch["labels"]
        if not self.loss_chunk_tokens:
            logits = self.logits(batch)
            return F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), ignore_index=IGNORE_INDEX)
        ids = (batch["input_ids"], batch["position_ids"], batch["document_ids"])
        summed = self.model(
            *ids,
            attention_backend=self.implementation.attention,
            labels=labels,
            loss_chunk_tokens=self.loss_chunk_tokens,
            max_seqlen=batch["input_ids"].shape[1],
        )
        return summed / (labels != IGNORE_INDEX).sum()

    def __call__(self, batch: Batch, update: bool = True) -> float:
        """One step, gradients set to None first (so none live through the forward); the
        loss before the update. `update=False`: forward and backward only, the gradients
        dropped: the loss at the current weights, which stay as they are."""
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.device.type == "cuda"):
            self.optimizer.zero_grad(set_to_none=True)
            loss = self.loss(batch)
            loss.backward()
            if update:
                self.optimizer.step()
            else:
                self.optimizer.zero_grad(set_to_none=True)
            return loss.item()


class LitGPTStep(DeviceStep):
    """litgpt's compiled GPT with the same shapes (its own initialisation, plain rows)."""

    def __init__(self, config: ModelConfig, seq_len: int, device: torch.device):
        from litgpt.config import Config as LitConfig
        from litgpt.model import GPT

        lit = LitConfig.from_name(
            "tiny-llama-1.1b", block_size=seq_len, vocab_size=config.vocab_size, padded_vocab_size=config.vocab_size
        )
        if (lit.n_layer, lit.n_embd, lit.intermediate_size) != (config.n_layers, config.d_model, config.d_ff):
            raise SystemExit(f"litgpt's tiny-llama-1.1b differs from {config}: compare tinyllama-1.1b only")
        torch.manual_seed(0)
        with torch.device(device):
            self.network = GPT(lit)
        optimizer = torch.optim.AdamW(self.network.parameters(), lr=LEARNING_RATE, fused=True)
        super().__init__(LITGPT, self.network, optimizer)
        self.model = torch.compile(self.network)

    def logits(self, batch: Batch) -> torch.Tensor:
        return self.model(batch["input_ids"])


def seeded_model(config: ModelConfig, device: torch.device) -> Llama:
    """Our model with train_step.py's seed, initialised on `device` (a GPU initialises
    1.1B parameters in a fraction of a second, a CPU in ~10 s): the same weights each call."""
    torch.manual_seed(SEED)
    with torch.device(device):
        return Llama(config)


def hf_llama(llama: Llama, attention: str) -> torch.nn.Module:
    """transformers' LlamaForCausalLM(attn_implementation=`attention`) with `llama`'s
    weights, on its device: model/hf.py's config and names, as export_hf writes them."""
    transformers.logging.set_verbosity_error()
    config = transformers.LlamaConfig.from_dict({**hf_config(llama.config), "attn_implementation": attention})
    with torch.device(llama.tok_embeddings.weight.device):
        model = transformers.LlamaForCausalLM(config)
    model.load_state_dict({hf_name(name): tensor for name, tensor in weights(llama).items()})
    return model.train()


def library_steps(
    pair: list[Implementation], config: ModelConfig, seq_len: int, args: argparse.Namespace
) -> dict[Implementation, DeviceStep]:
    """One model and one AdamW for the implementations of one library (plain and packed
    rows): HF's from the seeded weights, ours compiled with `--compile`, or litgpt's."""
    device = torch.device(args.device)
    if pair == [LITGPT]:
        return {LITGPT: LitGPTStep(config, seq_len, device)}
    model: torch.nn.Module = seeded_model(config, device)
    if pair[0].library == "hf":
        model = hf_llama(model, pair[0].attention)  # the seeded Llama is freed here
    elif args.compile:
        for block in model.blocks:
            block.compile()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE, fused=True)
    return {impl: DeviceStep(impl, model, optimizer, args.loss_chunk_tokens) for impl in pair}


StepResult = tuple[float, float, float]
"""(first loss, step ms, peak GiB)."""


def measure_library(
    pair: list[Implementation], config: ModelConfig, seq_len: int, batches: dict[Implementation, Batch], args
) -> dict[Implementation, StepResult | None]:
    """First losses at the seeded weights (forward and backward without an update, which
    also compiles), then each kind of rows timed with its own allocator peak; None where
    the device ran out of memory. The model dies with this frame (`release` collects it)."""
    device = torch.device(args.device)
    results: dict[Implementation, StepResult | None] = dict.fromkeys(pair)
    try:
        steps = library_steps(pair, config, seq_len, args)
        first = {impl: steps[impl](batches[impl], update=False) for impl in pair}
        for impl in pair:
            reset_peak(device)
            run = functools.partial(steps[impl], batches[impl])
            ms = device_timing.interleaved_median_ms({"step": run}, args.repeats, device)["step"]
            results[impl] = (first[impl], ms, device_timing.peak_total_gib(device))
    except torch.OutOfMemoryError:
        pass
    return results


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def release(device: torch.device) -> None:
    """Free what the last library left: its compiled blocks are kept alive by a reference
    cycle (`nn.Module.compile` stores a function bound to the block), which only the
    cycle collector frees; then the allocator's cache and its peak."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    reset_peak(device)


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


def step_estimate_gib(config: ModelConfig, seq_len: int, backend: str, args: argparse.Namespace) -> float:
    """train/memory_budget.py's estimate for our step: `--batch` rows of T, bf16-mixed, one device,
    attention `backend`, blocks compiled with `--compile`, `--loss-chunk-tokens` (0: the full
    logits), gradients freed before each forward (`DeviceStep`), without the CUDA context
    (the allocator's peak does not hold it)."""
    overrides = [
        f"model.preset={config.preset}",
        f"model.vocab_size={config.vocab_size}",
        f"model.max_position={seq_len}",
        f"model.attention_backend={backend}",
        f"data.window={seq_len}",
        f"train.micro_batch_size={args.batch}",
        f"train.global_batch_tokens={args.batch * seq_len}",
        f"train.loss_chunk_tokens={args.loss_chunk_tokens}",
        f"train.compile={str(args.compile).lower()}",
    ]
    estimate = estimate_memory(load([], overrides), 1, "bf16-mixed", cuda=False, gradients_freed_before_forward=True)
    return estimate.total / GIB


def libraries(args: argparse.Namespace) -> list[list[Implementation]]:
    """The implementations grouped by the model they share: HF's, ours per backend (plain
    and packed rows each), litgpt's (plain rows) where asked and importable."""
    groups = [[Implementation("hf", "sdpa", packed) for packed in (False, True)]]
    groups += [[Implementation("longctx", backend, packed) for packed in (False, True)] for backend in args.backends]
    if args.litgpt and args.preset == "tinyllama-1.1b" and litgpt_available():
        groups.append([LITGPT])
    return groups


def step_rows(seq_len: int, args: argparse.Namespace) -> list[list[str]]:
    device = torch.device(args.device)
    config = ModelConfig.from_preset(args.preset, vocab_size=args.vocab, max_position=seq_len)
    groups = libraries(args)
    implementations = sorted((impl for group in groups for impl in group), key=lambda i: i == LITGPT or i.packed)
    blocks = token_blocks(stdlib_document_lengths(), args.batch, seq_len, config.vocab_size)
    batches = {impl: {k: v.to(device) for k, v in rows_for(impl, blocks).items()} for impl in implementations}
    results: dict[Implementation, StepResult | None] = {}
    start = time.perf_counter()
    for group in groups:  # one model on the device at a time
        results.update(measure_library(group, config, seq_len, batches, args))
        release(device)
        print(f"train_gpu: T={seq_len} {group[0].name} measured, {time.perf_counter() - start:.0f} s", flush=True)
    for impl, result in results.items():
        hf = results.get(Implementation("hf", "sdpa", packed=impl.packed))
        if impl != LITGPT and result is not None and hf is not None and abs(result[0] - hf[0]) > 2e-2:
            raise SystemExit(f"{impl.name}: first loss {result[0]:.4f} differs from HF's {hf[0]:.4f}")
    rows = [step_row(seq_len, impl, results, config, batches[impl], args) for impl in implementations]
    if LITGPT not in results:
        why = "not asked (--no-litgpt)" if not args.litgpt else "not measured (litgpt not importable)"
        rows.append([str(seq_len), "litgpt compiled", why, *[""] * (len(STEP_COLUMNS) - 3)])
    return rows


def step_row(
    seq_len: int,
    impl: Implementation,
    results: dict[Implementation, StepResult | None],
    config: ModelConfig,
    batch: Batch,
    args: argparse.Namespace,
) -> list[str]:
    """One row of the `train_step` table (columns as STEP_COLUMNS; module docstring)."""
    result = results[impl]
    if result is None:
        return [str(seq_len), impl.name, "out of memory", *[""] * (len(STEP_COLUMNS) - 3)]
    _, ms, peak_gib = result
    experiment = ExperimentConfig(model=config, data=DataConfig(window=seq_len))
    flops_per_token, peak = training_flops_per_token(experiment), peak_flops(torch.device(args.device))
    hf = results.get(Implementation("hf", "sdpa", packed=impl.packed))
    litgpt = results.get(LITGPT)
    tokens_per_s = args.batch * seq_len / (ms / 1e3)
    useful = useful_flops_per_token(config, batch["document_ids"]) if impl.packed else flops_per_token
    ours = impl.library == "longctx"
    return [
        str(seq_len),
        impl.name,
        f"{ms:.0f}",
        f"{tokens_per_s:.0f}",
        "" if hf is None or impl == LITGPT else f"{hf[1] / ms:.2f}x",
        "" if litgpt is None or impl == LITGPT else f"{litgpt[1] / ms:.2f}x",
        "n/a" if peak is None else f"{tokens_per_s * flops_per_token / peak:.1%}",
        "n/a" if peak is None or impl == LITGPT else f"{tokens_per_s * useful / peak:.1%}",
        "n/a" if math.isnan(peak_gib) else f"{peak_gib:.1f}",
        f"{step_estimate_gib(config, seq_len, impl.attention, args):.1f}" if ours else "",
    ]


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
