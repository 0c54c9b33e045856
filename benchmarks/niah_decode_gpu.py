"""Batched NIAH-style decoding on a GPU: the engine's `generate` against Hugging Face `generate`.

    python3 benchmarks/niah_decode_gpu.py --out DIR [--lengths 4096 8192] [--batch 16] [--new-tokens 64]
    PYTHONPATH=src python benchmarks/niah_decode_gpu.py --smoke --out /tmp/niah_decode   # CPU, tiny, fp32

tinyllama-1.1b's shapes (22 layers, 32/4 heads, d 2,048, vocabulary 32,000) with seeded
random weights in bf16 (the weights themselves, not autocast). The model is written once
with `export_hf` into a temporary directory, so both arms run the same weights:

- `longctx rope` / `longctx string`: `model.inference.generation.generate` (batch_size = `--batch`,
  the whole prompt prefilled in one forward, decoding through `DecodeGraph` with the
  Triton decoding kernel: `cuda_decoding="graph+kernel"`, opted into here since the
  engine's default is eager; a CUDA graph replayed per step on a GPU) on the model with `fuse_projections_` applied (the inference
  layout), plain RoPE and StRing (`arm_config("string")`: S = L/3 of the 2,048 training
  length, W = 128);
- `hf sdpa`: `AutoModelForCausalLM.from_pretrained(dir, dtype=bfloat16,
  attn_implementation="sdpa")` and its `generate(input_ids, attention_mask,
  max_new_tokens=N, min_new_tokens=N, do_sample=False)` (default dynamic cache).

Prompts: `--batch` NIAH-style prompts per length (filler ids, a needle run at 1/3 depth, the
needle's first ids again at the end: hf_attention.py's `prompt_ids`, seeds 0..batch-1), the
same ids for every arm, all of one length (no padding). A random-weight model retrieves
nothing: this measures speed only. EOS stops nothing on either side (no stop rule; HF's
generation config has no EOS id), so every row generates exactly `--new-tokens` tokens.

Per arm and length, each the median of `--repeats` calls, `torch.cuda.synchronize` around:
`prefill s` = a call with one new token (the prompt's forward and its argmax); `total s` =
a call with N new tokens (prefill + N - 1 decoding steps; the engine's includes recording
its CUDA graph); decode tokens/s = batch x (N - 1) / (total - prefill); `vs hf` = that rate
over HF's. One warm-up call per arm at 256 tokens before timing. `first-token agreement`:
rows whose first generated token equals HF's, and `all-token agreement`: generated tokens
equal to HF's at the same step (bf16 random weights make near-ties, so this is reported,
not asserted; StRing moves positions beyond S, so its tokens may differ from plain RoPE's).
Writes niah_decode_gpu.md and .json (benchmarks/report.py) to --out.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable

import report
import torch
from hf_attention import prompt_ids

from longctx.config.model import ModelConfig
from longctx.config.position_methods import arm_config
from longctx.model.hf import export_hf
from longctx.model.inference.generation import generate
from longctx.model.llama import Llama
from longctx.model.position_methods import build_position_method

SEED = 0
CUDA_DECODING = "graph+kernel"
"""The engine's decoding measured: steps replayed as a CUDA graph, attention in the Triton kernel."""
WARMUP_LENGTH = 256
SMOKE_OVERRIDES = {"n_layers": 2, "d_model": 128, "n_heads": 8, "n_kv_heads": 2, "d_ff": 256, "vocab_size": 512}
COLUMNS = [
    "T",
    "arm",
    "prefill s",
    "total s",
    "decode tokens/s",
    "total tokens/s",
    "vs hf (decode)",
    "first-token agreement",
    "all-token agreement",
]

Generator = Callable[[list[list[int]], int], list[list[int]]]
"""(prompts, new tokens) -> each prompt's generated token ids."""


def build(smoke: bool, device: torch.device, dtype: torch.dtype) -> Llama:
    """tinyllama-1.1b's shapes (tiny with `smoke`), seeded random weights in `dtype`, on `device`."""
    config = ModelConfig.from_preset("tinyllama-1.1b", **(SMOKE_OVERRIDES if smoke else {}))
    torch.manual_seed(SEED)
    with torch.device(device):
        model = Llama(config)
    return model.to(dtype).eval()


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def longctx_arm(model: Llama, method, batch: int) -> Generator:
    """The engine's greedy generation, no stop rule (every row runs all new tokens)."""

    def run(prompts: list[list[int]], new_tokens: int) -> list[list[int]]:
        outputs = generate(
            model,
            prompts,
            max_new_tokens=new_tokens,
            batch_size=batch,
            position_method=method,
            cuda_decoding=CUDA_DECODING,
        )
        return [list(output.token_ids) for output in outputs]

    return run


def hf_arm(model_dir: str, device: torch.device, dtype: torch.dtype) -> Generator:
    """transformers' greedy `generate` on the exported directory, its EOS id removed."""
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    hf = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, attn_implementation="sdpa")
    hf = hf.to(device).eval()
    hf.generation_config.eos_token_id = None  # no EOS stop: every row generates all new tokens

    def run(prompts: list[list[int]], new_tokens: int) -> list[list[int]]:
        ids = torch.tensor(prompts, device=device)
        out = hf.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            pad_token_id=0,
        )
        return out[:, ids.shape[1] :].tolist()

    return run


