"""Prefill and per-token decode time of every position method vs plain RoPE on CPU.

    .venv/bin/python benchmarks/position_methods.py [--lengths 1024 4096] [--repeats 7]

Setting, per sequence length T:

- the `tiny` preset's attention shapes (8 query heads, 4 key/value heads, head_dim 32),
  float32, batch 1, one document of T tokens (the NIAH setting), `--threads` threads
  (default: torch's); the model's training length is T, so StRing uses S = round(T/3), W = 128 and the
  baselines the STRING §4.2 protocol (`baseline_protocol`);
- every method runs with the CPU default backend: `rope` (plain RoPE), `ntk` and `yarn`
  call `attention()` with `varlen`; the others run their passes in the pure-torch path;
- prefill: one layer's work including its setup: `plan` (the per-forward positions, cos/sin
  and key ranges), rotating q and k, and attention over T queries;
- decode: one new token over a KV cache of T - 1 tokens: `plan` for T keys, rotating the
  new query (and key), attention. rope/ntk/yarn/string cache keys rotated (`rotate_keys`);
  rerope/self_extend/dca cache them un-rotated and re-rotate the whole cache every step, as
  their rewritten key positions require.

Times are medians over `--repeats` rounds; each round times every method once, in turn,
so that load changes on a shared machine hit all methods alike. Before timing, every
method's one-token decode of the last position must match its prefill's last row (1e-4).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from longctx.model.llama import ModelConfig
from longctx.model.position_methods import (
    PositionMethod,
    PositionMethodConfig,
    StringConfig,
    build_position_method,
)

HEADS, KV_HEADS, HEAD_DIM = 8, 4, 32  # the `tiny` preset: d_model 256 over 8 heads
SEED = 0
TOLERANCE = 1e-4
METHODS = ("rope", "ntk", "yarn", "rerope", "self_extend", "dca", "string", "string-repo")


def build(name: str, training_length: int) -> PositionMethod:
    model = ModelConfig.from_preset("tiny", max_position=training_length)
    if name == "string-repo":
        return build_position_method(PositionMethodConfig(name="string", string=StringConfig(compat="repo")), model)
    return build_position_method(PositionMethodConfig(name=name), model)


def make_inputs(seq_len: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(SEED)
    q = torch.randn(1, seq_len, HEADS, HEAD_DIM, generator=generator)
    k = torch.randn(1, seq_len, KV_HEADS, HEAD_DIM, generator=generator)
    v = torch.randn(1, seq_len, KV_HEADS, HEAD_DIM, generator=generator)
    return q, k, v, torch.arange(seq_len)[None]


def prefill_op(method: PositionMethod, q, k, v, positions) -> Callable[[], torch.Tensor]:
    return lambda: method.attend(q, k, v, position_ids=positions)


def decode_op(method: PositionMethod, q, k, v, positions) -> Callable[[], torch.Tensor]:
    """The last token over a cache of the others, written in place like the model's KVCache;
    the cache of earlier tokens is prepared outside the timing."""
    rotated = method.caches_rotated_keys
    cache = method.rotate_keys(k, positions) if rotated else k.clone()

    def step() -> torch.Tensor:
        cache[:, -1:] = method.rotate_keys(k[:, -1:], positions[:, -1:]) if rotated else k[:, -1:]
        return method.attend(q[:, -1:], cache, v, position_ids=positions, keys_rotated=rotated)

    return step


def interleaved_medians(ops: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Median ms per op; each round runs every op once (after one warm-up round)."""
    for op in ops.values():
        op()
    times: dict[str, list[float]] = {name: [] for name in ops}
    for _ in range(repeats):
        for name, op in ops.items():
            start = time.perf_counter()
            op()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) * 1e3 for name, values in times.items()}


def measure(seq_len: int, repeats: int) -> list[list[str]]:
    q, k, v, positions = make_inputs(seq_len)
    methods = {name: build(name, seq_len) for name in METHODS}
    for name, method in methods.items():
        last_row = prefill_op(method, q, k, v, positions)()[:, -1]
        decoded = decode_op(method, q, k, v, positions)()[:, 0]
        difference = (last_row - decoded).abs().max().item()
        if difference >= TOLERANCE:
            raise SystemExit(f"{name}: decoding differs from prefill by {difference:.2e} at T={seq_len}; not timing it")
    with torch.no_grad():
        prefill = interleaved_medians({n: prefill_op(m, q, k, v, positions) for n, m in methods.items()}, repeats)
        decode = interleaved_medians({n: decode_op(m, q, k, v, positions) for n, m in methods.items()}, repeats * 5)
    rows = []
    for name, method in methods.items():
        params = ", ".join(f"{key}={value:.4g}" if isinstance(value, float) else f"{key}={value}" for key, value in method.params.items())
        rows.append([
            str(seq_len), name, params or "-",
            f"{prefill[name]:.1f}", f"{prefill[name] / prefill['rope']:.2f}x",
            f"{decode[name]:.3f}", f"{decode[name] / decode['rope']:.2f}x",
        ])  # fmt: skip
    return rows


COLUMNS = ("T", "method", "parameters", "prefill ms", "vs rope", "decode ms/token", "vs rope")


def markdown_table(rows: list[list[str]]) -> str:
    lines = [COLUMNS, ("---:", "---", "---", "---:", "---:", "---:", "---:"), *rows]
    return "\n".join("| " + " | ".join(cells) + " |" for cells in lines)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096], help="sequence lengths T (= training length)")
    parser.add_argument("--repeats", type=int, default=7, help="timed prefill rounds (decode: 5x as many); medians reported")
    parser.add_argument("--threads", type=int, default=0, help="torch threads; 0 = torch's default")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(
        f"H={HEADS}, Hkv={KV_HEADS}, D={HEAD_DIM}, float32, batch 1, one document, "
        f"{torch.get_num_threads()} threads, {args.repeats} prefill rounds",
        flush=True,
    )
    rows = []
    for seq_len in args.lengths:
        rows += measure(seq_len, args.repeats)
        print(f"T={seq_len} done", flush=True)
    print()
    print(markdown_table(rows))


if __name__ == "__main__":
    main()
