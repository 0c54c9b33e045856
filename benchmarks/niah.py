"""NIAH evaluation throughput: batched KV-cache greedy decoding vs no-cache recompute, and a full search.

Launch from the repository root:

    .venv/bin/python benchmarks/niah.py [--preset tiny] [--checkpoint PATH] [--lengths 256 512]
                                        [--prompts 8] [--new-tokens 48] [--backend sdpa]
                                        [--threads N] [--search-max-length 1024] [--tests 50]
                                        [--skip-throughput] [--skip-search] [--heatmap PATH]

What it measures (bpe-8192, Paul Graham haystack, `paper` task prompts, float32, CPU):

1. Throughput at each of `--lengths`: the same `--prompts` prompts decoded for
   `--new-tokens` greedy tokens three ways, side by side:
   - `recompute`: `greedy_generate_recompute`, all prompts in one batch, the whole
     sequence re-run for every new token (no cache);
   - `kv, batch 1`: `model.inference.generation.generate` one prompt at a time;
   - `kv, batched`: `model.inference.generation.generate`, all prompts per forward (no stop rule).
   All three must produce the same tokens (checked; the script aborts otherwise). Times
   are single runs after a short warm-up decode; "speedup" is recompute / batched time.
2. A full effective-length search (`eval.niah.evaluation.evaluate`: one engine cell per length,
   decoded by `model.inference.generation.generate`, stopping at EOS) of the model: lengths
   128, 256, ... `--search-max-length`, `--tests` prompts each, every length evaluated
   (`stop_at_first_failure=False`), wall time per length and in total, sample building and
   scoring included. A random-init model finds no needle, so its effective length is 0.
   `--out DIR` writes the search's table to DIR/niah_search.json and .md (report.py).

`make bench-gpu-effective-length`: `--device cuda --preset tinyllama-1.1b
--skip-throughput --search-max-length 4096 --tests 50`: the search's time on the 1.1B
shapes in bf16 (random weights: every length is evaluated, none passes), at least 50
tests per length (the script refuses fewer on a GPU). `--smoke` runs it on CPU with the
debug model up to 256 tokens, 2 tests per length.

The host's load average is printed: other processes on a 2-core machine slow torch's
thread pool a lot. Measured on the 2-core dev VM (torch 2.14.1, load average 0.9-1.7),
`tiny`, defaults (docs/benchmarks.md):

    threads  speedup vs recompute (L=256 / 512)   full search (8 lengths x 50 tests)
    1        27.6x / 43.1x                         56.3 s
    2        23.4x / 23.9x                         32.1 s
"""

from __future__ import annotations

import argparse
import functools
import os
import time

import numpy as np
import report
import torch

from longctx.config import EvalConfig, ExperimentConfig, NiahConfig
from longctx.config.model import ModelConfig
from longctx.data.tokenizer import load_tokenizer
from longctx.eval.cells import Decoding
from longctx.eval.effective_length import plot_heatmap
from longctx.eval.niah.evaluation import evaluate
from longctx.eval.niah.generator import make_samples
from longctx.eval.niah.haystack import Haystack
from longctx.model.checkpoint import load_model
from longctx.model.inference.generation import generate
from longctx.model.inference.prefill import greedy_generate_recompute
from longctx.model.llama import Llama
from longctx.runtime import tune_cpu_allocator

WIDTHS = (6, 13, 14, 14, 19, 9)
MIN_TESTS = 50


def timed(fn):
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def cached(model, input_ids: torch.Tensor, new_tokens: int, backend: str, batch_size: int) -> torch.Tensor:
    """Cached greedy decoding of the prompts, `batch_size` per forward, no stop rule."""
    prompts = input_ids.tolist()
    generations = generate(model, prompts, max_new_tokens=new_tokens, batch_size=batch_size, attention_backend=backend)
    return torch.tensor([g.token_ids for g in generations])


def throughput(model, tokenizer, haystack, lengths, prompts, new_tokens, backend) -> None:
    print(f"\n== greedy decoding of {prompts} prompts x {new_tokens} new tokens ==")
    header = ("length", "recompute s", "kv batch-1 s", "kv batched s", "new tok/s batched", "speedup")
    print("".join(f"{h:>{w}}" for h, w in zip(header, WIDTHS, strict=True)))
    for length in lengths:
        samples = make_samples(tokenizer, haystack, length, prompts, seed=0)
        input_ids = torch.from_numpy(np.stack([s.input_ids for s in samples]))
        cached(model, input_ids[:, :64], 4, backend, prompts)  # warm-up: prefill, cached steps
        batched, t_batched = timed(functools.partial(cached, model, input_ids, new_tokens, backend, prompts))
        single, t_single = timed(functools.partial(cached, model, input_ids, new_tokens, backend, 1))
        recomputed, t_recompute = timed(functools.partial(greedy_generate_recompute, model, input_ids, new_tokens))
        if not (torch.equal(batched, single) and torch.equal(batched, recomputed)):
            raise SystemExit(f"length {length}: the three decoders disagree")
        cells = (
            length,
            f"{t_recompute:.2f}",
            f"{t_single:.2f}",
            f"{t_batched:.2f}",
            f"{prompts * new_tokens / t_batched:.1f}",
            f"{t_recompute / t_batched:.1f}x",
        )
        print("".join(f"{c:>{w}}" for c, w in zip(cells, WIDTHS, strict=True)))


