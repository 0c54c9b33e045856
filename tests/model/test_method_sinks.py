"""Attention sinks (gpt-oss) under the multi-pass position methods, against the dense
float64 reference of each paper's P' with the sink as one more column of logit s_h and
value 0 in every row's softmax (tests/model/helpers.dense_reference): the sink joins the
softmax over the union of the passes' keys once, however many passes the method runs.
Prefill on the pure-torch kernels and on the varlen layout (through a stand-in of torch's
varlen kernel, tests/model/varlen_stand_in.py), one-token decoding, gradients of q, k, v and
the sinks themselves; bf16 on the varlen layout (the stand-in here, the installed kernel on
CUDA under the `gpu` marker) within bf16 rounding of the float64 reference.
"""

import math

import pytest
import torch

from longctx.config.position_methods import REPO_STRING_ATTENTION_FACTOR
from longctx.model.position_methods import (
    dca_method,
    rerope_method,
    rope_method,
    self_extend_method,
    string_method,
)
from tests.model import varlen_stand_in
from tests.model.helpers import (
    assert_decoding_equals_prefill,
    dca_relative,
    decoding_step,
    dense_reference,
    plain_frequencies,
    random_qkv,
    repo_string_relative,
    rerope_relative,
    rope_relative,
    rotary,
    self_extend_relative,
    string_relative,
    two_rows,
)


def cases():
    """name -> (method, P' of its paper, score factor, query factor)."""
    return {
        "rope": (rope_method(rotary()), rope_relative, 1.0, None),
        "string": (string_method(rotary(), 10, 3), string_relative(10, 3), 1.0, None),
        "string-repo": (
            string_method(rotary(), 10, 3, "repo"),
            repo_string_relative(10, 3),
            REPO_STRING_ATTENTION_FACTOR**2,
            None,
        ),
        "rerope": (
            rerope_method(rotary(), 7, 16),
            rerope_relative(7),
            1.0,
            lambda m: max(1.0, math.log(m + 1) / math.log(16)),
        ),
        "self_extend": (self_extend_method(rotary(), 8, 4), self_extend_relative(8, 4), 1.0, None),
        "dca": (dca_method(rotary(), 10, 4), dca_relative(10, 4), 1.0, None),
    }


def sinks(heads: int = 4) -> torch.Tensor:
    """Sink logits of the scores' size (q.k / sqrt(d) ~ 1 with random q, k): they take a
    visible share of every row, more of the long rows' than a per-pass sink would."""
    return torch.tensor([2.5, -1.0, 0.5, 4.0], dtype=torch.float64)[:heads]


def reference(name, q, k, v, positions, docs, sink):
    _, relative, score_factor, query_factor = cases()[name]
    return dense_reference(
        q,
        k,
        v,
        positions,
        docs,
        relative,
        plain_frequencies(),
        score_factor=score_factor,
        query_factor=query_factor,
        sinks=sink,
    )


@pytest.mark.parametrize("name", list(cases()))
def test_sinks_join_the_merged_softmax_once(name):
    method = cases()[name][0]
    positions, docs = two_rows([31, 17], 48)
    q, k, v = random_qkv(2, 48, 48)
    got = method.attend(q, k, v, position_ids=positions, document_ids=docs, block_size=8, sinks=sinks())
    expected = reference(name, q, k, v, positions, docs, sinks())
    torch.testing.assert_close(got, expected, atol=1e-10, rtol=0)
    without = method.attend(q, k, v, position_ids=positions, document_ids=docs, block_size=8)
    assert (got - without).abs().max() > 1e-2  # the sinks matter
    if len(method.passes) > 1:  # one sink per pass would take a larger share of the far rows
        per_pass = method.attend(q, k, v, position_ids=positions, document_ids=docs, sinks=sinks() + math.log(2))
        assert (per_pass - got).abs().max() > 1e-3


@pytest.mark.parametrize("name", [name for name in cases() if name != "string-repo"])
def test_one_token_decoding_with_sinks_equals_prefill_rows(name):
    """string-repo decodes over [0, S-1], not its prefill's [0, S] (test_position_methods)."""
    assert_decoding_equals_prefill(cases()[name][0], sinks=sinks())


