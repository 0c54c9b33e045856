"""Resume checks compatibility first (train/resume_check.py, issue 37 item 4): a changed
shape, vocabulary, window or position setting is named, checkpoint value against the
run's, before any state is loaded; the keys that may change are accepted."""

import lightning as L
import pytest
import torch

from longctx.cli import main
from longctx.config import load
from longctx.train.resume_check import resume_mismatches
from tests.train.helpers import overrides


@pytest.fixture(scope="module")
def short_run(workspace):
    out = workspace / "resume-check"
    args = overrides(workspace, out, **{"train.max_steps": 2, "probe.fi": False, "log.wandb_mode": "disabled"})
    assert main(["pretrain", *args]) == 0
    return args, out / "checkpoints" / "last.ckpt"


def test_changed_shapes_window_and_positions_are_all_named_before_any_state_loads(
    short_run, tmp_path, monkeypatch, capsys
):
    args, checkpoint = short_run

    def no_fit(*args, **kwargs):
        raise AssertionError("Trainer.fit ran: the state was being loaded")

    monkeypatch.setattr(L.Trainer, "fit", no_fit)
    changed = {
        "model.n_layers": 3,
        "data.window": 32,
        "model.rope_base": 50000.0,
        "data.position_transform": "randpos",
        "data.target_length": 48,
    }
    new_args = [a for a in args if not a.startswith(tuple(f"{k}=" for k in changed))]
    new_args += [f"{key}={value}" for key, value in changed.items()] + [f"train.resume={checkpoint}"]
    assert main(["pretrain", *new_args]) == 2
    error = capsys.readouterr().err
    for line in (
        "model.n_layers: checkpoint 2, this run 3",
        "data.window: checkpoint 64, this run 32",
        "model.rope_base: checkpoint 10000.0, this run 50000.0",
        "data.position_transform: checkpoint 'none', this run 'randpos'",
        "data.target_length: checkpoint 64, this run 48",  # 0 resolves to model.max_position
    ):
        assert line in error, line
    assert f"init={checkpoint}" in error
    assert "train.max_steps" not in error and "model.attention_backend" not in error


def test_keys_that_may_change_on_resume_are_accepted(short_run):
    args, checkpoint = short_run
    saved = torch.load(checkpoint, map_location="cpu", weights_only=True)["hyper_parameters"]["config"]
    assert resume_mismatches(saved, load([], args)) == []
    changed = load(
        [],
        [
            *args,
            "train.max_steps=50",
            "train.checkpoint_every_steps=7",
            "log.every_steps=5",
            "probe.fi_every_steps=3",
            "probe.fi=true",
            "train.devices=2",
            "train.num_nodes=2",
            "train.loader_workers=2",
        ],
    )
    assert resume_mismatches(saved, changed) == []
    assert resume_mismatches(saved, load([], [*args, "data.tokenizer=bpe-8192"])) == [
        f"data.tokenizer: checkpoint {saved['data']['tokenizer']!r}, this run 'bpe-8192'"
    ]
