"""Chunked cross-entropy equals plain cross-entropy over full fp32 logits: loss and every
parameter's gradient, with ignored labels and chunks that do not divide the tokens."""

import pytest
import torch
import torch.nn.functional as F

from longctx.batch import IGNORE_INDEX
from longctx.config.model import ModelConfig
from longctx.model.llama import Llama
from longctx.model.loss import chunked_cross_entropy
from tests.helpers import packed_document_ids, reset_position_ids


def loss_and_grads(model, ids, labels, options, chunk_tokens):
    model.zero_grad(set_to_none=True)
    if chunk_tokens is None:
        logits = model(ids, **options)  # at least fp32, as the chunked loss computes it (fp64 stays fp64)
        logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
        loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=IGNORE_INDEX, reduction="sum")
    else:
        loss = model(ids, labels=labels, loss_chunk_tokens=chunk_tokens, **options)
    loss.backward()
    return loss.detach(), {name: p.grad.clone() for name, p in model.named_parameters()}


@pytest.mark.parametrize("chunk_tokens", [7, 32, 0])
def test_chunked_loss_matches_plain_loss_and_gradients(chunk_tokens):
    model = Llama(ModelConfig.from_preset("debug", max_position=64)).double()
    lengths = [20, 12]
    ids = torch.randint(0, 8192, (2, 32))
    labels = torch.randint(0, 8192, (2, 32))
    labels[0, :5] = IGNORE_INDEX
    labels[1, -3:] = IGNORE_INDEX
    options = {
        "position_ids": reset_position_ids(lengths, batch=2),
        "document_ids": packed_document_ids(lengths, batch=2),
    }
    expected_loss, expected_grads = loss_and_grads(model, ids, labels, options, None)
    loss, grads = loss_and_grads(model, ids, labels, options, chunk_tokens)
    torch.testing.assert_close(loss, expected_loss, rtol=1e-6, atol=0)  # both fp64 (an fp64 model's logits)
    for name, grad in expected_grads.items():
        torch.testing.assert_close(grads[name], grad, rtol=1e-5, atol=1e-9, msg=name)


def test_chunked_loss_never_holds_all_logits():
    """The largest float32 tensor the head produces is one chunk's logits."""
    hidden = torch.randn(64, 16, requires_grad=True)
    head = torch.nn.Linear(16, 1000, bias=False)
    labels = torch.randint(0, 1000, (64,))
    sizes = []
    head.register_forward_hook(lambda module, args, out: sizes.append(out.shape[0]))
    chunked_cross_entropy(hidden, head, labels, chunk_tokens=16).backward()
    assert sizes and max(sizes) == 16  # forward and the backward recomputation, 16 tokens each


def test_bad_chunk_size_is_rejected():
    with pytest.raises(ValueError, match="chunk_tokens must be > 0"):
        chunked_cross_entropy(torch.randn(4, 2), torch.nn.Linear(2, 3), torch.zeros(4, dtype=torch.long), 0)


def reference_loss_and_grads(hidden, weight, labels):
    """Full [N, vocab] logits in float64, then the summed cross-entropy over labelled tokens."""
    hidden = hidden.detach().double().requires_grad_()
    weight = weight.detach().double().requires_grad_()
    loss = F.cross_entropy(hidden @ weight.T, labels, ignore_index=IGNORE_INDEX, reduction="sum")
    loss.backward()
    return loss.detach(), hidden.grad, weight.grad


def kernel_loss_and_grads(hidden, head, labels, chunk_tokens, kernel):
    hidden = hidden.detach().clone().requires_grad_()
    head.zero_grad(set_to_none=True)
    loss = chunked_cross_entropy(hidden, head, labels, chunk_tokens, kernel=kernel)
    loss.backward()
    return loss.detach(), hidden.grad, head.weight.grad


def loss_inputs(device="cpu", dtype=torch.float32):
    """50 tokens (not a multiple of the 16-token chunks), d=24, vocab 300, ignored labels
    at the start and in the middle."""
    generator = torch.Generator().manual_seed(0)
    hidden = torch.randn(50, 24, generator=generator).to(device, dtype)
    head = torch.nn.Linear(24, 300, bias=False).to(device, dtype)
    with torch.no_grad():
        head.weight.copy_(torch.randn(300, 24, generator=generator) * 0.2)
    labels = torch.randint(0, 300, (50,), generator=generator).to(device)
    labels[:5] = IGNORE_INDEX
    labels[20:23] = IGNORE_INDEX
    return hidden, head, labels


