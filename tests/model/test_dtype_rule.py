"""The dtype rule at the attention boundary: under autocast (bf16-mixed) and bf16-true the
kernels get q, k and v in one dtype (RoPE runs in fp32 and is cast back), and the model's
output stays close to its fp32 run."""

import pytest
import torch

from longctx.config.model import ModelConfig
from longctx.model import attention as attention_module
from longctx.model.llama import Llama
from longctx.model.position_methods import cpu as passes_cpu
from longctx.model.position_methods import rerope_method, string_method
from tests.helpers import packed_document_ids, reset_position_ids


def record_dtypes(monkeypatch) -> list:
    seen = []
    for module, name in (
        (attention_module, "_sdpa_attention"),
        (attention_module, "_varlen_attention"),
        (passes_cpu, "_kernel"),
    ):
        original = getattr(module, name)

        def recording(q, k, v, *args, _original=original, **kwargs):
            seen.append((q.dtype, k.dtype, v.dtype))
            return _original(q, k, v, *args, **kwargs)

        monkeypatch.setattr(module, name, recording)
    return seen


METHODS = {
    "rope": lambda model: None,
    "string": lambda model: string_method(model.rope, 12, 3),
    "rerope": lambda model: rerope_method(model.rope, 8, 16),
}


@pytest.mark.parametrize("precision", ["bf16-mixed", "bf16-true"])
@pytest.mark.parametrize("backend", ["sdpa", "varlen"])
@pytest.mark.parametrize("method_name", list(METHODS))
def test_kernels_get_one_dtype_and_match_fp32(precision, backend, method_name, monkeypatch):
    torch.manual_seed(0)
    model = Llama(ModelConfig.from_preset("debug", max_position=32, init_std=0.1))
    method = METHODS[method_name](model)
    lengths = [20, 28]
    ids = torch.randint(0, 8192, (1, 48))
    options = {
        "position_ids": reset_position_ids(lengths),
        "document_ids": packed_document_ids(lengths),
        "attention_backend": backend,
        "position_method": method,
    }
    with torch.no_grad():
        reference = model(ids, **options)
        seen = record_dtypes(monkeypatch)
        if precision == "bf16-mixed":
            with torch.autocast("cpu", dtype=torch.bfloat16):
                got = model(ids, **options)
        else:
            got = model.to(torch.bfloat16)(ids, **options)
    assert seen and all(dtypes == (torch.bfloat16,) * 3 for dtypes in seen), seen
    error = (got.float() - reference).abs().max() / reference.abs().max()
    assert error < 0.05, f"bf16 logits differ from fp32 by {error:.3f} of their range"
