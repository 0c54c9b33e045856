"""f_W, the relative positions a sliding layer of window W trains, against a pair-by-pair
count; through `PositionFrequency` (state, merge, summary) and the training callback."""

from __future__ import annotations

import pytest
import torch

from longctx.probes.position_frequency import PositionFrequency, relative_position_counts
from longctx.probes.sliding_frequency import windowed_position_counts
from tests.helpers import packed_document_ids


def brute_force(position_ids, document_ids, max_distance, window, labels=None):
    counts = torch.zeros(max_distance, dtype=torch.long)
    overflow = 0
    for b in range(position_ids.shape[0]):
        run = 0
        runs = []
        for t in range(position_ids.shape[1]):
            run += t == 0 or bool(document_ids[b, t] != document_ids[b, t - 1])
            runs.append(run)
        for q in range(position_ids.shape[1]):
            if labels is not None and labels[b, q] == -100:
                continue
            for k in range(max(0, q - window + 1), q + 1):
                if runs[k] == runs[q]:
                    d = int(position_ids[b, q] - position_ids[b, k])
                    if d < max_distance:
                        counts[d] += 1
                    else:
                        overflow += 1
    return counts, overflow


def batch(skipping: bool):
    docs = torch.stack([packed_document_ids([9, 4, 27])[0], torch.zeros(40, dtype=torch.long)])
    positions = torch.stack([torch.cat([torch.arange(9), torch.arange(4), torch.arange(27)]), torch.arange(40)])
    if skipping:  # PoSE-like: a jump of 50 in the middle of each long document
        positions[0, 25:] += 50
        positions[1, 20:] += 50
    labels = torch.randint(0, 5, (2, 40))
    labels[:, ::3] = -100
    return positions, docs, labels


@pytest.mark.parametrize("skipping", [False, True], ids=["consecutive", "skipping"])
@pytest.mark.parametrize(("window", "max_distance"), [(6, 32), (6, 100), (40, 16)])
@pytest.mark.parametrize("labelled", [False, True])
def test_windowed_counts_match_the_pair_by_pair_count(skipping, window, max_distance, labelled):
    positions, docs, labels = batch(skipping)
    labels = labels if labelled else None
    expected_counts, expected_overflow = brute_force(positions, docs, max_distance, window, labels)
    full = relative_position_counts(positions, docs, max_distance, labels).counts
    for given in (None, full):  # the loop and the consecutive-ids shortcut
        counts, overflow = windowed_position_counts(positions, docs, max_distance, window, labels, given)
        assert torch.equal(counts, expected_counts)
        assert int(overflow) == expected_overflow


def test_a_sliding_layer_trains_no_distance_beyond_its_window_unless_ids_skip():
    positions, docs, _ = batch(False)
    counts, _ = windowed_position_counts(positions, docs, 100, 6)
    assert counts[6:].sum() == 0 and counts[:6].sum() > 0
    positions, docs, _ = batch(True)
    counts, _ = windowed_position_counts(positions, docs, 100, 6)
    assert counts[50:56].sum() > 0  # the jump: token distance < 6, position distance ~50


def test_the_accumulator_keeps_state_merges_and_reports_the_sliding_layers():
    positions, docs, labels = batch(False)
    data = {"input_ids": torch.zeros_like(docs), "position_ids": positions, "document_ids": docs, "labels": labels}
    counts = PositionFrequency(32, sliding_window=6)
    counts.update(data)
    assert int(counts.sliding[:6].sum()) > 0 and int(counts.sliding[6:].sum()) == 0
    again = counts.empty_like()
    again.load_state_dict(counts.state_dict())
    again.merge(counts)
    assert torch.equal(again.sliding, 2 * counts.sliding)
    summary = counts.summary(32)
    assert summary["fi/sliding_f@W-1"] == int(counts.sliding[5]) and summary["fi/sliding_f@W/2"] == int(
        counts.sliding[3]
    )
    with pytest.raises(KeyError, match="sliding"):
        PositionFrequency(32).load_state_dict(counts.state_dict())
    with pytest.raises(ValueError, match="sliding_window"):
        PositionFrequency(32).merge(counts)
