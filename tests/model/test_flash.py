"""Backend `flash` and the position methods' band passes on the varlen kernel, run on CPU
through stand-ins with the exact signatures of torch's `varlen_attn` (tests/model/
varlen_stand_in.py), against the dense `sdpa` backend and the float64 Eq. 4 references.
The same code paths on a real GPU are the `gpu` tests at the end."""

import functools
import math
import sys
import types

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from longctx.config.model import ModelConfig
from longctx.config.position_methods import REPO_STRING_ATTENTION_FACTOR
from longctx.gpu_checks import assert_band_pass_gradients_match_fp64_path, relative_error
from longctx.model import attention as attention_module
from longctx.model import flash
from longctx.model.attention import attention, resolve_backend
from longctx.model.llama import Llama
from longctx.model.position_methods import dca_method, rerope_method, self_extend_method, string_method
from longctx.model.position_methods import gpu as passes_gpu
from longctx.model.position_methods import method as method_module
from tests.helpers import packed_document_ids
from tests.model import varlen_stand_in
from tests.model.helpers import (
    cached_greedy,
    dca_relative,
    dense_reference,
    plain_frequencies,
    random_qkv,
    repo_string_relative,
    rerope_relative,
    rotary,
    self_extend_relative,
    string_relative,
    two_rows,
)

VERSIONS = list(varlen_stand_in.STAND_INS)


def document_rows(total: int = 32) -> torch.Tensor:
    """Row 0: packed documents (one of a single token); row 1: one document."""
    return torch.stack([packed_document_ids([5, 1, 9, total - 15])[0], torch.zeros(total, dtype=torch.long)])


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("kv_heads", [4, 2, 1], ids=["mha", "gqa", "mqa"])
def test_flash_backend_matches_sdpa_forward_and_backward(version, kv_heads, monkeypatch):
    varlen_stand_in.install(monkeypatch, version)
    docs = document_rows()
    q, k, v = (t.requires_grad_() for t in random_qkv(2, 32, 32, heads=4, kv_heads=kv_heads))
    weights = torch.randn(2, 32, 4, q.shape[-1], dtype=q.dtype)
    results = []
    for backend in ("flash", "sdpa"):
        out = attention(q, k, v, document_ids=docs, backend=backend)
        grads = torch.autograd.grad((out * weights).sum(), (q, k, v))
        results.append((out, *grads))
    for got, expected in zip(*results, strict=True):
        torch.testing.assert_close(got, expected, atol=1e-10, rtol=0)


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("q_len", [1, 7])
def test_flash_backend_decoding_and_chunked_prefill_match_sdpa(version, q_len, monkeypatch):
    varlen_stand_in.install(monkeypatch, version)
    docs = document_rows()
    q, k, v = random_qkv(2, q_len, 32)
    expected = attention(q, k, v, document_ids=docs, backend="sdpa")
    torch.testing.assert_close(attention(q, k, v, document_ids=docs, backend="flash"), expected, atol=1e-10, rtol=0)


def test_model_builds_the_flash_layout_once_per_forward(monkeypatch):
    """cu_seqlens and the max lengths (the batch's one host sync) come from one plan that
    every layer reuses; the logits equal the sdpa backend's."""
    varlen_stand_in.install(monkeypatch, "torch-2.14")
    builds = []
    build = attention_module._flash_cu_seqlens
    monkeypatch.setattr(attention_module, "_flash_cu_seqlens", lambda *a: builds.append(1) or build(*a))
    model = Llama(ModelConfig.from_preset("debug", n_layers=3)).double()
    ids, docs = torch.randint(0, 8192, (2, 32)), document_rows()
    flash = model(ids, document_ids=docs, attention_backend="flash")
    assert len(builds) == 1
    torch.testing.assert_close(flash, model(ids, document_ids=docs, attention_backend="sdpa"), atol=1e-10, rtol=0)


def test_auto_picks_flash_on_cuda_for_half_precision():
    cuda = torch.device("cuda")  # a device object only: nothing runs on it
    assert resolve_backend("auto", cuda, torch.bfloat16) == "flash"
    assert resolve_backend("auto", cuda, torch.float16) == "flash"
    assert resolve_backend("auto", cuda, torch.float32) == "flex"  # the flash kernels take fp16/bf16 only
    assert resolve_backend("auto", torch.device("cpu"), torch.bfloat16) == "varlen"


