"""The Figure 2 / Figure 7 / Table 1 tables from known frames, and the plots drawing exactly
those numbers (read back from the matplotlib artists)."""

import math

import numpy as np
import pandas as pd
import pytest

from longctx.analysis import figures
from longctx.analysis.tables import ablation_grid, effective_length_table, table1, table1_markdown


def history(rows):
    return pd.DataFrame(rows, columns=["run", "step", "metric", "value"]).astype({"step": "int64", "value": "float64"})


@pytest.fixture
def two_runs():
    rows = []
    for run, per_step in (("2k", 100.0), ("4k", 200.0)):
        for step in range(1, 7):
            rows.append((run, step, "train/tokens_seen", per_step * step))
            rows.append((run, step, "train/loss", 10.0 / step))
    rows += [
        ("2k", 3, "niah/effective_length", 128),
        ("2k", 3, "niah/f_at_effective_length", 900),
        ("2k", 6, "niah/effective_length", 256),
        ("2k", 6, "niah/f_at_effective_length", 1500),
        ("4k", 6, "niah/effective_length", 384),
    ]  # its f comes from the snapshot
    return history(rows)


def fi_frame(run, step, counts):
    return pd.DataFrame(
        {
            "run": run,
            "step": step,
            "tokens_seen": 0,
            "distance": np.arange(len(counts)),
            "count": np.asarray(counts, dtype=np.int64),
        }
    )


def test_effective_length_table_pairs_probes_with_tokens_and_f(two_runs):
    fi = fi_frame("4k", 6, np.arange(512)[::-1])
    table = effective_length_table(two_runs, fi)
    assert table.values.tolist() == [
        ["2k", 3, 300.0, 128.0, 900.0],
        ["2k", 6, 600.0, 256.0, 1500.0],
        ["4k", 6, 1200.0, 384.0, float(511 - 383)],
    ]
    # tokens of a step that did not log them: step x the run's tokens per step
    dropped = (two_runs["run"] == "2k") & (two_runs["step"] == 3) & (two_runs["metric"] == "train/tokens_seen")
    sparse = two_runs[~dropped]
    assert effective_length_table(sparse)["tokens_seen"].tolist()[0] == 300.0
    assert math.isnan(effective_length_table(two_runs)["f_at_effective_length"].iloc[2])  # no snapshot given
    assert effective_length_table(history([("a", 1, "train/loss", 1.0)])).empty


def test_figure2_draws_the_table(two_runs):
    table = effective_length_table(two_runs, fi_frame("4k", 6, np.arange(512)[::-1]))
    axis = figures.plot_effective_length_vs_tokens(table).axes[0]
    assert [line.get_label() for line in axis.lines] == ["2k", "4k"]
    assert axis.lines[0].get_xdata().tolist() == [300.0, 600.0] and axis.lines[0].get_ydata().tolist() == [128, 256]
    axis = figures.plot_effective_length_vs_frequency(table).axes[0]
    assert axis.lines[0].get_xdata().tolist() == [128, 256] and axis.lines[0].get_ydata().tolist() == [900, 1500]
    assert axis.lines[1].get_ydata().tolist() == [128] and axis.get_yscale() == "log"
    zero = table.assign(effective_length=0.0)
    axis = figures.plot_effective_length_vs_frequency(zero).axes[0]
    assert not axis.lines and "no probe" in axis.texts[0].get_text()


def test_loss_and_fi_plots(two_runs, tmp_path):
    axis = figures.plot_history(two_runs, "train/loss", x="train/tokens_seen").axes[0]
    assert axis.lines[1].get_xdata().tolist() == [200.0 * s for s in range(1, 7)]
    assert axis.lines[1].get_ydata().tolist() == [10.0 / s for s in range(1, 7)]
    fi = pd.concat([fi_frame("a", 2, [8, 6, 4, 2]), fi_frame("a", 4, [16, 12, 8, 4])])
    fi["tokens_seen"] = fi["step"] * 10
    from longctx.analysis.fi import fi_growth

    axis = figures.plot_fi_growth(fi_growth(fi)).axes[0]
    assert [line.get_label() for line in axis.lines] == ["a: f(L/4)", "a: f(L/2)", "a: f(3L/4)"]
    assert axis.lines[1].get_xdata().tolist() == [20, 40] and axis.lines[1].get_ydata().tolist() == [4, 8]
    axis = figures.plot_fi(fi).axes[0]
    assert axis.lines[0].get_ydata().tolist() == [16, 12, 8, 4]
    path = figures.save(figures.plot_fi(fi), tmp_path / "out", "fi")
    assert path == tmp_path / "out" / "fi.png" and path.stat().st_size > 5_000


