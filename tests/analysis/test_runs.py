"""load_history: exact frames from known files, the W&B fallback against metrics.jsonl of the
same real run, the step alignment of probe rows, online runs through a fake API, and errors
that name the path at fault."""

import json
import shutil
import sys
import types

import numpy as np
import pandas as pd
import pytest

from longctx.analysis import runs as runs_module
from longctx.analysis.runs import expand, find_runs, load_history, wide
from longctx.analysis.wandb_offline import offline_runs, read_run


def write_lines(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join((row if isinstance(row, str) else json.dumps(row)) + "\n" for row in rows))
    return path


def frame(rows):
    return pd.DataFrame(rows, columns=["run", "step", "metric", "value"]).astype(
        {"run": str, "step": "int64", "metric": str, "value": "float64"}
    )


def test_metrics_jsonl_gives_the_exact_tidy_frame(tmp_path):
    write_lines(
        tmp_path / "a" / "metrics.jsonl",
        [
            {"step": 1, "train/loss": 5.5, "train/tokens_seen": 512.0},
            "",
            {"step": 2, "train/loss": 5.25, "train/tokens_seen": 1024.0, "perf/mfu": 0.125},
            {"step": 2, "train/loss": 5.0, "train/tokens_seen": 1024.0},  # a redone step: the later row wins
        ],
    )
    write_lines(tmp_path / "b" / "metrics.jsonl", [{"step": 3, "train/loss": 4.0}])
    history = load_history([tmp_path / "a", tmp_path / "b"])
    expected = frame(
        [
            ("a", 2, "perf/mfu", 0.125),
            ("a", 1, "train/loss", 5.5),
            ("a", 2, "train/loss", 5.0),
            ("a", 1, "train/tokens_seen", 512.0),
            ("a", 2, "train/tokens_seen", 1024.0),
            ("b", 3, "train/loss", 4.0),
        ]
    )
    pd.testing.assert_frame_equal(history, expected)
    table = wide(history, ["train/loss", "perf/mfu"])
    assert list(table.columns) == ["run", "step", "train/loss", "perf/mfu"]
    assert table[["run", "step", "train/loss"]].values.tolist() == [["a", 1, 5.5], ["a", 2, 5.0], ["b", 3, 4.0]]
    assert np.isnan(table["perf/mfu"][0]) and table["perf/mfu"][1] == 0.125
    assert load_history({"mine": tmp_path / "b"})["run"].tolist() == ["mine"]


def test_wandb_rows_are_put_on_the_optimizer_step_axis():
    rows = [
        {"train/loss": 2.0, "epoch": 0, "trainer/global_step": 0, "_step": 0, "_runtime": 1.0},  # Lightning: before ++
        {"fi/f@L/4": 10, "trainer/global_step": 1, "_step": 1},  # a probe: on Lightning's axis
        {"fi/curve_table._type": "table-file", "fi/curve_table.nrows": 256, "trainer/global_step": 1, "_step": 2},
        {"niah/effective_length": 128, "_step": 3},  # no trainer step: W&B's own
        {"flag": True, "text": "x", "trainer/global_step": 4, "_step": 4},  # not numeric scalars
    ]
    assert runs_module._wandb_records(rows) == [
        (1, "train/loss", 2.0),
        (2, "fi/f@L/4", 10.0),
        (3, "niah/effective_length", 128.0),
    ]


