"""Chunked prefill with the KV cache equals the unchunked forward for every position method
(model/inference/prefill.py): the logits of every prompt position and the greedy tokens."""

import pytest
import torch

from longctx.config.model import ModelConfig
from longctx.config.position_methods import POSITION_METHODS, PositionMethodConfig, StringConfig
from longctx.model.inference.prefill import greedy_generate_recompute
from longctx.model.llama import Llama
from longctx.model.position_methods import build_position_method
from tests.model.helpers import cached_greedy

TRAINING_LENGTH = 48
PROMPT = 70  # past the training length: the methods' far passes are all in play
ARMS = [*POSITION_METHODS, "string-repo"]


def _method(arm: str, config: ModelConfig):
    if arm == "rope":
        return None  # the model's own plain RoPE (layer_attention.Dense)
    name, _, compat = arm.partition("-")
    string = StringConfig(local_window=4, compat=compat or "paper")
    return build_position_method(PositionMethodConfig(name=name, string=string), config)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    config = ModelConfig.from_preset("debug", vocab_size=256, max_position=TRAINING_LENGTH, init_std=0.2)
    return Llama(config).double().eval()


@pytest.mark.parametrize("arm", ARMS)
@pytest.mark.parametrize("chunk", [13, 32])
def test_chunked_prefill_logits_equal_the_unchunked_forward(model, arm, chunk):
    method = _method(arm, model.config)
    ids = torch.randint(0, 256, (2, PROMPT), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = model(ids, position_method=method)
        cache = model.new_kv_cache(2, PROMPT)
        pieces = [model(ids[:, s : s + chunk], kv_cache=cache, position_method=method) for s in range(0, PROMPT, chunk)]
    torch.testing.assert_close(torch.cat(pieces, dim=1), full, atol=1e-10, rtol=0)


@pytest.mark.parametrize("arm", ARMS)
def test_chunked_prefill_greedy_tokens_equal_the_recomputed_reference(model, arm):
    method = _method(arm, model.config)
    ids = torch.randint(0, 256, (2, PROMPT), generator=torch.Generator().manual_seed(2))
    chunked = cached_greedy(model, ids, 8, position_method=method, prefill_chunk_tokens=17)
    whole = cached_greedy(model, ids, 8, position_method=method)
    reference = greedy_generate_recompute(model, ids, 8, position_method=method)
    assert torch.equal(chunked, whole)
    if arm == "string-repo":
        # Cached decoding attends [0, S-1], re-running the prompt [0, S] (the authors' code,
        # position_methods/method.py): only the first token, from the prefill, must agree.
        assert torch.equal(chunked[:, :1], reference[:, :1])
        return
    assert torch.equal(chunked, reference)


def test_prefill_chunk_tokens_must_not_be_negative(model):
    with pytest.raises(ValueError, match="prefill_chunk_tokens must be >= 0"):
        cached_greedy(model, torch.zeros(1, 4, dtype=torch.long), 1, prefill_chunk_tokens=-1)
