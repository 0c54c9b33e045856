"""StRing and the baselines against dense float64 references built from each paper's P'.

The reference knows nothing of passes, blocks or log-sum-exps: for every (query m, key n)
pair of a document it evaluates the published modified relative position P'[m][n],
rotates the query by P'[m][n] and leaves the key at 0 (RoPE scores depend only on the
difference), and takes one masked softmax over all pairs.
"""

import math
import sys
import types

import pytest
import torch

from longctx.config.model import ModelConfig
from longctx.config.position_methods import (
    REPO_STRING_ATTENTION_FACTOR,
    PositionMethodConfig,
    StringConfig,
    baseline_protocol,
)
from longctx.errors import ConfigError
from longctx.model.attention import attention
from longctx.model.position_methods import (
    build_position_method,
    dca_method,
    ntk_method,
    rerope_method,
    rope_method,
    self_extend_method,
    string_method,
    yarn_method,
)
from longctx.model.position_methods import cpu as cpu_kernels
from longctx.model.rope import apply_rotary
from tests.helpers import packed_document_ids, reset_position_ids
from tests.model.helpers import (
    BASE,
    DIM,
    all_methods,
    assert_decoding_equals_prefill,
    dca_relative,
    decoding_step,
    dense_reference,
    plain_frequencies,
    random_qkv,
    repo_string_relative,
    require_backend,
    rerope_relative,
    rope_relative,
    rotary,
    self_extend_relative,
    string_attention,
    string_relative,
    two_rows,
)

# --- StRing -----------------------------------------------------------------------------

STRING_CASES = [  # (L, S, W)
    (48, 16, 4),
    (48, 16, 0),
    (40, 13, 12),
    (24, 30, 8),  # S >= L: plain RoPE
    (20, 2, 1),  # a 2-distance window: blocks of one query
    (20, 1, 0),  # a 1-distance window: masked calls only
]


@pytest.mark.parametrize("length,shift,window", STRING_CASES)
@pytest.mark.parametrize("kv_heads,block_size", [(4, 256), (2, 7), (1, 7)], ids=["mha", "gqa-blocks", "mqa-blocks"])
def test_string_matches_eq4_reference(length, shift, window, kv_heads, block_size):
    q, k, v = random_qkv(1, length, length, kv_heads=kv_heads)
    positions = torch.arange(length)[None]
    docs = torch.zeros(1, length, dtype=torch.long)
    got = string_attention(q, k, v, shift=shift, local_window=window, position_ids=positions, block_size=block_size)
    expected = dense_reference(q, k, v, positions, docs, string_relative(shift, window), plain_frequencies())
    torch.testing.assert_close(got, expected, atol=1e-10, rtol=0)


def test_string_batch_of_packed_and_single_documents_matches_reference():
    positions, docs = two_rows([21, 5, 1, 29], 56)
    q, k, v = random_qkv(2, 56, 56)
    got = string_attention(q, k, v, shift=9, local_window=3, position_ids=positions, document_ids=docs, block_size=8)
    expected = dense_reference(q, k, v, positions, docs, string_relative(9, 3), plain_frequencies())
    torch.testing.assert_close(got, expected, atol=1e-10, rtol=0)


def test_string_packed_documents_each_equal_their_own_run():
    lengths = [37, 27]
    positions, docs = reset_position_ids(lengths), packed_document_ids(lengths)
    q, k, v = random_qkv(1, 64, 64)
    packed = string_attention(
        q, k, v, shift=12, local_window=4, position_ids=positions, document_ids=docs, block_size=16
    )
    start = 0
    for length in lengths:
        piece = slice(start, start + length)
        alone = string_attention(q[:, piece], k[:, piece], v[:, piece], shift=12, local_window=4)
        torch.testing.assert_close(packed[:, piece], alone, atol=1e-12, rtol=0)
        start += length


def test_string_rows_before_the_shift_equal_plain_rope_attention():
    length, shift = 40, 15
    q, k, v = random_qkv(2, length, length)
    got = string_attention(q, k, v, shift=shift, local_window=5)
    rope = rotary()
    cos, sin = rope(torch.arange(length)[None].expand(2, -1), torch.float64)
    plain = attention(apply_rotary(q, cos, sin), apply_rotary(k, cos, sin), v, backend="sdpa")
    torch.testing.assert_close(got[:, :shift], plain[:, :shift], atol=1e-6, rtol=0)
    assert (got[:, shift:] - plain[:, shift:]).abs().max() > 1e-2  # the shift is not a no-op


