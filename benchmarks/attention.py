"""Document-masked attention: the CPU table (`varlen`, `flex` vs `sdpa`) and the kernel table (GPU).

Launch from the repository root:

    .venv/bin/python benchmarks/attention.py [--lengths 1024 2048 4096 8192] [--repeats 5]
                                             [--batch 1] [--skip-flex]        # CPU table
    python benchmarks/attention.py --out DIR [--smoke]                       # kernel table

What it measures, for each sequence length T:

- rows packed from documents whose lengths follow the embedded corpus: a random stdlib
  `.py` file's size in bytes / 3.5 chars per token (at least 16 tokens), documents
  concatenated until the row is full, the last one cut at T (fixed seed, deterministic);
- the `tiny` preset's attention shapes: 8 query heads, 4 key/value heads, head_dim 32,
  float32, CPU, torch's default thread count;
- forward+backward time and peak extra memory of `varlen` vs `sdpa`, and forward time
  (under `torch.no_grad()`) of `flex` vs `sdpa`. Every timed call includes `build_mask`,
  because a model builds the mask once per forward pass. Times are the median of
  `--repeats` calls after one warm-up call (and the correctness check, which runs every op
  once before), the two compared backends taking turns call by call so that other load on
  the machine slows both alike; the load average is printed with the table. `flex`
  compiles on its first call per shape: that call is not timed; "flex compile s" is its
  duration minus the steady-state forward time. Compilation is cold: the inductor cache
  lives in a fresh temporary directory for each run.

Before timing, the outputs (and, for `varlen`, the q/k/v gradients) must match `sdpa`
to 1e-4 max abs difference, or the script aborts.

The kernel table (`make bench-gpu-kernels`: `benchmarks/attention.py --out DIR`; also
`--device cuda|cpu`, `--kernels`): doc-masked attention at T = 4K, 16K, 64K on the same
packed rows, TinyLlama's attention shapes (32 heads, 4 key/value heads, head_dim 64), bf16
on CUDA (fp32 on CPU). Backends: `sdpa` (dense mask), `flex`, `flash` (varlen FA2, native
GQA where the kernel takes it: flash-attn, or torch's `enable_gqa`) and `flash-expanded`
(k/v expanded to the query heads before the call, the copy and its gradient inside the
timed call: what torch 2.11 gets). Each backend's mask (build_mask) is built once, outside
the timed calls. Columns: forward ms (no grad), forward+backward ms, useful TFLOP/s of
each, fwd+bwd speed relative to sdpa, peak MiB above the inputs (CUDA allocator). Times
are the median of at least MIN_REPEATS = 10 calls per cell after one warm-up call (which
compiles flex), backends taking turns; --repeats can raise it, never lower it. Outputs
must match sdpa (2e-2 in bf16) where sdpa's dense mask fits (T <= --check-max); a backend
that fails or differs is reported, not timed. `--out DIR` writes DIR/attention.json (every
number) and DIR/attention.md (the header line and the Markdown rows for
docs/benchmarks.md). `--smoke`: the same code on CPU at T = 128, 320 with 4/2 heads of
16 (a test runs it).

Useful FLOPs (device_timing.causal_attention_flops) count only the (query, key) pairs a
causal document-masked kernel must compute, P = sum_docs l (l + 1) / 2 per head: forward
QK^T and PV each take 2 D FLOPs per pair, so fwd = 4 P D H; backward recomputes QK^T and
computes dV = P^T dO, dP = dO V^T, dQ = dS K and dK = dS^T Q, 5 products of 2 P D each,
2.5x the forward (FlashAttention-2's accounting), so fwd+bwd = 3.5 x fwd = 14 P D H. Padding
or masked-out work a kernel does anyway is not counted: a kernel that computes the full
T x T square scores at most half its raw rate here.

Memory (Linux only, `cpu_memory.py`): torch has no allocator statistics on CPU, and its
CPU tensors are plain malloc/mmap memory, so the peak is read from the kernel. Each
measurement runs in a fresh spawned process, which first runs the op on a 64-token slice
(loading kernels and thread pools), creates the inputs, reads its resident set size
(VmRSS), resets the high-water mark (`/proc/self/clear_refs` = 5), runs build_mask +
forward + backward once and reports VmHWM - VmRSS. Caveats: it counts the output and the
q/k/v gradients (the same for every backend), pages the process touched rather than bytes
torch asked for, and anything else the process allocated meanwhile; it is good to about
1 MiB.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import random
import statistics
import sysconfig
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import cpu_memory
import device_timing
import torch

from longctx.model import flash
from longctx.model.attention import attention, build_mask

HEADS, KV_HEADS, HEAD_DIM = 8, 4, 32  # the `tiny` preset: d_model 256 over 8 heads
CHARS_PER_TOKEN = 3.5
MIN_DOCUMENT_TOKENS = 16
SEED = 0
TOLERANCE = 1e-4
WARMUP_TOKENS = 64


# --- packed rows ----------------------------------------------------------------------


def stdlib_document_lengths() -> list[int]:
    """Token length of every stdlib `.py` file, estimated from its size in bytes."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(path for path in root.rglob("*.py") if "site-packages" not in path.relative_to(root).parts)
    return [max(MIN_DOCUMENT_TOKENS, round(path.stat().st_size / CHARS_PER_TOKEN)) for path in files]


