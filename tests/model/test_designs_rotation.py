"""head_dim decoupled from d_model / n_heads, qk-norm (per head, whole projection) and
partial RoPE (`first`, `p-rope`) in longctx's model, against a float64 reference written
from the formulas (docs/design.md §5): every tensor of the model recomputed by hand (embedding,
RMSNorm, projections, the qk-norm, the rotation as explicit channel pairs, one dense
masked softmax per head, SwiGLU, head), forward and backward, on the CPU backends and on
the flash path through the varlen stand-in; cached decoding, save/load, a training step,
the position methods under partial rotation, and the config's bad input.
"""

import itertools
import math

import pytest
import torch
import torch.nn.functional as F

from longctx.config.model import ModelConfig
from longctx.errors import ConfigError
from longctx.gpu_checks import prepared_workspace
from longctx.model.checkpoint import load_model, save_model
from longctx.model.llama import Llama
from longctx.model.position_methods import dca_method, rerope_method, rope_method, self_extend_method, string_method
from longctx.model.rope import RopeScaling, RotaryEmbedding
from tests.helpers import packed_document_ids, reset_position_ids
from tests.model import varlen_stand_in
from tests.model.helpers import (
    BASE,
    DIM,
    dca_relative,
    dense_reference,
    random_qkv,
    rerope_relative,
    self_extend_relative,
    stepwise_logits,
    string_relative,
    two_rows,
)

DESIGNS = {
    "head_dim": dict(head_dim=24),
    "qk_norm=head": dict(qk_norm="head"),
    "qk_norm=projection": dict(qk_norm="projection", head_dim=24),
    "first": dict(rotary_fraction=0.75),  # Phi-4-mini's fraction: 12 of 16 channels
    "p-rope": dict(rotary_fraction=0.375, partial_rotary="p-rope"),  # 3 of 8 pairs
    "combined": dict(head_dim=24, qk_norm="head", rotary_fraction=0.5, attention_bias="qkv"),
}
"""On the debug preset (d_model 64, 4 heads of 16, 2 k/v heads)."""
TOLERANCE = 1e-10
"""float64 model against the float64 formula: only summation order differs (~1e-14)."""


def design_model(design: str, **overrides) -> Llama:
    config = ModelConfig.from_preset("debug", vocab_size=256, init_std=0.1, **{**DESIGNS[design], **overrides})
    model = Llama(config).double()
    with torch.no_grad():  # norms away from 1 and biases away from 0: a misplaced one shows
        for name, parameter in model.named_parameters():
            if "norm" in name or name.endswith(".bias"):
                parameter.add_(0.3 * torch.randn_like(parameter))
    return model


# --- the reference ----------------------------------------------------------------------


def rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def rotation_pairs(config: ModelConfig) -> tuple[list[int], list[int], torch.Tensor]:
    """Channel a_i rotates with b_i by theta_i (float32 values, as a model stores them).
    Full: (i, i + D/2), theta_i = base^(-2i/D). `first`: R = p D channels, (i, i + R/2),
    theta_i = base^(-2i/R), the rest pass through. `p-rope`: full pairs, theta_i = 0 for
    the slowest D/2 - floor(p D / 2)."""
    dim, p = config.head_size, config.rotary_fraction
    width = round(p * dim) if config.partial_rotary == "first" else dim
    half = width // 2
    theta = (1.0 / config.rope_base ** (2 * torch.arange(half, dtype=torch.float64) / width)).float().double()
    if config.partial_rotary == "p-rope":
        theta[math.floor(p * dim / 2) :] = 0.0
    return list(range(half)), list(range(half, width)), theta


def rotate_pairs(x: torch.Tensor, positions: torch.Tensor, config: ModelConfig) -> torch.Tensor:
    """x [B, T, heads, D] at positions [B, T], pair by pair."""
    first, second, theta = rotation_pairs(config)
    angles = positions.double()[:, :, None, None] * theta  # [B, T, 1, pairs]
    a, b = x[..., first], x[..., second]
    out = x.clone()
    out[..., first] = a * angles.cos() - b * angles.sin()
    out[..., second] = b * angles.cos() + a * angles.sin()
    return out