def test_wandb_fallback_matches_metrics_jsonl_of_the_same_run(fixture_run):
    from_metrics = load_history(fixture_run.run, prefer="metrics")
    from_wandb = load_history(fixture_run.run, prefer="wandb")
    assert sorted(from_metrics["step"].unique()) == list(range(1, fixture_run.steps + 1))
    # metrics.jsonl holds train/*, perf/* and the probes' scalars, all of them in W&B too
    assert {"train/loss", "fi/f@L/4", "fi/tokens_seen", "niah/effective_length"} <= set(from_metrics["metric"])
    shared = from_wandb[from_wandb["metric"].isin(set(from_metrics["metric"]))].reset_index(drop=True)
    assert set(shared["metric"]) == set(from_metrics["metric"])
    pd.testing.assert_frame_equal(shared, from_metrics)
    # auto: metrics.jsonl plus whatever only W&B has
    auto = load_history(fixture_run.run)
    only_wandb = from_wandb[~from_wandb["metric"].isin(set(from_metrics["metric"]))]
    expected = pd.concat([from_metrics, only_wandb]).sort_values(
        ["run", "metric", "step"], kind="stable", ignore_index=True
    )
    pd.testing.assert_frame_equal(auto, expected)


def test_probe_rows_line_up_with_the_snapshots_and_probe_files(fixture_run):
    table = wide(load_history(fixture_run.run)).set_index("step")
    # f(i) is logged every 2 steps at the finished step: equal to the snapshot written at step 6
    snapshot = np.load(fixture_run.run / "fi" / "fi-step-0000006.npz")
    assert table.loc[6, "fi/f@L/4"] == snapshot["relative"][256 // 4]
    assert table.loc[6, "fi/tokens_seen"] == snapshot["tokens_seen"] == table.loc[6, "train/tokens_seen"]
    assert table["fi/f@L/4"].dropna().index.tolist() == [2, 4, 6]
    probes = {
        int(p.parent.name[5:]): json.loads(p.read_text())["effective_length"]
        for p in fixture_run.run.glob("niah/step-*/niah.json")
    }
    assert probes and table["niah/effective_length"].dropna().to_dict() == probes


def test_without_wandb_the_probe_files_supply_the_effective_length(fixture_run, tmp_path):
    run = tmp_path / "copy"
    shutil.copytree(fixture_run.run, run, ignore=shutil.ignore_patterns("wandb", "checkpoints"))
    history = load_history(run)
    lengths = history[history["metric"] == "niah/effective_length"]
    assert lengths["step"].tolist() == [3, 6]
    assert set(history["metric"]) == set(load_history(fixture_run.run, prefer="metrics")["metric"]) | {
        "niah/effective_length"
    }


def test_a_wandb_file_or_offline_run_directory_is_one_run(fixture_run):
    run_dir = offline_runs(fixture_run.run)[0]
    wandb_file = next(run_dir.glob("run-*.wandb"))
    by_file, by_dir = load_history(wandb_file), load_history(run_dir)
    assert by_file["run"].unique().tolist() == [wandb_file.stem.removeprefix("run-")]
    assert by_dir["run"].unique().tolist() == [fixture_run.run.name]
    pd.testing.assert_frame_equal(by_file.drop(columns="run"), by_dir.drop(columns="run"))
    pd.testing.assert_frame_equal(by_dir, load_history(fixture_run.run, prefer="wandb"))


def test_evaluation_runs_are_not_training_history(fixture_run):
    assert read_run(offline_runs(fixture_run.wandb_eval)[0])["job_type"] == "niah"
    with pytest.raises(FileNotFoundError, match="fixture-wandb has neither metrics.jsonl nor an offline W&B run"):
        load_history(fixture_run.wandb_eval)


def test_online_runs_go_through_the_wandb_api(monkeypatch):
    calls = []

    class FakeRun:
        def scan_history(self):
            yield {"train/loss": 3.0, "epoch": 0, "trainer/global_step": 4, "_step": 0}
            yield {"niah/pass_rate": {"_type": "table-file", "nrows": 2}, "fi/f@L/2": 7, "trainer/global_step": 4}

    class FakeApi:
        def run(self, path):
            calls.append(path)
            return FakeRun()

    monkeypatch.setitem(sys.modules, "wandb", types.SimpleNamespace(Api=FakeApi))
    history = load_history("team/longctx/abc123")
    assert calls == ["team/longctx/abc123"]
    pd.testing.assert_frame_equal(
        history, frame([("team/longctx/abc123", 5, "fi/f@L/2", 7.0), ("team/longctx/abc123", 5, "train/loss", 3.0)])
    )


def test_find_runs_and_expand(fixture_run, tmp_path):
    assert find_runs(str(fixture_run.run.parent / "*")) == [fixture_run.run]
    (tmp_path / "x").mkdir()
    (tmp_path / "y").mkdir()
    assert expand(f"{tmp_path / 'y'}, {tmp_path / 'x'}") == [tmp_path / "y", tmp_path / "x"]
    with pytest.raises(FileNotFoundError, match="nothing-here"):
        expand(str(tmp_path / "nothing-here*"))
    with pytest.raises(FileNotFoundError, match="names no run directory"):
        find_runs(str(tmp_path / "*"))
    with pytest.raises(FileNotFoundError, match="names no run directory"):  # evaluations only, no training
        find_runs(str(fixture_run.ablation / "*"))


@pytest.mark.parametrize(
    "content, message",
    [
        ("", "metrics.jsonl is empty"),
        ("\n\n", "metrics.jsonl is empty"),
        ('{"step": 1, "train/loss": 1.0}\n{"step": 2, "train/loss"\n', r"metrics.jsonl:2: not a JSON line"),
        ('{"train/loss": 1.0}\n', r"metrics.jsonl:1: expected an object with an integer 'step'"),
        ("[1, 2]\n", r"metrics.jsonl:1: expected an object"),
    ],
)
def test_bad_metrics_files_are_named(tmp_path, content, message):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "metrics.jsonl").write_text(content)
    with pytest.raises(ValueError, match=message) as error:
        load_history(tmp_path / "run")
    assert str(tmp_path / "run" / "metrics.jsonl") in str(error.value)