def results_frame():
    rows = [
        ("a/rope", "m1", "rope", "rope", 128, 0.25, None, None),
        ("a/s1", "m1", "string", "string (local_window=32, shift_ratio=0.25)", 256, 0.5, 32, 0.25),
        ("a/s2", "m1", "string", "string (local_window=32, shift_ratio=0.5)", 384, 0.75, 32, 0.5),
        ("a/s3", "m1", "string", "string (local_window=64, shift_ratio=0.25)", 320, 0.625, 64, 0.25),
        ("b/rope", "m2", "rope", "rope", 64, 0.0, None, None),
    ]
    frame = pd.DataFrame(
        rows,
        columns=["source", "run", "method", "label", "effective_length", "accuracy", "local_window", "shift_ratio"],
    )
    frame["step"] = pd.array([None] * len(rows), dtype="Int64")
    frame["failure_depth_low"], frame["failure_depth_high"] = 0.0, 0.25
    frame["local_window"] = frame["local_window"].astype("Int64")
    return frame


def test_ablation_grid_and_figure7():
    grid = ablation_grid(results_frame())
    assert grid.index.tolist() == [32, 64] and grid.columns.tolist() == [0.25, 0.5]
    np.testing.assert_array_equal(grid.to_numpy(), [[256, 384], [320, np.nan]])
    assert ablation_grid(results_frame(), "accuracy").loc[32, 0.5] == 0.75
    figure = figures.plot_ablation(grid)
    image = figure.axes[0].images[0].get_array()
    np.testing.assert_array_equal(image.filled(np.nan), grid.to_numpy())
    assert sorted(t.get_text() for t in figure.axes[0].texts) == ["256", "320", "384"]
    duplicated = pd.concat([results_frame(), results_frame().iloc[[1]].assign(source="c/s1")])
    with pytest.raises(ValueError, match="a/s1, c/s1"):
        ablation_grid(duplicated)
    with pytest.raises(ValueError, match="no string evaluations with parameters window"):
        ablation_grid(results_frame(), rows="window")
    probes = results_frame().assign(step=pd.array([10] * 5, dtype="Int64"))
    with pytest.raises(ValueError, match="no string evaluations"):
        ablation_grid(probes)  # in-training probes are not an ablation


def test_table1_and_its_markdown():
    table = table1(results_frame())
    assert table.index.tolist()[0] == "rope" and table.columns.tolist() == ["m1", "m2"]
    assert table.loc["rope"].tolist() == [0.25, 0.0]
    assert table.loc["string (local_window=32, shift_ratio=0.5)", "m1"] == 0.75
    assert math.isnan(table.loc["string (local_window=32, shift_ratio=0.5)", "m2"])
    lines = table1_markdown(results_frame()).splitlines()
    assert lines[:3] == ["| method | m1 | m2 |", "|---|---|---|", "| rope | 25.0 | 0.0 |"]
    assert lines[-2:] == ["| m1 | 0-25% |", "| m2 | 0-25% |"]
    with pytest.raises(ValueError, match="several evaluations"):
        table1(pd.concat([results_frame(), results_frame().iloc[[0]]]))


def saved_figures(monkeypatch) -> list:
    """Every matplotlib Figure saved from now on (the figure functions return only paths)."""
    from matplotlib.figure import Figure

    saved, savefig = [], Figure.savefig

    def recording_savefig(figure, *args, **kwargs):
        saved.append(figure)
        return savefig(figure, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", recording_savefig)
    return saved


def test_figure1_and_figure4_reuse_the_probe_plots(tmp_path, monkeypatch):
    from longctx.config import NiahConfig
    from longctx.eval.effective_length import EffectiveLengthResult, LengthResult
    from longctx.eval.niah.evaluation import write_result
    from longctx.probes.dataset_fi import figure1_frequencies

    drawn = saved_figures(monkeypatch)
    lengths = np.array([100, 50, 256, 300, 10])
    assert figures.figure1(lengths, 64, tmp_path / "fig1.png").is_file()
    expected = figure1_frequencies(lengths, 64)
    panels = [axis for axis in drawn[-1].axes if axis.get_title()]
    assert [axis.get_title() for axis in panels] == ["(a) natural", "(b) uniform", "(c) concatenated"]
    for axis, name in zip(panels, ("natural", "uniform", "concatenated"), strict=True):
        heights = [bar.get_height() for bar in axis.patches]
        np.testing.assert_array_equal(heights, expected.frequency[name])  # one bar per position i < 64
    histograms = [axis for axis in drawn[-1].axes if not axis.get_title()]
    counts = [sum(bar.get_height() for bar in axis.patches) for axis in histograms]
    assert counts == [len(expected.lengths[name]) for name in ("natural", "uniform", "concatenated")]
    result = EffectiveLengthResult(
        128,
        [LengthResult(128, 2, 2, 1.0, 0.3, 1.0, 1.0, "", 0.0)],
        [0.0, 0.5, 1.0],
        [1.0, 1.0],
        np.ones((2, 1)),
        config=NiahConfig(step=128, max_length=128),
    )
    numbers, _ = write_result(result, tmp_path / "eval", "t")
    for source, name in ((numbers, "fig4.png"), (result, "fig4b.png")):
        assert figures.figure4(source, tmp_path / name).is_file()
        axis = drawn[-1].axes[0]
        np.testing.assert_array_equal(axis.images[0].get_array().filled(np.nan), result.heatmap)
        assert [tick.get_text() for tick in axis.get_xticklabels()] == ["128"]
        assert [tick.get_text() for tick in axis.get_yticklabels()] == ["0-50%", "50-100%"]
