"""load_niah / load_niah_wandb / niah_result: frames equal the JSON they were read from,
results written through the real EffectiveLengthResult type round-trip, the W&B runs of
`longctx niah` agree with the niah.json of the same evaluation, and errors name the file."""

import json
import math

import numpy as np
import pandas as pd
import pytest

from longctx.analysis.niah_results import load_niah, load_niah_wandb, method_label, niah_result
from longctx.config import NiahConfig
from longctx.eval.effective_length import EffectiveLengthResult, LengthResult
from longctx.eval.niah.evaluation import peak_failure_depth, write_result


def make_result(rates, effective, lengths=(128, 256, 384), tests=4, max_length=384) -> EffectiveLengthResult:
    rows = [
        LengthResult(length, tests, round(rate * tests), rate, rate / 2, min(1.0, rate + 0.2), rate, "x", 0.1)
        for length, rate in zip(lengths, rates, strict=True)
    ]
    heatmap = np.array([[0.5, math.nan, 1.0][: len(rows)], [0.25, 0.0, math.nan][: len(rows)]])
    return EffectiveLengthResult(
        effective_length=effective,
        per_length=rows,
        depth_edges=[0.0, 0.5, 1.0],
        depth_recall=[0.75, 0.125],
        heatmap=heatmap,
        skipped_lengths=[],
        config=NiahConfig(step=128, max_length=max_length, tests_per_length=tests),
    )


@pytest.fixture
def written(tmp_path):
    """A rope and two StRing evaluations of model m1, one of m2, and a training probe."""
    results = {
        "m1/name=rope": make_result([1.0, 0.25], 128, lengths=(128, 256)),
        "m1/name=string,local_window=32,shift_ratio=0.25": make_result([1.0, 1.0, 0.75], 384),
        "m1/name=string/local_window=64,shift_ratio=0.5": make_result([1.0, 0.5, 0.5], 384),
        "m2/name=string,local_window=32,shift_ratio=0.25": make_result([0.25], 0, lengths=(128,)),
        "m2/niah/step-0000040": make_result([0.5, 0.0], 128, lengths=(128, 256)),
    }
    for name, result in results.items():
        write_result(result, tmp_path / name, name)
    return tmp_path, results


def test_frames_equal_the_written_results(written):
    root, results = written
    frames = load_niah(root)
    by_source = frames.results.set_index("source")
    assert len(by_source) == len(results)
    for name, result in results.items():
        source = str(root / name / "niah.json")
        row = by_source.loc[source]
        assert row["effective_length"] == result.effective_length
        at_l = [r.rate for r in result.per_length if r.length == 384]
        assert row["accuracy"] == (at_l[0] if at_l else pytest.approx(math.nan, nan_ok=True))
        assert row["length"] == 384 and row["tests_per_length"] == 4
        assert (row["failure_depth_low"], row["failure_depth_high"]) == peak_failure_depth(result) == (0.5, 1.0)
        lengths = frames.per_length[frames.per_length["source"] == source]
        columns = ["length", "tests", "passed", "rate", "wilson_low", "wilson_high", "recall"]
        assert lengths[columns].values.tolist() == [[getattr(r, c) for c in columns] for r in result.per_length]
        cells = frames.heatmap[frames.heatmap["source"] == source]
        grid = cells.pivot(index="depth_low", columns="length", values="recall").to_numpy()
        np.testing.assert_array_equal(grid, result.heatmap)
    rows = by_source.loc[[str(root / n / "niah.json") for n in results]]
    assert rows["run"].tolist() == ["m1", "m1", "m1", "m2", "m2"]
    assert rows["step"].isna().tolist() == [True] * 4 + [False] and rows["step"].iloc[4] == 40
    assert rows["method"].tolist()[:4] == ["rope", "string", "string", "string"] and pd.isna(rows["method"].iloc[4])
    assert rows["local_window"].tolist()[1:4] == [32, 64, 32] and rows["shift_ratio"].tolist()[1:4] == [0.25, 0.5, 0.25]
    assert rows["label"].tolist() == [
        "rope",
        "string (local_window=32, shift_ratio=0.25)",
        "string (local_window=64, shift_ratio=0.5)",
        "string (local_window=32, shift_ratio=0.25)",
        "unknown",
    ]