# --- position methods: band passes on the varlen kernel ------------------------------------

BAND_METHODS = {
    "string": (lambda: string_method(rotary(), 10, 3), string_relative(10, 3), 1.0, None),
    "string-repo": (
        lambda: string_method(rotary(), 10, 3, "repo"),
        repo_string_relative(10, 3),
        REPO_STRING_ATTENTION_FACTOR**2,
        None,
    ),
    "rerope": (
        lambda: rerope_method(rotary(), 7, 16),
        rerope_relative(7),
        1.0,
        lambda m: max(1.0, math.log(m + 1) / math.log(16)),
    ),
    "self_extend": (lambda: self_extend_method(rotary(), 8, 3), self_extend_relative(8, 3), 1.0, None),
    "dca": (lambda: dca_method(rotary(), 9, 4), dca_relative(9, 4), 1.0, None),
    "dca-full-window": (lambda: dca_method(rotary(), 6, 6), dca_relative(6, 6), 1.0, None),
}


DECODE_RELATIVE = {"string-repo": string_relative(10, 3)}
"""Methods whose one-query forwards attend other distances than their prefill: StRing
compat='repo' decodes over the band [0, S-1] (position_methods/method.py)."""


def band_rows(rows: str) -> tuple[torch.Tensor, torch.Tensor]:
    """positions, document ids: `two-rows` = packed documents shorter and longer than the
    bands, then one document whose positions start at 5 (DCA's chunks follow positions, not
    indices); `one-document` = that second row alone (NIAH's layout: the rows of every call
    are contiguous)."""
    positions, docs = two_rows([19, 1, 4, 12], 36)
    positions[1] += 5
    return (positions, docs) if rows == "two-rows" else (positions[1:], docs[1:])


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("name", list(BAND_METHODS))
@pytest.mark.parametrize("rows", ["two-rows", "one-document"])
def test_band_passes_on_the_varlen_kernel_match_the_dense_reference(version, name, rows, monkeypatch):
    """Prefill, chunked prefill and one-token decoding with a cache of (rotated, where the
    method allows) keys, GQA, on both layouts of `band_rows`; DCA's earlier-chunks segments
    split over several calls. With one document, every call reads its queries and keys as
    slices (DCA's earlier-chunks keys only in a call of one segment: their ranges overlap)."""
    varlen_stand_in.install(monkeypatch, version)
    monkeypatch.setattr(passes_gpu, "KEYS_PER_CALL", 40)
    calls = []
    kernel = varlen_stand_in.STAND_INS[version]

    @functools.wraps(kernel)  # keeps the signature the backend inspects
    def counting_kernel(*args, **kwargs):
        calls.append(1)
        return kernel(*args, **kwargs)

    monkeypatch.setattr(torch.nn.attention.varlen, "varlen_attn", counting_kernel)
    make, relative, score_factor, query_factor = BAND_METHODS[name]
    method = make()
    positions, docs = band_rows(rows)
    q, k, v = random_qkv(positions.shape[0], 36, 36)
    expected = dense_reference(
        q, k, v, positions, docs, relative, plain_frequencies(), score_factor=score_factor, query_factor=query_factor
    )
    plan = method.plan(positions, docs, backend="flash")
    assert plan.backend == "flash"
    if rows == "one-document":
        for pass_plan, pass_calls in zip(plan.passes, plan.layout.calls, strict=True):
            for call in pass_calls:
                assert isinstance(call.queries, slice) and call.empty_queries is None
                if pass_plan.chunk is None or pass_plan.chunk[1] < 2:
                    assert isinstance(call.keys, slice)
    got = method.attend(q, k, v, position_ids=positions, document_ids=docs, backend="flash")
    tolerance = 1e-6  # the kernel's log-sum-exp is fp32 (as flash-attn's), the rest fp64
    torch.testing.assert_close(got, expected, atol=tolerance, rtol=0)
    assert calls, "the varlen kernel was not called"
    rotated = method.caches_rotated_keys
    cache = method.rotate_keys(k, positions) if rotated else k
    decoded = expected
    if name in DECODE_RELATIVE:
        decoded = dense_reference(
            q, k, v, positions, docs, DECODE_RELATIVE[name], plain_frequencies(), score_factor=score_factor
        )
    for start, end in [(0, 1), (9, 10), (10, 11), (19, 20), (20, 27), (35, 36)]:
        step = method.attend(
            q[:, start:end],
            cache[:, :end],
            v[:, :end],
            position_ids=positions[:, :end],
            document_ids=docs[:, :end],
            keys_rotated=rotated,
            backend="flash",
        )
        reference = decoded if end - start == 1 else expected
        torch.testing.assert_close(step, reference[:, start:end], atol=tolerance, rtol=0)


