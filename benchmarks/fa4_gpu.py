"""flash-attn-4 against the flash path's varlen kernel: document-masked attention, checked, then timed.

    source .device/env.sh; source .device-fa4/step/env.sh && python3 benchmarks/fa4_gpu.py --out DIR

flash-attn-4 (`flash_attn.cute.flash_attn_varlen_func`: FlashAttention written in NVIDIA's
CuTe DSL for Hopper and Blackwell; wheels from `make device-fa4`, GPU step speed-fa4 in
tools/gpu/gpu_steps.toml) is compared with the kernel the model's `flash` backend uses
now, `flash.resolve_kernel()` (torch's `varlen_attn`, or flash-attn 2 where installed),
called through `flash.varlen_flash` exactly as the model calls it: on torch 2.11, whose
wrapper has no `enable_gqa`, k/v are expanded to the query heads inside the call.

1. Checks (bf16, one row of documents packed to --check-length tokens as
   benchmarks/attention.py packs them), one per thing the flash path needs; fa4's output and
   q/k/v gradients (one shared upstream gradient) against the current kernel's:
   - varlen: causal, document-masked through cu_seqlens, as many key/value heads as query heads;
   - gqa: 4 key/value heads for 32 query heads, given to fa4 as they are (not expanded): its
     dk/dv must come back with 4 heads;
   - window: gqa with the left window (255, 0), a causal band of 256 distances (sliding layers);
   - lse: the log-sum-exp [H, Nq] in fp32 (what a merge of band passes reads);
   - chunked: each document's last --chunk queries against all of its keys (cu_q != cu_k, the
     causal diagonal aligned bottom-right, as chunked prefill and decoding call the kernel).
   A tensor passes when max |fa4 - current| <= 2e-2 x max |current| (two bf16 kernels differ
   by a few bf16 roundings of the largest entries); the LSE when max |difference| <= 1e-2.
2. Timing at T = 4K, 16K, 64K on benchmarks/attention.py's packed rows, TinyLlama's attention
   shapes (32 query heads, 4 key/value heads, head dim 64), bf16, causal: forward (no grad) and
   forward+backward ms (median of attention.MIN_REPEATS calls after a warm-up, the kernels
   taking turns), useful TFLOP/s counted as the kernel table counts them, peak MiB above the
   inputs, and fa4's first call in seconds (the DSL compiles its kernels there).
3. Verdicts: one line per requirement and per length, then `verdict: adopt` only if fa4 is
   installed, passes every check and is faster forward+backward at every length, else
   `verdict: keep` with the reasons.

Writes DIR/fa4.json (every number) and DIR/fa4.md. Without flash-attn-4 importable, or
without CUDA, it says so and exits 1: nothing was measured.

Adoption, after a measured `adopt` and not before: `flash.resolve_kernel` would return a
`VarlenKernel` for `flash_attn.cute.flash_attn_varlen_func` called with `fa4_arguments`
(windows with -1 as None, a causal flag, native GQA, the LSE as returned); until then no
model code calls flash-attn-4.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import device_timing
import torch
from attention import KERNEL_LENGTHS, MIN_REPEATS, SEED, pack_rows, stdlib_document_lengths

from longctx.model import flash

TOLERANCE = 2e-2
LSE_TOLERANCE = 1e-2
WINDOW = (255, 0)
CHECKS = ("varlen", "gqa", "window", "lse", "chunked")


@dataclass(frozen=True)
class Layout:
    """Sequences laid end to end: queries cu_q[i]:cu_q[i+1] against keys cu_k[i]:cu_k[i+1]."""

    cu_q: torch.Tensor
    cu_k: torch.Tensor
    max_q: int
    max_k: int


def layout(key_lengths: list[int], query_lengths: list[int], device: torch.device) -> Layout:
    def cumulative(lengths: list[int]) -> torch.Tensor:
        return torch.tensor([0, *lengths], device=device).cumsum(0).to(torch.int32)

    return Layout(cumulative(query_lengths), cumulative(key_lengths), max(query_lengths), max(key_lengths))


def fa4_arguments(where: Layout, *, scale: float, window: tuple[int, int], lse: bool) -> dict:
    """flash-attn-4's keyword arguments for the flash path's call: its windows take None for
    unbounded where ours take -1, and causal is its own flag (both bottom-right aligned)."""
    left, right = window
    causal = left < 0 and right == 0
    size = (None, None) if causal else (None if left < 0 else left, None if right < 0 else right)
    return {
        "cu_seqlens_q": where.cu_q,
        "cu_seqlens_k": where.cu_k,
        "max_seqlen_q": where.max_q,
        "max_seqlen_k": where.max_k,
        "softmax_scale": scale,
        "causal": causal,
        "window_size": size,
        "return_lse": lse,
    }


Call = Callable[..., tuple[torch.Tensor, torch.Tensor | None]]
"""(q, k, v, layout, scale=, window=, lse=) -> (out, lse or None)."""


def fa4_call(function: Callable[..., tuple]) -> Call:
    def call(q, k, v, where, *, scale, window, lse):
        out, log_sum_exp = function(q, k, v, **fa4_arguments(where, scale=scale, window=window, lse=lse))
        return out, (log_sum_exp if lse else None)

    return call


def current_call(kernel: flash.VarlenKernel) -> Call:
    def call(q, k, v, where, *, scale, window, lse):
        return flash.varlen_flash(
            q,
            k,
            v,
            where.cu_q,
            where.cu_k,
            where.max_q,
            where.max_k,
            scale=scale,
            window=window,
            lse=lse,
            kernel=kernel,
        )

    return call


def describe_kernel(kernel: flash.VarlenKernel) -> str:
    name = "flash-attn 2" if kernel.flash_attn else "torch varlen_attn"
    return f"{name}, GQA {'native' if kernel.enable_gqa else 'expanded'}"


# --- checks ---------------------------------------------------------------------------


def gap(got: torch.Tensor, expected: torch.Tensor) -> float:
    """max |got - expected| / max |expected| (inf when the shapes differ)."""
    if got.shape != expected.shape:
        return float("inf")
    return ((got.float() - expected.float()).abs().max() / expected.float().abs().max().clamp_min(1e-12)).item()


def check(
    name: str, fa4: Call, current: Call, pieces: list[int], shapes: tuple[int, int, int], device, dtype, chunk: int
) -> dict:
    """One requirement (module docstring): fa4's out, grads (and LSE) against the current kernel's."""
    heads, kv_heads, head_dim = shapes
    if name == "varlen":
        kv_heads = heads
    queries = [min(chunk, length) for length in pieces] if name == "chunked" else pieces
    where = layout(pieces, queries, device)
    window = WINDOW if name == "window" else flash.CAUSAL
    generator = torch.Generator(device).manual_seed(SEED)

    def randn(rows: int, count: int) -> torch.Tensor:
        return torch.randn(rows, count, head_dim, generator=generator, device=device, dtype=dtype)

    inputs = (randn(sum(queries), heads), randn(sum(pieces), kv_heads), randn(sum(pieces), kv_heads))
    grad_out = randn(sum(queries), heads)
    results = {}
    for label, call in (("fa4", fa4), ("current", current)):
        q, k, v = (t.clone().requires_grad_() for t in inputs)
        try:
            out, lse = call(q, k, v, where, scale=head_dim**-0.5, window=window, lse=name == "lse")
            out.backward(grad_out)
        except Exception as error:  # the kernel refuses or fails: the requirement is not met
            return {"check": name, "passed": False, "note": f"{label}: {type(error).__name__}: {str(error)[:200]}"}
        results[label] = {"out": out.detach(), "dq": q.grad, "dk": k.grad, "dv": v.grad, "lse": lse}
    fa4_result, reference = results["fa4"], results["current"]
    gaps = {key: gap(fa4_result[key], reference[key]) for key in ("out", "dq", "dk", "dv")}
    passed = all(value <= TOLERANCE for value in gaps.values())
    note = f"k/v heads {kv_heads} given, dk {tuple(fa4_result['dk'].shape)}"
    if name == "lse":
        got, expected = fa4_result["lse"], reference["lse"]
        if got is None or expected is None or got.shape != expected.shape:
            shapes_seen = [None if t is None else tuple(t.shape) for t in (got, expected)]
            return {"check": name, "passed": False, "gaps": gaps, "note": f"LSE shapes fa4/current {shapes_seen}"}
        gaps["lse_abs"] = (got.float() - expected.float()).abs().max().item()
        passed = passed and gaps["lse_abs"] <= LSE_TOLERANCE
    return {"check": name, "passed": passed, "gaps": gaps, "note": note}


def run_checks(fa4: Call, current: Call, pieces: list[int], shapes, device, dtype, chunk: int) -> list[dict]:
    return [check(name, fa4, current, pieces, shapes, device, dtype, chunk) for name in CHECKS]


# --- timing ---------------------------------------------------------------------------


def time_length(seq_len: int, pieces: list[int], calls: dict[str, Call], args, device, dtype) -> list[dict]:
    """One record per kernel at one packed row of seq_len tokens (causal, document-masked)."""
    where = layout(pieces, pieces, device)
    generator = torch.Generator(device).manual_seed(SEED)

    def randn(heads: int, grad: bool) -> torch.Tensor:
        shape = (seq_len, heads, args.head_dim)
        return torch.randn(shape, generator=generator, device=device, dtype=dtype).requires_grad_(grad)

    q, k, v = randn(args.heads, True), randn(args.kv_heads, True), randn(args.kv_heads, True)
    grad_out = randn(args.heads, False)
    options = {"scale": args.head_dim**-0.5, "window": flash.CAUSAL, "lse": False}

    def forward(call: Call) -> None:
        with torch.no_grad():
            call(q, k, v, where, **options)

    def train(call: Call) -> None:
        q.grad = k.grad = v.grad = None
        call(q, k, v, where, **options)[0].backward(grad_out)

    ready, records = {}, {}
    for name, call in calls.items():
        records[name] = {"T": seq_len, "docs": len(pieces), "kernel": name}
        try:
            start = time.perf_counter()
            train(call)  # the first call: for fa4 the DSL compiles its kernels here
            forward(call)
            device_timing.synchronize(device)
            records[name]["first_call_s"] = time.perf_counter() - start
            ready[name] = call
        except Exception as error:
            records[name]["failed"] = f"{type(error).__name__}: {str(error)[:200]}"
    timings = device_timing.attention_timings(
        ready, forward, train, repeats=args.repeats, device=device,
        document_lengths=pieces, heads=args.heads, head_dim=args.head_dim,
    )  # fmt: skip
    for name, timing in timings.items():
        records[name] |= timing
    return list(records.values())


# --- verdicts and tables --------------------------------------------------------------


def decide(installed: bool, checks: list[dict], rows: list[dict], lengths: list[int]) -> list[str]:
    """A line per requirement and per length, the last `verdict: adopt` only if fa4 is
    installed, passes every check and is faster forward+backward at every one of `lengths`
    (a length without rows, as in the files written before the last length is timed, is
    not timed: no adoption from part of the table)."""
    lines = [f"verdict: installed: {'yes' if installed else 'no'}"]
    reasons = [] if installed else ["not installed"]
    for record in checks:
        gaps = ", ".join(f"{key} {value:.1e}" for key, value in record.get("gaps", {}).items())
        lines.append(f"verdict: {record['check']}: {'pass' if record['passed'] else 'FAIL'} ({gaps}; {record['note']})")
        if not record["passed"]:
            reasons.append(f"{record['check']} check failed")
    missing = [name for name in CHECKS if name not in {record["check"] for record in checks}]
    reasons += [f"{name} not checked" for name in missing]
    for seq_len in lengths:
        at = {row["kernel"]: row for row in rows if row["T"] == seq_len}
        fa4, current = at.get("fa4", {}), at.get("current", {})
        if "fwd_bwd_ms" not in fa4 or "fwd_bwd_ms" not in current:
            why = fa4.get("failed") or current.get("failed") or "not timed yet"
            lines.append(f"verdict: faster at T={seq_len}: no ({why})")
            reasons.append(f"not timed at T={seq_len}")
            continue
        ratio = current["fwd_bwd_ms"] / fa4["fwd_bwd_ms"]
        faster = ratio > 1
        lines.append(
            f"verdict: faster at T={seq_len}: {'yes' if faster else 'no'} "
            f"(fwd+bwd {fa4['fwd_bwd_ms']:.3f} ms vs {current['fwd_bwd_ms']:.3f} ms, {ratio:.2f}x)"
        )
        if not faster:
            reasons.append(f"slower at T={seq_len}")
    if not lengths:
        reasons.append("no length timed")
    lines.append("verdict: adopt" if not reasons else f"verdict: keep the current kernel ({'; '.join(reasons)})")
    return lines


COLUMNS = ("T", "docs", "kernel", "fwd ms", "fwd+bwd ms", "fwd TFLOP/s", "fwd+bwd TFLOP/s", "fa4 speedup", "peak MiB")
COLUMNS += ("first call s",)


def table_rows(rows: list[dict]) -> list[list[str]]:
    cells = []
    for row in rows:
        line = [str(row["T"]), str(row["docs"]), row["kernel"]]
        if "failed" in row:
            cells.append([*line, f"failed: {row['failed'][:80]}", *[""] * (len(COLUMNS) - 4)])
            continue
        other = next((r for r in rows if r["T"] == row["T"] and r["kernel"] == "current" and "fwd_bwd_ms" in r), None)
        speedup = f"{other['fwd_bwd_ms'] / row['fwd_bwd_ms']:.2f}x" if other and row["kernel"] == "fa4" else ""
        line += [f"{row['fwd_ms']:.3f}", f"{row['fwd_bwd_ms']:.3f}", f"{row['fwd_tflops']:.1f}"]
        line += [
            f"{row['fwd_bwd_tflops']:.1f}",
            speedup,
            device_timing.mib(row["peak_mib"]),
            f"{row['first_call_s']:.1f}",
        ]
        cells.append(line)
    return cells


def markdown(header: str, rows: list[dict], verdicts: list[str]) -> str:
    lines = [COLUMNS, ("---:",) * len(COLUMNS), *table_rows(rows)]
    table = "\n".join("| " + " | ".join(cells) + " |" for cells in lines)
    return f"{header}\n\n{table}\n\n" + "\n".join(f"- {line.removeprefix('verdict: ')}" for line in verdicts) + "\n"


def load_fa4() -> tuple[Callable[..., tuple] | None, str]:
    """flash-attn-4's varlen function and its versions, or None and why it does not import."""
    try:
        from flash_attn.cute import flash_attn_varlen_func
    except Exception as error:  # ImportError, or the DSL failing to load its compiled libraries
        return None, f"{type(error).__name__}: {error}"
    versions = []
    for name in ("flash-attn-4", "nvidia-cutlass-dsl", "quack-kernels"):
        try:
            versions.append(f"{name} {importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            versions.append(f"{name} (no metadata)")
    return flash_attn_varlen_func, ", ".join(versions)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="writes DIR/fa4.json and DIR/fa4.md")
    parser.add_argument("--lengths", type=int, nargs="+", default=KERNEL_LENGTHS, help="timed row lengths T")
    parser.add_argument("--check-length", type=int, default=4096, help="tokens of the checks' packed row")
    parser.add_argument("--chunk", type=int, default=64, help="queries per document in the chunked check")
    parser.add_argument("--repeats", type=int, default=MIN_REPEATS, help="timed calls per cell (median)")
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=4)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument(
        "--device", choices=("cuda", "cpu"), default="cuda", help="cpu: fp32, for CPU stand-ins (tests)"
    )
    args = parser.parse_args(argv)
    if args.repeats < MIN_REPEATS:
        parser.error(f"--repeats {args.repeats}: at least {MIN_REPEATS}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    function, versions = load_fa4()
    if function is None:
        print(f"flash-attn-4 is not importable ({versions}): nothing measured. On the GPU machine run the setup")
        print("calls of step speed-fa4, then `source .device-fa4/step/env.sh` (make device-fa4 stages the wheels).")
        return 1
    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: flash-attn-4's kernels run on Hopper/Blackwell GPUs only; nothing measured")
        return 1
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    kernel = flash.resolve_kernel()
    header = (
        f"{device_timing.device_name(device)}; {versions}; current kernel: {describe_kernel(kernel)}; "
        f"H={args.heads}, Hkv={args.kv_heads}, D={args.head_dim}, {str(dtype).removeprefix('torch.')}, causal, "
        "one packed row, "
        f"median of {args.repeats} calls"
    )
    print(header, flush=True)
    calls = {"fa4": fa4_call(function), "current": current_call(kernel)}
    document_lengths = stdlib_document_lengths()
    _, check_pieces = pack_rows(document_lengths, args.check_length, 1)
    shapes = (args.heads, args.kv_heads, args.head_dim)
    started = time.perf_counter()
    checks = run_checks(calls["fa4"], calls["current"], check_pieces, shapes, device, dtype, args.chunk)
    print(f"checks in {time.perf_counter() - started:.1f} s (fa4's kernels compiled on their first calls)", flush=True)
    rows: list[dict] = []
    text = write(args, header, versions, checks, rows)  # each stage is kept should the step's limit stop the next
    for seq_len in args.lengths:
        _, pieces = pack_rows(document_lengths, seq_len, 1)
        rows += time_length(seq_len, pieces, calls, args, device, dtype)
        print(f"T={seq_len} timed", flush=True)
        text = write(args, header, versions, checks, rows)
    print(text)
    print("\n".join(decide(True, checks, rows, args.lengths)))  # the verdict lines, greppable
    return 0


def write(args: argparse.Namespace, header: str, versions: str, checks: list[dict], rows: list[dict]) -> str:
    """DIR/fa4.md and DIR/fa4.json from what is measured so far; the Markdown."""
    verdicts = decide(True, checks, rows, args.lengths)
    text = markdown(header, rows, verdicts)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "fa4.md").write_text(text)
    result = {"benchmark": "fa4", "header": header, "torch": torch.__version__, "versions": versions}
    result |= {
        "tolerance": TOLERANCE,
        "lse_tolerance": LSE_TOLERANCE,
        "window": WINDOW,
        "check_length": args.check_length,
    }
    result |= {"checks": checks, "rows": rows, "verdicts": verdicts}
    (args.out / "fa4.json").write_text(json.dumps(result, indent=1) + "\n")
    return text


if __name__ == "__main__":
    raise SystemExit(main())