def test_repo_compat_double_counts_the_shift_diagonal_and_scales_scores():
    length, shift, window = 40, 12, 4
    positions, docs = two_rows([25, 15], length)
    q, k, v = random_qkv(2, length, length)
    repo = string_attention(
        q, k, v, shift=shift, local_window=window, compat="repo", position_ids=positions, document_ids=docs
    )
    expected = dense_reference(
        q,
        k,
        v,
        positions,
        docs,
        repo_string_relative(shift, window),
        plain_frequencies(),
        score_factor=REPO_STRING_ATTENTION_FACTOR**2,
    )
    torch.testing.assert_close(repo, expected, atol=1e-10, rtol=0)
    # Below the shift, repo = paper with scores scaled by (1 + 0.1 ln 2)^2; beyond it they differ.
    scale = DIM**-0.5 * REPO_STRING_ATTENTION_FACTOR**2
    paper = string_attention(
        q, k, v, shift=shift, local_window=window, position_ids=positions, document_ids=docs, scale=scale
    )
    before = positions < shift
    torch.testing.assert_close(repo[before], paper[before], atol=1e-12, rtol=0)
    assert (repo[~before] - paper[~before]).abs().max() > 1e-3


def test_repo_compat_decoding_attends_up_to_s_minus_1():
    """compat='repo', as the authors' string_for_llama.py: a single-query forward (cached
    decoding) attends the diagonal band [0, S-1] (m - n = S only in the shifted pass, at W),
    a multi-query forward (prefill, chunked prefill) [0, S] (m - n = S twice); shifted band
    and temperature are the same. Dense float64 references for both, packed documents."""
    length, shift, window = 40, 12, 4
    method = string_method(rotary(), shift, window, "repo")
    positions, docs = two_rows([25, 15], length)
    q, k, v = random_qkv(2, length, length)
    factor = REPO_STRING_ATTENTION_FACTOR**2
    prefill_reference = dense_reference(
        q, k, v, positions, docs, repo_string_relative(shift, window), plain_frequencies(), score_factor=factor
    )
    decode_reference = dense_reference(
        q, k, v, positions, docs, string_relative(shift, window), plain_frequencies(), score_factor=factor
    )
    cache = method.rotate_keys(k, positions)
    for t in range(length):
        step = decoding_step(method, t, q, cache, v, positions, docs, keys_rotated=True)
        torch.testing.assert_close(step, decode_reference[:, t], atol=1e-10, rtol=0)
    for start, end in [(0, 13), (13, 14), (13, 15), (15, 40)]:  # chunks of one and two queries too
        if end - start == 1:
            continue  # a one-query chunk is a decoding step (above)
        chunk = method.attend(
            q[:, start:end],
            cache[:, :end],
            v[:, :end],
            position_ids=positions[:, :end],
            document_ids=docs[:, :end],
            keys_rotated=True,
        )
        torch.testing.assert_close(chunk, prefill_reference[:, start:end], atol=1e-10, rtol=0)
    # Where a key sits at distance S the two differ; elsewhere they agree.
    reaches_shift = positions >= shift
    assert (decode_reference[reaches_shift] - prefill_reference[reaches_shift]).abs().max() > 1e-3
    torch.testing.assert_close(decode_reference[~reaches_shift], prefill_reference[~reaches_shift], atol=1e-12, rtol=0)


LONG_CASES = {  # long enough for several full tiles (band passes) or unmasked bulks (DCA's blocks)
    "string": (lambda: string_method(rotary(max_position=320, dim=8), 60, 16), string_relative(60, 16)),
    "self_extend": (lambda: self_extend_method(rotary(max_position=320, dim=8), 50, 4), self_extend_relative(50, 4)),
    "dca": (lambda: dca_method(rotary(max_position=320, dim=8), 140, 20), dca_relative(140, 20)),
}