@pytest.mark.parametrize("version", list(varlen_stand_in.STAND_INS))
@pytest.mark.parametrize("name", ["string", "string-repo", "rerope", "self_extend", "dca"])
def test_varlen_layout_applies_the_sinks_to_its_merged_calls(name, version, monkeypatch):
    """The flash path's merge of kernel calls, on CPU through a stand-in of torch's varlen
    kernel (tests/model/varlen_stand_in.py): bands, DCA's chunk segments, empty rows."""
    varlen_stand_in.install(monkeypatch, version)
    method = cases()[name][0]
    positions, docs = two_rows([19, 1, 4, 12], 36)
    q, k, v = random_qkv(2, 36, 36)
    assert method.plan(positions, docs, backend="flash").backend == "flash"
    got = method.attend(q, k, v, position_ids=positions, document_ids=docs, backend="flash", sinks=sinks())
    # the kernel's log-sum-exp is float32 (the stand-in's too): the merge weights round to it
    torch.testing.assert_close(got, reference(name, q, k, v, positions, docs, sinks()), atol=1e-6, rtol=0)


@pytest.mark.parametrize("name", ["string", "rerope", "dca"])
def test_gradients_with_sinks_equal_the_references(name):
    """q, k, v and the sink logits: the merged lse's gradient carries the sinks' share."""
    method = cases()[name][0]
    positions, docs = two_rows([20, 12], 32)
    q, k, v = (t.requires_grad_() for t in random_qkv(2, 32, 32))
    sink = sinks().requires_grad_()
    weights = torch.randn(2, 32, 4, 16, dtype=torch.float64)

    def gradients(out: torch.Tensor) -> list[torch.Tensor]:
        return list(torch.autograd.grad((out * weights).sum(), (q, k, v, sink)))

    got = gradients(method.attend(q, k, v, position_ids=positions, document_ids=docs, block_size=8, sinks=sink))
    expected = gradients(reference(name, q, k, v, positions, docs, sink))
    for mine, theirs in zip(got, expected, strict=True):
        torch.testing.assert_close(mine, theirs, atol=1e-10, rtol=0)
    assert expected[3].abs().min() > 1e-4  # every sink's own gradient is checked


def test_sinks_of_the_wrong_shape_are_refused_in_one_line():
    method = cases()["string"][0]
    q, k, v = random_qkv(1, 12, 12)
    with pytest.raises(ValueError, match=r"one logit per query head, shape \(4,\), got \(2,\)") as error:
        method.attend(q, k, v, sinks=torch.zeros(2, dtype=torch.float64))
    assert "\n" not in str(error.value)


def bf16_errors(name: str, device: torch.device) -> list[float]:
    """Relative L2 errors of the flash path in bf16 against the float64 reference with the sink
    column: prefill, then one-token decoding steps (the first of the second document included)."""
    positions, docs = two_rows([19, 1, 16], 36)
    q, k, v = random_qkv(2, 36, 36)
    expected = reference(name, q, k, v, positions, docs, sinks())
    method = cases()[name][0].to(device)
    q, k, v = (t.to(device, torch.bfloat16) for t in (q, k, v))
    positions, docs = positions.to(device), docs.to(device)
    sink = sinks().to(device, torch.bfloat16)
    rotated = method.caches_rotated_keys
    cache = method.rotate_keys(k, positions) if rotated else k
    with torch.no_grad():
        got = method.attend(q, k, v, position_ids=positions, document_ids=docs, backend="flash", sinks=sink)
        assert got.dtype == torch.bfloat16
        errors = [relative_error(got, expected)]
        for t in (0, 9, 10, 35):
            step = decoding_step(
                method, t, q, cache, v, positions, docs, keys_rotated=rotated, backend="flash", sinks=sink
            )
            errors.append(relative_error(step, expected[:, t]))
    return errors


def relative_error(got: torch.Tensor, expected: torch.Tensor) -> float:
    return ((got.double().cpu() - expected).norm() / expected.norm()).item()


@pytest.mark.parametrize("name", ["string", "rerope", "self_extend", "dca"])
def test_flash_layout_with_bf16_sinks_stays_within_bf16_rounding(name, monkeypatch):
    """On CPU through the stand-in of torch's varlen kernel: sinks, q, k, v in bf16."""
    varlen_stand_in.install(monkeypatch, "torch-2.14")
    assert max(bf16_errors(name, torch.device("cpu"))) < 3e-2


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["string", "rerope", "self_extend", "dca"])
def test_flash_path_with_sinks_in_bf16_matches_the_reference(name):
    """The installed varlen kernel on CUDA in bf16: relative L2 below 3e-2 (tests/model/
    test_flash.py's bound for the band passes in bf16)."""
    assert max(bf16_errors(name, torch.device("cuda"))) < 3e-2
