"""longctx's position methods inside transformers (longctx.hf_attention), side by side in one run.

    python benchmarks/hf_attention.py [--model DIR] [--lengths 4096 8192] [--prompts 1] [--new-tokens 16]
        [--tiny-length 32768] [--threads 2] [--out DIR]

Table `hf_attention` (issue 45 item 7): SmolLM2-135M-Instruct as `make real-model` builds it
(float32), the same prompts (NIAH-style: a needle run inside filler ids, then its first ids
again as the question) at each length, prompt + new tokens = the length (8,192 = L: no
position beyond the training length), three arms:

- `hf sdpa`: transformers' `generate` with `attn_implementation="sdpa"` (plain RoPE);
- `hf longctx_string`: the same `generate` with `attn_implementation="longctx_string"`
  (StRing with longctx's defaults: S = L/3 = 2,731, W = 128 at L = 8,192);
- `longctx string`: longctx's own engine (import_hf + model.inference.generation.generate) with the
  same method.

Per test: prefill seconds (the first forward), decoding seconds per token, the whole test,
and the process's peak resident memory (VmHWM) with its growth over the loaded model (the
high-water mark is reset after loading, `/proc/self/clear_refs`). Each (arm, length) runs in
a fresh spawned process after a 64-token warm-up, so neither memory nor caches carry over;
`--repeats N` runs N interleaved rounds of all arms and keeps each measurement's smallest
value (on a shared machine other load only ever adds).

Table `hf_attention_tiny` (item 2): a tiny random Llama (2 layers, 4 heads of 16) prefilling
one `--tiny-length` prompt on CPU, `sdpa` against `longctx_string` and `longctx_rope`: peak
memory and seconds.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import time
from pathlib import Path

import report
from cpu_memory import reset_peak, status_bytes

MIB = 2**20
DEFAULT_MODEL = Path(os.environ.get("LONGCTX_CACHE", Path.home() / ".cache" / "longctx")) / "hf/smollm2-135m-instruct"
ARMS = ("hf sdpa", "hf longctx_string", "longctx string")
TINY_ARMS = ("sdpa", "longctx_string", "longctx_rope")


def prompt_ids(vocab_size: int, length: int, seed: int) -> list[int]:
    """A NIAH-style prompt of `length` tokens: filler ids, a needle run at 1/3 depth, the
    needle's first tokens again at the end (the question). Deterministic in `seed`."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(200, min(vocab_size, 40000), (length,), generator=generator)
    needle = torch.randint(200, min(vocab_size, 40000), (12,), generator=generator)
    depth = length // 3
    ids[depth : depth + 12] = needle
    ids[-6:] = needle[:6]
    return ids.tolist()


class _FirstCall:
    """Times every forward of a module: the first is the prefill."""

    def __init__(self, module):
        self.times: list[float] = []
        self._start = 0.0
        module.register_forward_pre_hook(lambda *_: self._begin())
        module.register_forward_hook(lambda *_: self.times.append(time.perf_counter() - self._start))

    def _begin(self) -> None:
        self._start = time.perf_counter()


def _run_arm(arm: str, model_dir: str, length: int, prompts: int, new_tokens: int, threads: int) -> dict:
    import torch

    torch.set_num_threads(threads)
    if arm.startswith("hf"):
        import transformers

        import longctx.hf_attention  # noqa: F401  (registers longctx_string)

        name = arm.split()[1]
        model = transformers.AutoModelForCausalLM.from_pretrained(
            model_dir, dtype=torch.float32, attn_implementation=name
        )
        model.eval()
        model.generation_config.eos_token_id = None  # every arm generates all new tokens (no EOS stop)
        vocab = model.config.vocab_size
        timer = _FirstCall(model)

        def run(ids: list[int], tokens: int) -> list[int]:
            with torch.no_grad():
                out = model.generate(torch.tensor([ids]), max_new_tokens=tokens, do_sample=False, pad_token_id=0)
            return out[0, len(ids) :].tolist()

    else:
        from longctx.config.position_methods import PositionMethodConfig
        from longctx.model.hf import import_hf
        from longctx.model.inference.generation import generate
        from longctx.model.position_methods import build_position_method

        own = import_hf(model_dir).eval()
        method = build_position_method(PositionMethodConfig(name="string"), own.config)
        vocab = own.config.vocab_size
        timer = _FirstCall(own)

        def run(ids: list[int], tokens: int) -> list[int]:
            with torch.no_grad():
                (generation,) = generate(own, [ids], max_new_tokens=tokens, position_method=method)
            return list(generation.token_ids)

    run(prompt_ids(vocab, 64, seed=99), 2)  # warm-up: kernels, thread pools
    baseline = reset_peak()
    prefill, decode, total, outputs = [], [], [], []
    for seed in range(prompts):
        timer.times.clear()
        start = time.perf_counter()
        outputs.append(run(prompt_ids(vocab, length - new_tokens, seed), new_tokens))
        total.append(time.perf_counter() - start)
        prefill.append(timer.times[0])
        decode.append(sum(timer.times[1:]) / max(len(timer.times) - 1, 1))
    peak = status_bytes("VmHWM")
    return {
        "prefill": sum(prefill) / prompts,
        "decode": sum(decode) / prompts,
        "total": sum(total) / prompts,
        "peak": peak / MIB,
        "extra": (peak - baseline) / MIB,
        "outputs": outputs,
    }


