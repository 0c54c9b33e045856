"""The attention designs on the GPU path (docs/design.md §5), each a whole small model on the
`flash` backend against the same weights in float64 on the dense `sdpa` backend: logits
and every parameter's gradient, forward and backward, at gpu-check's 8K (make gpu-check's
correctness part) or the CPU smoke's 48 tokens (tests/tools/test_gpu_check.py, through the
varlen stand-in). The float64 side is itself checked against the loop-by-loop references
of tests/model/designs_reference.py and tests/model/test_designs_rotation.py.

    error = assert_design_matches_float64("sliding 1K", total=8192, device=CUDA)
"""

from __future__ import annotations

import copy

import torch

from longctx.config.model import ModelConfig
from longctx.model.llama import Llama

DESIGNS: dict[str, dict] = {
    "sliding": {"layer_types": ["sliding", "full"], "sliding_rope_base": 1000.0},
    "nope": {"nope_layers": [0]},
    "qk-norm head": {"qk_norm": "head"},
    "qk-norm projection": {"qk_norm": "projection"},
    "p-rope 0.25": {"rotary_fraction": 0.25, "partial_rotary": "p-rope"},
    "partial first 0.5": {"rotary_fraction": 0.5, "partial_rotary": "first"},
    "sinks": {"attention_sinks": True, "layer_types": ["sliding", "full"]},
    "ssmax": {"attn_temperature": {"type": "ssmax"}},
}
"""Overrides of a 2-layer model with heads of 64 (8 query, 2 key/value heads); `sliding`
and `sinks` get a window of total / 8 (1K at 8K, 6 tokens in the smoke); the sinks' own
gradient is among the compared ones."""

BF16_BOUND = 3e-2
"""Relative L2 error of bf16 autocast against float64: 8 mantissa bits (~4e-3 a rounding),
summed over thousands of keys and two layers."""
FP32_BOUND = 1e-4


def design_config(name: str, total: int) -> ModelConfig:
    overrides = dict(DESIGNS[name])
    if "layer_types" in overrides:
        overrides["sliding_window"] = max(total // 8, 2)
    return ModelConfig.from_preset(
        "debug",
        vocab_size=256,
        d_model=512,
        n_heads=8,
        n_kv_heads=2,
        d_ff=512,
        max_position=total,
        **overrides,
    )


def _logits_and_gradients(model: Llama, ids, positions, documents, backend: str, weights) -> list[torch.Tensor]:
    model.zero_grad(set_to_none=True)
    logits = model(ids, positions, documents, attention_backend=backend)
    (logits.float() * weights).sum().backward()
    return [logits.detach()] + [p.grad.detach() for p in model.parameters() if p.grad is not None]


def assert_design_matches_float64(name: str, total: int, device: torch.device, backend: str = "flash") -> float:
    """Design `name` on `backend` (bf16 autocast on CUDA, float32 on CPU) against float64 on
    `sdpa`, one row of four packed documents of `total` tokens: the largest relative L2 error
    of the logits and the parameters' gradients, asserted below its bound."""
    torch.manual_seed(0)
    model = Llama(design_config(name, total)).to(device)
    for parameter_name, parameter in model.named_parameters():  # norms away from 1
        if parameter_name.endswith("norm.weight"):
            parameter.data.uniform_(0.5, 1.5)
        if parameter_name.endswith("attn.sinks"):  # near a short document's lse, so they matter
            parameter.data.uniform_(0.0, 4.0)
    reference = copy.deepcopy(model).double()
    lengths = [total // 4, 1, total // 2, total - total // 4 - total // 2 - 1]
    documents = torch.cat([torch.full((n,), i) for i, n in enumerate(lengths)])[None].to(device)
    positions = torch.cat([torch.arange(n) for n in lengths])[None].to(device)
    ids = torch.randint(0, 256, (1, total), device=device)
    weights = torch.randn(1, total, 256, device=device)
    cuda = device.type == "cuda"
    with torch.autocast("cuda", torch.bfloat16, enabled=cuda):
        got = _logits_and_gradients(model, ids, positions, documents, backend, weights)
    expected = _logits_and_gradients(reference, ids, positions, documents, "sdpa", weights.double())
    bound = BF16_BOUND if cuda else FP32_BOUND
    worst = 0.0
    for index, (a, b) in enumerate(zip(got, expected, strict=True)):
        error = ((a.double() - b).norm() / b.norm().clamp(min=1e-30)).item()
        assert error < bound, f"{name}: {'logits' if index == 0 else f'gradient {index}'} relative L2 error {error:.1e}"
        worst = max(worst, error)
    return worst