def test_greedy_decoding_with_string_on_the_varlen_kernel_equals_the_cpu_path(monkeypatch):
    varlen_stand_in.install(monkeypatch, "torch-2.11")
    model = Llama(ModelConfig.from_preset("debug", max_position=24)).double()
    method = string_method(model.rope, 8, 2).double()
    prompts = torch.randint(0, 8192, (2, 30))
    flash = cached_greedy(model, prompts, 6, attention_backend="flash", position_method=method)
    cpu = cached_greedy(model, prompts, 6, attention_backend="varlen", position_method=method)
    assert torch.equal(flash, cpu)


# --- the fold of the passes' calls (gpu._merge_into) against the merge formula ------------------


def formula_merge(parts: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
    """The merge of passes written from its formula (a softmax over the parts' key sets),
    in float64: with m = max_i lse_i,
    out = sum_i o_i exp(lse_i - m) / sum_i exp(lse_i - m), lse = m + log sum_i exp(lse_i - m).
    parts: (out [N, H, D], lse [H, N]); lse -inf: the part covers nothing at that row."""
    outs = torch.stack([out.double() for out, _ in parts])
    lses = torch.stack([lse.double().t() for _, lse in parts])  # [P, N, H]
    m = lses.max(0).values
    weights = torch.exp(lses - m)
    total = weights.sum(0)
    return (outs * weights[..., None]).sum(0) / total[..., None], (m + total.log()).t()


MERGE_SHAPE = (40, 3, 8)  # queries N, heads H, head_dim D
MERGE_ROWS = [slice(0, 40), slice(5, 35), torch.tensor([1, 2, 3, 17, 18, 39])]
"""The calls' rows: all (the first pass's call), a slice, gathered rows (DCA's calls)."""


def merge_calls(count: int, dtype: torch.dtype) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """`count` calls' (out [n, H, D] in `dtype`, lse [H, n] in the merge's dtype) over
    MERGE_ROWS; the second call's first 4 rows see no key (output 0, lse -inf)."""
    generator = torch.Generator().manual_seed(7)
    _, heads, dim = MERGE_SHAPE
    lse_dtype = torch.promote_types(dtype, torch.float32)
    calls = []
    for rows in MERGE_ROWS[:count]:
        size = rows.stop - rows.start if isinstance(rows, slice) else len(rows)
        out = torch.randn(size, heads, dim, generator=generator, dtype=torch.float64).to(dtype)
        lse = (3 * torch.randn(heads, size, generator=generator, dtype=torch.float64)).to(lse_dtype)
        calls.append((out, lse))
    if count > 1:
        calls[1][0][:4] = 0.0
        calls[1][1][:, :4] = -math.inf
    return calls


def whole(call: tuple[torch.Tensor, torch.Tensor], rows) -> tuple[torch.Tensor, torch.Tensor]:
    """A call's (out, lse) over all N rows: output 0 and lse -inf where it has none."""
    total, heads, dim = MERGE_SHAPE
    out = torch.zeros(total, heads, dim, dtype=torch.float64).index_copy(0, torch.arange(total)[rows], call[0].double())
    lse = torch.full((heads, total), -math.inf, dtype=torch.float64)
    return out, lse.index_copy(1, torch.arange(total)[rows], call[1].double())


def fold(calls, recording: bool) -> tuple[torch.Tensor, torch.Tensor]:
    merged = None
    for (out, lse), rows in zip(calls, MERGE_ROWS, strict=False):
        merged = passes_gpu._merge_into(merged, out, lse, rows, MERGE_SHAPE[0], recording)
    assert merged is not None
    return merged


MERGE_TOLERANCES = {torch.float64: 1e-12, torch.float32: 1e-6, torch.bfloat16: 2.0**-7}
"""|out - formula| / max_i |o_i| at each element, per fold: float64/32 at rounding level;
bf16 2^-7, one rounding more than the formula's one (2^-8): lerp's weight is rounded to
bf16. The log-sum-exps stay in fp32/fp64: 1e-5 / 1e-12 absolute."""


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("count", [2, 3])
def test_folding_calls_equals_the_merge_formula(dtype, count):
    """`_merge_into`, call after call, in place (inference) and out of place (autograd),
    against the merge formula: rows as slices and gathered indices,
    rows a call covers only in part, rows where a call sees no key."""
    calls = merge_calls(count, dtype)
    expected_out, expected_lse = formula_merge(
        [whole(call, rows) for call, rows in zip(calls, MERGE_ROWS, strict=False)]
    )
    recorded = fold(calls, recording=True)
    in_place = fold([(out.clone(), lse.clone()) for out, lse in calls], recording=False)
    for got in (recorded, in_place):
        assert got[0].dtype == dtype and got[1].dtype == calls[0][1].dtype
    torch.testing.assert_close(in_place, recorded, atol=0, rtol=0)
    bound = torch.stack([whole(call, rows)[0].abs() for call, rows in zip(calls, MERGE_ROWS, strict=False)]).amax(0)
    error = (recorded[0].double() - expected_out).abs() / bound
    assert error.max() <= MERGE_TOLERANCES[dtype] * (count - 1), error.max()
    lse_tolerance = 1e-12 if dtype == torch.float64 else 1e-5
    torch.testing.assert_close(recorded[1].double(), expected_lse, atol=lse_tolerance, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16], ids=str)
