"""Prefill and per-token decode time of every position method vs plain RoPE on CPU.

    .venv/bin/python benchmarks/position_methods.py [--lengths 1024 4096] [--layers 1]
        [--repeats 7] [--threads 0] [--clock wall|cpu] [--level attention model]

Two levels, each its own table:

- `attention`: the attention operation alone (below), where a method's extra work shows
  undiluted;
- `model`: the `tiny` model (4 layers, d_model 256, 8.1M parameters, max_position = T,
  seeded random weights) as NIAH runs it: prefill = `Llama.forward` over the T-token
  prompt into a fresh KV cache with `last_logits_only`; decode = one more token through
  that cache (the cache is rewound one position before every timed step). This is the
  setting of the STRING paper's efficiency test (Appendix A.3: inference time of
  Llama 3.1 8B with and without StRing).

Attention-level setting, per sequence length T:

- the `tiny` preset's attention shapes (8 query heads, 4 key/value heads, head_dim 32),
  float32, batch 1, one document of T tokens (the NIAH setting); the training length is
  T, so StRing uses S = round(T/3), W = 128 and the baselines the STRING §4.2 protocol
  (`baseline_protocol`);
- every method runs with the CPU default backend: `rope` (plain RoPE), `ntk` and `yarn`
  call `attention()` with `varlen`; the others run their passes in the pure-torch path;
- one timed forward = the per-forward setup (`plan`: positions, cos/sin, key ranges; for
  rope/ntk/yarn the same plus `build_mask`) + `--layers` attention layers (rotate q and k,
  attend). The default, 1 layer, charges a method its whole setup; a model shares the
  setup across its layers (TinyLlama: 22);
- prefill: T queries over T keys. decode: one new token over a KV cache of T - 1 tokens,
  the new key written in place as the model's KVCache does. rope/ntk/yarn/string cache
  keys rotated (`rotate_keys`); rerope/self_extend/dca cache them un-rotated and rotate
  what they read every step, as their rewritten key positions require.

glibc malloc is tuned as the CLI does it (`runtime.py`). Times are the best of
`--repeats` rounds (decode: 5x as many) after a warm-up; each round times every method
once, in turn, so that load changes on a shared machine hit all methods alike. `--clock
cpu` measures process CPU time instead of wall time: use it with `--threads 1` on a
machine that other jobs share. Before timing, every method's decoding of the last token
must match the last row of its prefill (1e-4; at model level, the last logits).

`--device cuda` (on CPU too with `--device cpu --portable`): the model level only, with
`--preset` (default tinyllama-1.1b; 22 layers, d_model 2048) in bf16 on CUDA, attention
backend `auto` (flash: the passes of position_methods/gpu.py for string, rerope,
self_extend and dca), one document of T tokens, training length
T. Per method a first prefill (timed alone: its peak memory, MiB above the weights and
inputs and GiB of all allocated, and the decoding check's reference), then `--repeats`
prefills taking turns (median, CUDA-synchronised; with `--repeats 0` the first call's time
is reported), and at the lengths of `--decode-lengths` (default all) 5 x repeats decoding
steps; ratios to plain RoPE (added unless `--no-rope-baseline`). Decoding must match the
prefill's last logits to 5% of their range (bf16). `make gpu-check`'s long-context part:
`--lengths 32768 131072 --methods string --repeats 2 --decode-lengths 32768`, then
`--preset llama3.1-8b --lengths 131072 --methods string --no-rope-baseline --repeats 0
--decode-lengths`.
`--preset llama3.1-8b`: a random-initialised Llama-3.1-8B configuration (32 layers,
d_model 4,096, 32/8 heads, d_ff 14,336, vocabulary 128,256, RoPE base 500,000 with
llama3 scaling 8x from 8,192), for the memory case of a real model at 128K.

`make bench-gpu-positions` runs, with `--out DIR` writing
DIR/positions_<preset>.json and .md (benchmarks/report.py):

    --device cuda --lengths 8192 32768 131072 --methods string rerope self_extend dca
    --device cuda --preset llama3.1-8b --lengths 131072 --methods string --repeats 3

Minimum repeats on a GPU: 5 for tinyllama-1.1b, 3 for the 8B case (its 128K prefill takes
seconds); decode takes 5x as many. `--smoke` runs the same code on CPU at debug sizes.

`--count-ops` (CPU, no timing): one layer of a bf16 prefill on the flash path with
`--preset`'s heads (one document of T tokens, training length T, keys as the model hands
them over), the varlen kernel replaced by one that only allocates its outputs, under both
of torch's signatures (2.11: k/v expanded for GQA; 2.14: `enable_gqa`). Per method: the
aten ops around the kernel, the MiB their outputs write (in-place included) and allocate,
the kernel's output MiB, and the peak MiB of storages held during the layer, as a device
allocator sees them (CPU kernels' own mixed-dtype temporaries left out).
"""