@pytest.mark.parametrize("band_block", [16, 128])
@pytest.mark.parametrize("name", list(LONG_CASES))
def test_long_documents_with_batched_blocks_match_reference(name, band_block, monkeypatch):
    make, relative = LONG_CASES[name]
    method = make()
    positions, docs = reset_position_ids([250, 70]), packed_document_ids([250, 70])
    q, k, v = random_qkv(1, 320, 320, heads=2, kv_heads=1, dim=8)
    calls = []
    kernel = cpu_kernels._kernel

    def recording_kernel(q, k, v, scale, *, causal=False, allowed=None):
        calls.append((q.shape[0], causal, allowed is None))
        return kernel(q, k, v, scale, causal=causal, allowed=allowed)

    monkeypatch.setattr(cpu_kernels, "_kernel", recording_kernel)
    monkeypatch.setattr(cpu_kernels, "BAND_BLOCK", band_block)
    plan = method.plan(positions, docs, block_size=16, dtype=q.dtype)
    got = method(q, k, v, plan)
    expected = dense_reference(q, k, v, positions, docs, relative, plain_frequencies(dim=8))
    torch.testing.assert_close(got, expected, atol=1e-10, rtol=0)
    if name == "dca":  # unmasked bulks next to masked edges widened to 64-key multiples
        bulks = [
            spans.bulk for p in plan.passes for spans in p.blocks[0] if spans is not None and spans.bulk is not None
        ]
        assert len(bulks) >= 6
        return
    # The window pass [0, w - 1] over the 250-token document: queries from w - 1 on go in
    # blocks, all of them one batched masked kernel call.
    width = method.params.get("shift", method.params.get("neighbor_window"))
    blocks = (250 - (width - 1)) // band_block
    assert (blocks, False, False) in calls


# --- decoding, chunked prefill, cached keys -----------------------------------------------


# string-repo is exempt: its one-token decoding attends the band [0, S-1], its prefill
# [0, S], as the authors' code does (test_repo_compat_decoding_attends_up_to_s_minus_1).
@pytest.mark.parametrize("name", [name for name in all_methods() if name != "string-repo"])
def test_one_token_decoding_equals_prefill_rows(name):
    assert_decoding_equals_prefill(all_methods()[name], block_size=8)


@pytest.mark.parametrize("name", ["string", "dca", "self_extend"])
def test_chunked_prefill_equals_full_prefill(name):
    method = all_methods()[name]
    positions, docs = two_rows([30, 20], 50)
    q, k, v = random_qkv(2, 50, 50)
    full = method.attend(q, k, v, position_ids=positions, document_ids=docs)
    for start, end in [(0, 13), (13, 31), (31, 50)]:
        chunk = method.attend(
            q[:, start:end],
            k[:, :end],
            v[:, :end],
            position_ids=positions[:, :end],
            document_ids=docs[:, :end],
            block_size=5,
        )
        torch.testing.assert_close(chunk, full[:, start:end], atol=1e-12, rtol=0)


def test_methods_that_rewrite_key_positions_refuse_rotated_keys():
    positions = torch.arange(20)[None]
    for name in ("rerope", "self_extend", "dca"):
        method = all_methods()[name]
        assert not method.caches_rotated_keys
        with pytest.raises(ValueError, match="un-rotated"):
            method.plan(positions, keys_rotated=True)


# --- baselines ----------------------------------------------------------------------------


def hf_yarn_frequencies(factor, original):
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = LlamaConfig(
        hidden_size=DIM * 4,
        num_attention_heads=4,
        head_dim=DIM,
        rope_theta=BASE,
        max_position_embeddings=64,
        rope_scaling={"rope_type": "yarn", "factor": factor, "original_max_position_embeddings": original},
    )
    inv_freq, attention_factor = ROPE_INIT_FUNCTIONS["yarn"](config, "cpu")
    return inv_freq.double(), attention_factor


