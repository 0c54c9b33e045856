"""An exported HF directory a user can load: AutoTokenizer + AutoModelForCausalLM generate
until EOS; import_hf refuses configs our Llama cannot represent, naming the field."""

import json
import re

import pytest
import torch

from longctx.cli import main
from longctx.config.model import ModelConfig, config_dict
from longctx.data.corpus import embedded_documents
from longctx.data.tokenizer import load_tokenizer, train_bpe
from longctx.model.checkpoint import save_model
from longctx.model.hf import export_hf, import_hf
from longctx.model.inference.prefill import greedy_generate_recompute
from longctx.model.llama import Llama

transformers = pytest.importorskip("transformers")

TEXT = "The river ran past the old mill, and 123456 was the number on the door."


@pytest.fixture(scope="module")
def bpe_file(tmp_path_factory):
    texts = [doc.text for _, doc in zip(range(30), embedded_documents(("prose",)), strict=False)]
    path = tmp_path_factory.mktemp("bpe") / "tokenizer.json"
    train_bpe(texts, vocab_size=512, path=path)
    return path


@pytest.fixture(scope="module")
def tokenizer(bpe_file):
    return load_tokenizer(str(bpe_file))  # what data.tokenizer=<path> gives a training run


def _model() -> Llama:
    torch.manual_seed(0)
    return Llama(ModelConfig.from_preset("debug", vocab_size=512, init_std=0.1)).eval()


def _make_eos_the_kth_greedy_token(model: Llama, prompt: torch.Tensor, eos_id: int) -> list[int]:
    """Swap two rows of the output layer so that greedy decoding emits EOS after a few
    ordinary tokens; returns what our own decoding then yields up to and including EOS."""
    before = greedy_generate_recompute(model, prompt, 12)[0].tolist()
    k = next(k for k in range(3, 12) if before[k] not in before[:k] and eos_id not in before[: k + 1])
    with torch.no_grad():
        weight = model.output.weight
        weight[[eos_id, before[k]]] = weight[[before[k], eos_id]]
    after = greedy_generate_recompute(model, prompt, k + 1)[0].tolist()
    assert after == [*before[:k], eos_id]  # the reference continuation: k tokens, then EOS
    return after


def test_auto_classes_load_the_export_and_generate_until_eos(tokenizer, tmp_path):
    model = _model()
    prompt_ids = tokenizer.encode(TEXT)
    expected = _make_eos_the_kth_greedy_token(model, torch.tensor([prompt_ids]), tokenizer.eos_id)
    export_hf(model, tmp_path, tokenizer=tokenizer)

    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path)
    assert hf_tokenizer(TEXT)["input_ids"] == prompt_ids  # no BOS/EOS added, same pieces
    assert hf_tokenizer.decode(prompt_ids) == tokenizer.decode(prompt_ids)
    assert (hf_tokenizer.eos_token_id, hf_tokenizer.pad_token_id) == (tokenizer.eos_id, tokenizer.pad_id)

    hf_model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert (hf_model.generation_config.eos_token_id, hf_model.generation_config.pad_token_id) == (
        tokenizer.eos_id,
        tokenizer.pad_id,
    )
    inputs = hf_tokenizer(TEXT, return_tensors="pt")
    with torch.no_grad():
        generated = hf_model.generate(**inputs, max_new_tokens=30, do_sample=False)
    assert generated[0, len(prompt_ids) :].tolist() == expected  # stopped at EOS, not after 30 tokens


def test_cli_exports_the_tokenizer_the_checkpoint_was_trained_with(bpe_file, tokenizer, tmp_path, capsys):
    model = _model()
    checkpoint = {
        "state_dict": {f"model.{k}": v for k, v in model.state_dict().items()},
        "hyper_parameters": {"model": config_dict(model.config), "experiment": {"data": {"tokenizer": str(bpe_file)}}},
    }
    torch.save(checkpoint, tmp_path / "last.ckpt")
    assert main(["export-hf", str(tmp_path / "last.ckpt"), str(tmp_path / "hf")]) == 0
    assert "generation_config.json" in capsys.readouterr().out
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert (config["eos_token_id"], config["pad_token_id"], config["bos_token_id"]) == (
        tokenizer.eos_id,
        tokenizer.pad_id,
        None,
    )
    assert json.loads((tmp_path / "hf" / "tokenizer.json").read_text()) == json.loads(bpe_file.read_text())


