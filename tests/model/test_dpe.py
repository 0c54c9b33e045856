"""DPE (Lu et al., 2025) against a float64 transcription of the authors' released code.

The reference knows nothing of passes or log-sum-exps: for every (query m, key n) pair of a
document it builds each channel's query and key RoPE index as the released
`dpe_for_llama.py` does, rotates q and k at them and takes one masked softmax.
"""

import functools
import math

import pytest
import torch

import longctx.hf_attention as hfa
from longctx.config.methods.dpe import probing_grid
from longctx.config.model import ModelConfig
from longctx.config.position_methods import PositionMethodConfig
from longctx.errors import ConfigError
from longctx.model.llama import Llama
from longctx.model.position_methods import build_position_method
from longctx.model.position_methods.methods.dpe import dpe_method
from longctx.model.position_methods.methods.rope import rope_method
from longctx.model.position_methods.methods.self_extend import self_extend_method
from tests.hf_attention.helpers import build, own_model, tokens
from tests.model import varlen_stand_in
from tests.model.helpers import (
    assert_decoding_equals_prefill,
    plain_frequencies,
    random_qkv,
    rotary,
    stepwise_logits,
    two_rows,
)

TOLERANCE = 1e-10
"""float64 throughout; the sums differ only in order."""


def released_channel_positions(m, n, window, scale_factors, groups_range, head_dim, longest):
    """Transcribes LuLuLuyi/DPE `dpe_for_llama.py`, `dpe_flash_forward` (the q_len ==
    kv_seq_len branch, select_topk_dim=False) with `atten_merge_forward` and `concat_tensors`:
    the (query, key) RoPE index of every channel for query position m and key position n.
    `atten_merge_forward`: flash-attn window (window - 1, 0) at own positions for m - n <
    window; the scaled pass's queries [window:] against keys [:len - window], causal, i.e.
    keys n <= m - window. Scaled positions: query m // s + W' - W' / s (a float), key n // s,
    W' = 0 if every position < window else window. `concat_tensors`: group i's cos/sin on
    channels [r_i, r_i+1) and half + [r_i, r_i+1)."""
    if m - n < window:
        return [float(m)] * head_dim, [float(n)] * head_dim
    re_window = 0 if longest < window else window
    half = head_dim // 2
    query, key = [0.0] * head_dim, [0.0] * head_dim
    for i, s in enumerate(scale_factors):
        for channel in range(groups_range[i], groups_range[i + 1]):
            for c in (channel, half + channel):
                query[c] = m // s + re_window - re_window / s
                key[c] = float(n // s)
    return query, key


def released_reference(q, k, v, positions, docs, window, scale_factors):
    """One float64 softmax over each query's document keys n <= m, q and k rotated per
    channel at `released_channel_positions` (rotate-half layout: channel c and c + D/2
    rotate by theta_c)."""
    q, k, v = q.double(), k.double(), v.double()
    batch, length, heads, dim = q.shape
    k = k.repeat_interleave(heads // k.shape[2], dim=2)
    v = v.repeat_interleave(heads // v.shape[2], dim=2)
    theta = plain_frequencies(dim=dim).repeat(2)
    groups_range = [g * (dim // 2) // len(scale_factors) for g in range(len(scale_factors) + 1)]
    out = torch.zeros_like(q)
    for b in range(batch):
        longest = int(positions[b].max())
        for i in range(length):
            keys = [j for j in range(i + 1) if docs[b, j] == docs[b, i]]
            scores = []
            for j in keys:
                query_at, key_at = released_channel_positions(
                    int(positions[b, i]), int(positions[b, j]), window, scale_factors, groups_range, dim, longest
                )
                q_rot = rotate_channels(q[b, i], torch.tensor(query_at, dtype=torch.float64) * theta)
                k_rot = rotate_channels(k[b, j], torch.tensor(key_at, dtype=torch.float64) * theta)
                scores.append((q_rot * k_rot).sum(-1) / math.sqrt(dim))
            weights = torch.stack(scores).softmax(0)  # [keys, H]
            out[b, i] = torch.einsum("kh,khd->hd", weights, v[b, keys])
    return out


def rotate_channels(x, angles):
    """x [H, D] rotated per channel: x cos + rotate_half(x) sin (transformers' apply_rotary_pos_emb)."""
    half = x.shape[-1] // 2
    swapped = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * angles.cos() + swapped * angles.sin()


CASES = [  # (window, scale factors over DIM / 2 = 8 pairs)
    (8, (1, 2, 4, 8)),
    (4, (4, 2, 1, 4, 2, 1, 2, 4)),
    (6, (2, 3)),  # W / s whole for every s
    (8, (1,)),  # one group at 1: plain RoPE
]


@pytest.mark.parametrize("window,scales", CASES)
@pytest.mark.parametrize("block_size", [256, 5])
def test_dpe_matches_the_released_per_dimension_scaling(window, scales, block_size):
    positions, docs = two_rows([19, 1, 4, 12], 36)
    q, k, v = random_qkv(2, 36, 36)
    method = dpe_method(rotary(), window, scales)
    got = method.attend(q, k, v, position_ids=positions, document_ids=docs, block_size=block_size)
    expected = released_reference(q, k, v, positions, docs, window, scales)
    torch.testing.assert_close(got, expected, atol=TOLERANCE, rtol=0)


def test_dpe_is_self_extend_when_every_group_shares_a_scale_and_rope_when_it_is_one():
    positions, docs = two_rows([20, 16], 36)
    q, k, v = random_qkv(2, 36, 36)
    options = {"position_ids": positions, "document_ids": docs}
    dpe = dpe_method(rotary(), 8, (4, 4)).attend(q, k, v, **options)
    torch.testing.assert_close(dpe, self_extend_method(rotary(), 8, 4).attend(q, k, v, **options), atol=1e-12, rtol=0)
    ones = dpe_method(rotary(), 8, (1, 1)).attend(q, k, v, **options)
    torch.testing.assert_close(ones, rope_method(rotary()).attend(q, k, v, **options), atol=1e-12, rtol=0)
    other = dpe_method(rotary(), 8, (1, 8)).attend(q, k, v, **options)
    assert (other - ones).abs().max() > 1e-3  # the slow half scaled: a different output


@pytest.mark.parametrize("scales", [(1, 2, 4, 8), (8, 1)])
def test_dpe_decoding_equals_prefill(scales):
    method = dpe_method(rotary(), 8, scales)
    assert not method.caches_rotated_keys and method.exact_below == 8
    assert_decoding_equals_prefill(method)


@pytest.mark.parametrize("version", list(varlen_stand_in.STAND_INS))
def test_dpe_on_the_varlen_kernel_matches_the_reference(version, monkeypatch):
    varlen_stand_in.install(monkeypatch, version)
    kernel = torch.nn.attention.varlen.varlen_attn
    calls = []

    @functools.wraps(kernel)
    def counting(*args, **kwargs):
        calls.append(1)
        return kernel(*args, **kwargs)

    monkeypatch.setattr(torch.nn.attention.varlen, "varlen_attn", counting)
    positions, docs = two_rows([19, 1, 4, 12], 36)
    q, k, v = random_qkv(2, 36, 36)
    method = dpe_method(rotary(), 8, (1, 2, 4, 8))
    got = method.attend(q, k, v, position_ids=positions, document_ids=docs, backend="flash")
    expected = released_reference(q, k, v, positions, docs, 8, (1, 2, 4, 8))
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=0)  # the kernel's lse is fp32
    assert calls


def test_model_with_dpe_decodes_as_it_prefills():
    config = ModelConfig.from_preset("debug", vocab_size=256, init_std=0.1, max_position=24)
    model = Llama(config).double().eval()
    method_config = PositionMethodConfig(name="dpe", dpe={"local_window": 8, "scale_factors": "1-2-4-8"})
    method = build_position_method(method_config, config).double()
    ids = torch.randint(0, 256, (1, 40))
    with torch.no_grad():
        full = model(ids, position_method=method)
        plain = model(ids)
    torch.testing.assert_close(stepwise_logits(model, ids, 30, position_method=method), full, atol=TOLERANCE, rtol=0)
    assert (full - plain).abs().max() > 1e-3


def test_longctx_dpe_in_transformers_equals_longctxs_model(tmp_path):
    """The per-pair maps through hf_attention's relative rotation (q/k arrive rotated)."""
    model = build("llama-tied")
    own = own_model(model, tmp_path)
    params = {"local_window": 8, "scale_factors": "1-2-4-8"}
    hfa.apply(model, "dpe", **params)
    method = build_position_method(PositionMethodConfig(name="dpe", dpe=params), own.config)
    ids = tokens()
    with torch.no_grad():
        got = model(ids).logits
        expected = own(ids, position_method=method)
    assert (got - expected).abs().max() <= 5e-6  # transformers' float32 RoPE angles


def test_dpe_config_resolves_and_names_the_key():
    def resolved(**values):
        return PositionMethodConfig(name="dpe", dpe=values).resolved(8192)

    assert resolved() == {"local_window": 1024, "scale_factors": "2-2-2-2-2-2-2-2"}
    assert resolved(scale_factors=" 2-8-2-8-32-32-32-4")["scale_factors"] == "2-8-2-8-32-32-32-4"
    with pytest.raises(ConfigError, match=r"eval.position_method.dpe.scale_factors: scale 3 does not divide"):
        resolved(scale_factors="3-2")
    with pytest.raises(ConfigError, match=r"position_method.dpe.scale_factors: expected positive integers"):
        resolved(scale_factors="2-x")
    with pytest.raises(ConfigError, match=r"position_method.dpe.scale_factors: every scale must be >= 1"):
        resolved(scale_factors="2-0")
    with pytest.raises(ConfigError, match=r"position_method.dpe.local_window: must be > 0"):
        resolved(local_window=-4)
    with pytest.raises(ValueError, match="3 scale factors cannot split 8 rotated frequency pairs"):
        dpe_method(rotary(), 8, (1, 2, 4))


def test_the_probing_grid_is_the_authors_detection_script():
    """run_niah_detect.sh: factor = TEST / PRETRAIN * 2 for the other groups; detecting
    factors TEST / length for length = TEST, TEST / 2, ... >= 1024."""
    grid = probing_grid(16384, 8192)
    assert sorted({f for _, f in grid}) == [1, 2, 4, 8, 16] and len(grid) == 8 * 5
    assert grid[1, 16] == "16-4-4-4-4-4-4-4" and grid[8, 1] == "4-4-4-4-4-4-4-1"
    at_training_length = probing_grid(8192, 8192)
    assert sorted({f for _, f in at_training_length}) == [1, 2, 4, 8]
    assert grid[3, 4] == at_training_length[3, 4].replace("2", "4")
    for scales in grid.values():  # every entry is a valid DPE at the authors' W = 1024
        PositionMethodConfig(name="dpe", dpe={"scale_factors": scales}).resolved(8192)


def test_longctx_dpe_cached_generate_in_transformers_equals_a_full_forward():
    model = hfa.apply(build("llama-tied"), "dpe", local_window=8, scale_factors="1-2-4-8")
    ids = tokens(1, 40)
    out = model.generate(
        ids, max_new_tokens=10, do_sample=False, output_scores=True, return_dict_in_generate=True, pad_token_id=0
    )
    with torch.no_grad():
        full = model(out.sequences).logits[0, ids.shape[1] - 1 : -1].double()
    # generate hands out float32 scores: the cached steps equal the full forward to float32 rounding
    assert (torch.stack(out.scores, dim=1)[0].double() - full).abs().max() <= 1e-5
