"""Helpers shared by the replication's tests and the tools' (the twin's archives)."""

import json

import torch

from longctx.probes.position_frequency import PositionFrequency
from longctx.train.callbacks.frequency import save_npz


def fi_run(root, window, steps, seed=10):
    """A pretraining run's f(i) arrays as the FrequencyCallback saves them, counted by
    PositionFrequency on packed random-length documents (noisy counts, as in training)."""
    run = root / "pretrain" / f"w{window}_s{seed}"
    generator = torch.Generator().manual_seed(window)
    counts = PositionFrequency(window)
    for step in steps:
        lengths = torch.randint(50, 2 * window, (64,), generator=generator)
        document = torch.repeat_interleave(torch.arange(64), lengths)[: 4 * window].reshape(4, window)
        starts = torch.cat([torch.ones(4, 1, dtype=torch.bool), document[:, 1:] != document[:, :-1]], dim=1)
        index = torch.arange(window).expand(4, -1)
        position = index - torch.cummax(torch.where(starts, index, 0), dim=1).values
        counts.update({"input_ids": document, "position_ids": position, "document_ids": document, "labels": document})
        save_npz(counts, run / "fi" / f"fi-step-{step:07d}.npz")
    (run / "metrics.jsonl").write_text(json.dumps({"step": steps[-1], "train/loss": 2.0}) + "\n")
    (run / "checkpoints").mkdir()
    (run / "checkpoints" / "last.ckpt").write_bytes(b"\0" * 100_000)
    return run