def pack_rows(document_lengths: list[int], seq_len: int, batch: int) -> tuple[torch.Tensor, list[int]]:
    """document_ids [batch, seq_len] of random documents laid end to end, and the length of
    every document as it appears in the rows (the last one of a row is cut at seq_len)."""
    rng = random.Random(SEED)
    rows, pieces = [], []
    for _ in range(batch):
        row: list[int] = []
        while len(row) < seq_len:
            piece = min(rng.choice(document_lengths), seq_len - len(row))
            row += [len(pieces)] * piece
            pieces.append(piece)
        rows.append(row)
    return torch.tensor(rows), pieces


def describe_documents(seq_len: int, batch: int, pieces: list[int]) -> str:
    p90 = torch.tensor(pieces, dtype=torch.float64).quantile(0.9).item()
    return (
        f"T={seq_len}: {len(pieces) / batch:.2f} documents/row, length median {statistics.median(pieces):.0f}, "
        f"mean {statistics.mean(pieces):.0f}, p90 {p90:.0f} tokens"
    )


# --- the measured ops -----------------------------------------------------------------


@dataclasses.dataclass
class Inputs:
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    grad_out: torch.Tensor
    document_ids: torch.Tensor


def make_inputs(document_ids: torch.Tensor) -> Inputs:
    generator = torch.Generator().manual_seed(SEED)
    batch, seq_len = document_ids.shape

    def randn(heads: int) -> torch.Tensor:
        return torch.randn(batch, seq_len, heads, HEAD_DIM, generator=generator)

    q, k, v = (randn(heads).requires_grad_() for heads in (HEADS, KV_HEADS, KV_HEADS))
    return Inputs(q, k, v, randn(HEADS), document_ids)


def forward(inputs: Inputs, backend: str) -> torch.Tensor:
    mask = build_mask(inputs.document_ids, inputs.q.shape[1], backend)
    return attention(inputs.q, inputs.k, inputs.v, backend=backend, mask=mask)


def forward_only(inputs: Inputs, backend: str) -> tuple[torch.Tensor]:
    """Inference: no autograd graph, and q/k/v detached (compiled flex rejects leaves that require grad)."""
    detached = dataclasses.replace(inputs, q=inputs.q.detach(), k=inputs.k.detach(), v=inputs.v.detach())
    with torch.no_grad():
        return (forward(detached, backend),)


def forward_backward(inputs: Inputs, backend: str) -> tuple[torch.Tensor, ...]:
    """Output and q/k/v gradients; gradients start from None, as after zero_grad()."""
    for tensor in (inputs.q, inputs.k, inputs.v):
        tensor.grad = None
    out = forward(inputs, backend)
    out.backward(inputs.grad_out)
    return out.detach(), inputs.q.grad, inputs.k.grad, inputs.v.grad


# --- correctness, time, memory --------------------------------------------------------


def require_match(name: str, expected: tuple[torch.Tensor, ...], actual: tuple[torch.Tensor, ...]) -> None:
    difference = max((a - e).abs().max().item() for a, e in zip(actual, expected, strict=True))
    if difference >= TOLERANCE:
        raise SystemExit(f"{name} differs from sdpa by {difference:.2e} (tolerance {TOLERANCE:.0e}); not timing it")


