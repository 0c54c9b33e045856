"""Gated DeltaNet (model/delta_rule.py, model/gated_deltanet.py) against independent references:

- the delta rule, chunked and recurrent, against a float64 transcription of the recurrence
  S_t = exp(g_t) S_{t-1} (I - beta_t k_t k_t^T) + beta_t k_t v_t^T, o_t = S_t^T q_t written
  here with explicit matrices, with packed documents (the state zeroed at each start);
- the convolution against torch's F.conv1d run on each document alone;
- the layer in both variants against transformers 5.23's OlmoHybridGatedDeltaNet and
  Qwen3NextGatedDeltaNet (their torch fallbacks) on the same weights, float32;
- a packed row against each of its documents run alone, and gradients of the chunked form
  against the recurrent form's;
- fla's kernels against the torch path (`gpu`).
"""

import itertools

import pytest
import torch
import torch.nn.functional as F

from longctx.batch import document_start_mask
from longctx.config.model import ModelConfig
from longctx.model.delta_rule import causal_conv, chunked_delta_rule, prepare_qk, recurrent_delta_rule
from longctx.model.gated_deltanet import GatedDeltaNet, Recurrence

FLOAT64 = {"atol": 1e-11, "rtol": 0.0}
"""float64 on both sides: the sums differ only in order (chunked vs token by token)."""
TRANSFORMERS = {"atol": 1e-5, "rtol": 0.0}
"""float32 on both sides (transformers' fallbacks compute in float32), outputs of size ~1:
measured 7e-7; the bound leaves room for another BLAS's summation order."""
VARIANTS = ["olmo_hybrid", "qwen3_next"]


def brute_force(q, k, v, g, beta, starts, state):
    """The recurrence in float64 with explicit [Dk, Dk] matrices, head by head (module
    docstring); q, k already normalised and repeated to the value heads."""
    batch, seq, heads, key_dim = q.shape
    out = torch.zeros(batch, seq, heads, v.shape[-1], dtype=torch.float64)
    final = torch.zeros(batch, heads, key_dim, v.shape[-1], dtype=torch.float64)
    eye = torch.eye(key_dim, dtype=torch.float64)
    for b in range(batch):
        for h in range(heads):
            s = state[b, h].clone() if state is not None else torch.zeros(key_dim, v.shape[-1], dtype=torch.float64)
            for t in range(seq):
                if starts[b, t]:
                    s = torch.zeros_like(s)
                kt = k[b, t, h][:, None]
                transition = torch.exp(g[b, t, h]) * (eye - beta[b, t, h] * kt @ kt.T)
                s = transition @ s + beta[b, t, h] * kt @ v[b, t, h][None, :]
                out[b, t, h] = s.T @ q[b, t, h]
            final[b, h] = s
    return out, final


def random_inputs(seq=37, batch=2, key_heads=2, value_heads=4, key_dim=8, value_dim=6, seed=0):
    generator = torch.Generator().manual_seed(seed)

    def draw(*shape):
        return torch.randn(*shape, generator=generator, dtype=torch.float64)

    q, k = draw(batch, seq, key_heads, key_dim), draw(batch, seq, key_heads, key_dim)
    v = draw(batch, seq, value_heads, value_dim)
    g = -torch.rand(batch, seq, value_heads, generator=generator, dtype=torch.float64)
    beta = 2 * torch.rand(batch, seq, value_heads, generator=generator, dtype=torch.float64)  # up to 2: neg eigvals
    state = draw(batch, value_heads, key_dim, value_dim)
    return q, k, v, g, beta, state


def packed_starts(seq: int) -> torch.Tensor:
    """Row 0 continues its state into a first document, new ones at 10 and 33; row 1 starts
    fresh with documents at 0, 20 and 21 (one of a single token)."""
    starts = torch.zeros(2, seq, dtype=torch.bool)
    starts[0, [10, 33]] = True
    starts[1, [0, 20, 21]] = True
    return starts


@pytest.mark.parametrize("chunk_size", [1, 8, 16, 64])
def test_chunked_and_recurrent_equal_the_float64_recurrence_on_packed_rows(chunk_size):
    q, k, v, g, beta, state = random_inputs()
    q, k = prepare_qk(q, k, v.shape[2])
    starts = packed_starts(q.shape[1])
    expected, expected_state = brute_force(q, k, v, g, beta, starts, state)
    for out, final in (
        chunked_delta_rule(q, k, v, g, beta, starts, state, chunk_size),
        recurrent_delta_rule(q, k, v, g, beta, starts, state),
    ):
        torch.testing.assert_close(out, expected, **FLOAT64)
        torch.testing.assert_close(final, expected_state, **FLOAT64)


