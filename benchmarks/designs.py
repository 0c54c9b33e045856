"""The attention designs on CPU: a training step's time and peak memory at 4K per design as
ratios to plain RoPE in one run, and the KV cache's bytes per token of context.

    .venv/bin/python benchmarks/designs.py --out bench-out          # ~3 minutes on 2 cores
    .venv/bin/python benchmarks/designs.py --smoke --out /tmp/b     # tiny sizes (make test)
    .venv/bin/python benchmarks/designs.py --designs "3:1 Gated DeltaNet hybrid (8 layers)"
                                                                    # plain RoPE and the named rows

Every design is the `tiny` preset at 6 layers (so 5:1 has one global layer), window W =
512 where layers slide, on the `varlen` backend (the CPU training default), batch 1, one
document per row; step = forward + backward of the summed cross-entropy, median of
`--repeats` after one warm-up; peak = resident memory above the prepared model
(benchmarks/cpu_memory.py, a fresh process per design). KV bytes per token: the cache's
allocated bytes at 2T minus at T, over T (float32 keys and values): a sliding layer's
memory does not grow with the context, so 5:1 holds about 1/6 of all-full per token, and
a Gated DeltaNet layer holds a constant recurrent and convolution state, so the 3:1 hybrid's
cache grows only with its full layers (2 of 8; at 8 layers, as the designs sweep's hybrid
arms, its step is not a like-for-like ratio to the 6-layer rows: 6 linear + 2 full layers;
its delta rule runs in torch, the CPU path). A design the model does not build yet is
listed as such.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import cpu_memory
import report

from longctx.config.model import ModelConfig
from longctx.model.llama import Llama

DESIGNS: dict[str, dict] = {
    "plain RoPE": {},
    "NoPE every 4th layer": {"nope_every": 4},
    "5:1 sliding/global": {"global_every": 6, "sliding_rope_base": 10000.0, "rope_base": 1000000.0},
    "all sliding": {"layer_types": ["sliding"] * 6},
    "p-RoPE 0.25": {"rotary_fraction": 0.25, "partial_rotary": "p-rope"},
    "qk-norm per head": {"qk_norm": "head"},
    "sinks": {"attention_sinks": True},
    "SSMax temperature": {"attn_temperature": {"type": "ssmax"}},
    "3:1 Gated DeltaNet hybrid (8 layers)": {"n_layers": 8, "linear_attention": {"full_every": 4}},
}
"""Overrides of the benchmark's base config (see `config`)."""


def config(design: str, length: int, smoke: bool) -> ModelConfig:
    base = dict(n_layers=6, max_position=length, sliding_window=16 if smoke else 512)
    preset = "debug" if smoke else "tiny"
    return ModelConfig.from_preset(preset, **{**base, **DESIGNS[design]})


def prepare_step(design: str, length: int, smoke: bool):
    """The model, its inputs and one warm-up step; returns the step as a callable."""
    torch.manual_seed(0)
    model = Llama(config(design, length, smoke))
    ids = torch.randint(0, model.config.vocab_size, (1, length + 1))

    def step() -> None:
        model.zero_grad(set_to_none=True)
        loss = model(ids[:, :-1], labels=ids[:, 1:], attention_backend="varlen")
        loss.backward()

    step()
    return step


def step_ms(design: str, length: int, smoke: bool, repeats: int) -> float:
    step = prepare_step(design, length, smoke)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def kv_bytes_per_token(design: str, length: int, smoke: bool) -> float:
    model = Llama(config(design, length, smoke))
    sizes = []
    for max_len in (length, 2 * length):
        cache = model.new_kv_cache(1, max_len)
        with torch.no_grad():
            model(torch.zeros(1, 1, dtype=torch.long), kv_cache=cache)
        sizes.append(cache.nbytes)
    return (sizes[1] - sizes[0]) / length


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="directory for designs.json and designs.md")
    parser.add_argument("--length", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--smoke", action="store_true", help="debug preset, 64 tokens, one repeat")
    parser.add_argument(
        "--designs", nargs="+", choices=list(DESIGNS), help="only these rows, after plain RoPE (the ratios' base)"
    )
    args = parser.parse_args()
    chosen = ["plain RoPE", *(d for d in args.designs if d != "plain RoPE")] if args.designs else list(DESIGNS)
    length, repeats = (64, 1) if args.smoke else (args.length, args.repeats)
    rows, plain = [], None
    for design in chosen:
        try:
            ms = step_ms(design, length, args.smoke, repeats)
        except NotImplementedError as error:
            rows.append([design, f"not built: {error}", "", "", "", ""])
            continue
        peak = cpu_memory.peak_extra_mib(prepare_step, design, length, args.smoke)
        kv = kv_bytes_per_token(design, length, args.smoke)
        plain = plain or (ms, peak, kv)
        rows.append(
            [
                design,
                f"{ms:.0f}",
                f"{ms / plain[0]:.2f}x",
                f"{peak:.0f}",
                f"{peak / plain[1]:.2f}x",
                f"{kv / 1024:.1f} KiB ({kv / plain[2]:.2f}x)",
            ]
        )
    columns = ["design", "step ms", "vs plain", "peak MiB", "vs plain", "KV cache per token"]
    settings = {**report.environment(), "length": length, "repeats": repeats, "smoke": args.smoke}
    report.write(args.out, "designs", columns, rows, settings=settings)


if __name__ == "__main__":
    main()
