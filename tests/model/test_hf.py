"""Hugging Face interop: logits equal transformers' LlamaForCausalLM on exported weights."""

import dataclasses
import json

import pytest
import torch

from longctx.config.model import ModelConfig
from longctx.model.checkpoint import load_model, save_model
from longctx.model.hf import export_hf, import_hf
from longctx.model.llama import Llama
from longctx.model.rope import RopeScaling

transformers = pytest.importorskip("transformers")

SCALINGS = {
    "none": RopeScaling(),
    "linear": RopeScaling("linear", factor=2.0),
    "ntk": RopeScaling("ntk", factor=4.0),
    "yarn": RopeScaling("yarn", factor=4.0, original_max_position=128),
    "llama3": RopeScaling("llama3", factor=8.0, original_max_position=128, low_freq_factor=1.0, high_freq_factor=4.0),
}


def hf_logits(directory, ids):
    hf = transformers.LlamaForCausalLM.from_pretrained(directory, attn_implementation="eager").eval()
    with torch.no_grad():
        return hf(ids).logits


def random_model(preset, **overrides):
    # init_std 0.1: logits of several units, so a wrong frequency or norm is far above 1e-4.
    return Llama(ModelConfig.from_preset(preset, init_std=0.1, **overrides)).eval()


@pytest.mark.parametrize("scaling", list(SCALINGS))
@pytest.mark.parametrize("kv_heads", [2, 4], ids=["gqa", "mha"])
def test_debug_logits_match_transformers(tmp_path, scaling, kv_heads):
    model = random_model("debug", n_kv_heads=kv_heads, rope_base=50000.0, rope_scaling=SCALINGS[scaling])
    ids = torch.randint(0, model.config.vocab_size, (2, 300))  # beyond the 128-token original context
    export_hf(model, tmp_path)
    with torch.no_grad():
        ours = model(ids)
    theirs = hf_logits(tmp_path, ids)
    assert ours.abs().max() > 1.0
    assert (ours - theirs).abs().max() <= 1e-4


@pytest.mark.parametrize("scaling", ["none", "yarn", "llama3"])
def test_tiny_logits_match_transformers(tmp_path, scaling):
    model = random_model("tiny", rope_scaling=SCALINGS[scaling])
    ids = torch.randint(0, model.config.vocab_size, (1, 256))
    export_hf(model, tmp_path)
    with torch.no_grad():
        ours = model(ids)
    assert (ours - hf_logits(tmp_path, ids)).abs().max() <= 1e-4


def test_parity_check_detects_a_wrong_rope_base(tmp_path):
    """Negative control: the same weights under another base are far outside tolerance."""
    model = random_model("debug")
    export_hf(model, tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["rope_theta"] = 20000.0
    config.pop("longctx_rope_scaling")
    (tmp_path / "config.json").write_text(json.dumps(config))
    ids = torch.randint(0, model.config.vocab_size, (1, 64))
    with torch.no_grad():
        assert (model(ids) - hf_logits(tmp_path, ids)).abs().max() > 1e-2


@pytest.mark.parametrize("scaling", list(SCALINGS))
def test_export_import_round_trip(tmp_path, scaling):
    model = random_model("debug", rope_scaling=SCALINGS[scaling])
    restored = import_hf(export_hf(model, tmp_path))
    assert restored.config == model.config
    for (name, a), (_, b) in zip(model.state_dict().items(), restored.state_dict().items(), strict=True):
        assert torch.equal(a, b), name


def test_import_of_a_transformers_saved_model(tmp_path):
    """A directory written by transformers itself (no longctx keys) loads and agrees."""
    hf_config = transformers.LlamaConfig(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=1,
        rope_theta=30000.0,
        max_position_embeddings=256,
        tie_word_embeddings=False,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 4.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
    )
    hf = transformers.LlamaForCausalLM(hf_config).eval()
    hf.save_pretrained(tmp_path)
    ours = import_hf(tmp_path)
    assert ours.config.rope_scaling.type == "llama3" and ours.config.rope_base == 30000.0
    ids = torch.randint(0, 512, (1, 100))
    with torch.no_grad():
        assert (ours(ids) - hf(ids).logits).abs().max() <= 1e-4


def test_save_and_load_longctx_safetensors(tmp_path):
    model = random_model("debug", rope_scaling=SCALINGS["yarn"])
    path = save_model(model, tmp_path / "model.safetensors")
    loaded = load_model(path)
    assert loaded.config == model.config
    ids = torch.randint(0, model.config.vocab_size, (1, 16))
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids), model(ids))


def test_lightning_style_checkpoint_loads_weights_only(tmp_path):
    model = random_model("debug")
    checkpoint = {
        "state_dict": {f"model.{k}": v for k, v in model.state_dict().items()},
        "hyper_parameters": {"model": dataclasses.asdict(model.config)},
    }
    torch.save(checkpoint, tmp_path / "last.ckpt")
    loaded = load_model(tmp_path / "last.ckpt")
    assert torch.equal(loaded.output.weight, model.output.weight)


class NotAllowed:
    pass


def test_checkpoint_with_arbitrary_objects_is_refused(tmp_path):
    torch.save({"state_dict": {}, "hyper_parameters": {"model": NotAllowed()}}, tmp_path / "evil.ckpt")
    with pytest.raises(Exception, match="[Ww]eights only load failed|Unsupported global"):
        load_model(tmp_path / "evil.ckpt")


def test_import_errors_name_the_tensor(tmp_path):
    model = random_model("debug")
    export_hf(model, tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["longctx_rope_scaling"]["type"] = "none"
    config["intermediate_size"] = 128
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"model.layers.0.mlp.gate_proj.weight has shape \(256, 64\)"):
        import_hf(tmp_path)