from __future__ import annotations

import argparse
import collections
import math
import sys
import time
import weakref
from collections.abc import Callable

import device_timing
import report
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from longctx.config.methods.registry import arm_names, method_names
from longctx.config.model import ModelConfig
from longctx.config.position_methods import arm_config
from longctx.model.llama import Llama
from longctx.model.position_methods import PositionMethod, build_position_method
from longctx.model.rope import RopeScaling
from longctx.runtime import tune_cpu_allocator

HEADS, KV_HEADS, HEAD_DIM = 8, 4, 32  # the `tiny` preset: d_model 256 over 8 heads
SEED = 0
TOLERANCE = 1e-4
METHODS = method_names() + arm_names()
"""Every registered method and arm (string-repo)."""
DECODING_DIFFERS = ("string-repo",)
"""Methods whose cached decoding step is not a prefill row, by design: StRing compat='repo'
decodes over the band [0, S-1] and prefills over [0, S], as the authors' code does
(position_methods/method.py); their decoding is checked against a dense reference in
tests/model/test_position_methods.py instead."""
GOALS = {"prefill": 1.2, "decode": 1.3}  # StRing vs plain RoPE: the cost of the shifted band must stay small


LLAMA31_8B = dict(
    vocab_size=128256,
    d_model=4096,
    n_layers=32,
    n_heads=32,
    n_kv_heads=8,
    d_ff=14336,
    rope_base=500000.0,
    rope_scaling=RopeScaling("llama3", factor=8.0, original_max_position=8192),
)
"""Llama-3.1-8B's config.json, as model fields (random weights: a memory and time case)."""


def model_config(preset: str, max_position: int) -> ModelConfig:
    """A preset of config/model.py, or `llama3.1-8b`."""
    if preset == "llama3.1-8b":
        return ModelConfig(preset=preset, max_position=max_position, **LLAMA31_8B)  # type: ignore[arg-type]
    return ModelConfig.from_preset(preset, max_position=max_position)


def build(name: str, training_length: int, preset: str = "tiny") -> PositionMethod:
    return build_position_method(arm_config(name), model_config(preset, training_length))