def test_prepare_qk_normalises_scales_and_repeats():
    q, k, *_ = random_inputs(seq=3)
    pq, pk = prepare_qk(q, k, 4)
    eps = 1e-6  # fla's and transformers' x / sqrt(|x|^2 + eps)
    torch.testing.assert_close(pk[:, :, 0], k[:, :, 0] / (k[:, :, 0].norm(dim=-1, keepdim=True) ** 2 + eps).sqrt())
    torch.testing.assert_close(pk[:, :, 1], pk[:, :, 0], **FLOAT64)  # key head 0 serves value heads 0, 1
    norms = q.norm(dim=-1).repeat_interleave(2, dim=2)
    torch.testing.assert_close(pq.norm(dim=-1), 8**-0.5 * norms / (norms**2 + eps).sqrt())


def test_convolution_restarts_at_each_document_and_continues_its_state():
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(2, 37, 5, generator=generator, dtype=torch.float64)
    weight = torch.randn(5, 4, generator=generator, dtype=torch.float64)
    state = torch.randn(2, 5, 3, generator=generator, dtype=torch.float64)
    starts = packed_starts(37)
    out, new_state = causal_conv(x, weight, starts, state)
    for row in range(2):
        edges = [0, *starts[row].nonzero().flatten().tolist(), 37]
        for begin, end in itertools.pairwise(edges):
            if begin == end:
                continue
            prefix = state[row] if begin == 0 and not starts[row, 0] else torch.zeros(5, 3, dtype=torch.float64)
            inputs = torch.cat([prefix, x[row, begin:end].T], 1)[None]
            alone = F.silu(F.conv1d(inputs, weight[:, None], groups=5))[0].T
            torch.testing.assert_close(out[row, begin:end], alone, **FLOAT64)
    # The kept state: row 0's last three inputs (one document); row 1's last document (16
    # tokens from 21) also covers all three.
    torch.testing.assert_close(new_state, x[:, -3:].transpose(1, 2), **FLOAT64)
    short = torch.zeros(1, 37, dtype=torch.bool)
    short[0, 35] = True  # a last document of two tokens: the third kept input is zeroed
    _, kept = causal_conv(x[:1], weight, short, None)
    assert kept[0, :, 0].abs().max() == 0 and torch.equal(kept[0, :, 1:], x[0, 35:].T)


def layer_config(variant: str, **overrides) -> ModelConfig:
    linear = dict(
        variant=variant,
        n_key_heads=2,
        n_value_heads=4,
        key_head_dim=8,
        value_head_dim=6,
        chunk_size=16,
        allow_neg_eigval=variant == "olmo_hybrid",
    )
    linear.update(overrides)
    return ModelConfig(
        d_model=32, n_layers=2, n_heads=4, layer_types=["linear", "full"], norm_eps=1e-6, linear_attention=linear
    )


def transformers_layer(variant: str):
    """transformers' layer of the same shapes, its parameters drawn away from their
    initial values (A_log, dt_bias, the norm and the convolution), and its parameters
    renamed to ours."""
    pytest.importorskip("transformers")
    shapes = dict(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=64,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=1,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=8,
        linear_value_head_dim=6,
        linear_conv_kernel_dim=4,
        layer_types=["linear_attention", "full_attention"],
        rms_norm_eps=1e-6,
    )
    if variant == "olmo_hybrid":
        from transformers.models.olmo_hybrid.configuration_olmo_hybrid import OlmoHybridConfig
        from transformers.models.olmo_hybrid.modeling_olmo_hybrid import OlmoHybridGatedDeltaNet

        layer = OlmoHybridGatedDeltaNet(OlmoHybridConfig(**shapes, linear_allow_neg_eigval=True), 0)
        names = {"o_proj.weight": "wo.weight", "o_norm.weight": "norm_weight"}
    else:
        from transformers.models.qwen3_next.configuration_qwen3_next import Qwen3NextConfig
        from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextGatedDeltaNet

        layer = Qwen3NextGatedDeltaNet(Qwen3NextConfig(**shapes), 0)
        names = {"out_proj.weight": "wo.weight", "norm.weight": "norm_weight"}
    names["conv1d.weight"] = "conv_weight"
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, parameter in layer.named_parameters():
            if name in ("A_log", "dt_bias") or "norm" in name or "conv1d" in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.5)
    return layer, {names.get(name, name): value for name, value in layer.state_dict().items()}