@pytest.mark.parametrize("count", [2, 3])
def test_folding_calls_has_the_merge_formulas_gradients(dtype, count):
    """Backward through the fold (gradients of the outputs and of the lse, which carries the
    band passes' q/k gradients, sinks.lse_with_gradient) equals the formula's: float64 to
    1e-10; bf16 outputs (fp32 lse) within 1e-2 relative L2 (measured 2.5e-3: bf16 rounds
    at 4e-3), against the formula in float64 of the same values."""
    calls = [(out.requires_grad_(), lse.requires_grad_()) for out, lse in merge_calls(count, dtype)]
    exact = [(out.detach().double().requires_grad_(), lse.detach().double().requires_grad_()) for out, lse in calls]
    generator = torch.Generator().manual_seed(3)
    out_weights = torch.randn(MERGE_SHAPE, generator=generator, dtype=torch.float64)
    lse_weights = torch.randn(MERGE_SHAPE[1], MERGE_SHAPE[0], generator=generator, dtype=torch.float64)
    results = []
    for merged, leaves in (
        (fold(calls, recording=True), calls),
        (formula_merge([whole(c, r) for c, r in zip(exact, MERGE_ROWS, strict=False)]), exact),
    ):
        loss = (merged[0].double() * out_weights).sum() + (merged[1].double() * lse_weights).sum()
        results.append(torch.autograd.grad(loss, [t for call in leaves for t in call]))
    for got, expected in zip(*results, strict=True):
        assert got.isfinite().all()
        if dtype == torch.float64:
            torch.testing.assert_close(got, expected, atol=1e-10, rtol=0)
        else:
            assert (got.double() - expected).norm() <= 1e-2 * expected.norm()


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("rows", ["two-rows", "one-document"])
def test_band_passes_in_bf16_copy_nothing_in_fp32_around_the_kernel(version, rows, monkeypatch):
    """Inference in bf16 (the GPU's case): around the kernel calls no op writes an fp32
    tensor as large as the output (only the [H, N] log-sum-exps and weights are fp32),
    and with one document no row is gathered or scattered (DCA's earlier-chunks keys
    aside): the passes read slices and fold in place, into the output of the fp64 path
    to bf16's precision."""
    varlen_stand_in.install(monkeypatch, version)
    kernel = varlen_stand_in.STAND_INS[version]
    in_kernel = []

    @functools.wraps(kernel)
    def marked_kernel(*args, **kwargs):
        in_kernel.append(True)
        try:
            return kernel(*args, **kwargs)
        finally:
            in_kernel.pop()

    monkeypatch.setattr(torch.nn.attention.varlen, "varlen_attn", marked_kernel)
    ops: list[tuple[str, list[tuple[torch.dtype, int]]]] = []

    class Recorder(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if not in_kernel:
                written = [(t.dtype, t.numel()) for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
                ops.append((func.overloadpacket.__name__, written))
            return out

    def recorded_passes(*args, **kwargs):
        with Recorder():
            return passes_gpu.varlen_passes(*args, **kwargs)

    monkeypatch.setattr(method_module, "varlen_passes", recorded_passes)
    positions, docs = band_rows(rows)
    exact = random_qkv(positions.shape[0], 36, 36)
    q, k, v = (t.bfloat16() for t in exact)
    for name, (make, *_) in BAND_METHODS.items():
        ops.clear()
        with torch.no_grad():
            out = make().attend(q, k, v, position_ids=positions, document_ids=docs, backend="flash")
        assert ops and out.dtype == torch.bfloat16
        expected = make().attend(*exact, position_ids=positions, document_ids=docs)  # the pure-torch path, fp64
        assert relative_error(out.float(), expected) < 3e-2  # bf16, as the backward check
        fp32_copies = [op for op, written in ops if (torch.float32, out.numel()) in written]
        assert not fp32_copies, (name, fp32_copies)
        if rows == "one-document":
            moved = [op for op, _ in ops if op in ("index", "index_put", "index_put_", "index_copy", "index_copy_")]
            assert moved == (["index", "index"] if name.startswith("dca") else []), (name, moved)


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("name", ["string", "rerope", "dca"])
@pytest.mark.parametrize("rows", ["two-rows", "one-document"])
def test_band_passes_in_bf16_match_the_fp64_path_forward_and_backward(version, name, rows, monkeypatch):
    """The GPU check (`gpu_checks.assert_band_pass_gradients_match_fp64_path`: output and
    q/k/v gradients within 3e-2 relative L2) on CPU through the stand-in, in bf16: the
    fold's bf16 weights and accumulator included (measured ~6e-3)."""
    varlen_stand_in.install(monkeypatch, version)
    make = BAND_METHODS[name][0]
    positions, docs = band_rows(rows)
    q, k, v = random_qkv(positions.shape[0], 36, 36)
    assert_band_pass_gradients_match_fp64_path(make, positions, docs, q, k, v, torch.device("cpu"))


@pytest.mark.parametrize("version", VERSIONS)
def test_stand_in_lse_carries_no_gradient_like_the_kernel(version):
    """torch's varlen_attn backward drops grad_lse (2.11 and 2.14): the stand-in's lse is
    detached, its output differentiable."""
    kernel = varlen_stand_in.STAND_INS[version]
    q, k, v = (torch.randn(6, 2, 8, dtype=torch.float64, requires_grad=True) for _ in range(3))
    cu = torch.tensor([0, 2, 6], dtype=torch.int32)
    from torch.nn.attention.varlen import AuxRequest

    out, lse = kernel(q, k, v, cu, cu, 4, 4, return_aux=AuxRequest(lse=True), window_size=(-1, 0))
    assert out.requires_grad and not lse.requires_grad


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("name", list(BAND_METHODS))
@pytest.mark.parametrize("rows", ["two-rows", "one-document"])
def test_merged_passes_on_the_varlen_kernel_have_exact_gradients(version, name, rows, monkeypatch):
    """The stand-in's lse carries no gradient (as the kernel's); the merge's gradients still
    equal the float64 dense reference's: q, k and v, both layouts of `band_rows`, GQA, DCA's
    split calls."""
    varlen_stand_in.install(monkeypatch, version)
    monkeypatch.setattr(passes_gpu, "KEYS_PER_CALL", 40)
    make, relative, score_factor, query_factor = BAND_METHODS[name]
    method = make()
    positions, docs = band_rows(rows)
    q, k, v = (t.requires_grad_() for t in random_qkv(positions.shape[0], 36, 36))
    weights = torch.randn(*q.shape, dtype=q.dtype)
    expected = dense_reference(
        q, k, v, positions, docs, relative, plain_frequencies(), score_factor=score_factor, query_factor=query_factor
    )
    expected_grads = torch.autograd.grad((expected * weights).sum(), (q, k, v))
    got = method.attend(q, k, v, position_ids=positions, document_ids=docs, backend="flash")
    got_grads = torch.autograd.grad((got * weights).sum(), (q, k, v))
    tolerance = 1e-5  # the kernel's log-sum-exp is fp32 (as flash-attn's), the rest fp64
    for got_grad, expected_grad in zip(got_grads, expected_grads, strict=True):
        torch.testing.assert_close(got_grad, expected_grad, atol=tolerance, rtol=0)


@pytest.mark.parametrize("name", list(BAND_METHODS))
def test_merged_passes_on_the_pure_torch_path_have_exact_gradients(name):
    """The CPU default path (position_methods/cpu.py) against the same float64 reference: its
    fused CPU kernel drops the log-sum-exp's gradient, so under autograd it runs explicit
    math (before that fix: q/k gradients off by 10-30% once documents outgrow the bands)."""
    make, relative, score_factor, query_factor = BAND_METHODS[name]
    positions, docs = two_rows([19, 1, 4, 12], 36)
    q, k, v = (t.requires_grad_() for t in random_qkv(2, 36, 36))
    weights = torch.randn(2, 36, 4, q.shape[-1], dtype=q.dtype)
    expected = dense_reference(
        q, k, v, positions, docs, relative, plain_frequencies(), score_factor=score_factor, query_factor=query_factor
    )
    expected_grads = torch.autograd.grad((expected * weights).sum(), (q, k, v))
    got = make().attend(q, k, v, position_ids=positions, document_ids=docs)
    got_grads = torch.autograd.grad((got * weights).sum(), (q, k, v))
    for got_grad, expected_grad in zip(got_grads, expected_grads, strict=True):
        torch.testing.assert_close(got_grad, expected_grad, atol=1e-10, rtol=0)


@pytest.mark.parametrize(
    ("version", "kv_heads", "repeats", "enable_gqa"),
    [
        ("torch-2.14", 4, 1, False),
        ("torch-2.14", 1, 1, True),
        ("torch-2.11", 4, 1, False),
        ("torch-2.11", 2, 2, False),
        ("torch-2.11", 1, 4, False),
    ],
)
def test_gqa_is_native_where_the_signature_has_enable_gqa(version, kv_heads, repeats, enable_gqa, monkeypatch):
    """The decision reads the wrapper's signature (2.14: `enable_gqa`; 2.11: none), and the
    kernel gets exactly the heads it decided on."""
    varlen_stand_in.install(monkeypatch, version)
    kernel = flash.resolve_kernel()
    assert flash.kv_repeats(kernel, 4, kv_heads) == repeats
    calls = []
    stand_in = varlen_stand_in.STAND_INS[version]

    @functools.wraps(stand_in)
    def recording(q, k, v, *args, **kwargs):
        calls.append((k.shape[1], kwargs.get("enable_gqa", False)))
        return stand_in(q, k, v, *args, **kwargs)

    kernel = flash.VarlenKernel(recording, flash_attn=False, enable_gqa=kernel.enable_gqa)
    q, k, v = torch.randn(10, 4, 8), torch.randn(10, kv_heads, 8), torch.randn(10, kv_heads, 8)
    cu = torch.tensor([0, 3, 10], dtype=torch.int32)
    flash.varlen_flash(q, k, v, cu, cu, 7, 7, scale=0.3, kernel=kernel)
    assert calls == [(kv_heads * repeats, enable_gqa)]
    with pytest.raises(ValueError, match="not a multiple"):
        flash.kv_repeats(kernel, 4, 3)


def test_flash_attn_4s_namespace_package_alone_leaves_torchs_kernel_in_use(monkeypatch):
    """flash-attn-4 installs `flash_attn` as a namespace package holding only `cute`: not
    flash-attn 2's module, so torch's kernel is resolved; flash-attn 2's is taken as before."""
    varlen_stand_in.install(monkeypatch, "torch-2.14")
    namespace = types.ModuleType("flash_attn")
    namespace.__path__ = []  # a package, as the import system builds a namespace one
    monkeypatch.setitem(sys.modules, "flash_attn", namespace)
    kernel = flash.resolve_kernel()
    assert not kernel.flash_attn and kernel.function is varlen_stand_in.STAND_INS["torch-2.14"]
    assert flash.available()
    monkeypatch.setattr(namespace, "flash_attn_varlen_func", lambda *a, **k: None, raising=False)
    assert flash.resolve_kernel().flash_attn


@pytest.mark.parametrize(("q_len", "window"), [(1, (-1, -1)), (2, (-1, 0)), (32, (-1, 0))])
def test_decoding_passes_no_causal_window(q_len, window, monkeypatch):
    """One query per row sees its whole document: no window (FA2's GQA decoding path needs
    right < 0); more queries need the causal one. Outputs equal sdpa either way."""
    varlen_stand_in.install(monkeypatch, "torch-2.14")
    windows = []
    stand_in = varlen_stand_in.STAND_INS["torch-2.14"]

    @functools.wraps(stand_in)
    def recording(*args, **kwargs):
        windows.append(kwargs["window_size"])
        return stand_in(*args, **kwargs)

    monkeypatch.setattr(torch.nn.attention.varlen, "varlen_attn", recording)
    docs = document_rows()
    q, k, v = random_qkv(2, q_len, 32)
    got = attention(q, k, v, document_ids=docs, backend="flash")
    assert windows == [window]
    torch.testing.assert_close(got, attention(q, k, v, document_ids=docs, backend="sdpa"), atol=1e-10, rtol=0)


def test_max_seqlen_from_the_host_skips_the_device_read(monkeypatch):
    """With a host bound (the row length here) the plan reads no maximum from the device:
    the kernel gets the bound, and the result is unchanged."""
    varlen_stand_in.install(monkeypatch, "torch-2.11")
    docs = document_rows()

    def no_max(*args, **kwargs):
        raise AssertionError("max() read from the device")

    plan = attention_module.build_mask(docs, 32, "flash", max_seqlen=32)
    assert (plan.extra.max_q, plan.extra.max_k) == (32, 32)
    decode = attention_module.build_mask(docs, 1, "flash", max_seqlen=32)
    assert (decode.extra.max_q, decode.extra.max_k) == (1, 32)
    q, k, v = random_qkv(2, 32, 32)
    expected = attention(q, k, v, document_ids=docs, backend="sdpa")
    monkeypatch.setattr(torch.Tensor, "max", no_max)
    got = attention(q, k, v, mask=attention_module.build_mask(docs, 32, "flash", max_seqlen=32))
    torch.testing.assert_close(got, expected, atol=1e-10, rtol=0)


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(BAND_METHODS))
@pytest.mark.parametrize("rows", ["two-rows", "one-document"])
def test_band_passes_in_bf16_inference_on_cuda_match_the_fp64_path(name, rows):
    """Inference (no autograd: the in-place fold, the sliced rows) on CUDA with the installed
    varlen kernel in bf16, against the pure-torch path in fp64: relative L2 below 3e-2, the
    bound of the backward check (`gpu_checks.assert_band_pass_gradients_match_fp64_path`)."""
    make = BAND_METHODS[name][0]
    positions, docs = band_rows(rows)
    q, k, v = random_qkv(positions.shape[0], 36, 36)
    expected = make().attend(q, k, v, position_ids=positions, document_ids=docs)
    cuda = torch.device("cuda")
    inputs = (t.to(cuda, torch.bfloat16) for t in (q, k, v))
    with torch.no_grad():
        got = (
            make()
            .to(cuda)
            .attend(*inputs, position_ids=positions.to(cuda), document_ids=docs.to(cuda), backend="flash")
        )
    assert got.dtype == torch.bfloat16
    assert relative_error(got.float(), expected) < 3e-2
