"""The numerics fixes on a real GPU (`gpu`; skipped without CUDA): the merged band passes'
gradients through torch's varlen kernel (whose backward drops grad_lse), bf16-true RoPE on
CUDA, and the boundary-built flex BlockMask on CUDA, each against an independent reference."""

import pytest
import torch

from longctx.config.model import ModelConfig
from longctx.model.attention import _flex_block_mask, attention
from longctx.model.llama import Llama
from tests.model.helpers import BLOCK_FIELDS, all_methods, dense_block_mask, random_qkv, two_rows

pytestmark = pytest.mark.gpu
CUDA = torch.device("cuda")
CPU = torch.device("cpu")


def relative_error(got: torch.Tensor, expected: torch.Tensor) -> float:
    return ((got.double().cpu() - expected).norm() / expected.norm()).item()


def assert_band_pass_gradients_match_fp64_path(
    method_factory, positions, docs, q, k, v, device, reference_device=CPU, dtype=torch.bfloat16
):
    """The method (a fresh one from `method_factory` for each side) in `dtype` on `device`'s
    flash path against its pure-torch path in fp64 on `reference_device` (exact autograd,
    checked against the dense Eq. 4 reference in tests/model/test_flash.py): output and
    q/k/v gradients through the merged passes (the lse merge's backward), relative L2 error
    of each below 3e-2 in bf16 (8 mantissa bits, ~4e-3 per rounding), 1e-5 otherwise.
    Returns the largest error. `make gpu-check` runs it at 8K with the STRING §4.2
    parameters (benchmarks/gpu_check_correctness.py)."""
    bound = 3e-2 if dtype == torch.bfloat16 else 1e-5
    q, k, v = (t.detach().to(reference_device, torch.float64).requires_grad_() for t in (q, k, v))
    weights = torch.randn(*q.shape[:3], q.shape[-1], dtype=torch.float64, device=reference_device)
    reference_rows = [t.to(reference_device) for t in (positions, docs)]
    expected = (
        method_factory()
        .to(reference_device)
        .attend(q, k, v, position_ids=reference_rows[0], document_ids=reference_rows[1])
    )
    expected_grads = torch.autograd.grad((expected * weights).sum(), (q, k, v))
    method = method_factory().to(device)
    leaves = [t.detach().to(device, dtype).requires_grad_() for t in (q, k, v)]
    got = method.attend(*leaves, position_ids=positions.to(device), document_ids=docs.to(device), backend="flash")
    got_grads = torch.autograd.grad((got.double() * weights.to(device)).sum(), leaves)
    expected_cpu = [t.detach().cpu() for t in (expected, *expected_grads)]
    errors = [relative_error(g.detach(), e) for g, e in zip((got, *got_grads), expected_cpu, strict=True)]
    assert max(errors) < bound, f"relative errors (out, dq, dk, dv) {[f'{e:.2e}' for e in errors]} >= {bound}"
    return max(errors)


@pytest.mark.parametrize("name", ["string", "string-repo", "rerope", "self_extend", "dca"])
def test_band_pass_gradients_on_the_varlen_kernel_match_the_cpu_fp64_path(name):
    positions, docs = two_rows([19, 1, 16], 36)
    q, k, v = random_qkv(2, 36, 36)
    assert_band_pass_gradients_match_fp64_path(lambda: all_methods()[name], positions, docs, q, k, v, CUDA)


def assert_bf16_true_rope_matches_float64(device: torch.device) -> None:
    """The CPU test's bound (m theta 2^-23 + 4e-6) on `device`'s cos/sin of a bf16 model."""
    config = ModelConfig.from_preset("debug", max_position=131072)
    model = Llama(config).to(device, torch.bfloat16)
    positions = torch.tensor([[0, 2047, 32767, 131071]], device=device)
    cos, sin = model.rope(positions, torch.bfloat16)
    dim = config.head_dim
    theta = 1.0 / config.rope_base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    angles = positions.cpu().double()[..., None] * theta
    angles = torch.cat([angles, angles], dim=-1)
    bound = angles * 2.0**-23 * 1.01 + 4e-6
    assert ((cos.cpu().double() - angles.cos()).abs() <= bound).all(), "cos beyond m theta 2^-23 + 4e-6"
    assert ((sin.cpu().double() - angles.sin()).abs() <= bound).all(), "sin beyond m theta 2^-23 + 4e-6"


def test_bf16_true_rope_on_cuda_matches_float64():
    assert_bf16_true_rope_matches_float64(CUDA)


def test_flex_block_mask_on_cuda_equals_create_block_mask_and_trains():
    lengths = [300, 1, 500, 223]
    docs = torch.cat([torch.full((n,), i) for i, n in enumerate(lengths)])[None].to(CUDA)
    got = _flex_block_mask(docs, docs.shape[1])
    expected = dense_block_mask(docs.cpu(), docs.shape[1])
    for name in BLOCK_FIELDS:
        assert torch.equal(getattr(got, name).cpu(), getattr(expected, name)), name
    q, k, v = (t.to(CUDA).requires_grad_() for t in random_qkv(1, 1024, 1024, dtype=torch.float32))
    outs = {}
    for backend in ("flex", "sdpa"):
        out = attention(q, k, v, document_ids=docs, backend=backend)
        outs[backend] = (out, *torch.autograd.grad(out.square().sum(), (q, k, v)))
    for got_tensor, expected_tensor in zip(outs["flex"], outs["sdpa"], strict=True):
        torch.testing.assert_close(got_tensor, expected_tensor, atol=2e-3, rtol=2e-3)
