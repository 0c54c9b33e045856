"""Gemma 3 270M (pretrained, Q4_K_M dequantized to float32; `make real-model-gemma3`), a
hybrid model (15 sliding layers of window 512, 3 full): longctx's import of the converted
directory against transformers' Gemma3ForCausalLM on the same files, in float32, on a prompt
past the sliding window; the same greedy tokens through longctx's engine (KV cache, its
sliding layers keeping their last keys) as transformers' `generate`. Skipped when the
converted directory is absent (it is never downloaded by the test suite)."""

import pytest
import torch

from longctx.eval.niah.haystack import paul_graham_text
from longctx.model.gguf import cache_root
from longctx.model.hf import import_hf
from longctx.model.inference.generation import generate
from longctx.model_tokenizer import tokenizer_for_model

pytestmark = pytest.mark.slow
transformers = pytest.importorskip("transformers")

DIRECTORY = cache_root() / "hf" / "gemma3-270m"
if not (DIRECTORY / "config.json").is_file():
    pytest.skip(f"{DIRECTORY} is absent: `make real-model-gemma3` converts it", allow_module_level=True)

LENGTH, KEEP = 700, 256
"""Positions 444..699 are compared: from inside the first window to 188 tokens past it."""
PROMPTS = ("The capital of France is", "def fibonacci(n):", "The first law of thermodynamics states that")


def with_bos(tokenizer, text: str) -> list[int]:
    """The checkpoint's BOS (id 2, `<bos>`: its tokenizer adds it, as transformers' does), then the text."""
    assert tokenizer.add_bos and tokenizer.bos_id == 2
    return [tokenizer.bos_id, *tokenizer.encode(text)]


@pytest.fixture(scope="module")
def models():
    torch.manual_seed(0)
    reference = transformers.AutoModelForCausalLM.from_pretrained(
        DIRECTORY, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    return reference, import_hf(DIRECTORY).eval(), tokenizer_for_model(DIRECTORY)


def test_import_equals_transformers_in_float32_past_the_sliding_window(models):
    reference, ours, tokenizer = models
    ids = with_bos(tokenizer, paul_graham_text()[:20_000])[:LENGTH]
    assert len(ids) == LENGTH
    batch = torch.tensor([ids])
    with torch.no_grad():
        expected = reference(batch, logits_to_keep=KEEP).logits[0]
        got = ours(batch)[0, -KEEP:]
    difference = (got - expected).abs().max().item()
    # Bound 1e-3 on logits up to 40.7 (measured 1.1e-4: float32 over 18 layers, transformers'
    # eager attention against longctx's; a wrong window, RoPE base or norm moves them by >0.1).
    assert difference < 1e-3, f"max |logit difference| {difference:.3g}"
    assert torch.equal(got.argmax(-1), expected.argmax(-1))


def test_greedy_tokens_equal_transformers_generate(models):
    reference, ours, tokenizer = models
    prompts = [with_bos(tokenizer, text) for text in PROMPTS]
    with torch.no_grad():
        own = generate(ours, prompts, max_new_tokens=16, batch_size=1)
        for prompt, generation in zip(prompts, own, strict=True):
            hf = reference.generate(
                torch.tensor([prompt]), max_new_tokens=16, do_sample=False, eos_token_id=None, pad_token_id=0
            )[0, len(prompt) :].tolist()
            assert generation.token_ids == hf[: len(generation.token_ids)], tokenizer.decode(prompt)
    assert tokenizer.decode(own[0].token_ids).startswith(" the capital of the country of France.")
