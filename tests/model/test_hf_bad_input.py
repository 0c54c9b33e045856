"""Truncated or corrupted weight files, a shard missing from an index, a directory without
weights: each an error naming the file and what is wrong, raised before the model is
allocated or any tensor read."""

import json
import re

import pytest
import torch

from longctx.cli import main
from longctx.config.model import ModelConfig, config_dict
from longctx.errors import CheckpointError
from longctx.model import hf as hf_module
from longctx.model.checkpoint import load_model, save_model
from longctx.model.hf import export_hf, import_hf
from longctx.model.llama import Llama
from longctx.model.weight_files import SafetensorsFile


@pytest.fixture
def model():
    return Llama(ModelConfig.from_preset("debug", vocab_size=256))


@pytest.fixture
def no_allocation(monkeypatch):
    """Fail the test if the loader reads a tensor or allocates the model."""

    def refuse(*args, **kwargs):
        raise AssertionError("a tensor was read or the model allocated before the files were checked")

    monkeypatch.setattr(SafetensorsFile, "read", refuse)
    monkeypatch.setattr(hf_module, "materialize", refuse)


def truncate(path, keep: int) -> None:
    data = path.read_bytes()
    path.write_bytes(data[:keep])


def lightning_checkpoint(model, path):
    torch.save(
        {
            "state_dict": {f"model.{k}": v for k, v in model.state_dict().items()},
            "hyper_parameters": {"model": config_dict(model.config)},
        },
        path,
    )


@pytest.mark.parametrize("damage", ["truncated", "garbage"])
def test_a_broken_ckpt_names_the_file(model, tmp_path, damage, capsys):
    path = tmp_path / "last.ckpt"
    lightning_checkpoint(model, path)
    if damage == "truncated":
        truncate(path, path.stat().st_size // 2)
    else:
        path.write_bytes(b"\x00not a checkpoint" * 100)
    with pytest.raises(CheckpointError, match=re.escape(f"{path}: cannot be read as a torch checkpoint: ")):
        load_model(path)
    assert main(["export-hf", str(path), str(tmp_path / "out"), "--tokenizer", "none"]) == 2
    assert f"{path}: cannot be read as a torch checkpoint" in capsys.readouterr().err


@pytest.mark.parametrize(
    "damage, message",
    [
        ("truncated", "ends at data byte {end}, the file holds {held}: the file is truncated"),
        ("short", "too short for a safetensors header"),
        ("header-length", "header length 18446744073709551615 exceeds the file's"),
        ("header-json", "the safetensors header is not valid JSON"),
        ("header-offsets", "spans bytes 0..4, but F32 [256, 64] needs 65536"),
    ],
)
def test_a_broken_safetensors_file_names_the_file(model, tmp_path, damage, message, no_allocation):
    path = save_model(model, tmp_path / "model.safetensors")
    data = path.read_bytes()
    header_length = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + header_length])
    end = max(entry["data_offsets"][1] for name, entry in header.items() if name != "__metadata__")
    if damage == "truncated":
        path.write_bytes(data[:-100])
    elif damage == "short":
        path.write_bytes(data[:5])
    elif damage == "header-length":
        path.write_bytes(b"\xff" * 8 + data[8:])
    elif damage == "header-json":
        path.write_bytes(data[:8] + b"{" * header_length + data[8 + header_length :])
    else:
        header["tok_embeddings.weight"]["data_offsets"] = [0, 4]
        text = json.dumps(header, separators=(",", ":")).encode().ljust(header_length)
        path.write_bytes(data[:8] + text + data[8 + header_length :])
    expected = message.format(end=end, held=len(data) - 100 - 8 - header_length)
    with pytest.raises(CheckpointError, match=re.escape(f"{path}: ") + ".*" + re.escape(expected)):
        load_model(path)


def test_a_truncated_last_shard_fails_before_any_tensor_is_read(model, tmp_path, no_allocation):
    transformers = pytest.importorskip("transformers")
    hf = transformers.LlamaForCausalLM(
        transformers.LlamaConfig(
            vocab_size=256,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
        )
    )
    hf.save_pretrained(tmp_path, max_shard_size="40KB")
    last = sorted(tmp_path.glob("model-*.safetensors"))[-1]
    truncate(last, last.stat().st_size - 10)
    with pytest.raises(CheckpointError, match=re.escape(str(last)) + ".*the file is truncated"):
        import_hf(tmp_path)


def test_a_shard_missing_from_the_index_is_named(model, tmp_path, no_allocation):
    export_hf(model, tmp_path)
    weight_map = {"model.embed_tokens.weight": "model.safetensors", "lm_head.weight": "model-00002.safetensors"}
    index = tmp_path / "model.safetensors.index.json"
    index.write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    with pytest.raises(CheckpointError, match=re.escape(f"{index}: names shard(s) ['model-00002.safetensors']")):
        import_hf(tmp_path)


def test_a_directory_without_weights_names_what_it_looked_for(model, tmp_path, capsys):
    export_hf(model, tmp_path)
    (tmp_path / "model.safetensors").unlink()
    with pytest.raises(
        CheckpointError,
        match="no weights: looked for model.safetensors.index.json, \\*.safetensors, "
        "pytorch_model.bin.index.json and pytorch_model\\*.bin",
    ):
        import_hf(tmp_path)


def test_a_corrupted_bin_names_the_file(model, tmp_path):
    export_hf(model, tmp_path)
    (tmp_path / "model.safetensors").unlink()
    (tmp_path / "pytorch_model.bin").write_bytes(b"PK\x03\x04 broken zip")
    with pytest.raises(CheckpointError, match=re.escape(f"{tmp_path / 'pytorch_model.bin'}: cannot be read")):
        import_hf(tmp_path)


def test_a_wrong_shape_names_the_file_and_tensor(model, tmp_path, no_allocation):
    export_hf(model, tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "vocab_size": 512}))
    with pytest.raises(
        CheckpointError,
        match=re.escape(
            f"{tmp_path / 'model.safetensors'}: model.embed_tokens.weight has shape (256, 64), expected (512, 64)"
        ),
    ):
        import_hf(tmp_path)
