"""Caches, padding, batches and dtypes: cached `generate` equals a full forward of the
produced sequence, a left-padded batch equals each row alone, StaticCache equals
DynamicCache, right-padded scoring and packed rows equal each row alone, the plan is
built once per forward, and float32 / bfloat16 models agree with longctx's model."""

import pytest
import torch

import longctx.hf_attention as hfa
from longctx.hf_attention import CompactMask
from longctx.model.position_methods import PositionMethod
from tests.hf_attention.helpers import ATTENTION_ARMS, PARAMS, build, method_of, own_method, own_model, tokens

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

NEW = 12
FAMILIES = ("llama-bias", "mistral", "qwen2-tied")


@pytest.fixture(scope="module")
def models():
    return {family: build(family) for family in FAMILIES}


def generate(model, ids, mask=None, **options):
    out = model.generate(
        ids,
        attention_mask=mask,
        max_new_tokens=NEW,
        do_sample=False,
        output_scores=True,
        return_dict_in_generate=True,
        **options,
    )
    return out.sequences, torch.stack(out.scores, dim=1).double()


def left_padded(lengths=(70, 50)):
    """Two prompts (70 and 50 tokens), the shorter left-padded with id 0, and their mask."""
    rows = [tokens(1, length, seed=seed)[0] for seed, length in enumerate(lengths)]
    width = max(lengths)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for index, row in enumerate(rows):
        ids[index, width - len(row) :], mask[index, width - len(row) :] = row, 1
    return rows, ids, mask


@pytest.mark.parametrize("arm", [arm for arm in ATTENTION_ARMS if arm != "string-repo"])
@pytest.mark.parametrize("family", FAMILIES)
def test_cached_generate_equals_a_full_forward_and_padded_rows_equal_rows_alone(models, family, arm):
    model = hfa.apply(models[family], method_of(arm), **PARAMS[arm])
    rows, ids, mask = left_padded()
    sequences, scores = generate(model, ids, mask)
    with torch.no_grad():
        full = model(sequences[:1]).logits[0, ids.shape[1] - 1 : -1].float().double()
    # generate hands out float32 scores: the cached steps equal the full forward to float32 rounding
    assert (scores[0] - full).abs().max() <= 1e-5
    for index, row in enumerate(rows):
        alone_sequences, alone_scores = generate(model, row[None])
        assert torch.equal(sequences[index, ids.shape[1] :], alone_sequences[0, len(row) :])
        assert (scores[index] - alone_scores[0]).abs().max() <= 1e-5
    _, static_scores = generate(model, ids, mask, cache_implementation="static")
    assert (static_scores - scores).abs().max() <= 1e-5


def test_repo_compat_decoding_equals_longctxs_own_cached_decoding(models, tmp_path):
    """compat='repo' decodes a token with the paper's diagonal (the authors' code): cached
    generate differs from a full forward by design, and equals longctx's own KV cache."""
    model = models["llama-bias"]
    own = own_model(model, tmp_path)
    hfa.apply(model, "string", **PARAMS["string-repo"])
    prompt = tokens(1, 70)
    sequences, scores = generate(model, prompt)
    method = own_method(own, "string-repo")
    cache = own.new_kv_cache(1, sequences.shape[1])
    with torch.no_grad():
        steps = [own(prompt, kv_cache=cache, position_method=method)[:, -1]]
        for token in sequences[0, prompt.shape[1] : -1]:
            steps.append(own(token.view(1, 1), kv_cache=cache, position_method=method)[:, -1])
        full = model(sequences).logits[0, prompt.shape[1] - 1 : -1].double()
    assert (scores[0] - torch.cat(steps).float().double()).abs().max() <= 1e-4
    assert (scores[0] - full).abs().max() > 1e-3


@pytest.mark.parametrize("arm", ["string", "dca"])
def test_right_padded_scoring_equals_each_row_alone(models, arm):
    model = hfa.apply(models["qwen2-tied"], method_of(arm), **PARAMS[arm])
    rows = [tokens(1, 90, seed=3)[0], tokens(1, 64, seed=4)[0]]
    ids = torch.zeros(2, 90, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for index, row in enumerate(rows):
        ids[index, : len(row)], mask[index, : len(row)] = row, 1
    with torch.no_grad():
        batched = model(ids, attention_mask=mask).logits
        for index, row in enumerate(rows):
            alone = model(row[None]).logits[0]
            assert (batched[index, : len(row)] - alone).abs().max() <= 1e-12


def test_packed_rows_are_documents(models):
    """position_ids that restart (packed sequences, no mask, no cache) start a new document."""
    model = hfa.apply(models["llama-bias"], "self_extend", **PARAMS["self_extend"])
    first, second = tokens(1, 60, seed=5), tokens(1, 50, seed=6)
    packed = torch.cat([first, second], dim=1)
    positions = torch.cat([torch.arange(60), torch.arange(50)])[None]
    with torch.no_grad():
        logits = model(packed, position_ids=positions).logits[0]
        assert (logits[:60] - model(first).logits[0]).abs().max() <= 1e-12
        assert (logits[60:] - model(second).logits[0]).abs().max() <= 1e-12


def test_the_plan_is_built_once_per_forward_from_a_compact_mask(models, monkeypatch):
    model = hfa.apply(models["mistral"], "string", **PARAMS["string"])
    plans, masks = [], []
    original = PositionMethod.plan

    def counting(self, *args, **kwargs):
        plans.append(args[0].shape)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(PositionMethod, "plan", counting)
    from longctx.hf_attention import kernel

    forward = kernel.forward_plan

    def spy(method, name, mask, *args):
        masks.append(mask)
        return forward(method, name, mask, *args)

    monkeypatch.setattr(kernel, "forward_plan", spy)
    _, ids, mask = left_padded()
    with torch.no_grad():
        model(ids, attention_mask=mask)
    assert len(plans) == 1 and model.config.num_hidden_layers == 2
    (compact,) = masks
    assert isinstance(compact, CompactMask) and compact.padding.shape == ids.shape


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("arm", ["string", "rerope", "dca"])
def test_float32_and_bfloat16_models_agree_with_longctx_as_closely_as_sdpa_does(tmp_path, dtype, arm):
    """In float32 / bfloat16, q/k arrive rotated with transformers' cos/sin in that dtype:
    the method differs from longctx's float64 model by no more than HF's own sdpa in that
    dtype differs from float64 sdpa (bf16: ~4e-2 on logits of a few units), far below
    the method's effect."""
    reference = build("qwen2-tied")
    own = own_model(reference, tmp_path)
    model = build("qwen2-tied", dtype=dtype)
    ids = tokens(2, 90)
    with torch.no_grad():
        plain = reference(ids).logits
        floor = (model(ids).logits.double() - plain).abs().max().item()
        hfa.apply(model, method_of(arm), **PARAMS[arm])
        expected = own(ids, position_method=own_method(own, arm))
        error = (model(ids).logits.double() - expected).abs().max().item()
    assert error <= max(1.5 * floor, 1e-5), (error, floor)
    assert (expected - plain).abs().max() >= 10 * error
