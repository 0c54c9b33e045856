"""load_fi / fi_snapshots / fi_growth against the snapshot arrays, Eq. 2 on a known batch,
and PositionFrequency.summary (the logged fi/f@... scalars)."""

import numpy as np
import pandas as pd
import pytest
import torch

from longctx.analysis.fi import f_at, fi_growth, fi_snapshots, load_fi
from longctx.probes.position_frequency import PositionFrequency
from longctx.train.callbacks.frequency import save_npz


def snapshot(run_dir, step, lengths, window):
    """A snapshot of rows whose documents have the given lengths (contiguous ids, all labelled)."""
    counts = PositionFrequency(window)
    for length in lengths:
        ids = torch.arange(length)[None]
        counts.update(
            {
                "input_ids": ids,
                "position_ids": ids,
                "document_ids": torch.zeros_like(ids),
                "labels": torch.zeros_like(ids),
            }
        )
    return save_npz(counts, run_dir / "fi" / f"fi-step-{step:07d}.npz"), counts


def test_counts_follow_eq2_on_known_documents(tmp_path):
    snapshot(tmp_path / "r", 2, [10], window=16)
    snapshot(tmp_path / "r", 4, [10, 6], window=16)
    fi = load_fi(tmp_path / "r")
    assert list(fi.columns) == ["run", "step", "tokens_seen", "distance", "count"]
    first = fi[fi["step"] == 2]
    # Eq. 2: f(i) = sum_s max(|s| - i, 0)
    assert first["count"].tolist() == [max(10 - i, 0) for i in range(16)]
    second = fi[fi["step"] == 4]
    assert second["count"].tolist() == [max(10 - i, 0) + max(6 - i, 0) for i in range(16)]
    assert second["tokens_seen"].unique().tolist() == [16]
    assert fi["distance"].tolist() == list(range(16)) * 2
    assert (fi["run"] == "r").all() and fi["count"].dtype == np.int64


def test_frames_equal_the_snapshot_arrays_of_the_fixture_run(fixture_run):
    fi = load_fi(fixture_run.run)
    totals = fi_snapshots(fixture_run.run)
    assert totals["step"].tolist() == [3, 6]
    for row in totals.itertuples():
        arrays = np.load(row.path)
        part = fi[fi["step"] == row.step]
        assert np.array_equal(part["count"].to_numpy(), arrays["relative"])
        assert part["count"].sum() == arrays["relative"].sum() == row.pairs
        assert row.tokens_seen == int(arrays["tokens_seen"]) and row.overflow == int(arrays["overflow"])
        assert row.window == 256
    absolute = load_fi(fixture_run.run, histogram="absolute")
    assert absolute[absolute["step"] == 6]["count"].sum() == np.load(totals["path"][1])["absolute"].sum()


def test_growth_equals_the_logged_summary_scalars(fixture_run):
    growth = fi_growth(load_fi(fixture_run.run), positions=("L/4", "L/2", "3L/4", "L-1"))
    for step, rows in growth.groupby("step"):
        counts = PositionFrequency(256)
        state = {k: torch.from_numpy(v) for k, v in np.load(fixture_run.run / "fi" / f"fi-step-{step:07d}.npz").items()}
        counts.load_state_dict(state)
        summary = counts.summary(256)
        assert dict(zip(rows["position"], rows["count"], strict=True)) == {
            p: summary[f"fi/f@{p}"] for p in ("L/4", "L/2", "3L/4", "L-1")
        }
        assert rows["tokens_seen"].unique().tolist() == [summary["fi/tokens_seen"]]
    assert growth["distance"].tolist()[:4] == [64, 128, 192, 255]


def test_f_at_reads_one_bin(tmp_path):
    snapshot(tmp_path / "r", 1, [8], window=8)
    fi = load_fi({"label": tmp_path / "r"})
    assert f_at(fi, "label", 1, 3) == 5.0
    assert np.isnan(f_at(fi, "label", 2, 3)) and np.isnan(f_at(fi, "label", 1, 8))
    with pytest.raises(ValueError, match="unknown positions"):
        fi_growth(fi, positions=("L/3",))


def test_bad_snapshots_are_named(tmp_path):
    with pytest.raises(FileNotFoundError, match=f"{tmp_path / 'missing'} does not exist"):
        load_fi(tmp_path / "missing")
    (tmp_path / "nofi").mkdir()
    with pytest.raises(FileNotFoundError, match=f"{tmp_path / 'nofi'} has no f\\(i\\) snapshot"):
        load_fi(tmp_path / "nofi")
    broken = tmp_path / "broken" / "fi" / "fi-step-0000001.npz"
    broken.parent.mkdir(parents=True)
    broken.write_bytes(b"PK\x03\x04 truncated")
    with pytest.raises(ValueError, match=f"{broken} is not a readable f\\(i\\) snapshot"):
        load_fi(tmp_path / "broken")
    other = tmp_path / "other" / "fi" / "fi-step-0000001.npz"
    other.parent.mkdir(parents=True)
    np.savez(other, counts=np.arange(3))
    with pytest.raises(ValueError, match=f"{other} lacks"):
        fi_snapshots(tmp_path / "other")


def test_growth_of_several_runs_keeps_them_apart(tmp_path):
    snapshot(tmp_path / "a", 1, [8], window=8)
    snapshot(tmp_path / "b", 1, [4, 4], window=8)
    growth = fi_growth(load_fi([tmp_path / "a", tmp_path / "b"]))
    expected = pd.DataFrame(
        {
            "run": ["a"] * 3 + ["b"] * 3,
            "step": [1] * 6,
            "position": ["L/4", "L/2", "3L/4"] * 2,
            "count": [6, 4, 2, 4, 0, 0],
        }
    )
    pd.testing.assert_frame_equal(growth[["run", "step", "position", "count"]], expected, check_dtype=False)
