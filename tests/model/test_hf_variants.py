"""What real checkpoints use, each on a tiny random model built and saved by transformers:
tied embeddings, attention biases (Llama's on q/k/v/o, Qwen2's on q/k/v), Mistral without
a sliding window, sharded safetensors with an index, pytorch_model*.bin (+ index), EOS as
a list. Our logits equal transformers' to fp32 tolerance, greedy decoding agrees for 32
tokens, and export -> reload in transformers gives the same logits again."""

import json

import pytest
import torch

from longctx.model.hf import export_hf, import_hf
from tests.model.helpers import cached_greedy
from tests.model.hf_models import LAYOUTS, SMALL, VARIANTS, build_hf, save_hf

transformers = pytest.importorskip("transformers")


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("kind", list(VARIANTS))
def test_logits_and_greedy_tokens_equal_transformers(tmp_path, kind, layout):
    hf = build_hf(kind)
    save_hf(hf, tmp_path, layout)
    if layout == "sharded":
        assert (tmp_path / "model.safetensors.index.json").exists() and len(list(tmp_path.glob("*.safetensors"))) > 2
    ours = import_hf(tmp_path).eval()
    config = ours.config
    assert config.tie_embeddings == hf.config.tie_word_embeddings
    assert config.attention_bias == {"llama-bias": "qkvo", "qwen2": "qkv", "qwen2-tied": "qkv"}.get(kind, "none")
    if config.tie_embeddings:
        assert ours.output.weight is ours.tok_embeddings.weight
    ids = torch.randint(0, SMALL["vocab_size"], (2, 96), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        theirs, mine = hf(ids).logits, ours(ids)
    assert theirs.abs().max() > 1.0
    assert (mine - theirs).abs().max() <= 1e-4
    prompt = ids[:, :24]
    expected = hf.generate(prompt, max_new_tokens=32, min_new_tokens=32, do_sample=False, pad_token_id=0)
    assert torch.equal(cached_greedy(ours, prompt, 32), expected[:, 24:])


@pytest.mark.parametrize("kind", list(VARIANTS))
def test_export_reloads_in_transformers_with_equal_logits(tmp_path, kind):
    hf = build_hf(kind)
    save_hf(hf, tmp_path / "in", "sharded")
    exported = export_hf(import_hf(tmp_path / "in"), tmp_path / "out")
    config = json.loads((exported / "config.json").read_text())
    assert config["tie_word_embeddings"] == hf.config.tie_word_embeddings
    with open(exported / "model.safetensors", "rb") as handle:
        names = json.loads(handle.read(int.from_bytes(handle.read(8), "little")))
    assert ("lm_head.weight" in names) != hf.config.tie_word_embeddings
    assert ("model.layers.0.self_attn.q_proj.bias" in names) == (kind != "llama-tied" and kind != "mistral")
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(exported).eval()
    assert type(reloaded).__name__ == ("Qwen2ForCausalLM" if kind.startswith("qwen2") else "LlamaForCausalLM")
    ids = torch.randint(0, SMALL["vocab_size"], (1, 80))
    with torch.no_grad():
        assert (reloaded(ids).logits - hf(ids).logits).abs().max() <= 1e-4


def test_the_biases_and_the_tie_matter(tmp_path):
    """Negative controls: without its q/k/v biases, or with an untied random head, the same
    Qwen2 model's logits are far outside the tolerance the tests above use."""
    hf = build_hf("qwen2-tied")
    save_hf(hf, tmp_path, "single")
    ids = torch.randint(0, SMALL["vocab_size"], (1, 64))
    with torch.no_grad():
        theirs = hf(ids).logits
        unbiased = import_hf(tmp_path)
        for block in unbiased.blocks:
            block.attn.wq.bias.zero_()
        untied = import_hf(tmp_path)
        untied.output.weight = torch.nn.Parameter(torch.randn_like(untied.output.weight) * 0.1)
        assert (unbiased(ids) - theirs).abs().max() > 1e-2
        assert (untied(ids) - theirs).abs().max() > 1e-2


def test_llama_attention_bias_is_not_qwen2s(tmp_path):
    """Llama's attention_bias biases o_proj too: Qwen2 files read as Llama lack o_proj.bias."""
    save_hf(build_hf("qwen2"), tmp_path, "single")
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "model_type": "llama", "attention_bias": True}))
    with pytest.raises(
        ValueError, match=r"model.layers.0.self_attn.o_proj.bias \(for blocks.0.attn.wo.bias\) is missing"
    ):
        import_hf(tmp_path)
