"""`longctx pretrain` of a tiny 3:1 hybrid (three Gated DeltaNet layers to one full) on CPU,
one process: the loss falls, a run stopped at step 3 and resumed repeats the uninterrupted
losses, and the f(i) probe logs the full layers' f(i) under their layer type's name beside
`fi/f@...`, which a model without linear layers logs alone, with the same counts."""

import json

from longctx.cli import main
from tests.train.helpers import STEPS, losses, overrides

LINEAR = {
    "model.n_layers": 4,
    "model.linear_attention.full_every": 4,
    "model.linear_attention.variant": "qwen3_next",
    "model.linear_attention.n_key_heads": 2,
    "model.linear_attention.n_value_heads": 4,
    "model.linear_attention.chunk_size": 16,
    "log.wandb_mode": "disabled",
}


def fi_rows(out):
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [row for row in rows if "fi/f@L/4" in row]


def test_a_hybrid_pretrains_resumes_and_logs_its_full_layers_fi(workspace, tmp_path):
    full, parts, plain = tmp_path / "hybrid", tmp_path / "parts", tmp_path / "plain"
    assert main(["pretrain", *overrides(workspace, full, **LINEAR)]) == 0
    curve = losses(full)
    assert curve[STEPS] < curve[1] - 0.2, curve  # measured 6.22 -> 5.87
    assert main(["pretrain", *overrides(workspace, parts, **LINEAR, **{"train.stop_at_step": 3})]) == 0
    assert main(["pretrain", *overrides(workspace, parts, **LINEAR), "train.resume=auto"]) == 0
    assert losses(parts) == curve
    fi = fi_rows(full)
    assert fi and all(row["fi/full_f@L/4"] == row["fi/f@L/4"] > 0 for row in fi)
    assert main(["pretrain", *overrides(workspace, plain, **{"log.wandb_mode": "disabled"})]) == 0
    unchanged = fi_rows(plain)
    assert not any(key.startswith("fi/full_") for row in unchanged for key in row)
    assert [row["fi/f@L/4"] for row in unchanged] == [row["fi/f@L/4"] for row in fi]  # the same tokens