def baseline_cases():
    """name -> (method, P' of its paper, frequencies, score factor, query factor)."""
    yarn_freq, yarn_factor = hf_yarn_frequencies(1.5, 32)
    ntk_freq = plain_frequencies(BASE * 1.5 ** (DIM / (DIM - 2)))
    return {
        "rope": (rope_method(rotary()), rope_relative, plain_frequencies(), 1.0, None),
        "ntk": (ntk_method(DIM, BASE, 1.5, 48), rope_relative, ntk_freq, 1.0, None),
        "yarn": (yarn_method(DIM, BASE, 1.5, 32, 48), rope_relative, yarn_freq, yarn_factor**2, None),
        "rerope": (
            rerope_method(rotary(), 7, 16),
            rerope_relative(7),
            plain_frequencies(),
            1.0,
            lambda m: max(1.0, math.log(m + 1) / math.log(16)),
        ),
        "rerope-no-log": (rerope_method(rotary(), 7), rerope_relative(7), plain_frequencies(), 1.0, None),
        "self_extend": (self_extend_method(rotary(), 8, 4), self_extend_relative(8, 4), plain_frequencies(), 1.0, None),
        "self_extend-uneven": (
            self_extend_method(rotary(), 7, 3),
            self_extend_relative(7, 3),
            plain_frequencies(),
            1.0,
            None,
        ),
        "dca": (dca_method(rotary(), 10, 4), dca_relative(10, 4), plain_frequencies(), 1.0, None),
        "dca-full-window": (dca_method(rotary(), 6, 6), dca_relative(6, 6), plain_frequencies(), 1.0, None),
    }


@pytest.mark.parametrize("name", list(baseline_cases()))
def test_baseline_matches_its_published_formula(name):
    pytest.importorskip("transformers")
    method, relative, frequencies, score_factor, query_factor = baseline_cases()[name]
    positions, docs = two_rows([31, 17], 48)
    q, k, v = random_qkv(2, 48, 48)
    got = method.attend(q, k, v, position_ids=positions, document_ids=docs, block_size=8)
    expected = dense_reference(
        q, k, v, positions, docs, relative, frequencies, score_factor=score_factor, query_factor=query_factor
    )
    # transformers computes YaRN's ramp in float32: its frequencies differ from ours by ~1e-7.
    torch.testing.assert_close(got, expected, atol=1e-6 if name == "yarn" else 1e-10, rtol=0)


@pytest.mark.parametrize("make", [lambda: ntk_method(DIM, BASE, 1.0, 48), lambda: yarn_method(DIM, BASE, 1.0, 32, 48)])
def test_ntk_and_yarn_with_factor_one_equal_rope(make):
    q, k, v = random_qkv(1, 30, 30)
    torch.testing.assert_close(make().attend(q, k, v), rope_method(rotary()).attend(q, k, v), atol=1e-12, rtol=0)


@pytest.mark.parametrize("training_length", [512, 1024, 2048, 4096])
def test_baseline_protocol_keeps_positions_within_two_thirds_of_training(training_length):
    """Under STRING §4.2's protocol every rewritten relative position over the real
    training length stays below the pretend length L' = 2/3 L."""
    pretend = round(2 * training_length / 3)
    m = torch.arange(training_length)
    last_row = {  # P'[L-1][n] for every n, from the papers' formulas (its maximum is the matrix's)
        "rerope": lambda p: [rerope_relative(p["window"])(training_length - 1, int(n))[0] for n in m],
        "self_extend": lambda p: [
            self_extend_relative(p["neighbor_window"], p["group_size"])(training_length - 1, int(n))[0] for n in m
        ],
        "dca": lambda p: [
            dca_relative(p["chunk_size"], p["local_window"])(int(i), int(n))[0] for i in m[-1:] for n in m
        ],
    }
    for name, row in last_row.items():
        params = baseline_protocol(name, training_length)
        assert max(row(params)) < pretend, (name, params)
    assert baseline_protocol("ntk", training_length)["factor"] == pytest.approx(1.5, abs=2e-3)
    yarn = baseline_protocol("yarn", training_length)
    assert (yarn["original_max_position"], yarn["factor"]) == (pretend, training_length / pretend)
    self_extend = baseline_protocol("self_extend", training_length)
    window, group = self_extend["neighbor_window"], self_extend["group_size"]
    assert window % group == 0 and (pretend - window) * group + window >= training_length


def test_dca_relative_positions_never_exceed_chunk_plus_window():
    method = dca_method(rotary(), 10, 4)
    q, k, v = random_qkv(1, 60, 60)
    expected = dense_reference(
        q, k, v, torch.arange(60)[None], torch.zeros(1, 60), dca_relative(10, 4), plain_frequencies()
    )
    torch.testing.assert_close(method.attend(q, k, v), expected, atol=1e-10, rtol=0)
    assert max(dca_relative(10, 4)(59, n)[0] for n in range(60)) == 13  # c - 1


# --- configuration and errors ---------------------------------------------------------


