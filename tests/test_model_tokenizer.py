"""tokenizer_for_model: the tokenizer comes with the model (an HF directory's own files, a
run's recorded data.tokenizer), the user's overrides it with a warning, and a tokenizer with
more ids than the model's embedding rows is an error naming both."""

import pytest
import torch
from tokenizers import Tokenizer as HfTokenizer

from longctx.config import ExperimentConfig, as_dict
from longctx.config.model import ModelConfig, config_dict
from longctx.data.tokenizer import TokenizerError
from longctx.model.checkpoint import save_model
from longctx.model.llama import Llama
from longctx.model_tokenizer import tokenizer_for_model
from tests.chat_tokenizer import CHATML_TEMPLATE, write_chat_tokenizer, write_hf_config


@pytest.fixture(scope="module")
def chat_dir(tmp_path_factory):
    directory = write_chat_tokenizer(tmp_path_factory.mktemp("chat"), vocab_size=400, add_bos_token=True)
    return write_hf_config(directory, vocab_size=416)  # padded embedding: more rows than ids


def test_hf_directory_brings_its_tokenizer_and_its_special_tokens(chat_dir):
    tokenizer = tokenizer_for_model(chat_dir)
    reference = HfTokenizer.from_file(str(chat_dir / "tokenizer.json"))
    assert tokenizer.vocab_size == 400
    assert (tokenizer.bos_id, tokenizer.eos_id) == (
        reference.token_to_id("<|im_start|>"),
        reference.token_to_id("<|im_end|>"),
    )
    assert tokenizer.add_bos is True
    assert tokenizer.chat_template == CHATML_TEMPLATE
    text = "The 4 magic numbers."
    assert tokenizer.encode(text) == reference.encode(text, add_special_tokens=False).ids
    assert tokenizer.encode_template("<|im_start|>user") == [1, *reference.encode("user").ids]


def test_hf_directory_without_a_tokenizer_is_a_named_error(tmp_path):
    write_hf_config(tmp_path / "m", vocab_size=8192)
    with pytest.raises(TokenizerError, match=f"{tmp_path / 'm'} has no tokenizer.json"):
        tokenizer_for_model(tmp_path / "m")
    assert tokenizer_for_model(tmp_path / "m", override="bpe-8192").vocab_size == 8192


def test_a_tokenizer_larger_than_the_embedding_names_both_numbers_and_files(chat_dir, tmp_path):
    small = write_hf_config(write_chat_tokenizer(tmp_path / "small", vocab_size=400), vocab_size=300)
    with pytest.raises(
        TokenizerError, match=f"has 400 tokens, the model's vocab_size is 300 \\({small}/config.json\\)"
    ):
        tokenizer_for_model(small)


def test_the_users_tokenizer_overrides_the_models_with_a_warning(chat_dir, tmp_path, caplog):
    other = write_chat_tokenizer(tmp_path / "other", vocab_size=380)
    with caplog.at_level("WARNING"):
        tokenizer = tokenizer_for_model(chat_dir, override=str(other))
    assert tokenizer.vocab_size == 380
    assert f"overrides the tokenizer of {chat_dir}" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING"):
        tokenizer_for_model(chat_dir, override=str(chat_dir / "tokenizer.json"))
    assert caplog.text == ""  # the same definition: nothing to warn about


def test_training_checkpoints_and_files_that_record_nothing(tmp_path):
    model = Llama(ModelConfig.from_preset("debug", vocab_size=512))
    experiment = as_dict(ExperimentConfig())
    experiment["data"]["tokenizer"] = "bpe-512"
    ckpt = tmp_path / "last.ckpt"
    torch.save({"state_dict": {}, "hyper_parameters": {"config": experiment, "model": config_dict(model.config)}}, ckpt)
    assert tokenizer_for_model(ckpt).name == "bpe-512"
    save_model(model, tmp_path / "m.safetensors")
    with pytest.raises(TokenizerError, match="does not record its tokenizer and its vocab_size 512"):
        tokenizer_for_model(tmp_path / "m.safetensors")
    assert tokenizer_for_model(tmp_path / "m.safetensors", override="bpe-512").vocab_size == 512
    assert tokenizer_for_model("", override=None).name == "bpe-8192"
