"""Pretraining with a context-extension transform: the rows the model trains on carry ids
beyond the window, and the f(i) probe counts them up to the target length."""

import json

import numpy as np
import pytest
import torch

from longctx.cli import main
from tests.train.helpers import overrides


@pytest.mark.parametrize("method", ["longrecipe", "randpos"])
def test_transformed_pretraining_counts_fi_up_to_the_target_length(workspace, tmp_path, method):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        out = tmp_path / method
        args = overrides(
            workspace,
            out,
            **{
                "data.position_transform": method,
                "model.max_position": 256,
                "data.target_length": 256,
                "train.max_steps": 3,
                "train.checkpoint_every_steps": 3,
                "probe.fi_every_steps": 3,
                "log.wandb_mode": "disabled",
            },
        )
        assert main(["pretrain", *args]) == 0
    finally:
        torch.set_num_threads(threads)
    counts = np.load(out / "fi" / "fi-step-0000003.npz")
    relative = counts["relative"]
    assert len(relative) == 256 and relative[64:].sum() > 0  # distances no 64-token row holds contiguously
    assert int(counts["overflow"]) == 0
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert any("train/loss" in row for row in metrics)
