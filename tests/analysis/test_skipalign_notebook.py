"""analysis/skipalign.ipynb runs top to bottom (nbclient, as test_notebooks.py runs the others)
on a normal and a skipalign SFT run, draws SkipAlign Fig. 2 and 3, and its table of pairs
beyond the original window matches the f(i) snapshots counted directly."""

import numpy as np
import pandas as pd
import pytest

from longctx.analysis.tables import sft_settings
from tests.analysis.helpers import execute, images, pngs


def beyond_window(run_dir, window):
    """(pairs, pairs at relative distance >= window) of the run's last f(i) snapshot, from the npz."""
    last = max((run_dir / "fi").glob("fi-step-*.npz"))
    with np.load(last) as snapshot:
        relative, overflow = snapshot["relative"].astype(np.int64), int(snapshot["overflow"])
    return int(relative.sum()) + overflow, int(relative[window:].sum()) + overflow


def test_skipalign_notebook(sft_runs, tmp_path, monkeypatch):
    monkeypatch.setenv("LONGCTX_SFT_RUNS", str(sft_runs.root / "runs" / "*"))
    monkeypatch.setenv("LONGCTX_FIGURES", str(tmp_path))
    monkeypatch.delenv("LONGCTX_WINDOW", raising=False)  # the window comes from the checkpoints
    notebook = execute("skipalign.ipynb")

    written = pngs(tmp_path)
    expected = {
        "skipalign_fig2.png",
        "skipalign_fig3_pass_rate.png",
        "skipalign_fig3_normal.png",
        "skipalign_fig3_skipalign.png",
    }
    assert set(written) == expected
    assert all(size > 10_000 for size in written.values()), written
    assert images(notebook) == len(expected)

    table = pd.read_csv(tmp_path / "skipalign_beyond_window.csv").set_index("run")
    assert set(table.index) == {"normal", "skipalign"}
    for run, run_dir in sft_runs.runs.items():
        pairs, beyond = beyond_window(run_dir, sft_runs.window)
        row = table.loc[run]
        assert (row["window"], row["pairs"], row["beyond"]) == (sft_runs.window, pairs, beyond)
        assert row["fraction_beyond"] == pytest.approx(beyond / pairs)
        assert row["variant"] == run
    assert table.loc["normal", "beyond"] == 0  # Normal-SFT never leaves the original window
    assert table.loc["skipalign", "beyond"] > 0  # skips put response queries beyond it ...
    assert table.loc["skipalign", "max_distance"] < 4 * sft_runs.window  # ... within sft.extended_length


def test_sft_settings_reads_the_checkpoint_config(sft_runs):
    settings = sft_settings(sft_runs.runs).set_index("run")
    assert list(settings["window"]) == [sft_runs.window] * 2
    assert settings.loc["skipalign", "extended_length"] == 4 * sft_runs.window
    assert settings.loc["normal", "variant"] == "normal" and settings.loc["skipalign", "strategy"] == "outer"
