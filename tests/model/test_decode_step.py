"""A cached decoding step (model/inference/step.py, docs/design.md §8 "The KV cache"): no host
sync, a bounded number of aten operations per layer, and the same logits as one full
forward over packed, left-padded rows whose documents change during decoding.

Sync and operation counts are deterministic properties of the code (not timings), read
by a TorchDispatchMode; `Tensor.tolist` is counted by wrapping it (on CPU it reads memory
without an aten call). benchmarks/decode_ops.py reports the same counts at tinyllama's
depth (docs/benchmarks.md, "Decode step operations (CPU proxy)")."""

import collections
import contextlib

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from longctx.config.model import ModelConfig
from longctx.config.position_methods import arm_config
from longctx.model.llama import Llama
from longctx.model.position_methods import build_position_method, string_method

SYNCS = ("_local_scalar_dense", "nonzero")
METHODS = ("plain", "rope", "string")
OPS_PER_LAYER = {"plain": 29, "rope": 29, "string": 32}
"""Upper bounds on the aten operations (views excluded) one layer adds to a float32
decoding step; before the decoding plan (model/inference/step.py) it took 52, 61 and 83."""
FUSED_OPS_PER_LAYER = {"plain": 25, "rope": 25, "string": 28}
"""The same with `Llama.fuse_projections_` (model/layers.py): q/k/v and gate/up as one
matmul each, q and k rotated without a copy. Of the 25: the two RMSNorms' 12 (CUDA runs
each as one kernel), 4 matmuls, the rotation's 4, the cache write's 2, attention, silu and
the gate product."""


class Counter(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not func.is_view:
            self.ops[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))

    @contextlib.contextmanager
    def counting(self):
        original = torch.Tensor.tolist

        def tolist(tensor):
            self.ops["tolist"] += 1
            return original(tensor)

        torch.Tensor.tolist = tolist
        try:
            with self:
                yield self
        finally:
            torch.Tensor.tolist = original

    @property
    def syncs(self) -> int:
        return sum(self.ops[name] for name in (*SYNCS, "tolist"))


def model_and_method(name: str, layers: int = 2, fused: bool = False):
    config = ModelConfig.from_preset("debug", n_layers=layers, max_position=48)
    torch.manual_seed(0)
    model = Llama(config).eval()
    if fused:
        model.fuse_projections_()
    if name == "string":  # S = 16 of L = 48, a window W < S
        return model, string_method(model.rope, shift=16, local_window=4)
    method = None if name == "plain" else build_position_method(arm_config(name), config)
    return model, method