def make_inputs(seq_len: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(SEED)
    q = torch.randn(1, seq_len, HEADS, HEAD_DIM, generator=generator)
    k = torch.randn(1, seq_len, KV_HEADS, HEAD_DIM, generator=generator)
    v = torch.randn(1, seq_len, KV_HEADS, HEAD_DIM, generator=generator)
    return q, k, v, torch.arange(seq_len)[None]


def prefill_op(method: PositionMethod, q, k, v, positions, layers: int = 1) -> Callable[[], torch.Tensor]:
    def forward() -> torch.Tensor:
        plan = method.plan(positions, dtype=q.dtype)
        for _ in range(layers):
            out = method(q, k, v, plan)
        return out

    return forward


def decode_op(method: PositionMethod, q, k, v, positions, layers: int = 1) -> Callable[[], torch.Tensor]:
    """The last token over a cache of the others; the cache of earlier tokens is prepared
    outside the timing, the new key is written into it in place."""
    rotated = method.caches_rotated_keys
    cache = method.rotate_keys(k, positions) if rotated else k.clone()

    def step() -> torch.Tensor:
        plan = method.plan(positions, q_len=1, keys_rotated=rotated, dtype=q.dtype)
        for _ in range(layers):
            cache[:, -1:] = method.rotate_keys(k[:, -1:], positions[:, -1:]) if rotated else k[:, -1:]
            out = method(q[:, -1:], cache, v, plan)
        return out

    return step


def model_ops(
    model: Llama, method: PositionMethod | None, input_ids: torch.Tensor, prepare_decode: bool = True
) -> tuple[Callable, Callable]:
    """(prefill, decode) of the whole model; decode reuses a cache holding the first T - 1
    tokens, rewound one position before each step (filled here only with `prepare_decode`:
    a second prefill, which the 128K cases without decoding skip)."""
    seq_len = input_ids.shape[1]

    def prefill() -> torch.Tensor:
        cache = model.new_kv_cache(1, seq_len)
        return model(input_ids, kv_cache=cache, position_method=method, last_logits_only=True)[:, -1]

    if not prepare_decode:
        return prefill, prefill
    cache = model.new_kv_cache(1, seq_len)
    model(input_ids[:, :-1], kv_cache=cache, position_method=method, last_logits_only=True)

    def decode() -> torch.Tensor:
        cache.length, cache.next_position = seq_len - 1, cache.next_position.new_full((1,), seq_len - 1)
        return model(input_ids[:, -1:], kv_cache=cache, position_method=method)[:, -1]

    return prefill, decode


def best_times(ops: dict[str, Callable[[], object]], repeats: int, clock: Callable[[], float]) -> dict[str, float]:
    """Best ms per op; each round runs every op once (after one warm-up round)."""
    for op in ops.values():
        op()
    times: dict[str, list[float]] = {name: [] for name in ops}
    for _ in range(repeats):
        for name, op in ops.items():
            start = clock()
            op()
            times[name].append(clock() - start)
    return {name: min(values) * 1e3 for name, values in times.items()}


@torch.no_grad()
def measure(seq_len: int, level: str, args: argparse.Namespace, clock: Callable[[], float]) -> list[list[str]]:
    methods = {name: build(name, seq_len) for name in METHODS}
    if level == "attention":
        q, k, v, positions = make_inputs(seq_len)
        prefill_ops = {n: prefill_op(m, q, k, v, positions, args.layers) for n, m in methods.items()}
        decode_ops = {n: decode_op(m, q, k, v, positions, args.layers) for n, m in methods.items()}
        checks = {
            n: (prefill_op(m, q, k, v, positions)()[:, -1], decode_op(m, q, k, v, positions)()[:, 0])
            for n, m in methods.items()
        }
    else:
        torch.manual_seed(SEED)
        model = Llama(ModelConfig.from_preset("tiny", max_position=seq_len)).eval()
        input_ids = torch.randint(
            0, model.config.vocab_size, (1, seq_len), generator=torch.Generator().manual_seed(SEED)
        )
        ops = {n: model_ops(model, m, input_ids) for n, m in methods.items()}
        prefill_ops = {n: prefill for n, (prefill, _) in ops.items()}
        decode_ops = {n: decode for n, (_, decode) in ops.items()}
        checks = {n: (prefill(), decode()) for n, (prefill, decode) in ops.items()}
    for name, (last_row, decoded) in checks.items():
        if name in DECODING_DIFFERS:
            continue
        difference = (last_row - decoded).abs().max().item()
        if difference >= TOLERANCE:
            raise SystemExit(f"{name}: decoding differs from prefill by {difference:.2e} at T={seq_len}; not timing it")
    prefill = best_times(prefill_ops, args.repeats, clock)
    decode = best_times(decode_ops, args.repeats * 5, clock)
    rows = []
    for name, method in methods.items():
        params = ", ".join(
            f"{key}={value:.4g}" if isinstance(value, float) else f"{key}={value}"
            for key, value in method.params.items()
        )
        rows.append(
            [
                level,
                str(seq_len),
                name,
                params or "-",
                f"{prefill[name]:.1f}",
                f"{prefill[name] / prefill['rope']:.2f}x",
                f"{decode[name]:.3f}",
                f"{decode[name] / decode['rope']:.2f}x",
            ]
        )
    for phase, times in (("prefill", prefill), ("decode", decode)):
        ratio = times["string"] / times["rope"]
        verdict = "meets" if ratio <= GOALS[phase] else "misses"
        print(
            f"{level} T={seq_len}: StRing {phase} {ratio:.2f}x plain RoPE ({verdict} the {GOALS[phase]}x goal)",
            flush=True,
        )
    return rows


COLUMNS = ("level", "T", "method", "parameters", "prefill ms", "vs rope", "decode ms/token", "vs rope")
DEVICE_COLUMNS = (
    "T",
    "method",
    "prefill ms",
    "vs rope",
    "decode ms/token",
    "vs rope",
    "prefill peak MiB",
    "peak GiB",
)


def timed_call(op: Callable[[], torch.Tensor], device: torch.device) -> tuple[torch.Tensor, float, float, float]:
    """(output, ms, peak MiB above the memory held before, peak GiB of all allocated) of
    one synchronised call: each method's first prefill, the decoding check's reference."""
    device_timing.synchronize(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0
    start = time.perf_counter()
    out = op()
    device_timing.synchronize(device)
    ms = (time.perf_counter() - start) * 1e3
    if device.type != "cuda":
        return out, ms, math.nan, math.nan
    peak = torch.cuda.max_memory_allocated(device)
    return out, ms, (peak - before) / 2**20, peak / 2**30


@torch.no_grad()
def device_rows(seq_len: int, args: argparse.Namespace) -> list[list[str]]:
    """The `--device` table's rows for one T: the model level in bf16 (CUDA) / fp32 (CPU).
    Per method: one first prefill (timed alone, its peak memory read, its last logits the
    decoding check's reference), then `--repeats` prefills taking turns with the other
    methods (median; with 0 repeats the first call is the time reported), and where T is
    in `--decode-lengths` 5 x repeats (at least 1) decoding steps of a T-1 token cache."""
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    torch.manual_seed(SEED)
    with device:  # initialised on the device: an 8B model is 32 GB in fp32
        model = Llama(model_config(args.preset, seq_len))
    model = model.to(dtype).eval()
    methods = {name: build(name, seq_len, args.preset).to(device) for name in args.methods}
    generator = torch.Generator().manual_seed(SEED)
    input_ids = torch.randint(0, model.config.vocab_size, (1, seq_len), generator=generator).to(device)
    decoding = args.decode_lengths is None or seq_len in args.decode_lengths
    first: dict[str, tuple[float, float, float]] = {}
    ops = {}
    for name, method in methods.items():
        prefill, decode = model_ops(model, method, input_ids, prepare_decode=decoding)
        last_row, *first[name] = timed_call(prefill, device)
        ops[name] = (prefill, decode)
        if decoding and name not in DECODING_DIFFERS:
            decoded, last_row = decode().float(), last_row.float()
            if (last_row - decoded).abs().max() > 0.05 * last_row.abs().max():
                raise SystemExit(f"{name}: decoding differs from prefill at T={seq_len}; not timing it")
    prefill_ms = {name: ms for name, (ms, _, _) in first.items()}
    if args.repeats:
        prefills = {n: p for n, (p, _) in ops.items()}
        prefill_ms = device_timing.interleaved_median_ms(prefills, args.repeats, device, warmup=False)
    decode_ms = {}
    if decoding:
        decodes = {n: d for n, (_, d) in ops.items()}
        decode_ms = device_timing.interleaved_median_ms(decodes, max(1, 5 * args.repeats), device)
    rows = []
    for name in ops:
        _, peak_mib, peak_gib = first[name]
        versus_rope = "rope" in ops and name != "rope"
        rows.append(
            [
                str(seq_len),
                name,
                f"{prefill_ms[name]:.1f}",
                f"{prefill_ms[name] / prefill_ms['rope']:.2f}x" if versus_rope else "",
                f"{decode_ms[name]:.2f}" if decoding else "not timed",
                f"{decode_ms[name] / decode_ms['rope']:.2f}x" if decoding and versus_rope else "",
                device_timing.mib(peak_mib),
                "n/a" if math.isnan(peak_gib) else f"{peak_gib:.1f}",
            ]
        )
    return rows


def device_main(args: argparse.Namespace) -> None:
    device = torch.device(args.device)
    if args.rope_baseline and "rope" not in args.methods:
        args.methods = ["rope", *args.methods]
    print(f"{device_timing.device_name(device)}; preset {args.preset}, batch 1, one document", flush=True)
    rows = [row for seq_len in args.lengths for row in device_rows(seq_len, args)]
    settings = {"preset": args.preset, "repeats": args.repeats, "device_name": device_timing.device_name(device)}
    notes = [
        "prefill ms: median of `repeats` calls after a first call (0 repeats: that first call); "
        "peak: of the first call, MiB above weights + inputs and GiB of all allocated."
    ]
    report.write(args.out, f"positions_{args.preset}", list(DEVICE_COLUMNS), rows, settings, notes)


# --- --count-ops: the flash path's work around the kernel, counted on CPU ---------------------


class _OpCounter(TorchDispatchMode):
    """aten ops outside the kernel, the bytes their outputs write (in-place ops included;
    views, and allocations without a write, excluded), the bytes of the new storages they
    allocate, and the peak of storages held (the kernel's outputs included): the memory a
    device allocator would see, without the temporaries CPU kernels add for mixed dtypes."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: collections.Counter[str] = collections.Counter()
        self.written = 0
        self.allocated = 0
        self.kernel_bytes = 0
        self.in_kernel = False
        self.held = 0
        self.peak = 0

    def track(self, tensor: torch.Tensor) -> None:
        """Count the tensor's storage as held until it is freed."""
        storage = tensor.untyped_storage()
        self.held += storage.nbytes()
        self.peak = max(self.peak, self.held)
        weakref.finalize(storage, self._free, storage.nbytes())

    def _free(self, nbytes: int) -> None:
        self.held -= nbytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        outputs = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
        if self.in_kernel or func.is_view or not outputs:
            return out
        inputs = {t.untyped_storage().data_ptr() for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
        writes = func.overloadpacket not in (
            torch.ops.aten.empty,
            torch.ops.aten.empty_like,
            torch.ops.aten.empty_strided,
        )
        if writes:
            self.ops[func.overloadpacket.__name__] += 1
        for t in outputs:
            self.written += t.numel() * t.element_size() if writes else 0
            if t.untyped_storage().data_ptr() not in inputs:
                self.allocated += t.untyped_storage().nbytes()
                self.track(t)
        return out


def _output_only_kernel(counter: _OpCounter, enable_gqa: bool) -> Callable:
    """A varlen_attn with torch's signature (2.14: `enable_gqa`; 2.11: none) that only
    allocates its outputs (out [Nq, H, D], lse [H, Nq] fp32): what the real kernel leaves."""

    def kernel(
        query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, return_aux=None, scale=None, window_size=(-1, -1)
    ):
        counter.in_kernel = True
        out = torch.zeros_like(query)
        lse = torch.zeros(query.shape[1], query.shape[0])
        counter.in_kernel = False
        for t in (out, lse) if return_aux is not None else (out,):
            counter.kernel_bytes += t.nbytes
            counter.track(t)
        return (out, lse) if return_aux is not None else out

    if not enable_gqa:
        return kernel

    def kernel_2_14(
        query,
        key,
        value,
        cu_seq_q,
        cu_seq_k,
        max_q,
        max_k,
        *,
        return_aux=None,
        scale=None,
        window_size=(-1, -1),
        enable_gqa=False,
    ):
        return kernel(
            query,
            key,
            value,
            cu_seq_q,
            cu_seq_k,
            max_q,
            max_k,
            return_aux=return_aux,
            scale=scale,
            window_size=window_size,
        )

    return kernel_2_14


@torch.no_grad()
def count_ops_main(args: argparse.Namespace) -> None:
    """One layer of a bf16 prefill on the flash path (`--preset`'s heads, one document of
    T tokens, training length T, keys as the model hands them over), on CPU with a kernel
    that only allocates its outputs: the aten ops around the kernel, the bytes they write
    and allocate, and the peak held above the inputs."""
    import torch.nn.attention.varlen as varlen

    config = model_config(args.preset, 2048)
    heads, kv_heads, dim = config.n_heads, config.n_kv_heads, config.head_size
    sys.modules["flash_attn"] = None  # type: ignore[assignment]  # torch's kernel signature
    rows = []
    for version, enable_gqa in (("2.11", False), ("2.14", True)):
        for seq_len in args.lengths:
            generator = torch.Generator().manual_seed(SEED)
            q = torch.randn(1, seq_len, heads, dim, generator=generator).bfloat16()
            k, v = (torch.randn(1, seq_len, kv_heads, dim, generator=generator).bfloat16() for _ in range(2))
            positions = torch.arange(seq_len)[None]
            for name in args.methods:
                method = build(name, seq_len, args.preset)
                counter = _OpCounter()
                varlen.varlen_attn = _output_only_kernel(counter, enable_gqa)  # type: ignore[assignment]
                rotated = method.caches_rotated_keys
                plan = method.plan(positions, keys_rotated=rotated, backend="flash", dtype=q.dtype)
                keys = method.rotate_keys(k, positions) if rotated else k
                method(q, keys, v, plan)  # warm-up: lazy imports, caches
                with counter:
                    out = method(q, keys, v, plan)
                    del out
                ops = dict(counter.ops)
                kernel_mib = counter.kernel_bytes / 2**20
                peak = counter.peak / 2**20
                rows.append(
                    [
                        version,
                        str(seq_len),
                        name,
                        str(sum(ops.values())),
                        f"{counter.written / 2**20:.0f}",
                        f"{counter.allocated / 2**20:.0f}",
                        f"{kernel_mib:.0f}",
                        f"{peak:.0f}",
                        " ".join(f"{op}:{n}" for op, n in sorted(ops.items())),
                    ]
                )
                print(" | ".join(rows[-1]), flush=True)
    columns = ("torch", "T", "method", "aten ops", "MiB written", "MiB allocated", "kernel out MiB", "peak MiB", "ops")
    lines = [columns, ("---", "---:", "---", "---:", "---:", "---:", "---:", "---:", "---"), *rows]
    print("\n".join("| " + " | ".join(cells) + " |" for cells in lines))


def markdown_table(rows: list[list[str]]) -> str:
    lines = [COLUMNS, ("---", "---:", "---", "---", "---:", "---:", "---:", "---:"), *rows]
    return "\n".join("| " + " | ".join(cells) + " |" for cells in lines)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--lengths", type=int, nargs="+", default=[1024, 4096], help="sequence lengths T (= training length)"
    )
    parser.add_argument("--layers", type=int, default=1, help="attention layers per timed forward (setup is shared)")
    parser.add_argument(
        "--repeats", type=int, default=7, help="timed prefill rounds (decode: 5x as many); best reported"
    )
    parser.add_argument("--threads", type=int, default=0, help="torch threads; 0 = torch's default")
    parser.add_argument(
        "--clock", choices=("wall", "cpu"), default="wall", help="wall time, or this process's CPU time"
    )
    parser.add_argument(
        "--level", nargs="+", choices=("attention", "model"), default=["attention", "model"], help="what is timed"
    )
    parser.add_argument(
        "--device", choices=("cpu", "cuda"), default="cpu", help="cuda: the device table (module docstring)"
    )
    parser.add_argument("--portable", action="store_true", help="the device table on --device cpu (smoke test)")
    parser.add_argument("--preset", default="tinyllama-1.1b", help="device table: model preset")
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS, help="device table: methods")
    parser.add_argument("--out", help="device table: directory for positions_<preset>.json and .md")
    parser.add_argument(
        "--decode-lengths", type=int, nargs="*", default=None, help="device table: T with decoding timed (default: all)"
    )
    parser.add_argument(
        "--no-rope-baseline", dest="rope_baseline", action="store_false", help="device table: plain RoPE not added"
    )
    parser.add_argument(
        "--count-ops",
        action="store_true",
        help="one bf16 flash-path layer on CPU: aten ops, bytes and peak around the kernel (count_ops_main)",
    )
    parser.add_argument("--smoke", action="store_true", help="the device table on CPU at debug sizes, 1 repeat")
    args = parser.parse_args()
    if args.smoke:
        args.device, args.portable, args.preset, args.lengths, args.repeats = "cpu", True, "debug", [512], 1
    return args


def main() -> None:
    args = parse_args()
    if args.count_ops:
        count_ops_main(args)
        return
    if args.device == "cuda" or args.portable:
        device_main(args)
        return
    tune_cpu_allocator()  # as `longctx niah` does
    if args.threads:
        torch.set_num_threads(args.threads)
    clock = time.perf_counter if args.clock == "wall" else time.process_time
    print(
        f"H={HEADS}, Hkv={KV_HEADS}, D={HEAD_DIM}, float32, batch 1, one document, {torch.get_num_threads()} threads, "
        f"{args.layers} layer(s) per forward, {args.clock} clock, best of {args.repeats} prefill rounds",
        flush=True,
    )
    rows = []
    for level in args.level:
        for seq_len in args.lengths:
            rows += measure(seq_len, level, args, clock)
    print()
    print(markdown_table(rows))


if __name__ == "__main__":
    main()
