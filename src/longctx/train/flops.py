"""Training FLOPs and peak FLOP/s for MFU, without Lightning (the GPU benchmarks import
this and would otherwise pay ~10 s of Lightning's import in every timed part).

MFU = achieved FLOP/s / peak FLOP/s. Training FLOPs per token (Kaplan et al. 2020;
PaLM Appendix B, halved for causal attention):

    6 * N_matmul + 6 * n_layers * d_model * window

where N_matmul counts every weight used in a matrix product (all but the input embedding,
which is a lookup). Peak FLOP/s: a table of dense bf16 tensor-core peaks for GPUs, and on
CPU a measured roofline: the best fp32 GEMM rate of this machine (`measure_cpu_gemm_flops`),
so CPU MFU says how close training runs to what matrix multiplication alone can reach.
"""

from __future__ import annotations

import time
from functools import cache

import torch

from longctx.config import ExperimentConfig

# Dense bf16 peaks (vendor datasheets, without sparsity), FLOP/s.
GPU_PEAK_FLOPS = {
    "H200": 989e12,
    "H100": 989e12,
    "A100": 312e12,
    "L40S": 362e12,
    "A10G": 125e12,
    "L4": 121e12,
    "RTX 4090": 165e12,
    "V100": 125e12,
}


def training_flops_per_token(config: ExperimentConfig) -> float:
    model = config.model
    matmul_parameters = (
        model.num_parameters() - model.vocab_size * model.d_model - (2 * model.n_layers + 1) * model.d_model
    )
    return 6 * matmul_parameters + 6 * model.n_layers * model.d_model * config.data.window


@cache
def measure_cpu_gemm_flops(size: int = 1024, repeats: int = 10) -> float:
    """Best fp32 matmul rate of this CPU with the current torch thread count, FLOP/s."""
    a, b = torch.randn(size, size), torch.randn(size, size)
    a @ b  # warm-up (thread pool, caches)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best


def peak_flops(device: torch.device) -> float | None:
    if device.type == "cpu":
        return measure_cpu_gemm_flops()
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        for key, flops in GPU_PEAK_FLOPS.items():
            if key in name:
                return flops
    return None
