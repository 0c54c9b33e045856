"""The inference layout (model/layers.py, `Llama.fuse_projections_`): q/k/v and gate/up in one
buffer each, the residual adds inside the last matmuls, torch's rms_norm; the same
Parameters, names and values, the same logits, fewer operations per decoding step.

References: the unfused model on the same weights (float64: to 1e-12, the matmuls only
regroup columns), the RMSNorm formula written out, and autograd through the separate
projections (training is not changed by the layout)."""

import collections
import copy

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from longctx.config.model import ModelConfig
from longctx.model.inference.step import joined
from longctx.model.layers import FusedWeights, RMSNorm
from longctx.model.llama import Llama

DESIGNS = {
    "llama": {},
    "qwen2 (q/k/v bias)": {"attention_bias": "qkv"},
    "qwen3 (head qk-norm)": {"qk_norm": "head", "head_dim": 24},
    "olmo2 (post norms, projection qk-norm)": {"norm_placement": "post", "qk_norm": "projection"},
    "gemma3 (sandwich, offset norms, sliding)": {
        "norm_placement": "sandwich",
        "norm_offset": True,
        "layer_types": ["sliding", "full"],
        "sliding_window": 8,
    },
}


def model(dtype=torch.float64, **overrides) -> Llama:
    torch.manual_seed(0)
    config = ModelConfig.from_preset("debug", n_layers=2, max_position=64, **overrides)
    built = Llama(config).to(dtype).eval()
    with torch.no_grad():  # non-trivial norm weights and biases
        for name, parameter in built.named_parameters():
            if "norm" in name or name.endswith("bias"):
                parameter.add_(0.1 * torch.randn_like(parameter))
    return built


def logits(m: Llama, ids: torch.Tensor, decode_from: int | None = None) -> torch.Tensor:
    """Full forward, or a prefill of `decode_from` tokens then one token at a time."""
    with torch.no_grad():
        if decode_from is None:
            return m(ids)
        cache = m.new_kv_cache(ids.shape[0], ids.shape[1])
        steps = [m(ids[:, :decode_from], kv_cache=cache)]
        steps += [m(ids[:, t : t + 1], kv_cache=cache) for t in range(decode_from, ids.shape[1])]
        return torch.cat(steps, dim=1)


@pytest.mark.parametrize("design", DESIGNS)
def test_the_fused_model_gives_the_same_logits_full_and_cached(design):
    plain = model(**DESIGNS[design])
    fused = copy.deepcopy(plain).fuse_projections_()
    assert fused.blocks[0].attn.fused is not None and fused.blocks[0].mlp.fused is not None
    ids = torch.randint(0, plain.config.vocab_size, (2, 24), generator=torch.Generator().manual_seed(1))
    reference = logits(plain, ids)
    with torch.enable_grad():  # the training forward: separate projections, residual adds apart
        trained = plain(ids).detach()
    assert (logits(fused, ids) - reference).abs().max() < 1e-12
    assert (logits(fused, ids, decode_from=16) - reference).abs().max() < 1e-12
    assert (trained - reference).abs().max() < 1e-12


def test_fusing_keeps_every_parameter_its_name_and_value():
    plain = model(attention_bias="qkv")
    fused = copy.deepcopy(plain)
    before = {name: id(p) for name, p in fused.named_parameters()}
    fused.fuse_projections_()
    assert {name: id(p) for name, p in fused.named_parameters()} == before
    expected, got = plain.state_dict(), fused.state_dict()
    assert list(got) == list(expected)
    assert all(torch.equal(got[name], expected[name]) for name in expected)
    attn = fused.blocks[1].attn
    weight, bias = attn.fused.joint((attn.wq, attn.wk, attn.wv))
    assert torch.equal(weight, torch.cat([attn.wq.weight, attn.wk.weight, attn.wv.weight]))
    assert torch.equal(bias, torch.cat([attn.wq.bias, attn.wk.bias, attn.wv.bias]))


def test_loading_and_optimizing_write_through_the_layout():
    fused = model().fuse_projections_()
    other = model()
    with torch.no_grad():
        for p in other.parameters():
            p.mul_(-1.5)
    fused.load_state_dict(other.state_dict())
    attn = fused.blocks[0].attn
    weight, _ = attn.fused.joint((attn.wq, attn.wk, attn.wv))
    assert torch.equal(weight[: attn.wq.out_features], other.blocks[0].attn.wq.weight)
    ids = torch.randint(0, other.config.vocab_size, (1, 12), generator=torch.Generator().manual_seed(2))
    assert (logits(fused, ids) - logits(other, ids)).abs().max() < 1e-12


