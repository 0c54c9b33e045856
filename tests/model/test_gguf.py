"""convert-gguf: a tiny llama GGUF written here with the `gguf` package -> our HF directory,
whose logits (through longctx's importer) and tokenizer equal transformers' own
GGUF-loaded model's."""

import json

import numpy as np
import pytest
import torch

from longctx.cli import main
from longctx.model.hf import import_hf
from longctx.model_tokenizer import tokenizer_for_model
from tests.chat_tokenizer import CHATML_TEMPLATE, write_chat_tokenizer

gguf = pytest.importorskip("gguf")
transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

D_MODEL, LAYERS, HEADS, KV_HEADS, D_FF, CONTEXT = 64, 2, 4, 2, 128, 256


def write_tiny_gguf(path, tokenizer_dir) -> int:
    """A float32 llama GGUF with random weights and the chat tokenizer (gpt2-style BPE);
    returns its vocabulary size."""
    spec = json.loads((tokenizer_dir / "tokenizer.json").read_text())
    vocab = spec["model"]["vocab"]
    tokens = sorted(vocab, key=vocab.get)
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]
    special = {t["content"]: t["id"] for t in spec["added_tokens"]}
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("tiny")
    writer.add_context_length(CONTEXT)
    writer.add_embedding_length(D_MODEL)
    writer.add_block_count(LAYERS)
    writer.add_feed_forward_length(D_FF)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_rope_freq_base(100000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_dimension_count(D_MODEL // HEADS)
    writer.add_vocab_size(len(tokens))
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("smollm")
    writer.add_token_list(tokens)
    writer.add_token_types([3 if t in special else 1 for t in tokens])
    writer.add_token_merges(merges)
    writer.add_bos_token_id(special["<|im_start|>"])
    writer.add_eos_token_id(special["<|im_end|>"])
    writer.add_pad_token_id(special["<|endoftext|>"])
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHATML_TEMPLATE)
    rng = np.random.default_rng(0)

    def tensor(name, *shape, ones=False):
        value = np.ones(shape, np.float32) if ones else rng.normal(0, 0.2, shape).astype(np.float32)
        writer.add_tensor(name, value)

    kv_width = KV_HEADS * D_MODEL // HEADS
    tensor("token_embd.weight", len(tokens), D_MODEL)
    for i in range(LAYERS):
        tensor(f"blk.{i}.attn_norm.weight", D_MODEL, ones=True)
        tensor(f"blk.{i}.attn_q.weight", D_MODEL, D_MODEL)
        tensor(f"blk.{i}.attn_k.weight", kv_width, D_MODEL)
        tensor(f"blk.{i}.attn_v.weight", kv_width, D_MODEL)
        tensor(f"blk.{i}.attn_output.weight", D_MODEL, D_MODEL)
        tensor(f"blk.{i}.ffn_norm.weight", D_MODEL, ones=True)
        tensor(f"blk.{i}.ffn_gate.weight", D_FF, D_MODEL)
        tensor(f"blk.{i}.ffn_up.weight", D_FF, D_MODEL)
        tensor(f"blk.{i}.ffn_down.weight", D_MODEL, D_FF)
    tensor("output_norm.weight", D_MODEL, ones=True)
    tensor("output.weight", len(tokens), D_MODEL)  # untied: the importer of this branch refuses tied ones
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return len(tokens)


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    root = tmp_path_factory.mktemp("gguf")
    write_chat_tokenizer(root / "tok", vocab_size=400)
    write_tiny_gguf(root / "tiny.gguf", root / "tok")
    assert main(["convert-gguf", str(root / "tiny.gguf"), str(root / "hf")]) == 0
    return root


def test_converted_directory_has_the_gguf_models_logits(converted):
    reference = transformers.AutoModelForCausalLM.from_pretrained(
        converted, gguf_file="tiny.gguf", dtype=torch.float32
    ).eval()
    ids = torch.randint(0, 400, (2, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = reference(ids).logits
        ours = import_hf(converted / "hf").eval()(ids)
    torch.testing.assert_close(ours, expected, atol=1e-5, rtol=1e-5)
    assert "quantization_config" not in json.loads((converted / "hf" / "config.json").read_text())


def test_converted_directory_brings_the_gguf_tokenizer_and_chat_template(converted):
    gguf_tokenizer = transformers.AutoTokenizer.from_pretrained(converted, gguf_file="tiny.gguf")
    ours = tokenizer_for_model(converted / "hf")
    text = "There is an important info hidden inside. One of the magic numbers is 123456."
    assert ours.encode(text) == gguf_tokenizer.encode(text, add_special_tokens=False)
    assert (ours.bos_id, ours.eos_id) == (gguf_tokenizer.bos_token_id, gguf_tokenizer.eos_token_id)
    assert ours.chat_template == CHATML_TEMPLATE


def test_convert_gguf_names_a_missing_or_foreign_file(tmp_path, capsys):
    assert main(["convert-gguf", str(tmp_path / "none.gguf"), str(tmp_path / "out")]) == 2
    assert f"GGUF file {tmp_path / 'none.gguf'} does not exist" in capsys.readouterr().err
    (tmp_path / "bad.gguf").write_bytes(b"not a gguf file at all")
    assert main(["convert-gguf", str(tmp_path / "bad.gguf"), str(tmp_path / "out")]) == 2
    assert f"{tmp_path / 'bad.gguf'}: not a readable GGUF file: no GGUF magic" in capsys.readouterr().err