def test_bad_sources_are_named(tmp_path):
    with pytest.raises(FileNotFoundError, match=f"{tmp_path / 'missing'} does not exist"):
        load_history(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=f"{tmp_path / 'empty'} has neither metrics.jsonl"):
        load_history(tmp_path / "empty")
    with pytest.raises(FileNotFoundError, match="has no metrics.jsonl"):
        load_history(tmp_path / "empty", prefer="metrics")
    bad = tmp_path / "run-bad.wandb"
    bad.write_bytes(b"not a log")
    with pytest.raises(ValueError, match=f"{bad} is not a W&B transaction log"):
        load_history(bad)
    notes = tmp_path / "notes.txt"
    notes.write_text("hello")
    with pytest.raises(ValueError, match=f"{notes} is neither a run directory"):
        load_history(notes)
    write_lines(tmp_path / "a" / "same" / "metrics.jsonl", [{"step": 1, "x": 1.0}])
    write_lines(tmp_path / "b" / "same" / "metrics.jsonl", [{"step": 1, "x": 1.0}])
    with pytest.raises(ValueError, match="both labelled 'same'"):
        load_history([tmp_path / "a" / "same", tmp_path / "b" / "same"])
    with pytest.raises(ValueError, match="prefer must be"):
        load_history(tmp_path / "a" / "same", prefer="csv")


def test_recorded_configs_name_the_run_without_a_checkpoint_or_section(tmp_path):
    import torch

    from longctx.analysis.runs import recorded_configs

    good, bare, other = tmp_path / "good", tmp_path / "bare", tmp_path / "other"
    for run, record in ((good, {"data": {"window": 64}, "sft": {"variant": "normal"}}), (other, {"data": {}})):
        (run / "checkpoints").mkdir(parents=True)
        torch.save({"hyper_parameters": {"config": record}}, run / "checkpoints" / "last.ckpt")
    bare.mkdir()
    assert recorded_configs([good], "sft") == [("good", {"data": {"window": 64}, "sft": {"variant": "normal"}})]
    with pytest.raises(FileNotFoundError, match="bare has no checkpoints/last.ckpt to read its sft config"):
        recorded_configs([bare], "sft")
    with pytest.raises(ValueError, match="holds no sft section"):
        recorded_configs([other], "sft")
