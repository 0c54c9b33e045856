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


def relative_error(got: torch.Tensor, expected: torch.Tensor) -> float:
    return ((got.double().cpu() - expected).norm() / expected.norm()).item()


@pytest.mark.parametrize("name", ["string", "string-repo", "rerope", "self_extend"])
def test_band_pass_gradients_on_the_varlen_kernel_match_the_cpu_fp64_path(name):
    """bf16 on CUDA vs fp64 on CPU: relative L2 error of each gradient below 3e-2 (bf16 keeps
    8 mantissa bits, ~4e-3 per rounding)."""
    positions, docs = two_rows([19, 1, 16], 36)
    q, k, v = (t.requires_grad_() for t in random_qkv(2, 36, 36))
    weights = torch.randn(2, 36, 4, q.shape[-1], dtype=torch.float64)
    expected = all_methods()[name].attend(q, k, v, position_ids=positions, document_ids=docs)
    expected_grads = torch.autograd.grad((expected * weights).sum(), (q, k, v))
    method = all_methods()[name].to(CUDA)
    leaves = [t.detach().to(CUDA, torch.bfloat16).requires_grad_() for t in (q, k, v)]
    got = method.attend(*leaves, position_ids=positions.to(CUDA), document_ids=docs.to(CUDA), backend="flash")
    got_grads = torch.autograd.grad((got.double() * weights.to(CUDA)).sum(), leaves)
    for got_grad, expected_grad in zip(got_grads, expected_grads, strict=True):
        assert relative_error(got_grad, expected_grad) < 3e-2


def test_bf16_true_rope_on_cuda_matches_float64():
    """The CPU test's bound (m theta 2^-23 + 4e-6) on the GPU's cos/sin."""
    config = ModelConfig.from_preset("debug", max_position=131072)
    model = Llama(config).to(CUDA, torch.bfloat16)
    positions = torch.tensor([[0, 2047, 32767, 131071]], device=CUDA)
    cos, sin = model.rope(positions, torch.bfloat16)
    dim = config.head_dim
    theta = 1.0 / config.rope_base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    angles = positions.cpu().double()[..., None] * theta
    angles = torch.cat([angles, angles], dim=-1)
    bound = angles * 2.0**-23 * 1.01 + 4e-6
    assert ((cos.cpu().double() - angles.cos()).abs() <= bound).all()
    assert ((sin.cpu().double() - angles.sin()).abs() <= bound).all()


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