def test_config_defaults_follow_the_paper_and_the_protocol():
    model = ModelConfig.from_preset("tiny")  # L = 1024
    string = build_position_method(PositionMethodConfig(name="string"), model)
    assert string.params == {"shift": 341, "local_window": 128, "compat": "paper"}
    for name in ("ntk", "yarn", "rerope", "self_extend", "dca"):
        assert build_position_method(PositionMethodConfig(name=name), model).params == baseline_protocol(name, 1024)
    explicit = PositionMethodConfig(name="string", string=StringConfig(shift=300, local_window=64, compat="repo"))
    assert build_position_method(explicit, model).params == {"shift": 300, "local_window": 64, "compat": "repo"}


@pytest.mark.parametrize(
    "string,key",
    [
        (StringConfig(shift=100, local_window=100), "eval.position_method.string.local_window"),
        (StringConfig(shift=50, local_window=128), "eval.position_method.string.local_window"),
        (StringConfig(shift_ratio=0.0), "eval.position_method.string.shift_ratio"),
        (StringConfig(shift=-3), "eval.position_method.string.shift"),
        (StringConfig(compat="github"), "eval.position_method.string.compat"),
    ],
)
def test_impossible_string_settings_name_their_key(string, key):
    with pytest.raises(ConfigError) as error:
        PositionMethodConfig(name="string", string=string).resolved(1024)
    assert error.value.key == key


def test_string_method_rejects_bad_shift_and_window():
    with pytest.raises(ValueError, match="local_window W must be in"):
        string_method(rotary(), 8, 8)
    with pytest.raises(ValueError, match="shift S must be > 0"):
        string_method(rotary(), 0, 0)
    with pytest.raises(ConfigError, match="not a registered position method"):
        PositionMethodConfig(name="longrope").resolved(1024)


def test_positions_must_be_consecutive_inside_a_document():
    q, k, v = random_qkv(1, 10, 10)
    skipped = torch.tensor([[0, 1, 2, 3, 7, 8, 9, 10, 11, 12]])
    with pytest.raises(ValueError, match="row 0 goes 3 -> 7 at key index 4"):
        string_attention(q, k, v, shift=4, local_window=1, position_ids=skipped)


# --- flash-attn path ------------------------------------------------------------------


def documented_flash_attn_varlen_func(
    q,
    k,
    v,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q,
    max_seqlen_k,
    softmax_scale,
    causal,
    window_size,
    return_attn_probs,
):
    """flash-attn 2's varlen attention as its docstring defines it, densely on CPU: per
    sequence, query i may see key j iff j <= i + sk - sq (causal, bottom-right aligned)
    and j >= i + sk - sq - window_size[0]; rows that see nothing give output 0 and
    log-sum-exp +inf. Returns (out [total_q, H, D], lse [H, total_q], None)."""
    assert causal and return_attn_probs and window_size[1] == 0
    outs, lses = [], []
    for i in range(len(cu_seqlens_q) - 1):
        qs = q[cu_seqlens_q[i] : cu_seqlens_q[i + 1]]
        ks, vs = (x[cu_seqlens_k[i] : cu_seqlens_k[i + 1]] for x in (k, v))
        sq, sk = qs.shape[0], ks.shape[0]
        assert sq <= max_seqlen_q and sk <= max_seqlen_k
        group = qs.shape[1] // ks.shape[1]
        ks, vs = ks.repeat_interleave(group, dim=1), vs.repeat_interleave(group, dim=1)
        last = torch.arange(sq)[:, None] + sk - sq
        seen = torch.arange(sk)[None, :] <= last
        if window_size[0] >= 0:
            seen &= torch.arange(sk)[None, :] >= last - window_size[0]
        scores = torch.einsum("qhd,khd->hqk", qs, ks) * softmax_scale
        scores = scores.masked_fill(~seen, -math.inf)
        lse = scores.logsumexp(-1)
        weights = torch.exp(scores - lse[..., None]).nan_to_num(0.0)
        outs.append(torch.einsum("hqk,khd->qhd", weights, vs))
        lses.append(lse.masked_fill(~seen.any(-1), math.inf))
    return torch.cat(outs), torch.cat(lses, dim=1), None


