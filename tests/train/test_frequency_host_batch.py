"""The f(i) callback counts the loader's host copy of a batch, never reading the device
copy back (issue 24, item 5): the count equals a direct count of the host rows."""

from types import SimpleNamespace

import torch

from longctx.probes.position_frequency import PositionFrequency
from longctx.train.callbacks.frequency import HostBatchDataModule, PositionFrequencyCallback


def contract(rows: int, window: int, first_document: int) -> dict[str, torch.Tensor]:
    documents = torch.zeros(rows, window, dtype=torch.long)
    documents[:, first_document:] = 1
    starts = torch.where(documents == 1, first_document, 0)
    return {
        "input_ids": torch.ones(rows, window, dtype=torch.long),
        "labels": torch.ones(rows, window, dtype=torch.long),
        "position_ids": torch.arange(window) - starts,
        "document_ids": documents,
    }


def test_datamodule_keeps_the_host_batch_and_the_callback_counts_it(tmp_path):
    host = contract(2, 16, first_document=5)
    datamodule = HostBatchDataModule()
    assert datamodule.on_before_batch_transfer(host, 0) is host
    # A stand-in for the device copy with other rows: the callback must not count it.
    device_copy = contract(2, 16, first_document=8)
    callback = PositionFrequencyCallback(16, tmp_path, every_steps=100)
    callback.on_train_batch_start(SimpleNamespace(datamodule=datamodule), None, device_copy, 0)
    expected = PositionFrequency(16, max_position=16)
    expected.update(host)
    assert torch.equal(callback.counts.relative, expected.relative)
    other = PositionFrequency(16, max_position=16)
    other.update(device_copy)
    assert not torch.equal(other.relative, expected.relative)


def test_callback_counts_the_batch_when_the_datamodule_keeps_none(tmp_path):
    batch = contract(1, 8, first_document=3)
    callback = PositionFrequencyCallback(8, tmp_path, every_steps=100)
    callback.on_train_batch_start(SimpleNamespace(datamodule=None), None, batch, 0)
    expected = PositionFrequency(8, max_position=8)
    expected.update(batch)
    assert torch.equal(callback.counts.relative, expected.relative)


def test_under_context_parallelism_only_the_first_rank_of_each_group_counts(tmp_path):
    """CP 2: ranks 0 and 2 count their group's rows, ranks 1 and 3 (the same rows) do not,
    so the all-reduced f(i) is the unsharded count once."""
    rows = contract(1, 16, first_document=5)
    counted = []
    for rank in range(4):
        callback = PositionFrequencyCallback(16, tmp_path, every_steps=100, context_parallel=2)
        callback.on_train_batch_start(SimpleNamespace(global_rank=rank), None, rows, 0)
        counted.append(int(callback.counts.relative.sum()))
    assert counted[0] == counted[2] > 0 and counted[1] == counted[3] == 0