def _run_tiny(arm: str, length: int, threads: int) -> dict:
    import torch
    import transformers

    import longctx.hf_attention as hfa

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=384,
        hidden_size=64,
        intermediate_size=160,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=length,
    )
    model = transformers.LlamaForCausalLM(config).eval()
    if arm == "sdpa":
        model.set_attn_implementation("sdpa")
    else:
        hfa.apply(model, arm.removeprefix("longctx_"))
    with torch.no_grad():
        model(torch.randint(0, 384, (1, 64)), logits_to_keep=1)
        ids = torch.randint(0, 384, (1, length))
        baseline = reset_peak()
        start = time.perf_counter()
        model(ids, logits_to_keep=1)
        seconds = time.perf_counter() - start
    peak = status_bytes("VmHWM")
    return {"seconds": seconds, "peak": peak / MIB, "extra": (peak - baseline) / MIB}


def _fastest(results: list[dict]) -> dict:
    """The smallest of each measurement over the rounds (a shared machine's other load only adds)."""
    return {key: min(r[key] for r in results) if key != "outputs" else results[0][key] for key in results[0]}


def _in_fresh_process(function, *args) -> dict:
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return pool.apply(function, args)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(DEFAULT_MODEL), help="the HF directory of `make real-model`")
    parser.add_argument("--lengths", type=int, nargs="+", default=[4096, 8192])
    parser.add_argument("--prompts", type=int, default=1, help="tests per length (the same prompts in every arm)")
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--tiny-length", type=int, default=32768, help="0 skips the tiny-model table")
    parser.add_argument("--skip-model", action="store_true", help="only the tiny-model table")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--repeats", type=int, default=1, help="rounds of all arms, interleaved; each cell the smallest value"
    )
    parser.add_argument("--out", help="directory for hf_attention(.json, .md) and hf_attention_tiny")
    args = parser.parse_args()
    import transformers

    settings = {"threads": args.threads, "transformers": transformers.__version__}
    if not args.skip_model:
        rows = []
        for length in args.lengths:
            results = {
                arm: _in_fresh_process(_run_arm, arm, args.model, length, args.prompts, args.new_tokens, args.threads)
                for arm in ARMS
            }
            sdpa = results["hf sdpa"]
            for arm in ARMS:
                result = results[arm]
                same = "yes" if result["outputs"] == results["longctx string"]["outputs"] else "no"
                rows.append(
                    [
                        f"{length:,}",
                        arm,
                        f"{result['prefill']:.2f}",
                        f"{result['prefill'] / sdpa['prefill']:.2f}x",
                        f"{result['decode'] * 1000:.0f}",
                        f"{result['total']:.2f}",
                        f"{result['peak']:.0f}",
                        f"{result['extra']:.0f}",
                        f"{result['peak'] / sdpa['peak']:.2f}x",
                        same,
                    ]
                )
        columns = [
            "tokens",
            "arm",
            "prefill s",
            "vs sdpa",
            "decode ms/token",
            "test s",
            "peak MiB",
            "growth MiB",
            "peak vs sdpa",
            "tokens = longctx string",
        ]
        notes = [
            f"SmolLM2-135M-Instruct float32, {args.prompts} prompt(s) per length, {args.new_tokens} new tokens, "
            "greedy; StRing S = L/3, W = 128 (L = max_position_embeddings: 8,192 for SmolLM2); each arm in a fresh process."
        ]
        settings_model = {**settings, "prompts": args.prompts, "new_tokens": args.new_tokens, "repeats": args.repeats}
        report.write(args.out, "hf_attention", columns, rows, settings_model, notes)
    if args.tiny_length:
        rounds = [
            {arm: _in_fresh_process(_run_tiny, arm, args.tiny_length, args.threads) for arm in TINY_ARMS}
            for _ in range(args.repeats)
        ]
        results = {arm: _fastest([one[arm] for one in rounds]) for arm in TINY_ARMS}
        sdpa = results["sdpa"]
        rows = [
            [
                f"{args.tiny_length:,}",
                arm,
                f"{result['seconds']:.2f}",
                f"{result['peak']:.0f}",
                f"{result['extra']:.0f}",
                f"{result['peak'] / sdpa['peak']:.2f}x",
                f"{result['extra'] / sdpa['extra']:.2f}x",
            ]
            for arm, result in results.items()
        ]
        columns = [
            "tokens",
            "attn_implementation",
            "prefill s",
            "peak MiB",
            "growth MiB",
            "peak vs sdpa",
            "growth vs sdpa",
        ]
        notes = [
            "Random LlamaForCausalLM, 2 layers, 4 heads (2 KV) of 16, float32, one prompt, logits of the last token."
        ]
        report.write(args.out, "hf_attention_tiny", columns, rows, {**settings, "repeats": args.repeats}, notes)


if __name__ == "__main__":
    main()
