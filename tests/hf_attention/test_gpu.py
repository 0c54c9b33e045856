"""Each registered function in bfloat16 on CUDA against longctx's own flash path (`gpu`;
skipped without CUDA): a random Llama (2 layers, 8 heads / 4 KV of 32) whose training length
is 2,048, the methods at their defaults (StRing S = 683, W = 128; the baselines by STRING
§4.2's protocol), one row; logits compared by relative L2 error. `make gpu-check` (part
correctness, benchmarks/gpu_check_correctness.py) runs it on one 8K row; on CPU (its
smoke) in float32 against longctx's pure-torch path."""

import pytest
import torch

from longctx.config.position_methods import PositionMethodConfig
from longctx.model.hf import import_hf
from longctx.model.position_methods import build_position_method

ARMS = ("rope", "string", "string-repo", "rerope", "self_extend", "dca")
TRAINING_LENGTH = 2048
BF16_BOUND = 3e-2
"""Relative L2 error of the logits in bf16: transformers rotates q/k with bf16 cos/sin,
longctx with float32 ones, and both round every activation to 8 mantissa bits (~4e-3 per
rounding, through 2 layers); float32: 1e-4."""


def relative_error(got: torch.Tensor, expected: torch.Tensor) -> float:
    got, expected = got.double(), expected.double()
    return ((got - expected).norm() / expected.norm()).item()


def assert_hf_functions_match_longctx(directory, device: torch.device, tokens: int, dtype: torch.dtype) -> dict:
    """{arm: relative L2 error} of longctx_<method> against longctx's own model on the same
    weights (flash path on CUDA), each below the bound; raises AssertionError otherwise."""
    import transformers

    import longctx.hf_attention as hfa

    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=1024,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=8,
        num_key_value_heads=4,
        max_position_embeddings=TRAINING_LENGTH,
        initializer_range=0.1,
    )
    transformers.LlamaForCausalLM(config).save_pretrained(directory)
    model = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=dtype).to(device).eval()
    own = import_hf(directory, dtype=dtype, device=device).eval()
    ids = torch.randint(0, config.vocab_size, (1, tokens), device=device)
    bound = BF16_BOUND if dtype == torch.bfloat16 else 1e-4
    errors = {}
    for arm in ARMS:
        method = arm.removesuffix("-repo")
        params = {"compat": "repo"} if arm == "string-repo" else {}
        settings = PositionMethodConfig(name=method)
        for key, value in params.items():
            setattr(getattr(settings, method), key, value)
        hfa.apply(model, method, **params)
        with torch.no_grad():
            got = model(ids).logits
            expected = own(ids, position_method=build_position_method(settings, own.config))
        errors[arm] = relative_error(got, expected)
    worst = max(errors, key=errors.get)
    assert errors[worst] < bound, f"{worst}: relative L2 error {errors[worst]:.2e} >= {bound} ({errors})"
    return errors


@pytest.mark.gpu
def test_registered_functions_in_bf16_match_longctxs_flash_path(tmp_path):
    assert_hf_functions_match_longctx(tmp_path, torch.device("cuda"), 1024, torch.bfloat16)