def test_compiled_kernel_matches_chunked_and_float64_reference():
    """fp32 against the float64 full-logits reference: rtol 1e-5 (loss ~ 300 summed terms)
    and 1e-4 / atol 1e-6 on gradients; compiled against chunked (same fp32 math, fused):
    rtol 1e-5 / atol 1e-6."""
    hidden, head, labels = loss_inputs()
    ref_loss, ref_hidden, ref_weight = reference_loss_and_grads(hidden, head.weight, labels)
    eager = kernel_loss_and_grads(hidden, head, labels, 16, "chunked")
    compiled = kernel_loss_and_grads(hidden, head, labels, 16, "compiled")
    for result in (eager, compiled):
        loss, grad_hidden, grad_weight = result
        torch.testing.assert_close(loss.double(), ref_loss, rtol=1e-5, atol=0)
        torch.testing.assert_close(grad_hidden.double(), ref_hidden, rtol=1e-4, atol=1e-6)
        torch.testing.assert_close(grad_weight.double(), ref_weight, rtol=1e-4, atol=1e-6)
        assert (grad_hidden[:5] == 0).all() and (grad_hidden[20:23] == 0).all()  # ignored tokens
    for got, want in zip(compiled, eager, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_compiled_kernel_through_the_model_matches_plain_loss():
    """Llama.forward(labels=..., loss_kernel="compiled") against full logits then
    cross-entropy: the loss and every parameter's gradient (float64 model)."""
    model = Llama(ModelConfig.from_preset("debug", max_position=64)).double()
    ids = torch.randint(0, 8192, (2, 32))
    labels = torch.randint(0, 8192, (2, 32))
    labels[0, :5] = IGNORE_INDEX
    expected_loss, expected_grads = loss_and_grads(model, ids, labels, {}, None)
    loss, grads = loss_and_grads(model, ids, labels, {"loss_kernel": "compiled"}, 24)
    torch.testing.assert_close(loss, expected_loss, rtol=1e-6, atol=0)
    for name, grad in expected_grads.items():
        torch.testing.assert_close(grads[name], grad, rtol=1e-5, atol=1e-9, msg=name)


def test_unknown_kernel_is_rejected():
    with pytest.raises(ValueError, match="is not one of"):
        chunked_cross_entropy(torch.randn(4, 2), torch.nn.Linear(2, 3), torch.zeros(4, dtype=torch.long), 2, kernel="x")


def test_liger_without_the_package_names_it(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "liger_kernel", None)
    monkeypatch.setitem(sys.modules, "liger_kernel.transformers", None)
    with pytest.raises(RuntimeError, match="liger_kernel.*pip install liger-kernel"):
        chunked_cross_entropy(
            torch.randn(4, 2), torch.nn.Linear(2, 3), torch.zeros(4, dtype=torch.long), 2, kernel="liger"
        )


@pytest.mark.gpu
def test_liger_kernel_matches_chunked_on_cuda():
    """Liger's fused linear cross-entropy against the chunked kernel, fp32 on CUDA (TF32
    off): rtol 1e-4 on the loss, 1e-3 / atol 1e-5 on gradients (Triton's summation order)."""
    pytest.importorskip("liger_kernel")
    if not torch.cuda.is_available():
        pytest.skip("liger_kernel needs CUDA")
    torch.backends.cuda.matmul.allow_tf32 = False
    hidden, head, labels = loss_inputs("cuda")
    want = kernel_loss_and_grads(hidden, head, labels, 16, "chunked")
    got = kernel_loss_and_grads(hidden, head, labels, 16, "liger")
    torch.testing.assert_close(got[0], want[0], rtol=1e-4, atol=0)
    for g, w in zip(got[1:], want[1:], strict=True):
        torch.testing.assert_close(g, w, rtol=1e-3, atol=1e-5)
