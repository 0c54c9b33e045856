"""`longctx pretrain` of a tiny 3:1 hybrid (three Gated DeltaNet layers to one full) on CPU,
one process: the loss falls, and the f(i) probe logs the full layers' f(i) under their
layer type's name beside the unchanged `fi/f@...`."""

import json

from longctx.cli import main
from tests.train.helpers import STEPS, losses, overrides


def test_a_hybrid_pretrains_with_falling_loss_and_full_layer_fi(workspace, tmp_path):
    out = tmp_path / "hybrid"
    extra = {
        "model.n_layers": 4,
        "model.linear_attention.full_every": 4,
        "model.linear_attention.variant": "qwen3_next",
        "model.linear_attention.n_key_heads": 2,
        "model.linear_attention.n_value_heads": 4,
        "model.linear_attention.chunk_size": 16,
        "log.wandb_mode": "disabled",
    }
    assert main(["pretrain", *overrides(workspace, out, **extra)]) == 0
    loss = losses(out)
    assert loss[STEPS] < loss[1] - 0.2, loss
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    fi = [row for row in rows if "fi/full_f@L/4" in row]
    assert fi and all(row["fi/full_f@L/4"] == row["fi/f@L/4"] > 0 for row in fi)
