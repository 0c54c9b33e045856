"""train.loss_weighting=inverse_frequency: hand-worked weights, the weighted step's objective
against a float64 reference, and the unweighted path left as it was."""

import pytest
import torch
import torch.nn.functional as F

from longctx.config import load
from longctx.data.packing import IGNORE_INDEX
from longctx.errors import ConfigError
from longctx.train.loss_weights import inverse_frequency_weights, position_label_counts, run_loss_weights
from longctx.train.module import LanguageModelModule


def test_weights_hand_worked():
    """n = [4, 2, 1, 0, 1]: 8 labelled tokens over 4 seen positions, n_mean = 2, so
    w = [2/4, 2/2, 2/1, cap, 2/1] = [0.5, 1, 2, cap, 2]; cap 1.5 clips the 2s."""
    counts = torch.tensor([4, 2, 1, 0, 1])
    assert inverse_frequency_weights(counts, cap=10.0).tolist() == [0.5, 1.0, 2.0, 10.0, 2.0]
    assert inverse_frequency_weights(counts, cap=1.5).tolist() == [0.5, 1.0, 1.5, 1.5, 1.5]


def row(positions, labels):
    return {"position_ids": torch.tensor(positions), "labels": torch.tensor(labels)}


def test_counts_are_labelled_tokens_per_position_id():
    """Two rows, two documents in the first: ids 0 1 2 | 0 1 and 0 1 2 3 4, the -100 labels
    not counted: position 0 is labelled 2 + 0 times, 1: 1 + 1, 2: 1 + 0, 3: 0 + 1, 4: 0 + 1."""
    rows = [
        row([0, 1, 2, 0, 1], [5, IGNORE_INDEX, 7, 8, 9]),
        row([0, 1, 2, 3, 4], [IGNORE_INDEX, 1, IGNORE_INDEX, 3, 4]),
    ]
    assert position_label_counts(rows, 6).tolist() == [2, 2, 1, 1, 1, 0]
    with pytest.raises(ValueError, match=">= 4"):
        position_label_counts(rows, 4)


def test_run_weights_are_written(tmp_path):
    rows = iter([row([0, 1, 0, 1], [1, 1, 1, 1]), row([0, 1, 2, 3], [1, 1, 1, 1]), row([0, 0, 0, 0], [1, 1, 1, 1])])
    weights = run_loss_weights(rows, 2, 4, 10.0, tmp_path)  # only the first 2 rows: n = [3, 3, 1, 1]
    assert weights.tolist() == pytest.approx([2 / 3, 2 / 3, 2.0, 2.0], rel=1e-7)
    assert '"counts": [3, 3, 1, 1]' in (tmp_path / "loss_weights.json").read_text()


def batch(vocab=8192, rows=2, window=16):
    ids = torch.randint(0, vocab, (rows, window + 1))
    labels = ids[:, 1:].clone()
    labels[:, :3] = IGNORE_INDEX
    return {
        "input_ids": ids[:, :-1],
        "labels": labels,
        "position_ids": torch.cat([torch.arange(6), torch.arange(10)]).expand(rows, -1),
        "document_ids": torch.cat([torch.zeros(6), torch.ones(10)]).long().expand(rows, -1),
    }


def test_weighted_loss_is_the_weighted_sum_over_labelled_tokens():
    """(sum w CE, sum w) against the float64 per-token loss of the same model weighted by hand."""
    torch.manual_seed(0)
    config = load([], ["data.window=16", "train.loss_weighting=inverse_frequency"])
    weights = torch.linspace(0.5, 3.0, 16)
    module = LanguageModelModule(config, loss_weights=weights)
    module.configure_model()
    data = batch()
    loss, total = module.summed_loss(data)
    logits = module(data).double().flatten(0, 1)
    labels = data["labels"].flatten()
    per_token = F.cross_entropy(logits, labels, ignore_index=IGNORE_INDEX, reduction="none")
    by_hand = torch.tensor([float(weights[p]) for p in data["position_ids"].flatten()], dtype=torch.float64)
    by_hand[labels == IGNORE_INDEX] = 0
    assert total.item() == pytest.approx(by_hand.sum().item(), rel=1e-6)
    assert loss.item() == pytest.approx((per_token * by_hand).sum().item(), rel=1e-5)
    # The step's objective sum(w CE) / sum(w): constant weights give the plain mean.
    flat = LanguageModelModule(config, loss_weights=torch.full((16,), 2.5))
    flat.model = module.model
    plain = LanguageModelModule(load([], ["data.window=16"]))
    plain.model = module.model
    weighted_sum, weight = flat.summed_loss(data)
    plain_sum, labelled = plain.summed_loss(data)
    assert (weighted_sum / weight).item() == pytest.approx((plain_sum / labelled).item(), rel=1e-6)


def test_unweighted_module_has_no_weights():
    module = LanguageModelModule(load([], ["data.window=16"]))
    assert module.loss_weights is None


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (["train.loss_weighting=inverse"], "train.loss_weighting"),
        (["train.loss_weight_cap=0.5"], "train.loss_weight_cap"),
        (["train.loss_weighting=inverse_frequency", "train.loss_chunk_tokens=64"], "train.loss_weighting"),
    ],
)
def test_bad_settings_are_rejected(overrides, key):
    with pytest.raises(ConfigError, match=key):
        load([], overrides)


def test_pretrain_counts_the_same_positions_as_the_fi_probe(workspace, tmp_path):
    """A weighted run's frozen counts n(p) (a pass over the run's rows before step 0) equal
    the f(i) probe's absolute-position counts accumulated while it trained on those rows."""
    import json

    import numpy as np

    from longctx.cli import main
    from tests.train.helpers import STEPS, overrides

    out = tmp_path / "weighted"
    args = overrides(workspace, out, **{"train.loss_weighting": "inverse_frequency", "log.wandb_mode": "disabled"})
    assert main(["pretrain", *args]) == 0
    saved = json.loads((out / "loss_weights.json").read_text())
    probe = np.load(out / "fi" / f"fi-step-{STEPS:07d}.npz")
    assert saved["rows"] == STEPS * 8
    assert saved["counts"] == probe["absolute"].tolist()
    counts = torch.tensor(saved["counts"])
    assert saved["weights"] == pytest.approx(inverse_frequency_weights(counts, 10.0).tolist())
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert all(np.isfinite(row["train/loss"]) for row in rows if "train/loss" in row)