@pytest.mark.parametrize("name", ["string", "string-repo", "rerope", "self_extend"])
def test_flash_layout_matches_torch_path_with_documented_kernel_semantics(name, monkeypatch):
    """The flash path's key cutting, windows and empty-row handling, run on CPU through a
    stand-in that implements flash-attn's documented varlen semantics."""
    stand_in = types.SimpleNamespace(flash_attn_varlen_func=documented_flash_attn_varlen_func)
    monkeypatch.setitem(sys.modules, "flash_attn", stand_in)
    method = all_methods()[name]
    positions, docs = two_rows([19, 1, 4, 12], 36)
    q, k, v = random_qkv(2, 36, 36)
    expected = method.attend(q, k, v, position_ids=positions, document_ids=docs, backend="sdpa")
    assert method.plan(positions, docs, backend="flash").backend == "flash"
    got = method.attend(q, k, v, position_ids=positions, document_ids=docs, backend="flash")
    torch.testing.assert_close(got, expected, atol=1e-12, rtol=0)
    for t in (0, 9, 10, 19, 20, 35):
        inputs = (q[:, t : t + 1], k[:, : t + 1], v[:, : t + 1])
        where = dict(position_ids=positions[:, : t + 1], document_ids=docs[:, : t + 1])
        step = method.attend(*inputs, **where, backend="flash")
        # string-repo decodes over [0, S-1], not its prefill's [0, S]: its reference is the torch path's step.
        reference = method.attend(*inputs, **where, backend="sdpa")[:, 0] if name == "string-repo" else expected[:, t]
        torch.testing.assert_close(step[:, 0], reference, atol=1e-12, rtol=0)


def test_math_kernel_for_other_devices_matches_the_cpu_kernel():
    """Off CPU the torch path scores explicitly; both kernels agree, GQA and masks included."""
    from longctx.model.sinks import attend_math as _attend_math

    q, k, v = torch.randn(1, 4, 9, DIM), torch.randn(1, 2, 13, DIM), torch.randn(1, 2, 13, DIM)
    bias = torch.zeros(9, 13).masked_fill(torch.rand(9, 13) < 0.4, -math.inf)
    bias[3] = -math.inf  # a query that sees nothing
    fused = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    fused_out, fused_lse = fused(q, k, v, 0.0, False, attn_mask=bias, scale=0.3)
    out, lse = _attend_math(q, k, v, bias, False, 0.3)
    seen = bias.isfinite().any(-1)
    torch.testing.assert_close(out[:, :, seen], fused_out[:, :, seen], atol=1e-5, rtol=0)
    torch.testing.assert_close(lse[:, :, seen], fused_lse[:, :, seen], atol=1e-5, rtol=0)
    assert (out[:, :, 3] == 0).all() and (lse[:, :, 3] == -math.inf).all()
    causal_out, causal_lse = _attend_math(q, k, v, None, True, 0.3)  # top-left aligned, as the CPU kernel
    fused_out, fused_lse = fused(q, k, v, 0.0, True, scale=0.3)
    torch.testing.assert_close(causal_out, fused_out, atol=1e-5, rtol=0)
    torch.testing.assert_close(causal_lse, fused_lse, atol=1e-5, rtol=0)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["string", "string-repo", "rerope", "self_extend"])
def test_flash_path_matches_torch_path(name):
    require_backend("flash")
    method = all_methods()[name].cuda()
    positions, docs = (t.cuda() for t in two_rows([19, 1, 16], 36))
    q, k, v = (t.cuda() for t in random_qkv(2, 36, 36, dtype=torch.bfloat16))
    flash = method.attend(q, k, v, position_ids=positions, document_ids=docs, backend="flash")
    reference = method.attend(
        q.float(), k.float(), v.float(), position_ids=positions, document_ids=docs, backend="sdpa"
    )
    torch.testing.assert_close(flash.float(), reference, atol=2e-2, rtol=0)
    for t in (0, 9, 10, 35):  # decoding rows, including the first of the second document
        inputs = (q[:, t : t + 1], k[:, : t + 1], v[:, : t + 1])
        where = dict(position_ids=positions[:, : t + 1], document_ids=docs[:, : t + 1])
        step = method.attend(*inputs, **where, backend="flash")
        expected = reference[:, t]
        if name == "string-repo":  # decodes over [0, S-1], not its prefill's [0, S]: the torch path's step
            expected = method.attend(*(x.float() for x in inputs), **where, backend="sdpa")[:, 0]
        torch.testing.assert_close(step[:, 0].float(), expected, atol=2e-2, rtol=0)