def timed(run: Generator, prompts: list[list[int]], new_tokens: int, device: torch.device):
    """(outputs, seconds) of one synchronised call."""
    synchronize(device)
    start = time.perf_counter()
    with torch.no_grad():
        outputs = run(prompts, new_tokens)
    synchronize(device)
    return outputs, time.perf_counter() - start


def measure(run: Generator, prompts: list[list[int]], args, device: torch.device) -> dict:
    """Median prefill and total seconds over `--repeats` calls, and the last call's tokens."""
    prefill, total, outputs = [], [], []
    for _ in range(args.repeats):
        prefill.append(timed(run, prompts, 1, device)[1])
        outputs, seconds = timed(run, prompts, args.new_tokens, device)
        total.append(seconds)
    for row in outputs:
        if len(row) != args.new_tokens:
            raise SystemExit(f"a row generated {len(row)} tokens, not {args.new_tokens}: a stop rule fired")
    return {"prefill": statistics.median(prefill), "total": statistics.median(total), "outputs": outputs}


def agreement(outputs: list[list[int]], reference: list[list[int]]) -> tuple[str, str]:
    """(rows whose first token equals the reference's, tokens equal at the same step), as 'k/n'."""
    first = sum(a[0] == b[0] for a, b in zip(outputs, reference, strict=True))
    steps = sum(x == y for a, b in zip(outputs, reference, strict=True) for x, y in zip(a, b, strict=True))
    return f"{first}/{len(outputs)}", f"{steps}/{sum(map(len, reference))}"


def table_rows(length: int, results: dict[str, dict], args) -> list[list[str]]:
    """One row per arm at one length (columns as COLUMNS)."""
    hf = results["hf sdpa"]
    decoded = args.batch * (args.new_tokens - 1)

    def decode_rate(result: dict) -> float:
        seconds = result["total"] - result["prefill"]
        return decoded / seconds if seconds > 0 else float("nan")

    rows = []
    for arm, result in results.items():
        first, steps = ("", "") if arm == "hf sdpa" else agreement(result["outputs"], hf["outputs"])
        rows.append(
            [
                str(length),
                arm,
                f"{result['prefill']:.3f}",
                f"{result['total']:.3f}",
                f"{decode_rate(result):.0f}",
                f"{args.batch * args.new_tokens / result['total']:.0f}",
                "" if arm == "hf sdpa" else f"{decode_rate(result) / decode_rate(hf):.2f}x",
                first,
                steps,
            ]
        )
        if arm != "hf sdpa":
            print(f"T={length} {arm}: first tokens agree with HF's on {first} rows, {steps} tokens", flush=True)
    return rows


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--lengths", type=int, nargs="+", default=[4096, 8192], help="prompt tokens")
    parser.add_argument("--batch", type=int, default=16, help="prompts per length, decoded as one batch")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3, help="timed calls per arm and length (median)")
    parser.add_argument("--smoke", action="store_true", help="tiny model in fp32 on CPU, lengths 64/128, batch 2")
    args = parser.parse_args()
    if args.smoke:
        args.lengths, args.batch, args.new_tokens, args.repeats = [64, 128], 2, 4, 1
    if args.new_tokens < 2:
        parser.error("--new-tokens must be at least 2 (one prefill token and one decoding step)")
    return args


def main() -> None:
    args = parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() and not args.smoke else "cpu")
    dtype = torch.float32 if args.smoke else torch.bfloat16
    model = build(args.smoke, device, dtype)
    vocab = model.config.vocab_size
    rows = []
    with tempfile.TemporaryDirectory(prefix="niah-decode-hf-") as model_dir:
        export_hf(model, model_dir)  # before fusing: the exported tensors are the Parameters as built
        model.fuse_projections_()
        string = build_position_method(arm_config("string"), model.config).to(device)
        arms = {
            "hf sdpa": hf_arm(model_dir, device, dtype),
            "longctx rope": longctx_arm(model, None, args.batch),
            "longctx string": longctx_arm(model, string, args.batch),
        }
        warmup = [prompt_ids(vocab, min(WARMUP_LENGTH, *args.lengths), seed=99) for _ in range(args.batch)]
        for run in arms.values():  # kernels, cuBLAS handles, the allocator's first blocks
            timed(run, warmup, 2, device)
        for length in args.lengths:
            prompts = [prompt_ids(vocab, length, seed) for seed in range(args.batch)]
            results = {}
            for arm, run in arms.items():
                results[arm] = measure(run, prompts, args, device)
                print(f"T={length} {arm}: {results[arm]['total']:.2f} s", flush=True)
            rows += table_rows(length, results, args)
    settings = {
        "preset": "tinyllama-1.1b" + (" (smoke: 2 layers, d 128)" if args.smoke else ""),
        "batch": args.batch,
        "new tokens": args.new_tokens,
        "repeats": args.repeats,
        "dtype": str(dtype).removeprefix("torch."),
        "smoke": args.smoke,
    }
    notes = [
        "prefill s: a call with one new token; total s: N new tokens; decode tokens/s = batch x (N - 1) / "
        "(total - prefill); medians of `repeats` calls, synchronised. Agreement: with HF's tokens "
        "(random weights: near-ties in bf16; StRing moves positions, so it may differ from RoPE).",
    ]
    if device.type != "cuda":
        notes.append("no CUDA: the engine decodes eagerly (no CUDA graph)")
    report.write(args.out, "niah_decode_gpu", COLUMNS, rows, settings=settings, notes=notes)


if __name__ == "__main__":
    main()