def counted_step(model, method, prompt: int = 40, batch: int = 2, kernel: bool = False) -> Counter:
    """Prefill `prompt` tokens of `batch` rows (two documents in row 0), decode one
    warm-up step, count the next; `kernel`: on a cache that opts in to the decoding kernel."""
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(0, model.config.vocab_size, (batch, prompt + 2), generator=generator)
    documents = torch.zeros(batch, prompt, dtype=torch.long)
    documents[0, prompt // 3 :] = 1
    cache = model.new_kv_cache(batch, prompt + 4, decode_kernel=kernel)
    with torch.no_grad():
        model(ids[:, :prompt], document_ids=documents, kv_cache=cache, position_method=method)
        model(ids[:, prompt : prompt + 1], kv_cache=cache, position_method=method)
        counter = Counter()
        with counter.counting():
            model(ids[:, prompt + 1 :], kv_cache=cache, position_method=method)
    return counter


@pytest.mark.parametrize("name", METHODS)
def test_a_decoding_step_never_waits_for_the_device(name):
    """No `.item()` / `bool()` / `nonzero` / `.tolist()` in a step, with packed rows."""
    counter = counted_step(*model_and_method(name))
    assert counter.syncs == 0, {op: counter.ops[op] for op in (*SYNCS, "tolist") if counter.ops[op]}


@pytest.mark.parametrize("fused", [False, True], ids=["plain layout", "fused"])
@pytest.mark.parametrize("name", METHODS)
def test_a_decoding_step_costs_a_bounded_number_of_operations_per_layer(name, fused):
    """What one more layer adds to a step (4 layers minus 2, halved): the block's own
    math, the rotation, the cache write and one attention call; the per-step plan (masks,
    cos/sin) is shared and not counted here."""
    two, four = (sum(counted_step(*model_and_method(name, layers, fused)).ops.values()) for layers in (2, 4))
    per_layer = (four - two) / 2
    assert per_layer <= (FUSED_OPS_PER_LAYER if fused else OPS_PER_LAYER)[name], per_layer


@pytest.mark.parametrize("name", METHODS)
def test_decoding_equals_one_full_forward_across_new_documents(name):
    """Rows of packed documents, a document that starts during decoding in row 1: every
    step's logits equal the full forward's at that position (float32, 1e-5 of their
    range), so the cache's device-side document starts follow the documents."""
    model, method = model_and_method(name)
    prompt, total = 30, 40
    ids = torch.randint(0, model.config.vocab_size, (2, total), generator=torch.Generator().manual_seed(2))
    documents = torch.zeros(2, total, dtype=torch.long)
    documents[0, 12:] = 1
    documents[1, 34:] = 1  # starts at decoding step 4
    positions = torch.cat([torch.arange(12), torch.arange(total - 12)])[None].repeat(2, 1)
    positions[1] = torch.cat([torch.arange(34), torch.arange(total - 34)])
    with torch.no_grad():
        full = model(ids, positions, documents, position_method=method)
        cache = model.new_kv_cache(2, total)
        steps = [model(ids[:, :prompt], positions[:, :prompt], documents[:, :prompt], cache, position_method=method)]
        for t in range(prompt, total):
            part = slice(t, t + 1)
            steps.append(model(ids[:, part], positions[:, part], documents[:, part], cache, position_method=method))
    stepwise = torch.cat(steps, dim=1)
    tolerance = 1e-5 * full.abs().max()
    assert (stepwise - full).abs().max() <= tolerance


def test_decoding_continues_the_last_document_when_ids_are_left_out():
    """With no document ids a step continues each row's last document: the same logits as
    passing that document's id, packed row included."""
    model, method = model_and_method("string")
    ids = torch.randint(0, model.config.vocab_size, (2, 24), generator=torch.Generator().manual_seed(3))
    documents = torch.zeros(2, 24, dtype=torch.long)
    documents[0, 8:] = 1
    outputs = []
    for given in (True, False):
        cache = model.new_kv_cache(2, 24)
        with torch.no_grad():
            model(ids[:, :20], document_ids=documents[:, :20], kv_cache=cache, position_method=method)
            for t in range(20, 24):
                docs = documents[:, t : t + 1] if given else None
                outputs.append(model(ids[:, t : t + 1], document_ids=docs, kv_cache=cache, position_method=method))
    assert torch.equal(torch.cat(outputs[:4], 1), torch.cat(outputs[4:], 1))


def test_the_device_math_of_a_step_equals_the_fused_cpu_kernel():
    """The path that runs off the CPU (`_attend_math`: GQA folded into the query rows) and
    the fused CPU kernel give the same output and log-sum-exp for two passes with their
    own masks, one of which sees no key in row 1 (float32, 1e-5)."""
    from longctx.model.inference.step import DecodeMask, _attend_math

    generator = torch.Generator().manual_seed(4)
    q = torch.randn(2, 8, 2, 16, generator=generator)
    k, v = (torch.randn(2, 2, 12, 16, generator=generator) for _ in range(2))
    allowed = torch.zeros(2, 2, 12, dtype=torch.bool)
    allowed[0, 0, 3:9], allowed[0, 1, :3], allowed[1, 0, 5:12] = True, True, True
    mask = DecodeMask(allowed, torch.float32)
    fused_out, fused_lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        q, k, v, 0.0, False, attn_mask=mask.bias, scale=0.25
    )[:2]
    out, lse = _attend_math(q, k, v, mask.bias, 0.25)
    seen = allowed.any(-1)[:, None].expand_as(lse)  # the fused kernel's lse is 0 for a row without keys
    assert torch.allclose(out[seen], fused_out[seen], atol=1e-5)
    assert torch.allclose(lse[seen], fused_lse[seen], atol=1e-5)
    assert (lse[~seen] < -1e30).all()  # weight 0 in the merge
