"""A real model on CPU: longctx's engine against transformers' `generate` (sdpa), batch 1, one run.

    python benchmarks/real_model_engine.py [--model DIR] [--lengths 8192] [--new-tokens 16] [--threads 1]
        [--repeats 1] [--out DIR]

Default model: Gemma 3 270M as `make real-model-gemma3` builds it (float32; a hybrid of 15
sliding layers of window 512 and 3 full layers). Two arms on the same prompt (prompt + new
tokens = the length; BOS, then filler ids with a needle run at 1/3 depth whose first ids end
the prompt), greedy, plain RoPE in both:

- `hf sdpa`: transformers' `generate` with `attn_implementation="sdpa"` (its default
  dynamic cache; a sliding layer's cache keeps its last window - 1 keys);
- `longctx`: `import_hf` + `model.inference.generation.generate` (whole-prompt prefill, KV cache with
  sliding layers keeping their window).

Per arm: prefill seconds (the first forward), decode ms per token, the whole test, the
process's peak resident memory (VmHWM; reset after loading) and its growth over the loaded
model, and whether the arms generate the same tokens. Each arm runs in a fresh spawned
process after a warm-up, so neither memory nor caches carry over; with `--repeats N` each
cell is the smallest of N interleaved rounds (other load on a shared machine only adds).
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
DEFAULT_MODEL = Path(os.environ.get("LONGCTX_CACHE", Path.home() / ".cache" / "longctx")) / "hf/gemma3-270m"
ARMS = ("hf sdpa", "longctx")


def prompt_ids(bos: int, length: int, seed: int) -> list[int]:
    """BOS, then `length` - 1 filler ids (200..40,000) with a 12-id needle at 1/3 depth whose
    first 6 ids end the prompt. Deterministic in `seed`."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(200, 40_000, (length - 1,), generator=generator)
    needle = torch.randint(200, 40_000, (12,), generator=generator)
    depth = length // 3
    ids[depth : depth + 12] = needle
    ids[-6:] = needle[:6]
    return [bos, *ids.tolist()]


class _Timer:
    """Times every forward of a module: the first of a test is the prefill."""

    def __init__(self, module):
        self.times: list[float] = []
        self._start = 0.0
        module.register_forward_pre_hook(lambda *_: self._begin())
        module.register_forward_hook(lambda *_: self.times.append(time.perf_counter() - self._start))

    def _begin(self) -> None:
        self._start = time.perf_counter()


def _run_arm(arm: str, model_dir: str, length: int, new_tokens: int, threads: int) -> dict:
    import torch

    torch.set_num_threads(threads)
    if arm == "hf sdpa":
        import transformers

        model = transformers.AutoModelForCausalLM.from_pretrained(
            model_dir, dtype=torch.float32, attn_implementation="sdpa"
        )
        model.eval()
        bos = model.config.bos_token_id

        def run(ids: list[int], tokens: int) -> list[int]:
            out = model.generate(
                torch.tensor([ids]), max_new_tokens=tokens, do_sample=False, eos_token_id=None, pad_token_id=0
            )
            return out[0, len(ids) :].tolist()

    else:
        from longctx.model.hf import import_hf
        from longctx.model.inference.generation import generate
        from longctx.model_tokenizer import tokenizer_for_model

        model = import_hf(model_dir).eval()
        bos = tokenizer_for_model(model_dir).bos_id

        def run(ids: list[int], tokens: int) -> list[int]:
            (generation,) = generate(model, [ids], max_new_tokens=tokens, batch_size=1)
            return list(generation.token_ids)

    timer = _Timer(model)
    with torch.no_grad():
        run(prompt_ids(bos, 64, seed=99), 2)  # warm-up: kernels, thread pools
        baseline = reset_peak()
        timer.times.clear()
        start = time.perf_counter()
        outputs = run(prompt_ids(bos, length - new_tokens, seed=0), new_tokens)
        total = time.perf_counter() - start
    peak = status_bytes("VmHWM")
    decode = timer.times[1:]
    return {
        "prefill": timer.times[0],
        "decode": sum(decode) / max(len(decode), 1),
        "total": total,
        "peak": peak / MIB,
        "extra": (peak - baseline) / MIB,
        "outputs": outputs,
    }


def _in_fresh_process(function, *args) -> dict:
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return pool.apply(function, args)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(DEFAULT_MODEL), help="an HF directory (`make real-model-gemma3`)")
    parser.add_argument("--lengths", type=int, nargs="+", default=[8192])
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=1, help="interleaved rounds; each cell the smallest value")
    parser.add_argument("--out", help="directory for real_model_engine(.json, .md)")
    args = parser.parse_args()
    import transformers

    rows = []
    for length in args.lengths:
        rounds = [
            {arm: _in_fresh_process(_run_arm, arm, args.model, length, args.new_tokens, args.threads) for arm in ARMS}
            for _ in range(args.repeats)
        ]
        best = {
            arm: {key: min(r[arm][key] for r in rounds) for key in rounds[0][arm] if key != "outputs"} for arm in ARMS
        }
        same = "yes" if all(r["longctx"]["outputs"] == r["hf sdpa"]["outputs"] for r in rounds) else "no"
        sdpa = best["hf sdpa"]
        for arm in ARMS:
            result = best[arm]
            rows.append(
                [
                    f"{length:,}",
                    arm,
                    f"{result['prefill']:.2f}",
                    f"{result['decode'] * 1000:.0f}",
                    f"{result['total']:.2f}",
                    f"{result['total'] / sdpa['total']:.2f}x",
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
        "decode ms/token",
        "test s",
        "test vs sdpa",
        "peak MiB",
        "growth MiB",
        "peak vs sdpa",
        "same tokens",
    ]
    notes = [
        f"{Path(args.model).name} float32, batch 1, one prompt per length, {args.new_tokens} new tokens, greedy, "
        f"plain RoPE; {args.threads} thread(s); each arm in a fresh process; load average at the end "
        f"{os.getloadavg()[0]:.1f}."
    ]
    settings = {
        "threads": args.threads,
        "new_tokens": args.new_tokens,
        "repeats": args.repeats,
        "transformers": transformers.__version__,
    }
    report.write(args.out, "real_model_engine", columns, rows, settings, notes)


if __name__ == "__main__":
    main()
