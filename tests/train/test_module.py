"""The LightningModule's pieces: LR schedule, loss, activation checkpointing."""

import math

import pytest
import torch

from longctx.config import load
from longctx.data.packing import IGNORE_INDEX
from longctx.train.module import LanguageModelModule, learning_rate, rescale_gradients


def test_cosine_schedule_hand_worked():
    kwargs = dict(warmup=10, total=110, peak=4e-4, floor=4e-5, shape="cosine")
    assert learning_rate(0, **kwargs) == pytest.approx(4e-5)  # (0 + 1) / 10 of the peak
    assert learning_rate(9, **kwargs) == pytest.approx(4e-4)
    assert learning_rate(10, **kwargs) == pytest.approx(4e-4)
    assert learning_rate(60, **kwargs) == pytest.approx((4e-4 + 4e-5) / 2)  # half-way: cos(pi/2) = 0
    assert learning_rate(110, **kwargs) == pytest.approx(4e-5)
    assert learning_rate(500, **kwargs) == pytest.approx(4e-5)
    linear = dict(kwargs, shape="linear")
    assert learning_rate(60, **linear) == pytest.approx((4e-4 + 4e-5) / 2)  # half-way down a straight line
    assert learning_rate(35, **linear) == pytest.approx(4e-4 - 0.25 * (4e-4 - 4e-5))


def batch(vocab=8192, rows=2, window=32):
    ids = torch.randint(0, vocab, (rows, window + 1))
    labels = ids[:, 1:].clone()
    labels[:, :5] = IGNORE_INDEX
    return {
        "input_ids": ids[:, :-1],
        "labels": labels,
        "position_ids": torch.arange(window).expand(rows, -1),
        "document_ids": torch.zeros(rows, window, dtype=torch.long),
    }


def test_summed_loss_is_the_sum_over_labelled_tokens():
    module = LanguageModelModule(load([], ["data.window=32"]))
    module.configure_model()
    data = batch()
    loss_sum, labelled = module.summed_loss(data)
    logits = module(data)
    mask = data["labels"] != IGNORE_INDEX
    log_probs = logits.log_softmax(-1)[mask]
    expected = -log_probs.gather(-1, data["labels"][mask][:, None]).sum()
    assert labelled == int(mask.sum()) == 2 * 27
    assert loss_sum.item() == pytest.approx(expected.item(), rel=1e-5)
    assert loss_sum.item() / labelled == pytest.approx(math.log(8192), rel=0.05)  # near-uniform at init


@pytest.mark.parametrize("flag", ["activation_checkpointing"])
def test_activation_checkpointing_changes_nothing_but_memory(flag):
    data = batch()
    grads, saved = {}, {}
    for enabled in (False, True):
        module = LanguageModelModule(load([], ["data.window=32", f"train.{flag}={enabled}"]))
        module.configure_model()
        count = [0]

        def pack(tensor, count=count):
            count[0] += 1
            return tensor

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            loss, _ = module.summed_loss(data)
        saved[enabled] = count[0]
        loss.backward()
        grads[enabled] = [p.grad.clone() for p in module.model.parameters()]
        names = list(module.model.state_dict())
        assert names[1] == "blocks.0.attn_norm.weight"  # checkpoints stay loadable
    assert saved[True] < saved[False] / 2  # block internals are recomputed, not stored
    for plain, checkpointed in zip(grads[False], grads[True], strict=True):
        torch.testing.assert_close(checkpointed, plain)