def test_cli_refuses_a_tokenizer_larger_than_the_model(bpe_file, tmp_path, capsys):
    save_model(Llama(ModelConfig.from_preset("debug", vocab_size=256)), tmp_path / "m.safetensors")
    assert main(["export-hf", str(tmp_path / "m.safetensors"), str(tmp_path / "hf"), "--tokenizer", str(bpe_file)]) == 2
    assert "has 512 tokens, the model's vocab_size is 256" in capsys.readouterr().err


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"hidden_act": "gelu"}, "hidden_act='gelu' is not supported"),
        ({"mlp_bias": True}, "mlp_bias=true is not supported"),
        ({"pretraining_tp": 2}, "pretraining_tp=2 is not supported"),
        ({"model_type": "gemma"}, "model_type is 'gemma', expected one of"),
        ({"head_dim": 33}, "head_dim=33 is not supported: RoPE needs an even head_dim"),
        ({"model_type": "mistral", "sliding_window": 256}, "sliding_window=256 is not supported"),
        ({"model_type": "qwen2", "use_sliding_window": True}, "use_sliding_window=true is not supported"),
        ({"model_type": "qwen2", "layer_types": ["full_attention", "sliding_attention"]}, "layer_types[1]="),
        ({"eos_token_id": [2, "</s>"]}, 'eos_token_id=[2, "</s>"] is not a token id'),
        (
            {"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}},
            "rope_scaling.rope_type='dynamic' is not supported",
        ),
        (
            {"rope_scaling": {"rope_type": "longrope", "factor": 2.0}},
            "rope_scaling.rope_type='longrope' is not supported",
        ),
        (
            {
                "rope_scaling": {
                    "rope_type": "yarn",
                    "factor": 4.0,
                    "mscale": 0.7,
                    "original_max_position_embeddings": 64,
                }
            },
            "rope_scaling.mscale=0.7 is not supported",
        ),
    ],
)
def test_import_refuses_what_it_cannot_represent(tmp_path, fields, message):
    export_hf(_model(), tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    for key in ("longctx_rope_scaling", "longctx_rope_base"):  # a config as transformers writes it
        config.pop(key)
    config.update(fields)
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=re.escape(f"config.json: {message}")):
        import_hf(tmp_path)


def test_cli_asks_for_the_tokenizer_when_the_file_does_not_record_it(tmp_path, capsys):
    save_model(Llama(ModelConfig.from_preset("debug", vocab_size=300)), tmp_path / "m.safetensors")
    assert main(["export-hf", str(tmp_path / "m.safetensors"), str(tmp_path / "hf")]) == 2
    assert "does not record its tokenizer" in capsys.readouterr().err
    assert main(["export-hf", str(tmp_path / "m.safetensors"), str(tmp_path / "hf"), "--tokenizer", "none"]) == 0
    assert "no tokenizer written" in capsys.readouterr().out


@pytest.mark.parametrize("key", ["config", "experiment"])
def test_experiment_settings_read_current_and_earlier_checkpoints(tmp_path, key):
    """Training checkpoints record the experiment under hyper_parameters["config"]; those of
    earlier versions under "experiment". Both are read; weights-only files hold none."""
    from longctx.model.checkpoint import experiment_settings

    path = tmp_path / "last.ckpt"
    torch.save({"hyper_parameters": {key: {"data": {"tokenizer": "bpe-512"}}}}, path)
    assert experiment_settings(path) == {"data": {"tokenizer": "bpe-512"}}
    torch.save({"hyper_parameters": {"model": {}}}, path)
    assert experiment_settings(path) is None
    assert experiment_settings(tmp_path / "model.safetensors") is None