def test_gradients_reach_the_parameters_of_a_fused_model():
    """With gradients the forward takes the separate projections: every Parameter gets the
    unfused model's gradient, and an optimizer step keeps the layout."""
    plain = model().train()
    fused = copy.deepcopy(plain).fuse_projections_()
    ids = torch.randint(0, plain.config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(3))
    for m in (plain, fused):
        m(ids, labels=ids).backward()
    for (name, a), b in zip(plain.named_parameters(), fused.parameters(), strict=True):
        assert torch.equal(a.grad, b.grad), name
    torch.optim.SGD(fused.parameters(), lr=0.1).step()
    attn = fused.blocks[0].attn
    assert attn.fused.joint((attn.wq, attn.wk, attn.wv)) is not None


def test_a_conversion_ends_the_layout_and_the_forward_falls_back():
    fused = model().fuse_projections_()
    converted = fused.to(torch.float32)
    attn = converted.blocks[0].attn
    assert attn.fused.joint((attn.wq, attn.wk, attn.wv)) is None
    plain = model().to(torch.float32)
    ids = torch.randint(0, plain.config.vocab_size, (1, 12), generator=torch.Generator().manual_seed(4))
    assert (logits(converted, ids) - logits(plain, ids)).abs().max() < 1e-5


def test_what_cannot_share_a_buffer_is_left_alone():
    on_meta = [nn.Linear(4, 3, device="meta"), nn.Linear(4, 2, device="meta")]
    assert FusedWeights.fuse_(on_meta) is None
    mixed = [nn.Linear(4, 3), nn.Linear(4, 2).double()]
    pointers = [linear.weight.data_ptr() for linear in mixed]
    assert FusedWeights.fuse_(mixed) is None
    assert [linear.weight.data_ptr() for linear in mixed] == pointers


def test_q_and_k_of_one_matmul_join_without_a_copy():
    qkv = torch.randn(3, 8 * 4 + 2 * 2 * 4)
    q, k, _ = qkv.split([32, 8, 8], dim=-1)
    q, k = q.view(1, 3, 8, 4), k.view(1, 3, 2, 4)
    both = joined(q, k)
    assert both.data_ptr() == q.data_ptr()
    assert torch.equal(both, torch.cat([q, k], dim=2))
    apart = joined(q.clone(), k.clone())  # separate tensors: a copy
    assert torch.equal(apart, torch.cat([q, k], dim=2))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_rms_norm_is_the_formula_with_the_weight_in_the_input_dtype(dtype):
    """transformers' Llama: weight * (x / sqrt(mean(x^2) + eps)) with the normalisation in
    fp32 (fp64 for fp64) rounded to x's dtype before the weight; bitwise on CPU."""
    torch.manual_seed(5)
    norm = RMSNorm(48, 1e-5).to(dtype)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(48))
    x = (3 * torch.randn(2, 5, 48)).to(dtype)
    wide = x.to(torch.float64 if dtype == torch.float64 else torch.float32)
    expected = norm.weight * (wide * torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + 1e-5)).to(dtype)
    assert torch.equal(norm(x), expected)


class Matmuls(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


def test_a_fused_decoding_step_runs_four_matmuls_and_no_residual_add_per_layer():
    """q/k/v, the output projection (with the residual), gate/up, down (with the residual);
    the plain layout runs seven matmuls and two adds."""
    counts = {}
    for name, fuse in (("plain", False), ("fused", True)):
        m = model(torch.float32)
        if fuse:
            m.fuse_projections_()
        cache = m.new_kv_cache(1, 20)
        ids = torch.randint(0, m.config.vocab_size, (1, 18), generator=torch.Generator().manual_seed(6))
        with torch.no_grad():
            m(ids[:, :17], kv_cache=cache)
            with Matmuls() as counter:
                m(ids[:, 17:], kv_cache=cache)
        counts[name] = counter.ops
    layers, head = 2, 1
    assert counts["fused"]["mm"] + counts["fused"]["addmm"] == 4 * layers + head
    assert counts["fused"]["addmm"] == 2 * layers
    assert counts["plain"]["cat"] - counts["fused"]["cat"] == layers  # q and k rotate as one view
    assert counts["plain"]["mm"] + counts["plain"]["addmm"] == 7 * layers + head


def test_a_hooked_sublayer_sees_its_own_output():
    """The residual joins the last matmul only where no forward hook watches a sublayer:
    a hook on the attention sees the attention's output, as in training."""
    m = model()
    ids = torch.randint(0, m.config.vocab_size, (1, 10), generator=torch.Generator().manual_seed(7))
    seen = []
    handle = m.blocks[0].attn.register_forward_hook(lambda module, args, out: seen.append(out.detach()))
    with torch.no_grad():
        m(ids)
    m(ids)
    handle.remove()
    assert (seen[0] - seen[1]).abs().max() < 1e-12
