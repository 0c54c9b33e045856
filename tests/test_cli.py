"""The `longctx` command: help, config printing, HF export, error exit codes."""

import subprocess
import sys

import pytest
import torch
import yaml
from safetensors import safe_open

from longctx.cli import main
from longctx.config.model import ModelConfig
from longctx.model.checkpoint import save_model
from longctx.model.hf import import_hf
from longctx.model.llama import Llama


def test_help_lists_the_commands():
    result = subprocess.run([sys.executable, "-m", "longctx", "--help"], capture_output=True, text=True, check=True)
    assert "config" in result.stdout and "export-hf" in result.stdout


def test_config_prints_the_resolved_yaml(capsys):
    assert main(["config", "model.preset=tiny", "train.lr=0.001", "data.window=1024", "train.micro_batch_size=4"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["model"]["d_model"] == 256 and printed["train"]["lr"] == 0.001


def test_config_error_exits_2_with_the_key(capsys):
    assert main(["config", "model.n_head=3"]) == 2
    assert "model.n_head: unknown key" in capsys.readouterr().err


def test_export_hf_from_a_saved_model(tmp_path, capsys):
    model = Llama(ModelConfig.from_preset("debug"))
    save_model(model, tmp_path / "model.safetensors")
    assert main(["export-hf", str(tmp_path / "model.safetensors"), str(tmp_path / "hf")]) == 0
    assert "1.2M parameters" in capsys.readouterr().out
    assert torch.equal(import_hf(tmp_path / "hf").output.weight, model.output.weight)


def test_export_hf_missing_checkpoint(tmp_path, capsys):
    assert main(["export-hf", str(tmp_path / "missing.ckpt"), str(tmp_path / "out")]) == 2
    assert "missing.ckpt does not exist" in capsys.readouterr().err


@pytest.mark.parametrize("dtype", ["bfloat16"])
def test_export_hf_in_bf16(tmp_path, dtype):
    save_model(Llama(ModelConfig.from_preset("debug")), tmp_path / "m.safetensors")
    assert main(["export-hf", str(tmp_path / "m.safetensors"), str(tmp_path / "hf"), "--dtype", dtype]) == 0
    with safe_open(str(tmp_path / "hf" / "model.safetensors"), framework="pt") as handle:
        assert handle.get_tensor("lm_head.weight").dtype == torch.bfloat16
    assert import_hf(tmp_path / "hf").config.vocab_size == 8192


def test_a_bug_keeps_its_traceback(monkeypatch):
    """Only bad input (LongctxError, a missing file) becomes a one-line exit 2; an error
    from a bug in the suite (here a ValueError from deep inside a command) propagates."""
    import longctx.config

    def broken_loader(paths, overrides):
        raise ValueError("internal invariant violated")

    monkeypatch.setattr(longctx.config, "load", broken_loader)
    with pytest.raises(ValueError, match="internal invariant violated"):
        main(["config"])


def test_domain_errors_share_one_base():
    from longctx.data.corpus import CorpusError
    from longctx.data.sft import SFTDataError
    from longctx.data.tokenizer import TokenizerError
    from longctx.errors import CheckpointError, ConfigError, DataError, LongctxError
    from longctx.eval.niah.needles import NiahError
    from longctx.sweep import SweepError

    for error in (
        ConfigError,
        DataError,
        CheckpointError,
        CorpusError,
        NiahError,
        SFTDataError,
        TokenizerError,
        SweepError,
    ):
        assert issubclass(error, LongctxError) and issubclass(error, ValueError), error


def test_niah_checkpoint_path_takes_config_values():
    """A sweep grid point names its own checkpoint: `${train.seed}` in the path is the point's seed."""
    from longctx import config as config_module
    from longctx.cli.common import interpolate as _interpolate
    from longctx.errors import ConfigError

    cfg = config_module.load([], ["train.seed=11", "data.window=256"])
    assert _interpolate("runs/x/w${data.window}_s${train.seed}/last.ckpt", cfg) == "runs/x/w256_s11/last.ckpt"
    assert _interpolate("runs/plain/last.ckpt", cfg) == "runs/plain/last.ckpt"
    with pytest.raises(ConfigError, match="train.nothing"):
        _interpolate("runs/s${train.nothing}/last.ckpt", cfg)