@pytest.mark.parametrize("variant", VARIANTS)
def test_layer_equals_transformers(variant):
    reference, weights = transformers_layer(variant)
    ours = GatedDeltaNet(layer_config(variant))
    ours.load_state_dict(weights)
    x = torch.randn(2, 37, 32, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        expected = reference(x)
        out = ours(x, Recurrence.of(torch.zeros(2, 37, dtype=torch.long)), 0)
    assert expected.abs().max() > 0.1
    torch.testing.assert_close(out, expected, **TRANSFORMERS)


@pytest.mark.parametrize("variant", VARIANTS)
def test_packed_row_equals_each_document_alone(variant):
    torch.manual_seed(5)
    layer = GatedDeltaNet(layer_config(variant, chunk_size=8)).double()
    x = torch.randn(2, 37, 32, dtype=torch.float64)
    documents = torch.tensor([[0] * 10 + [1] * 23 + [2] * 4, [0] * 20 + [1] + [2] * 16])
    with torch.no_grad():
        packed = layer(x, Recurrence.of(documents), 0)
        for row in range(2):
            for document in documents[row].unique():
                where = (documents[row] == document).nonzero().flatten()
                part = x[row : row + 1, where]
                alone = layer(part, Recurrence.of(torch.zeros(1, len(where), dtype=torch.long)), 0)
                torch.testing.assert_close(packed[row : row + 1, where], alone, **FLOAT64)


@pytest.mark.parametrize("variant", VARIANTS)
def test_chunked_gradients_equal_the_recurrent_forms(variant):
    torch.manual_seed(6)
    layer = GatedDeltaNet(layer_config(variant, chunk_size=8)).double()
    x = torch.randn(2, 21, 32, dtype=torch.float64, requires_grad=True)
    documents = torch.tensor([[0] * 9 + [1] * 12, [0] * 21])
    weights = torch.randn(2, 21, 32, dtype=torch.float64)
    grads = []
    for chunk in (8, 1):  # chunks of one token are the recurrence
        layer.chunk_size = chunk
        layer.zero_grad()
        x.grad = None
        (layer(x, Recurrence.of(documents), 0) * weights).sum().backward()
        grads.append([x.grad.clone(), *(p.grad.clone() for p in layer.parameters())])
    for chunked, recurrent in zip(*grads, strict=True):
        torch.testing.assert_close(chunked, recurrent, **FLOAT64)


def test_recurrence_continues_a_cached_row_only_in_its_document():
    class Cache:
        length = 5

        def continued_documents(self, batch, seq):
            return torch.tensor([[3], [3]])

    starts = Recurrence.of(torch.tensor([[3, 3, 4], [4, 4, 4]]), Cache()).starts
    assert starts.tolist() == [[False, False, True], [True, False, False]]
    assert torch.equal(Recurrence.of(torch.tensor([[3, 3, 4]])).starts, document_start_mask(torch.tensor([[3, 3, 4]])))
    with pytest.raises(ValueError, match="sequence shard"):
        Recurrence.of(torch.zeros(1, 3, dtype=torch.long), sharded=True)


def test_fla_kernel_is_refused_where_it_cannot_run():
    layer = GatedDeltaNet(layer_config("qwen3_next", kernel="fla"))
    with pytest.raises(ValueError, match="model.linear_attention.kernel=fla"):
        layer(torch.randn(1, 4, 32), Recurrence.of(torch.zeros(1, 4, dtype=torch.long)), 0)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fla_kernel_equals_the_torch_path_on_packed_rows(dtype):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    pytest.importorskip("fla")
    from longctx.model.delta_rule_fla import fla_delta_rule

    q, k, v, g, beta, state = (t.cuda() for t in random_inputs(seq=200, key_dim=64, value_dim=64))
    starts = torch.zeros(2, 200, dtype=torch.bool, device="cuda")
    starts[0, [70, 150]] = True
    starts[1, [0, 90]] = True
    beta = beta / 2
    out, final = fla_delta_rule(q.to(dtype), k.to(dtype), v.to(dtype), g.float(), beta.to(dtype), starts, state.float())
    pq, pk = prepare_qk(q.to(dtype), k.to(dtype), v.shape[2])
    expected, expected_state = chunked_delta_rule(pq, pk, v.to(dtype), g, beta.to(dtype), starts, state, 64)
    bound = 2e-3 if dtype == torch.float32 else 3e-2  # fla's fp32 accumulations in tf32 matmuls; bf16 inputs
    torch.testing.assert_close(out.float(), expected.float(), atol=bound, rtol=0.0)
    torch.testing.assert_close(final.float(), expected_state.float(), atol=bound, rtol=0.0)
