"""analysis/context_extension.ipynb runs top to bottom on one tiny run per recipe, draws f(i)
per recipe and the NIAH effective lengths, and its table matches the f(i) snapshots and
metrics the runs wrote."""

import json

import numpy as np
import pandas as pd

from tests.analysis.helpers import execute, images, pngs


def test_context_extension_notebook(extension_runs, tmp_path, monkeypatch):
    monkeypatch.setenv("LONGCTX_EXTENSION_RUNS", str(extension_runs.root / "runs" / "*"))
    monkeypatch.setenv("LONGCTX_FIGURES", str(tmp_path))
    notebook = execute("context_extension.ipynb")

    written = pngs(tmp_path)
    assert set(written) == {"context_extension_fi.png", "context_extension_niah.png"}
    assert all(size > 10_000 for size in written.values()), written
    assert images(notebook) == 2

    table = pd.read_csv(tmp_path / "context_extension.csv").set_index("run")
    assert set(table.index) == set(extension_runs.runs)
    for run, run_dir in extension_runs.runs.items():
        with np.load(max((run_dir / "fi").glob("fi-step-*.npz"))) as snapshot:
            relative = snapshot["relative"].astype(np.int64)
            tokens = int(snapshot["tokens_seen"])
        window = 256 if run == "full_length" else 64
        row = table.loc[run]
        assert (row["window"], row["target_length"], row["tokens_seen"]) == (window, 256, tokens)
        assert row["pairs"] == relative.sum() and row["pairs_beyond_window"] == relative[window:].sum()
        assert row["max_distance"] == np.flatnonzero(relative).max() < 256
        metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        lengths = [m["niah/effective_length"] for m in metrics if "niah/effective_length" in m]
        assert row["effective_length"] == lengths[-1]
    assert len(set(table["tokens_seen"])) == 1  # equal tokens
    for run in ("pose", "randpos", "longrecipe"):
        assert table.loc[run, "pairs_beyond_window"] > 0  # distances a contiguous 64-token row never trains
    assert table.loc["full_length", "position_transform"] == "none"
