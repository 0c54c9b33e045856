"""longctx_replication/seed_archive.py: what a finished seed's archive keeps, its size limit and its
fallback, and the layout extraction rebuilds."""

import json

import numpy as np
import pytest
import torch

from longctx.probes.position_frequency import PositionFrequency
from longctx.train.callbacks.frequency import save_npz
from longctx_replication.seed_archive import (
    SeedArchiveError,
    archive_path,
    extract_seed_archives,
    read_manifest,
    write_seed_archive,
)


def _fi_run(root, window, steps, seed=10):
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


def test_the_twin_s_f_i_arrays_at_full_size_fit_the_limit_and_round_trip(tmp_path):
    root = tmp_path / "runs"
    runs = [_fi_run(root, window, [300, 600, 900, 1200]) for window in (1024, 2048, 4096)]
    manifest = write_seed_archive(root, runs, archive_path(tmp_path / "archives", 10), {"seed": 10, "max_steps": 1200})
    assert manifest["bytes"] < 2**20 and manifest["left_out"] == []
    assert len(manifest["files"]) == 3 * 5 and not [f for f in manifest["files"] if "checkpoints" in f]
    extracted = tmp_path / "extracted"
    (found,) = extract_seed_archives(tmp_path / "archives", extracted)
    assert found["seed"] == 10 and found["files"] == manifest["files"]
    for name in manifest["files"]:
        if name.endswith(".npz"):
            with np.load(root / name) as original, np.load(extracted / name) as copy:
                assert all(np.array_equal(original[k], copy[k]) for k in original.files)
    assert not (extracted / "pretrain" / "w1024_s10" / "checkpoints").exists()


def test_over_the_limit_the_earlier_f_i_arrays_go_first_then_an_error(tmp_path):
    root = tmp_path / "runs"
    runs = [_fi_run(root, 4096, [300, 600, 900, 1200])]
    full = write_seed_archive(root, runs, tmp_path / "full.tar.xz", {"seed": 10})
    last = write_seed_archive(
        root, runs, tmp_path / "last.tar.xz", {"seed": 10}, max_bytes=full["bytes"] - 1
    )  # one byte too few for everything: every run keeps its last f(i) only
    fi = "pretrain/w4096_s10/fi/fi-step-"
    assert last["left_out"] == [f"{fi}{s:07d}.npz" for s in (300, 600, 900)]
    assert read_manifest(tmp_path / "last.tar.xz")["files"] == [f"{fi}0001200.npz", "pretrain/w4096_s10/metrics.jsonl"]
    with pytest.raises(SeedArchiveError, match="over the 1,000-byte limit"):
        write_seed_archive(root, runs, tmp_path / "none.tar.xz", {"seed": 10}, max_bytes=1000)
    assert not (tmp_path / "none.tar.xz").exists() and not list(tmp_path.glob("none*"))


def test_nothing_to_archive_and_no_archive_to_read_are_errors(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(SeedArchiveError, match="no record files"):
        write_seed_archive(tmp_path, [tmp_path / "empty"], tmp_path / "a.tar.xz", {"seed": 1})
    with pytest.raises(SeedArchiveError, match="no seed-<seed>.tar.xz"):
        extract_seed_archives(tmp_path / "empty", tmp_path / "out")
