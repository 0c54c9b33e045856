"""The numerics fixes on a real GPU (`gpu`; skipped without CUDA): the merged band passes'
gradients through torch's varlen kernel (whose backward drops grad_lse), bf16-true RoPE on
CUDA, and the boundary-built flex BlockMask on CUDA, each against an independent reference."""

import pytest
import torch

from longctx.gpu_checks import assert_band_pass_gradients_match_fp64_path, assert_bf16_true_rope_matches_float64
from longctx.model.attention import _flex_block_mask, attention
from tests.model.helpers import BLOCK_FIELDS, all_methods, dense_block_mask, random_qkv, two_rows

pytestmark = pytest.mark.gpu
CUDA = torch.device("cuda")


@pytest.mark.parametrize("name", ["string", "string-repo", "rerope", "self_extend", "dca"])
def test_band_pass_gradients_on_the_varlen_kernel_match_the_cpu_fp64_path(name):
    positions, docs = two_rows([19, 1, 16], 36)
    q, k, v = random_qkv(2, 36, 36)
    assert_band_pass_gradients_match_fp64_path(lambda: all_methods()[name], positions, docs, q, k, v, CUDA)


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
