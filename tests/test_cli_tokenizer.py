"""Every command takes its tokenizer from the one lookup (longctx/model_tokenizer.py): `pretrain
init=DIR` and `sft init=DIR` write their data in the HF directory's own tokenizer, and the
user's data.tokenizer overrides it."""

import pytest

from longctx.cli import main
from tests.chat_tokenizer import write_chat_tokenizer, write_hf_config


@pytest.fixture
def hf_dir(tmp_path):
    return write_hf_config(write_chat_tokenizer(tmp_path / "hf", vocab_size=400), vocab_size=400)


@pytest.mark.parametrize("command", ["pretrain", "sft"])
def test_init_from_an_hf_directory_uses_its_tokenizer(command, hf_dir, tmp_path, monkeypatch):
    other = write_chat_tokenizer(tmp_path / "other", vocab_size=380)
    seen = {}

    class Done(Exception):
        pass

    def capture(cfg, *args):
        seen["tokenizer"] = args[-1]
        raise Done

    monkeypatch.setattr("longctx.train.trainer.pretrain", capture)
    monkeypatch.setattr("longctx.data.dataset_sources.prepared_sources", lambda cfg, tokenizer: [])
    monkeypatch.setattr("longctx.train.sft.finetune", capture)
    with pytest.raises(Done):
        main([command, f"init={hf_dir}"])
    assert (seen["tokenizer"].name, seen["tokenizer"].vocab_size) == (str(hf_dir), 400)
    with pytest.raises(Done):
        main([command, f"init={hf_dir}", f"data.tokenizer={other}"])
    assert (seen["tokenizer"].name, seen["tokenizer"].vocab_size) == (str(other), 380)


def test_niah_on_an_hf_directory_without_a_tokenizer_is_a_named_error(tmp_path, capsys):
    write_hf_config(tmp_path / "bare", vocab_size=400)
    assert main(["niah", str(tmp_path / "bare"), "--lengths", "256", "log.wandb_mode=disabled"]) == 2
    assert f"{tmp_path / 'bare'} has no tokenizer.json" in capsys.readouterr().err
