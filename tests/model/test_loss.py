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
        logits = model(ids, **options)
        loss = F.cross_entropy(
            logits.float().flatten(0, 1), labels.flatten(), ignore_index=IGNORE_INDEX, reduction="sum"
        )
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
    torch.testing.assert_close(loss, expected_loss, rtol=1e-6, atol=0)  # both fp32 (logits are upcast to fp32)
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