SEARCH_COLUMNS = ["length", "rows per batch", "passed", "rate [Wilson 95%]", "seconds"]


def full_search(
    model, tokenizer, haystack, max_length, tests, new_tokens, backend, heatmap, cuda_decoding
) -> list[list[str]]:
    config = NiahConfig(
        max_length=max_length, tests_per_length=tests, max_new_tokens=new_tokens, stop_at_first_failure=False
    )
    print(
        f"\n== effective-length search: lengths {config.evaluated_lengths()[0]}..{config.evaluated_lengths()[-1]}, {tests} tests each =="
    )
    decoding = Decoding(batch_tokens=config.batch_tokens)
    start = time.perf_counter()
    experiment = ExperimentConfig(eval=EvalConfig(cuda_decoding=cuda_decoding))
    result = evaluate(model, experiment, tokenizer, haystack, settings=config, attention_backend=backend)
    total = time.perf_counter() - start
    for row in result.per_length:
        print(
            f"  L={row.length:>5}  batch {decoding.rows(row.length):>2}  pass {row.passed:>3}/{row.tests}"
            f"  rate {row.rate:.2f} [{row.wilson_low:.2f}, {row.wilson_high:.2f}]  {row.seconds:6.1f} s"
        )
    print(
        f"effective length {result.effective_length}; total {total:.1f} s for {len(config.evaluated_lengths()) * tests} tests"
    )
    if heatmap:
        print(f"heatmap -> {plot_heatmap(result, heatmap)}")
    rows = [
        [
            str(row.length),
            str(decoding.rows(row.length)),
            f"{row.passed}/{row.tests}",
            f"{row.rate:.2f} [{row.wilson_low:.2f}, {row.wilson_high:.2f}]",
            f"{row.seconds:.1f}",
        ]
        for row in result.per_length
    ]
    return [*rows, ["all", "", f"effective length {result.effective_length}", "", f"{total:.1f}"]]


def main() -> None:
    tune_cpu_allocator()  # as `longctx niah` does
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--checkpoint", help="a trained model (.safetensors / .ckpt / HF dir) instead of a random one")
    parser.add_argument("--lengths", type=int, nargs="+", default=[256, 512])
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--backend", default="sdpa", help="attention backend for decoding (model default: auto)")
    parser.add_argument("--threads", type=int, help="torch.set_num_threads")
    parser.add_argument("--search-max-length", type=int, default=1024)
    parser.add_argument("--tests", type=int, default=50)
    parser.add_argument("--skip-throughput", action="store_true")
    parser.add_argument("--skip-search", action="store_true")
    parser.add_argument("--heatmap", help="write the search's depth x length PNG here")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="cuda: the model in bf16 on the GPU")
    parser.add_argument(
        "--cuda-decoding",
        default="eager",
        help="the search's eval.cuda_decoding: eager | kernel | graph | graph+kernel (CPU: eager whatever it says)",
    )
    parser.add_argument("--out", help="directory for niah_search.json and .md (the search's table)")
    parser.add_argument("--smoke", action="store_true", help="debug model, lengths to 256, 2 tests: checks the script")
    args = parser.parse_args()
    if args.smoke:
        args.preset, args.skip_throughput, args.search_max_length, args.tests, args.new_tokens = (
            "debug",
            True,
            256,
            2,
            4,
        )
    elif args.device == "cuda" and not args.skip_search and args.tests < MIN_TESTS:
        parser.error(f"--tests must be at least {MIN_TESTS} per length on a GPU (the stated minimum)")

    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    device = torch.device(args.device)
    if args.checkpoint:
        model = load_model(args.checkpoint)
    else:
        with device:  # initialised on the device (tinyllama-1.1b: 4.4 GB in fp32)
            model = Llama(ModelConfig.from_preset(args.preset))
    model.to(device, torch.bfloat16 if device.type == "cuda" else torch.float32).eval()
    tokenizer = load_tokenizer("bpe-8192")
    haystack = Haystack.paul_graham(tokenizer)
    print(
        f"model {args.checkpoint or args.preset} ({model.config.num_parameters() / 1e6:.1f}M params), "
        f"backend {args.backend}, torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"load average {os.getloadavg()[0]:.2f}"
    )
    if not args.skip_throughput:
        throughput(model, tokenizer, haystack, args.lengths, args.prompts, args.new_tokens, args.backend)
    if not args.skip_search:
        rows = full_search(
            model,
            tokenizer,
            haystack,
            args.search_max_length,
            args.tests,
            args.new_tokens,
            args.backend,
            args.heatmap,
            args.cuda_decoding,
        )
        settings = {"model": args.checkpoint or args.preset, "tests per length": args.tests, "backend": args.backend}
        settings["cuda decoding"] = args.cuda_decoding
        report.write(args.out, "niah_search", SEARCH_COLUMNS, rows, settings)
    print(f"load average at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
