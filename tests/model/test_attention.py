"""Every attention backend against an independent float64 reference and against `sdpa`."""

import math

import pytest
import torch

from longctx.model.attention import attention, build_mask
from tests.helpers import packed_document_ids
from tests.model.helpers import require_backend


def naive_attention(q, k, v, document_ids):
    """Explicit softmax(QK^T / sqrt(d)) V in float64 with the document+causal mask.
    Queries are the last Tq key positions; GQA by repeating key/value heads."""
    q, k, v = q.double(), k.double(), v.double()
    batch, q_len, heads, dim = q.shape
    kv_len, kv_heads = k.shape[1], k.shape[2]
    k = k.repeat_interleave(heads // kv_heads, dim=2)
    v = v.repeat_interleave(heads // kv_heads, dim=2)
    out = torch.zeros(batch, q_len, heads, dim, dtype=torch.float64)
    for b in range(batch):
        for i in range(q_len):
            query_pos = kv_len - q_len + i
            keys = [j for j in range(query_pos + 1) if document_ids[b, j] == document_ids[b, query_pos]]
            scores = torch.einsum("hd,khd->hk", q[b, i], k[b, keys]) / math.sqrt(dim)
            out[b, i] = torch.einsum("hk,khd->hd", scores.softmax(-1), v[b, keys])
    return out


def random_qkv(batch, q_len, kv_len, heads=4, kv_heads=2, dim=16, requires_grad=False):
    q = torch.randn(batch, q_len, heads, dim, requires_grad=requires_grad)
    k = torch.randn(batch, kv_len, kv_heads, dim, requires_grad=requires_grad)
    v = torch.randn(batch, kv_len, kv_heads, dim, requires_grad=requires_grad)
    return q, k, v


def two_rows_of_documents():
    """Row 0: documents 37, 5, 1, 85 tokens; row 1: one 128-token document."""
    row0 = packed_document_ids([37, 5, 1, 85])[0]
    row1 = torch.zeros(128, dtype=torch.long)
    return torch.stack([row0, row1])


@pytest.mark.parametrize("kv_heads", [4, 2, 1], ids=["mha", "gqa2", "mqa"])
def test_sdpa_matches_naive_reference(kv_heads):
    docs = two_rows_of_documents()
    q, k, v = random_qkv(2, 128, 128, kv_heads=kv_heads)
    expected = naive_attention(q, k, v, docs)
    got = attention(q, k, v, document_ids=docs, backend="sdpa")
    torch.testing.assert_close(got.double(), expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize("block_size", [1, 16, 50, 256])
@pytest.mark.parametrize("kv_heads", [4, 2])
def test_varlen_matches_sdpa_forward_and_backward(block_size, kv_heads):
    docs = two_rows_of_documents()
    q, k, v = random_qkv(2, 128, 128, kv_heads=kv_heads, requires_grad=True)
    grad_out = torch.randn(2, 128, 4, 16)

    ref = attention(q, k, v, document_ids=docs, backend="sdpa")
    ref_grads = torch.autograd.grad(ref, (q, k, v), grad_out)
    got = attention(q, k, v, document_ids=docs, backend="varlen", block_size=block_size)
    got_grads = torch.autograd.grad(got, (q, k, v), grad_out)

    torch.testing.assert_close(got, ref, atol=1e-5, rtol=0)
    for g, r in zip(got_grads, ref_grads, strict=True):
        torch.testing.assert_close(g, r, atol=1e-5, rtol=0)


@pytest.mark.parametrize("lengths", [[300, 20, 3, 400], [700], [5, 250, 260, 1, 6]])
def test_varlen_long_and_short_documents_match_sdpa(lengths):
    """Long documents take the unmasked causal call, short ones grouped masked calls."""
    docs = packed_document_ids(lengths)
    q, k, v = random_qkv(1, sum(lengths), sum(lengths), requires_grad=True)
    grad_out = torch.randn(1, sum(lengths), 4, 16)
    ref = attention(q, k, v, document_ids=docs, backend="sdpa")
    ref_grads = torch.autograd.grad(ref, (q, k, v), grad_out)
    got = attention(q, k, v, document_ids=docs, backend="varlen")
    got_grads = torch.autograd.grad(got, (q, k, v), grad_out)
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=0)
    for g, r in zip(got_grads, ref_grads, strict=True):
        torch.testing.assert_close(g, r, atol=1e-5, rtol=0)


def test_varlen_chunks_partition_rows():
    from longctx.batch import document_start_mask
    from longctx.model.attention import SHORT_DOCUMENT, _row_chunks

    chunks = _row_chunks(document_start_mask(packed_document_ids([300, 20, 3, 400, 100, 100, 100]))[0])
    assert chunks == [(0, 300, False), (300, 323, True), (323, 723, False), (723, 923, True), (923, 1023, True)]
    assert all(end - start <= SHORT_DOCUMENT for start, end, masked in chunks if masked)


@pytest.mark.parametrize("backend", ["sdpa", "varlen"])
def test_queries_are_the_last_key_positions(backend):
    """Tq < Tk (decode, chunked prefill): rows equal the matching rows of the full pass."""
    docs = two_rows_of_documents()
    q, k, v = random_qkv(2, 128, 128)
    full = attention(q, k, v, document_ids=docs, backend="sdpa")
    for q_len in (1, 7, 60):
        part = attention(q[:, -q_len:], k, v, document_ids=docs, backend=backend)
        torch.testing.assert_close(part, full[:, -q_len:], atol=1e-5, rtol=0)
        torch.testing.assert_close(part.double(), naive_attention(q[:, -q_len:], k, v, docs), atol=1e-5, rtol=0)


@pytest.mark.parametrize("backend", ["sdpa", "varlen"])
def test_packed_row_equals_each_document_alone(backend):
    lengths = [30, 1, 64, 33]
    docs = packed_document_ids(lengths)
    q, k, v = random_qkv(1, sum(lengths), sum(lengths))
    packed = attention(q, k, v, document_ids=docs, backend=backend)
    start = 0
    for n in lengths:
        alone = attention(q[:, start : start + n], k[:, start : start + n], v[:, start : start + n], backend=backend)
        torch.testing.assert_close(packed[:, start : start + n], alone, atol=1e-5, rtol=0)
        start += n


def test_document_mask_changes_the_output():
    """Guard against a backend that ignores document_ids: masking must matter."""
    docs = two_rows_of_documents()
    q, k, v = random_qkv(2, 128, 128)
    masked = attention(q, k, v, document_ids=docs, backend="varlen")
    unmasked = attention(q, k, v, backend="varlen")
    assert (masked[0, 50:] - unmasked[0, 50:]).abs().max() > 1e-2
    torch.testing.assert_close(masked[1], unmasked[1])


def test_flex_matches_sdpa_in_inference():
    docs = two_rows_of_documents()
    q, k, v = random_qkv(2, 128, 128, dim=16)
    with torch.no_grad():
        ref = attention(q, k, v, document_ids=docs, backend="sdpa")
        got = attention(q, k, v, document_ids=docs, backend="flex")
    torch.testing.assert_close(got, ref, atol=1e-4, rtol=0)


def test_flex_refuses_backward_on_cpu():
    q, k, v = random_qkv(1, 128, 128, requires_grad=True)
    with pytest.raises(RuntimeError, match="no backward on CPU"):
        attention(q, k, v, backend="flex")


def test_mask_built_once_is_reused_and_checked():
    docs = two_rows_of_documents()
    q, k, v = random_qkv(2, 128, 128)
    mask = build_mask(docs, 128, "varlen")
    torch.testing.assert_close(attention(q, k, v, mask=mask), attention(q, k, v, document_ids=docs, backend="varlen"))
    with pytest.raises(ValueError, match="mask was built for q_len=128"):
        attention(q[:, :5], k, v, mask=mask)


@pytest.mark.parametrize(
    "shapes, message",
    [
        (((1, 8, 4, 16), (1, 8, 3, 16)), "not a multiple"),
        (((1, 9, 4, 16), (1, 8, 2, 16)), "disagree"),
        (((1, 8, 4, 16), (1, 8, 2, 8)), "disagree"),
    ],
)
def test_bad_shapes_are_rejected(shapes, message):
    q = torch.randn(shapes[0])
    k = torch.randn(shapes[1])
    with pytest.raises(ValueError, match=message):
        attention(q, k, k.clone(), backend="sdpa")


def test_unknown_backend_is_rejected():
    q, k, v = random_qkv(1, 8, 8)
    with pytest.raises(ValueError, match="not one of"):
        attention(q, k, v, backend="fast")


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["flash", "xformers", "flex"])
@pytest.mark.parametrize("q_len", [128, 1])
def test_cuda_backends_match_sdpa(backend, q_len):
    require_backend(backend)
    docs = two_rows_of_documents().cuda()
    q, k, v = (t.cuda().to(torch.bfloat16) for t in random_qkv(2, q_len, 128, dim=64))
    ref = attention(q.float(), k.float(), v.float(), document_ids=docs, backend="sdpa")
    got = attention(q, k, v, document_ids=docs, backend=backend)
    torch.testing.assert_close(got.float(), ref, atol=2e-2, rtol=0)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["flash", "xformers", "flex"])
def test_cuda_backends_backward_match_sdpa(backend):
    require_backend(backend)
    docs = two_rows_of_documents().cuda()
    q, k, v = (t.cuda().to(torch.bfloat16).requires_grad_() for t in random_qkv(2, 128, 128, dim=64))
    grad_out = torch.randn(2, 128, 4, 64, device="cuda", dtype=torch.bfloat16)
    ref = torch.autograd.grad(attention(q, k, v, document_ids=docs, backend="sdpa"), (q, k, v), grad_out)
    got = torch.autograd.grad(attention(q, k, v, document_ids=docs, backend=backend), (q, k, v), grad_out)
    for g, r in zip(got, ref, strict=True):
        torch.testing.assert_close(g.float(), r.float(), atol=5e-2, rtol=0)