def reference_logits(model: Llama, ids, position_ids, document_ids) -> torch.Tensor:
    config, eps = model.config, model.config.norm_eps
    w = dict(model.named_parameters())
    heads, kv_heads, dim = config.n_heads, config.n_kv_heads, config.head_size
    batch, seq = ids.shape
    visible = (document_ids[:, :, None] == document_ids[:, None, :]) & torch.ones(seq, seq, dtype=torch.bool).tril()
    x = w["tok_embeddings.weight"][ids]
    for layer in range(config.n_layers):
        p = f"blocks.{layer}."
        h = rms(x, w[p + "attn_norm.weight"], eps)
        q, k, v = (F.linear(h, w[f"{p}attn.{n}.weight"], w.get(f"{p}attn.{n}.bias")) for n in ("wq", "wk", "wv"))
        if config.qk_norm == "projection":  # over n_heads x head_dim, before the split
            q, k = rms(q, w[p + "attn.q_norm.weight"], eps), rms(k, w[p + "attn.k_norm.weight"], eps)
        q, k, v = q.view(batch, seq, heads, dim), k.view(batch, seq, kv_heads, dim), v.view(batch, seq, kv_heads, dim)
        if config.qk_norm == "head":  # over head_dim, one weight shared by the heads
            q, k = rms(q, w[p + "attn.q_norm.weight"], eps), rms(k, w[p + "attn.k_norm.weight"], eps)
        q, k = rotate_pairs(q, position_ids, config), rotate_pairs(k, position_ids, config)
        k, v = (t.repeat_interleave(heads // kv_heads, dim=2) for t in (k, v))
        scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(dim)
        weights = scores.masked_fill(~visible[:, None], -math.inf).softmax(-1)
        out = torch.einsum("bhqk,bkhd->bqhd", weights, v).reshape(batch, seq, heads * dim)
        x = x + F.linear(out, w[p + "attn.wo.weight"], w.get(p + "attn.wo.bias"))
        h = rms(x, w[p + "mlp_norm.weight"], eps)
        x = x + F.linear(
            F.silu(F.linear(h, w[p + "mlp.gate.weight"])) * F.linear(h, w[p + "mlp.up.weight"]),
            w[p + "mlp.down.weight"],
        )
    return F.linear(rms(x, w["norm.weight"], eps), w["output.weight"])


def packed_batch(vocab: int = 256):
    """Row 0: three packed documents with reset positions; row 1: one document."""
    lengths = [9, 1, 14]
    ids = torch.randint(0, vocab, (2, 24))
    documents = torch.stack([packed_document_ids(lengths)[0], torch.zeros(24, dtype=torch.long)])
    positions = torch.stack([reset_position_ids(lengths)[0], torch.arange(24)])
    return ids, positions, documents


@pytest.mark.parametrize("backend", ["sdpa", "varlen", "flash"])
@pytest.mark.parametrize("design", list(DESIGNS))
def test_design_matches_the_float64_formula_forward_and_backward(design, backend, monkeypatch):
    if backend == "flash":
        varlen_stand_in.install(monkeypatch, "torch-2.14")
    model = design_model(design)
    ids, positions, documents = packed_batch()
    probe = torch.randn(2, 24, 256, dtype=torch.float64)
    parameters = [p for _, p in model.named_parameters()]
    ours = model(ids, position_ids=positions, document_ids=documents, attention_backend=backend)
    expected = reference_logits(model, ids, positions, documents)
    assert expected.abs().max() > 1.0
    torch.testing.assert_close(ours, expected, atol=TOLERANCE, rtol=0)
    our_grads = torch.autograd.grad((ours * probe).sum(), parameters)
    expected_grads = torch.autograd.grad((expected * probe).sum(), parameters)
    for (name, _), got, want in zip(model.named_parameters(), our_grads, expected_grads, strict=True):
        torch.testing.assert_close(got, want, atol=TOLERANCE, rtol=0, msg=name)


def test_the_reference_sees_each_design():
    """Negative controls: the reference of another design is far from the model's logits."""
    ids, positions, documents = packed_batch()
    for design, other in (("qk_norm=head", dict(qk_norm="none")), ("first", dict(partial_rotary="p-rope"))):
        model = design_model(design)
        with torch.no_grad():
            ours = model(ids, position_ids=positions, document_ids=documents)
            model.config = ModelConfig.from_preset("debug", vocab_size=256, **{**DESIGNS[design], **other})
            assert (ours - reference_logits(model, ids, positions, documents)).abs().max() > 1e-2


@pytest.mark.parametrize("design", list(DESIGNS))
def test_shapes_names_and_parameter_count(design):
    model = design_model(design)
    config = model.config
    attn = model.blocks[0].attn
    d_q, d_kv = config.n_heads * config.head_size, config.n_kv_heads * config.head_size
    assert (attn.wq.weight.shape, attn.wk.weight.shape, attn.wo.weight.shape) == (
        (d_q, config.d_model),
        (d_kv, config.d_model),
        (config.d_model, d_q),
    )
    norms = {name: tuple(t.shape) for name, t in model.state_dict().items() if name.startswith("blocks.0.attn.")}
    if config.qk_norm == "head":
        assert norms["blocks.0.attn.q_norm.weight"] == norms["blocks.0.attn.k_norm.weight"] == (config.head_size,)
    elif config.qk_norm == "projection":
        assert (norms["blocks.0.attn.q_norm.weight"], norms["blocks.0.attn.k_norm.weight"]) == ((d_q,), (d_kv,))
    else:
        assert not any("q_norm" in name for name in norms)
    assert sum(p.numel() for p in model.parameters()) == config.num_parameters()


@pytest.mark.parametrize("design", list(DESIGNS))
def test_cached_decoding_equals_the_full_forward(design):
    model = design_model(design).eval()
    ids = torch.randint(0, 256, (2, 20))
    with torch.no_grad():
        full = model(ids)
    torch.testing.assert_close(stepwise_logits(model, ids, 12), full, atol=TOLERANCE, rtol=0)


@pytest.mark.parametrize("design", list(DESIGNS))
def test_save_and_load_keep_the_design(design, tmp_path):
    model = design_model(design).float()
    save_model(model, tmp_path / "model.safetensors")
    restored = load_model(tmp_path / "model.safetensors")
    assert restored.config == model.config
    assert torch.equal(restored.rope.inv_freq, model.rope.inv_freq)
    ids = torch.randint(0, 256, (1, 16))
    with torch.no_grad():
        assert torch.equal(restored(ids), model(ids))


@pytest.fixture(scope="module")
def corpus_rows(tmp_path_factory):
    """Rows of 65 tokens of the tiny prose corpus under its 512-token BPE."""
    from longctx.data.corpus import embedded_documents
    from longctx.data.tokenizer import load_tokenizer

    root = prepared_workspace(tmp_path_factory.mktemp("designs"))
    tokenizer = load_tokenizer(str(root / "tokenizer.json"))
    texts = [doc.text for doc in itertools.islice(embedded_documents(("prose",)), 12)]
    tokens = [t for text in texts for t in tokenizer.encode(text)]
    return torch.tensor(tokens[: 4 * 65]).view(4, 65)


@pytest.mark.parametrize("design", list(DESIGNS))
def test_training_steps_lower_the_loss_on_the_tiny_corpus(design, corpus_rows):
    torch.manual_seed(0)
    model = Llama(ModelConfig.from_preset("debug", vocab_size=512, **DESIGNS[design]))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    inputs, labels = corpus_rows[:, :-1], corpus_rows[:, 1:]
    losses = []
    for _ in range(6):
        loss = model(inputs, labels=labels, attention_backend="varlen") / labels.numel()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 0.5, losses
    assert all(p.grad is not None for p in model.parameters())


# --- the position methods under partial rotation -------------------------------------------


def partial_rotary(partial: str, fraction: float, max_position: int = 64) -> RotaryEmbedding:
    return RotaryEmbedding(
        DIM, BASE, RopeScaling(), max_position, rotary_fraction=fraction, partial_rotary=partial
    ).double()


def reference_inputs(q, k, partial: str, fraction: float):
    """dense_reference rotates pairs (i, i + D/2) by frequencies [D/2]. p-rope is that with
    zero frequencies; `first` is that after a permutation of the channels (the same for q
    and k, so every dot product is unchanged) that puts pair (i, i + R/2) at (i, i + D/2)
    and the pass-through channels on pairs of frequency 0."""
    half = DIM // 2
    if partial == "p-rope":
        theta = (1.0 / BASE ** (torch.arange(0, DIM, 2, dtype=torch.float64) / DIM)).float().double()
        theta[math.floor(fraction * DIM / 2) :] = 0.0
        return q, k, theta
    width = round(fraction * DIM)
    rest = DIM - width
    order = [
        *range(width // 2),
        *range(width, width + rest // 2),
        *range(width // 2, width),
        *range(width + rest // 2, DIM),
    ]
    theta = torch.zeros(half, dtype=torch.float64)
    theta[: width // 2] = (1.0 / BASE ** (torch.arange(0, width, 2, dtype=torch.float64) / width)).float().double()
    return q[..., order], k[..., order], theta


METHODS = {
    "rope": (lambda r: rope_method(r), lambda m, n: [m - n]),
    "string": (lambda r: string_method(r, 10, 3), string_relative(10, 3)),
    "rerope": (lambda r: rerope_method(r, 8), rerope_relative(8)),
    "self_extend": (lambda r: self_extend_method(r, 8, 3), self_extend_relative(8, 3)),
    "dca": (lambda r: dca_method(r, 9, 4), dca_relative(9, 4)),
}


@pytest.mark.parametrize("backend", ["varlen", "flash"])
@pytest.mark.parametrize("partial,fraction", [("first", 0.5), ("p-rope", 0.25)])
@pytest.mark.parametrize("name", list(METHODS))
def test_position_methods_rotate_only_the_partial_channels(name, partial, fraction, backend, monkeypatch):
    if backend == "flash":
        varlen_stand_in.install(monkeypatch, "torch-2.14")
    build, relative = METHODS[name]
    positions, documents = two_rows([21, 5, 1, 13], 40)
    q, k, v = random_qkv(2, 40, 40)
    method = build(partial_rotary(partial, fraction))
    got = method.attend(q, k, v, position_ids=positions, document_ids=documents, backend=backend)
    q_ref, k_ref, theta = reference_inputs(q, k, partial, fraction)
    expected = dense_reference(q_ref, k_ref, v, positions, documents, relative, theta)
    # the varlen kernel's log-sum-exp is fp32 (as flash-attn's) where passes merge, the rest fp64
    multi_pass = backend == "flash" and name != "rope"
    torch.testing.assert_close(got, expected, atol=1e-6 if multi_pass else TOLERANCE, rtol=0)


@pytest.mark.parametrize("design", ["first", "p-rope"])
@pytest.mark.parametrize("name", ["string", "dca"])
def test_model_with_a_method_decodes_as_it_prefills(design, name):
    """Through build_position_method's path: the model's rotary with its partial rotation."""
    from longctx.config.position_methods import PositionMethodConfig, StringConfig
    from longctx.model.position_methods import build_position_method

    model = design_model(design, max_position=24).eval()
    config = PositionMethodConfig(name=name, string=StringConfig(shift=10, local_window=3))
    method = build_position_method(config, model.config).double()
    assert method.rotary.rotary_dim == model.rope.rotary_dim
    assert torch.equal(method.rotary.inv_freq, model.rope.inv_freq)
    ids = torch.randint(0, 256, (1, 40))
    with torch.no_grad():
        full = model(ids, position_method=method)
    torch.testing.assert_close(stepwise_logits(model, ids, 30, position_method=method), full, atol=TOLERANCE, rtol=0)


def test_rerope_log_scaling_refuses_first_partial_rotation():
    with pytest.raises(ValueError, match=r"^rerope: .*model\.partial_rotary=first"):
        rerope_method(partial_rotary("first", 0.5), 8, 16)
    rerope_method(partial_rotary("p-rope", 0.5), 8, 16)  # zero frequencies: every channel scaled


# --- frequencies and bad input --------------------------------------------------------------


@pytest.mark.parametrize("fraction,rotating", [(0.25, 8), (0.3, 9), (0.5, 16), (1.0, 32)])
def test_p_rope_keeps_floor_p_d_over_2_pairs_as_transformers_proportional(fraction, rotating):
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = LlamaConfig(
        hidden_size=256,
        num_attention_heads=4,
        head_dim=64,
        rope_parameters={"rope_type": "proportional", "rope_theta": BASE, "partial_rotary_factor": fraction},
    )
    theirs, _ = ROPE_INIT_FUNCTIONS["proportional"](config, "cpu")
    ours = RotaryEmbedding(64, BASE, RopeScaling(), 2048, rotary_fraction=fraction, partial_rotary="p-rope").inv_freq
    assert int((ours > 0).sum()) == rotating
    torch.testing.assert_close(ours, theirs, atol=0, rtol=1e-6)


def test_first_computes_every_scaling_over_the_rotated_channels():
    for scaling in (RopeScaling("ntk", factor=4.0), RopeScaling("yarn", factor=4.0, original_max_position=128)):
        partial = RotaryEmbedding(32, BASE, scaling, 512, rotary_fraction=0.5)
        assert torch.equal(partial.inv_freq, RotaryEmbedding(16, BASE, scaling, 512).inv_freq)
        assert partial.rotary_dim == 16 and partial.head_dim == 32


@pytest.mark.parametrize(
    "fields,key,message",
    [
        (dict(rotary_fraction=0.0), "model.rotary_fraction", r"must be in \(0, 1\], got 0.0"),
        (dict(rotary_fraction=1.5), "model.rotary_fraction", r"must be in \(0, 1\], got 1.5"),
        (dict(rotary_fraction=0.3), "model.rotary_fraction", "4.8 channels: must be an even integer"),
        (dict(rotary_fraction=0.125, head_dim=24), "model.rotary_fraction", "3 channels: must be an even integer"),
        (dict(qk_norm="layer"), "model.qk_norm", "'layer' is not one of"),
        (dict(partial_rotary="last"), "model.partial_rotary", "'last' is not one of"),
        (dict(head_dim=15), "model.head_dim", "15 must be even"),
    ],
)
def test_bad_designs_name_their_key(fields, key, message):
    with pytest.raises(ConfigError, match=message) as error:
        ModelConfig.from_preset("debug", **fields)
    assert key in str(error.value)
    ModelConfig.from_preset("debug", rotary_fraction=0.3, partial_rotary="p-rope")  # any p: floor(p D / 2) pairs


def test_resume_names_a_changed_head_dim_or_partial_rotation():
    from longctx.config import as_dict, load
    from longctx.train.resume_check import resume_mismatches

    saved = as_dict(load([], ["model.head_dim=32", "model.rotary_fraction=0.5", "model.partial_rotary=p-rope"]))
    mismatches = resume_mismatches(saved, load([], []))
    for key in ("model.head_dim", "model.rotary_fraction", "model.partial_rotary"):
        assert any(line.startswith(f"{key}: checkpoint") for line in mismatches), (key, mismatches)
