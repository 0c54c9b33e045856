"""Each registered function in bfloat16 on CUDA against longctx's own flash path (`gpu`;
skipped without CUDA): a random Llama (2 layers, 8 heads / 4 KV of 32) whose training length
is 2,048, the methods at their defaults (StRing S = 683, W = 128; the baselines by STRING
§4.2's protocol), one row; logits compared by relative L2 error. `make gpu-check` (part
correctness, tools/gpu/gpu_check_correctness.py) runs it on one 8K row; on CPU (its
smoke) in float32 against longctx's pure-torch path."""

import pytest
import torch

from longctx.gpu_checks import assert_hf_functions_match_longctx


@pytest.mark.gpu
def test_registered_functions_in_bf16_match_longctxs_flash_path(tmp_path):
    assert_hf_functions_match_longctx(tmp_path, torch.device("cuda"), 1024, torch.bfloat16)