def interleaved_median_ms(ops: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Median ms of each op after one warm-up call; the ops take turns (ABAB...), so
    background load on the machine slows the compared backends alike."""
    for op in ops.values():
        op()
    seconds: dict[str, list[float]] = {name: [] for name in ops}
    for _ in range(repeats):
        for name, op in ops.items():
            start = time.perf_counter()
            op()
            seconds[name].append(time.perf_counter() - start)
    return {name: statistics.median(times) * 1e3 for name, times in seconds.items()}


def _prepare_forward_backward(document_ids: torch.Tensor, backend: str) -> Callable[[], object]:
    """Warm up on a 64-token slice, create the inputs; the op to measure (in the child process)."""
    forward_backward(make_inputs(document_ids[:, :WARMUP_TOKENS]), backend)
    inputs = make_inputs(document_ids)
    return functools.partial(forward_backward, inputs, backend)


def peak_extra_mib(document_ids: torch.Tensor, backend: str) -> float:
    """Peak memory of build_mask + forward + backward above the inputs, in a fresh process."""
    return cpu_memory.peak_extra_mib(_prepare_forward_backward, document_ids, backend)


# --- one row of the table -------------------------------------------------------------

COLUMNS = (
    "T",
    "docs/row",
    "sdpa fwd+bwd ms",
    "varlen fwd+bwd ms",
    "speedup",
    "sdpa peak MiB",
    "varlen peak MiB",
    "mem ratio",
    "sdpa fwd ms",
    "flex fwd ms",
    "flex speedup",
    "flex compile s",
)


def flex_first_call(inputs: Inputs, reference: tuple[torch.Tensor, ...]) -> float | str:
    """Seconds of flex's first (compiling) forward call, checked against sdpa, or why it failed."""
    try:
        start = time.perf_counter()
        out = forward_only(inputs, "flex")
    except Exception as error:  # e.g. no C++ toolchain for inductor: report it and go on
        return f"failed: {type(error).__name__}: {str(error).splitlines()[0][:80]}"
    first_call_s = time.perf_counter() - start
    require_match("flex forward", reference[:1], out)
    return first_call_s


def measure(seq_len: int, document_lengths: list[int], args: argparse.Namespace) -> list[str]:
    """One table row (cells in COLUMNS order) for sequence length seq_len."""
    document_ids, pieces = pack_rows(document_lengths, seq_len, args.batch)
    print(describe_documents(seq_len, args.batch, pieces), flush=True)
    inputs = make_inputs(document_ids)

    def op(run: Callable[..., object], backend: str) -> Callable[[], object]:
        return lambda: run(inputs, backend)

    reference = forward_backward(inputs, "sdpa")
    require_match("varlen forward+backward", reference, op(forward_backward, "varlen")())
    train_ops = {backend: op(forward_backward, backend) for backend in ("sdpa", "varlen")}
    train_ms = interleaved_median_ms(train_ops, args.repeats)
    sdpa_peak_mib = peak_extra_mib(document_ids, "sdpa")
    varlen_peak_mib = peak_extra_mib(document_ids, "varlen")

    flex = "skipped" if args.skip_flex else flex_first_call(inputs, reference)
    forward_ops = {"sdpa": op(forward_only, "sdpa")}
    if isinstance(flex, float):
        forward_ops["flex"] = op(forward_only, "flex")
    forward_ms = interleaved_median_ms(forward_ops, args.repeats)
    return [
        str(seq_len),
        f"{len(pieces) / args.batch:.2f}",
        f"{train_ms['sdpa']:.1f}",
        f"{train_ms['varlen']:.1f}",
        f"{train_ms['sdpa'] / train_ms['varlen']:.2f}x",
        f"{sdpa_peak_mib:.1f}",
        f"{varlen_peak_mib:.1f}",
        f"{sdpa_peak_mib / varlen_peak_mib:.2f}x",
        f"{forward_ms['sdpa']:.1f}",
        *flex_cells(flex, forward_ms),
    ]


def flex_cells(flex: float | str, forward_ms: dict[str, float]) -> list[str]:
    """Cells "flex fwd ms", "flex speedup", "flex compile s"; `flex` is the first call's
    seconds, or why flex was not timed."""
    if isinstance(flex, str):
        return [flex, "", ""]
    flex_ms = forward_ms["flex"]
    return [f"{flex_ms:.1f}", f"{forward_ms['sdpa'] / flex_ms:.2f}x", f"{flex - flex_ms / 1e3:.1f}"]


def markdown_table(rows: list[list[str]]) -> str:
    lines = [COLUMNS, ("---:",) * len(COLUMNS), *rows]
    return "\n".join("| " + " | ".join(cells) + " |" for cells in lines)


# --- kernel table (`make bench-gpu-kernels`): every backend at TinyLlama's attention shapes --

MIN_REPEATS = 10
"""Timed calls per kernel-table cell (the median is reported): --repeats may raise it, never
lower it, and --smoke keeps it."""
KERNEL_LENGTHS = [4096, 16384, 65536]
SMOKE_LENGTHS = [128, 320]
EXPANDED = "flash-expanded"
"""flash with k/v expanded to the query heads before the call (what torch 2.11 is given), the
copy and its backward inside the timed call: against `flash` (native GQA where the kernel
takes it), the cost of the copies."""
KERNEL_COLUMNS = (
    "T",
    "docs/row",
    "backend",
    "fwd ms",
    "fwd+bwd ms",
    "fwd TFLOP/s",
    "fwd+bwd TFLOP/s",
    "fwd+bwd vs sdpa",
    "peak MiB",
)


def kernel_rows(seq_len: int, document_lengths: list[int], args: argparse.Namespace) -> list[dict]:
    """One record per backend for sequence length seq_len (keys: KERNEL_COLUMNS' quantities)."""
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    document_ids, pieces = pack_rows(document_lengths, seq_len, args.batch)
    document_ids = document_ids.to(device)
    generator = torch.Generator(device).manual_seed(SEED)

    def randn(heads: int, grad: bool = True) -> torch.Tensor:
        shape = (args.batch, seq_len, heads, args.head_dim)
        return torch.randn(shape, generator=generator, device=device, dtype=dtype).requires_grad_(grad)

    q, k, v, grad_out = randn(args.heads), randn(args.kv_heads), randn(args.kv_heads), randn(args.heads, False)
    group = args.heads // args.kv_heads

    def prepare(backend: str) -> Callable[[], torch.Tensor]:
        """The forward of `backend` with its mask built here, outside every timed call."""
        mask = build_mask(document_ids, seq_len, "flash" if backend == EXPANDED else backend, dtype=dtype)
        if backend != EXPANDED:
            return lambda: attention(q, k, v, mask=mask)
        return lambda: attention(q, k.repeat_interleave(group, dim=2), v.repeat_interleave(group, dim=2), mask=mask)

    def forward_no_grad(forward: Callable[[], torch.Tensor]) -> torch.Tensor:
        with torch.no_grad():
            return forward()

    def train(forward: Callable[[], torch.Tensor]) -> None:
        q.grad = k.grad = v.grad = None
        forward().backward(grad_out)

    check = seq_len <= args.check_max and "sdpa" in args.backends
    reference = forward_no_grad(prepare("sdpa")) if check else None
    forwards, failed = {}, {}
    for backend in args.backends:
        try:
            forward = prepare(backend)
            out = forward_no_grad(forward)
            train(forward)
        except Exception as error:  # a backend this machine lacks: report it, time the others
            failed[backend] = f"failed: {type(error).__name__}: {str(error).splitlines()[0][:60]}"
            continue
        tolerance = 2e-2 if dtype == torch.bfloat16 else TOLERANCE
        if reference is not None and (out.float() - reference.float()).abs().max().item() > tolerance:
            failed[backend] = f"differs from sdpa by more than {tolerance:g}"
            continue
        forwards[backend] = forward
    timings = device_timing.attention_timings(
        forwards, forward_no_grad, train, repeats=args.repeats, device=device,
        document_lengths=pieces, heads=args.heads, head_dim=args.head_dim,
    )  # fmt: skip
    train_ms = {backend: timing["fwd_bwd_ms"] for backend, timing in timings.items()}
    records = []
    for backend in args.backends:
        record: dict = {"T": seq_len, "docs_per_row": len(pieces) / args.batch, "backend": backend}
        if backend in forwards:
            record |= timings[backend]
            record["fwd_bwd_vs_sdpa"] = train_ms["sdpa"] / train_ms[backend] if "sdpa" in train_ms else None
        else:
            record["failed"] = failed[backend]
        records.append(record)
    return records


def kernel_cells(record: dict) -> list[str]:
    cells = [str(record["T"]), f"{record['docs_per_row']:.2f}", record["backend"]]
    if "failed" in record:
        return [*cells, record["failed"], "", "", "", "", ""]
    versus = record["fwd_bwd_vs_sdpa"]
    return [
        *cells,
        f"{record['fwd_ms']:.2f}",
        f"{record['fwd_bwd_ms']:.2f}",
        f"{record['fwd_tflops']:.1f}",
        f"{record['fwd_bwd_tflops']:.1f}",
        "" if versus is None else f"{versus:.2f}x",
        device_timing.mib(record["peak_mib"]),
    ]


def kernel_main(args: argparse.Namespace) -> None:
    """The kernel table; with --out, also DIR/attention.json and DIR/attention.md."""
    if args.repeats < MIN_REPEATS:
        raise SystemExit(f"--repeats {args.repeats}: the kernel table takes at least {MIN_REPEATS}")
    device = torch.device(args.device)
    if args.smoke:
        args.lengths = args.lengths or SMOKE_LENGTHS
        args.heads, args.kv_heads, args.head_dim = 4, 2, 16
    args.lengths = args.lengths or KERNEL_LENGTHS
    if args.backends is None:
        args.backends = ["sdpa", "flex", "flash", EXPANDED] if device.type == "cuda" else ["sdpa", "varlen"]
    gqa = "n/a"
    if "flash" in args.backends and flash.available():
        gqa = "native" if flash.resolve_kernel().enable_gqa else "expanded"
    header = (
        f"{device_timing.device_name(device)}; batch {args.batch}, H={args.heads}, Hkv={args.kv_heads}, "
        f"D={args.head_dim}, {'bf16' if device.type == 'cuda' else 'fp32'}, median of {args.repeats} calls; "
        f"flash GQA: {gqa}"
    )
    print(header, flush=True)
    document_lengths = stdlib_document_lengths()
    records = [record for seq_len in args.lengths for record in kernel_rows(seq_len, document_lengths, args)]
    lines = [KERNEL_COLUMNS, ("---:",) * len(KERNEL_COLUMNS), *(kernel_cells(r) for r in records)]
    table = "\n".join("| " + " | ".join(cells) + " |" for cells in lines)
    print(table)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        result = {
            "benchmark": "attention",
            "header": header,
            "device": device_timing.device_name(device),
            "torch": torch.__version__,
            "shapes": {"batch": args.batch, "heads": args.heads, "kv_heads": args.kv_heads, "head_dim": args.head_dim},
            "repeats": args.repeats,
            "flash_gqa": gqa,
            "flops": "useful fwd = 4 H D sum_doc l(l+1)/2; fwd+bwd = 3.5 x fwd (module docstring)",
            "rows": [{key: value for key, value in r.items() if value == value} for r in records],  # NaN -> absent
        }
        (args.out / "attention.json").write_text(json.dumps(result, indent=2) + "\n")
        (args.out / "attention.md").write_text(f"{header}\n\n{table}\n")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default=None, help="kernel table device (default: cuda)")
    parser.add_argument("--kernels", action="store_true", help="the kernel table (implied by --device/--out/--smoke)")
    parser.add_argument("--out", type=Path, default=None, help="kernel table: write DIR/attention.json and .md")
    parser.add_argument("--smoke", action="store_true", help="kernel table at tiny sizes (runs on CPU)")
    parser.add_argument("--backends", nargs="+", default=None, help=f"kernel table: backends to time, or {EXPANDED}")
    parser.add_argument("--heads", type=int, default=32, help="kernel table: query heads")
    parser.add_argument("--kv-heads", type=int, default=4, help="kernel table: key/value heads")
    parser.add_argument("--head-dim", type=int, default=64, help="kernel table: head_dim")
    parser.add_argument("--check-max", type=int, default=16384, help="kernel table: largest T checked against sdpa")
    parser.add_argument("--lengths", type=int, nargs="+", default=None, help="sequence lengths T")
    parser.add_argument("--repeats", type=int, default=None, help="timed calls per measurement (median reported)")
    parser.add_argument("--batch", type=int, default=1, help="packed rows per batch")
    parser.add_argument("--skip-flex", action="store_true", help="CPU table: do not compile or time flex")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    if args.device or args.kernels or args.out or args.smoke:
        if args.device is None:
            args.device = "cpu" if args.smoke or not torch.cuda.is_available() else "cuda"
        args.repeats = MIN_REPEATS if args.repeats is None else args.repeats
        kernel_main(args)
        return
    args.lengths = args.lengths or [1024, 2048, 4096, 8192]
    args.repeats = args.repeats or 5
    load_at_start = os.getloadavg()[0]  # other work on the machine skews the times
    document_lengths = stdlib_document_lengths()
    print(
        f"{len(document_lengths)} stdlib documents; batch {args.batch}, H={HEADS}, Hkv={KV_HEADS}, D={HEAD_DIM}, "
        f"float32, {torch.get_num_threads()} threads, {args.repeats} repeats",
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="inductor-") as inductor_cache:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = inductor_cache  # cold compile: flex compile s is honest
        rows = [measure(seq_len, document_lengths, args) for seq_len in args.lengths]
    load_at_end = os.getloadavg()[0]
    print(f"\nload average (1 min): {load_at_start:.2f} at start, {load_at_end:.2f} at end, {os.cpu_count()} CPUs\n")
    print(markdown_table(rows))


if __name__ == "__main__":
    main()
