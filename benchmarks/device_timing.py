"""Timing and memory on any device, for the `--device cuda` modes of the benchmarks.

CUDA work is asynchronous: every timed region ends with `torch.cuda.synchronize`, and
peak memory is the caching allocator's `max_memory_allocated` above what was allocated
before the op (inputs, weights, optimizer state). On CPU the same functions run (the
modes can be smoke-tested without a GPU) and the peak is reported as unknown: the CPU
tables measure it in a fresh process instead (cpu_memory.py).

Useful attention FLOPs count only the pairs a document-masked causal kernel must compute:
forward 4 * H * D * sum_doc l (l + 1) / 2 (QK^T and PV, 2 FLOPs per multiply-add),
backward 2.5x the forward (FlashAttention-2's accounting), so fwd+bwd = 3.5x.
"""

from __future__ import annotations

import functools
import math
import statistics
import time
from collections.abc import Callable

import torch


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def interleaved_median_ms(
    ops: dict[str, Callable[[], object]], repeats: int, device: torch.device, warmup: bool = True
) -> dict[str, float]:
    """Median ms of each op after one warm-up call (unless the caller ran one already);
    ops take turns so drift hits all alike."""
    for op in ops.values() if warmup else ():
        op()
    synchronize(device)
    seconds: dict[str, list[float]] = {name: [] for name in ops}
    for _ in range(repeats):
        for name, op in ops.items():
            synchronize(device)
            start = time.perf_counter()
            op()
            synchronize(device)
            seconds[name].append(time.perf_counter() - start)
    return {name: statistics.median(times) * 1e3 for name, times in seconds.items()}


def peak_extra_mib(op: Callable[[], object], device: torch.device) -> float:
    """Peak allocated memory of one call of `op` above the memory held before it (CUDA);
    NaN on other devices."""
    if device.type != "cuda":
        op()
        return math.nan
    synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    op()
    synchronize(device)
    return (torch.cuda.max_memory_allocated(device) - before) / 2**20


def peak_total_gib(device: torch.device) -> float:
    """Everything the caching allocator held at its peak since the last reset (weights,
    optimizer state, activations), GiB; NaN off CUDA."""
    if device.type != "cuda":
        return math.nan
    synchronize(device)
    return torch.cuda.max_memory_allocated(device) / 2**30


def causal_attention_flops(document_lengths: list[int], heads: int, head_dim: int, backward: bool) -> float:
    """Useful FLOPs of document-masked causal attention (module docstring)."""
    forward = 4 * heads * head_dim * sum(length * (length + 1) / 2 for length in document_lengths)
    return forward * (3.5 if backward else 1.0)


def attention_timings(
    calls: dict[str, object],
    forward: Callable[[object], object],
    train: Callable[[object], object],
    *,
    repeats: int,
    device: torch.device,
    document_lengths: list[int],
    heads: int,
    head_dim: int,
) -> dict[str, dict[str, float]]:
    """For each named attention call: forward(call) and train(call) in ms (medians, the
    calls taking turns), their useful TFLOP/s (module docstring) and train's peak MiB."""
    timed = {}
    for label, step in (("fwd", forward), ("fwd_bwd", train)):
        ops = {name: functools.partial(step, call) for name, call in calls.items()}
        flops = causal_attention_flops(document_lengths, heads, head_dim, backward=label == "fwd_bwd")
        timed[label] = (interleaved_median_ms(ops, repeats, device), flops)
    return {
        name: {
            "fwd_ms": timed["fwd"][0][name],
            "fwd_bwd_ms": timed["fwd_bwd"][0][name],
            "fwd_tflops": timed["fwd"][1] / timed["fwd"][0][name] / 1e9,
            "fwd_bwd_tflops": timed["fwd_bwd"][1] / timed["fwd_bwd"][0][name] / 1e9,
            "peak_mib": peak_extra_mib(functools.partial(train, call), device),
        }
        for name, call in calls.items()
    }


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)}, torch {torch.__version__}, CUDA {torch.version.cuda}"
    return f"CPU, torch {torch.__version__}, {torch.get_num_threads()} threads"


def mib(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{value:.0f}"
