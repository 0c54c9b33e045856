"""longctx_replication/seed_archive.py: what a finished seed's archive keeps, the layout
extraction rebuilds, and which f(i) arrays are the earlier ones (the size limit that drops
them is the lab's: tests/tools/test_twin_lease.py)."""

import numpy as np
import pytest

from longctx_replication.seed_archive import (
    SeedArchiveError,
    archive_path,
    earlier_fi,
    extract_seed_archives,
    record_files,
    write_seed_archive,
)
from tests.replication.helpers import fi_run


def test_the_twin_s_records_round_trip_without_checkpoints(tmp_path):
    root = tmp_path / "runs"
    runs = [fi_run(root, window, [300, 600, 900, 1200]) for window in (1024, 2048, 4096)]
    manifest = write_seed_archive(root, runs, archive_path(tmp_path / "archives", 10), {"seed": 10, "max_steps": 1200})
    assert manifest["left_out"] == []
    assert len(manifest["files"]) == 3 * 5 and not [f for f in manifest["files"] if "checkpoints" in f]
    extracted = tmp_path / "extracted"
    (found,) = extract_seed_archives(tmp_path / "archives", extracted)
    assert found["seed"] == 10 and found["files"] == manifest["files"]
    for name in manifest["files"]:
        if name.endswith(".npz"):
            with np.load(root / name) as original, np.load(extracted / name) as copy:
                assert all(np.array_equal(original[k], copy[k]) for k in original.files)
    assert not (extracted / "pretrain" / "w1024_s10" / "checkpoints").exists()


def test_the_earlier_f_i_arrays_are_every_step_but_each_run_s_last(tmp_path):
    root = tmp_path / "runs"
    runs = [fi_run(root, 64, [3, 6, 9]), fi_run(root, 128, [5, 10])]
    names = [str(p.relative_to(root)) for p in earlier_fi(record_files(root, runs))]
    assert names == ["pretrain/w64_s10/fi/fi-step-0000003.npz", "pretrain/w64_s10/fi/fi-step-0000006.npz",
                     "pretrain/w128_s10/fi/fi-step-0000005.npz"]  # fmt: skip


def test_nothing_to_archive_and_no_archive_to_read_are_errors(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(SeedArchiveError, match="no record files"):
        write_seed_archive(tmp_path, [tmp_path / "empty"], tmp_path / "a.tar.xz", {"seed": 1})
    with pytest.raises(SeedArchiveError, match="no seed-<seed>.tar.xz"):
        extract_seed_archives(tmp_path / "empty", tmp_path / "out")