def test_niah_result_round_trips(written):
    root, results = written
    for name, result in results.items():
        path = root / name / "niah.json"
        back = niah_result(path)
        assert isinstance(back, EffectiveLengthResult)
        assert json.dumps(back.to_dict()) == json.dumps(result.to_dict()) == json.dumps(json.loads(path.read_text()))


def test_parameters_from_the_file_and_from_the_caller_override_the_path(written):
    root, _ = written
    path = root / "m1" / "name=rope" / "niah.json"
    data = json.loads(path.read_text())
    data["position_method"] = {"name": "string", "string": {"local_window": 16, "shift_ratio": 0.4}}
    path.write_text(json.dumps(data))
    row = load_niah(path).results.iloc[0]
    assert (row["method"], row["local_window"], row["shift_ratio"]) == ("string", 16, 0.4)
    row = load_niah(path, params={path: {"eval.position_method.string.local_window": 8}}).results.iloc[0]
    assert (row["method"], row["local_window"], row["shift_ratio"]) == ("string", 8, 0.4)
    assert load_niah({"chosen": path}).results["run"].tolist() == ["chosen"]


def test_method_label_shows_only_non_default_parameters():
    defaults = {"local_window": 128, "shift_ratio": 1 / 3, "shift": 0, "compat": "paper"}
    assert method_label("string", defaults) == "string"
    assert method_label("string", {"shift_ratio": 0.5, "local_window": 32}) == (
        "string (local_window=32, shift_ratio=0.5)"
    )
    assert method_label(None, {}) == "unknown"


def test_wandb_runs_of_longctx_niah_agree_with_their_niah_json(fixture_run):
    frames = load_niah_wandb(fixture_run.wandb_eval)
    (row,) = frames.results.itertuples()
    assert (row.run, row.method, row.local_window, row.shift_ratio) == ("fixture-wandb", "string", 8, 0.25)
    assert row.label == "string (local_window=8, shift_ratio=0.25)" and row.length == 256
    same = load_niah(fixture_run.ablation / "fixture" / "name=string,local_window=8,shift_ratio=0.25")
    assert row.effective_length == same.results["effective_length"].iloc[0]
    assert row.accuracy == same.results["accuracy"].iloc[0]
    columns = ["length", "tests", "passed", "rate", "wilson_low", "wilson_high"]
    assert frames.per_length[columns].values.tolist() == same.per_length[columns].values.tolist()
    assert frames.heatmap.empty  # W&B keeps the heatmap as an image only
    run = next(fixture_run.wandb_eval.glob("wandb/offline-run-*"))
    assert load_niah_wandb(run).results["source"].tolist() == [str(run)]


def test_fixture_ablation_is_found_with_its_parameters(fixture_run):
    results = load_niah(fixture_run.ablation).results
    strings = results[results["method"] == "string"]
    assert sorted(zip(strings["local_window"], strings["shift_ratio"], strict=True)) == [
        (8, 0.25),
        (8, 0.5),
        (16, 0.25),
        (16, 0.5),
    ]
    assert set(results["run"]) == {"fixture"} and results["step"].isna().all()  # W&B folders are not searched


def test_bad_niah_files_are_named(tmp_path, fixture_run):
    with pytest.raises(FileNotFoundError, match=f"{tmp_path / 'missing'} matches no file"):
        load_niah(tmp_path / "missing")
    (tmp_path / "none").mkdir()
    with pytest.raises(FileNotFoundError, match="holds no niah.json"):
        load_niah(tmp_path / "none")
    cases = {
        "empty": ("", "is empty"),
        "text": ("effective length 3", "is not JSON"),
        "partial": (json.dumps({"effective_length": 3}), r"lacks \['per_length', 'config'\]"),
        "rows": (
            json.dumps({"effective_length": 3, "config": {}, "per_length": [{"length": 1}]}),
            "a per_length row lacks",
        ),
    }
    for name, (text, message) in cases.items():
        path = tmp_path / name / "niah.json"
        path.parent.mkdir()
        path.write_text(text)
        with pytest.raises(ValueError, match=message) as error:
            load_niah(path)
        assert str(path) in str(error.value)
    with pytest.raises(FileNotFoundError, match="holds no W&B run of `longctx niah`"):
        load_niah_wandb(fixture_run.run)
    training = next(fixture_run.run.glob("wandb/offline-run-*"))
    with pytest.raises(ValueError, match=f"{training} is a W&B run of job type ''"):
        load_niah_wandb(training)