def test_compiled_blocks_give_the_eager_loss_and_gradients():
    """train.compile=true compiles each block (inductor's C++ backend on CPU) in place:
    same loss and gradients as eager, same parameter names, and the blocks really run
    compiled (dynamo counts the frames it converted)."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    data = batch()
    results = {}
    for enabled in (False, True):
        module = LanguageModelModule(load([], ["model.preset=debug", "data.window=32", f"train.compile={enabled}"]))
        module.configure_model()
        loss, _ = module.summed_loss(data)
        loss.backward()
        results[enabled] = (loss.detach(), [p.grad.clone() for p in module.model.parameters()])
        assert list(module.model.state_dict())[1] == "blocks.0.attn_norm.weight"
    assert counters["stats"]["unique_graphs"] >= 1
    torch.testing.assert_close(results[True][0], results[False][0], rtol=1e-5, atol=1e-5)
    for eager, compiled in zip(results[False][1], results[True][1], strict=True):
        torch.testing.assert_close(compiled, eager, rtol=1e-4, atol=1e-6)


def test_chunked_loss_gives_the_plain_loss_and_gradients():
    """train.loss_chunk_tokens routes the loss through the model's chunked cross-entropy."""
    data = batch()
    results = {}
    for chunk_tokens in (0, 10):
        module = LanguageModelModule(load([], ["data.window=32", f"train.loss_chunk_tokens={chunk_tokens}"]))
        module.configure_model()
        loss, labelled = module.summed_loss(data)
        loss.backward()
        results[chunk_tokens] = (loss.detach(), labelled, [p.grad.clone() for p in module.model.parameters()])
    (plain, plain_count, plain_grads), (chunked, chunked_count, chunked_grads) = results[0], results[10]
    assert chunked_count == plain_count
    torch.testing.assert_close(chunked, plain, rtol=1e-5, atol=0)
    for got, expected in zip(chunked_grads, plain_grads, strict=True):  # fp32: summation order differs
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-3 * expected.abs().max().item())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("labelled", [37, 0])
def test_rescale_equals_the_per_parameter_loop_bitwise(dtype, labelled):
    """One foreach multiply by a device scalar = the old `grad.mul_(capacity / labelled)`
    per parameter with a Python float (and no change when nothing is labelled)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(13, 7), torch.nn.LayerNorm(7), torch.nn.Linear(7, 3, bias=False))
    model.to(dtype)
    for parameter in model.parameters():
        parameter.grad = torch.randn_like(parameter) * 3
    model[1].bias.grad = None  # a parameter without a gradient is skipped
    capacity = 1024
    expected = {}
    for name, parameter in model.named_parameters():
        if parameter.grad is not None:
            grad = parameter.grad.clone()
            if labelled > 0:
                grad.mul_(capacity / labelled)
            expected[name] = grad
    totals = torch.tensor([float(capacity), float(labelled)], dtype=torch.float64)
    rescale_gradients(list(model.parameters()), totals[0], totals[1])
    assert model[1].bias.grad is None
    for name, parameter in model.named_parameters():
        if parameter.grad is not None:
            assert torch.equal(parameter.grad, expected[name]), name


@pytest.mark.parametrize("chunk", [0, 16])
def test_training_forward_bounds_documents_by_the_row_length(monkeypatch, chunk):
    """The row length reaches build_mask as the host-side `max_seqlen`, so the flash
    backend reads no maximum document length from the device in a training step."""
    from longctx.model import layer_attention

    seen = []
    build_mask = layer_attention.build_mask

    def recording(*args, **kwargs):
        seen.append(kwargs.get("max_seqlen"))
        return build_mask(*args, **kwargs)

    monkeypatch.setattr(layer_attention, "build_mask", recording)
    module = LanguageModelModule(load([], ["data.window=32", f"train.loss_chunk_tokens={chunk}"]))
    module.configure_model()
    module.summed_loss(batch(window=32))
    assert seen == [32]


def test_optimizer_step_frees_the_gradients_before_the_next_forward():
    """Lightning zeroes gradients inside the next closure, after `training_step`: without
    freeing them at the step, the previous step's gradients would sit through the next
    forward (the memory estimate counts only those the backward has made)."""
    module = LanguageModelModule(load([], ["data.window=32"]))
    module.configure_model()
    optimizer = torch.optim.SGD(module.parameters(), lr=0.1)
    loss_sum, _ = module.summed_loss(batch())
    loss_sum.backward()
    before = {name: p.detach().clone() for name, p in module.named_parameters()}
    assert all(p.grad is not None for p in module.parameters())
    module.optimizer_step(0, 0, optimizer)
    assert all(p.grad is None for p in module.parameters())
    assert any(not torch.equal(before[name], p) for name, p in module.named_parameters())  # it did step


def test_loss_kernel_reaches_the_model_and_gives_the_plain_loss(monkeypatch):
    """train.loss_kernel=compiled: the model's chunked loss is called with that kernel, and
    its loss equals the plain full-logits loss (fp32, rtol 1e-5)."""
    from longctx.model import llama as llama_module

    kernels = []
    chunked = llama_module.chunked_cross_entropy

    def recording(*args, **kwargs):
        kernels.append(kwargs.get("kernel"))
        return chunked(*args, **kwargs)

    monkeypatch.setattr(llama_module, "chunked_cross_entropy", recording)
    data = batch()
    losses = []
    for overrides in (["train.loss_chunk_tokens=0"], ["train.loss_chunk_tokens=10", "train.loss_kernel=compiled"]):
        module = LanguageModelModule(load([], ["data.window=32", *overrides]))
        module.configure_model()
        losses.append(module.summed_loss(data)[0].detach())
    assert kernels == ["compiled"]
    torch.testing.assert_close(losses[1], losses[0], rtol=1e-5, atol=0)
