"""eval/niah/table.py: the table assembled from cells equals the effective-length search
of `longctx niah` (niah/evaluation.evaluate) on the same config, cell by cell and output by
output; the peak failure depth pools a model's lengths; W&B gets the cells and the table."""

import dataclasses
import math

import numpy as np
import pytest
import torch

from longctx.analysis.wandb_offline import offline_runs, read_history
from longctx.cli import main
from longctx.config import ExperimentConfig
from longctx.config.model import ModelConfig
from longctx.config.position_methods import PositionMethodConfig, StringConfig
from longctx.eval.cell_progress import CellProgress
from longctx.eval.cells import Cell, CellResult
from longctx.eval.niah.evaluation import evaluate, peak_failure_depth, search_settings
from longctx.eval.niah.generator import make_samples
from longctx.eval.niah.table import assemble_table, format_table, method_table
from longctx.model.checkpoint import save_model
from longctx.model.inference.prefill import greedy_generate_recompute
from longctx.model.llama import Llama
from tests.eval.niah.helpers import eval_args


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return Llama(ModelConfig.from_preset("debug", max_position=256, init_std=0.2)).eval()


def test_table_equals_the_search_on_the_same_config(model, tokenizer, haystack, tmp_path):
    config = ExperimentConfig()
    config.eval.niah = dataclasses.replace(config.eval.niah, tests_per_length=3, max_new_tokens=10, batch_tokens=512)
    arms = {
        "rope": PositionMethodConfig(name="rope"),
        "string": PositionMethodConfig(name="string", string=StringConfig(local_window=16)),
    }
    lengths = [192, 256]
    table, results = method_table(
        {"m": model}, arms, config, tokenizer, haystack, lengths, cells_dir=tmp_path, progress=CellProgress(quiet=True)
    )
    settings = dataclasses.replace(search_settings(config, model), lengths=lengths)
    for arm, method in arms.items():
        search = evaluate(model, config, tokenizer, haystack, method=method, settings=settings)
        for row in search.per_length:
            assert table[f"m@{row.length}"][arm] == {
                "accuracy": row.rate,
                "passed": row.passed,
                "tests": row.tests,
                "wilson": (row.wilson_low, row.wilson_high),
                "peak_failure_depth": peak_failure_depth(search),
            }
    # Outputs too: each rope record's text is the full-recompute greedy decoding, cut at EOS.
    for result in results:
        samples = make_samples(tokenizer, haystack, result.cell.length, 3, seed=0)
        prompts = torch.from_numpy(np.stack([s.input_ids for s in samples]))
        assert result.cell.method != "rope" or [r["text"] for r in result.records] == [
            tokenizer.decode(row[: row.index(tokenizer.eos_id)] if tokenizer.eos_id in row else row)
            for row in greedy_generate_recompute(model, prompts, 10).tolist()
        ]
    assert {r.cell.method for r in results} == {"rope", "string"}


def _result(method, length, found, depths):
    records = [{"found": f, "depths": d, "score": float(sum(f) >= 2)} for f, d in zip(found, depths, strict=True)]
    passed = sum(r["score"] for r in records)
    summary = {"count": len(records), "score": passed / len(records), "passed": int(passed), "wilson": [0.1, 0.9]}
    return CellResult(Cell("m", method, "niah-paper", length), records, summary)


def test_peak_failure_depth_pools_the_lengths_of_a_model_and_method():
    """Hand-worked: bands of 0.5; at L=100 the answers at depth 0.1 and 0.2 are found, at
    L=200 the one at 0.3 is missed, those at 0.7 and 0.9 found: recall 2/3 in [0, 0.5), 2/2
    in [0.5, 1] pooled over both lengths, so the peak failure band is 0-50%."""
    results = [
        _result("rope", 100, [[True, True]], [[0.1, 0.2]]),
        _result("rope", 200, [[False, True, True]], [[0.3, 0.7, 0.9]]),
        _result("string", 200, [[True, False]], [[0.1, 0.9]]),
    ]
    models = {"m": Llama(ModelConfig.from_preset("debug", max_position=200))}
    table = assemble_table(results, models, [100, 200], depth_bands=2)
    assert table["m@100"]["rope"]["peak_failure_depth"] == (0.0, 0.5)
    assert table["m@200"]["rope"]["peak_failure_depth"] == (0.0, 0.5)
    assert table["m@200"]["string"]["peak_failure_depth"] == (0.5, 1.0)
    assert table["m@200"]["rope"]["accuracy"] == 1.0 and table["m@100"]["rope"]["tests"] == 1
    assert "string" not in table["m@100"]
    lines = format_table(table, ["rope", "string"]).splitlines()
    assert lines[3] == "| string | - | 0.0 [10, 90] n=1 |"
    assert math.isnan(assemble_table([], models, None, 2)["m"].get("rope", {}).get("accuracy", math.nan))


def test_another_benchmarks_task_tables_its_mean_score_without_depths():
    """eval.niah.task=ruler-<task>: niah-table runs the task the search runs (eval/registry.py);
    its records carry no depths and its scores may be fractions."""
    from longctx.eval.niah.table import niah_grid

    config = ExperimentConfig()
    config.eval.niah.task = "ruler-niah_multivalue"
    models = {"m": Llama(ModelConfig.from_preset("debug", max_position=200))}
    arms = {"rope": PositionMethodConfig()}
    assert [task.name for task in niah_grid(models, arms, config, None).tasks] == ["ruler-niah_multivalue"]
    records = [{"score": 0.75, "pred": "x", "outputs": ["1"]}, {"score": 0.25, "pred": "y", "outputs": ["2"]}]
    result = CellResult(Cell("m", "rope", "ruler-niah_multivalue", 200), records, {"count": 2, "score": 0.5})
    entry = assemble_table([result], models, None, depth_bands=2)["m"]["rope"]
    assert entry["accuracy"] == 0.5 and entry["tests"] == 2 and "wilson" not in entry
    assert all(math.isnan(edge) for edge in entry["peak_failure_depth"])
    assert format_table({"m": {"rope": entry}}, ["rope"]).splitlines()[2] == "| rope | 50.0 |"


def test_niah_table_command_reuses_its_cells_and_logs_them_to_wandb(tmp_path, haystack_file, capsys):
    checkpoint = tmp_path / "m.safetensors"
    save_model(Llama(ModelConfig.from_preset("debug", max_position=256)), checkpoint)
    out = tmp_path / "out" / "table.md"
    sets = [*eval_args(haystack_file), "log.wandb_mode=offline"]
    args = ["niah-table", str(checkpoint), *sets, "--methods", "rope", "--lengths", "128,256", "--out", str(out)]
    assert main(args) == 0
    err = capsys.readouterr().err
    assert "done  m.safetensors rope niah-paper L=128: 0.000 (0/2" in err and "L=256" in err
    cells = sorted(
        p.relative_to(tmp_path / "out" / "cells") for p in (tmp_path / "out" / "cells").rglob("summary.json")
    )
    assert [str(p) for p in cells] == [
        "m.safetensors/rope/niah-paper/L128/summary.json",
        "m.safetensors/rope/niah-paper/L256/summary.json",
    ]
    [run] = offline_runs(tmp_path / "out")
    [row] = [row for row in read_history(run) if "niah_table/cells.nrows" in row]
    assert row["niah_table/cells.nrows"] == 2 and row["niah_table/accuracy.nrows"] == 1  # 2 cells; 1 method
    assert row["niah_table/accuracy.ncols"] == 3  # method, m.safetensors@128, m.safetensors@256
    first = out.read_text()
    assert main([*args, "--quiet"]) == 0
    err = capsys.readouterr().err
    assert "done " not in err and "kept " not in err and "/2" not in err  # quiet: no lines, no bar
    assert out.read_text() == first
    records = sorted((tmp_path / "out" / "cells").rglob("samples.jsonl"))
    assert [len(path.read_text().splitlines()) for path in records] == [2, 2]  # nothing decoded again


def test_arms_outside_the_table_are_refused(tmp_path, haystack_file, capsys):
    checkpoint = tmp_path / "m.safetensors"
    save_model(Llama(ModelConfig.from_preset("debug", max_position=256)), checkpoint)
    sets = eval_args(haystack_file)
    assert main(["niah-table", str(checkpoint), "--methods", "rope,ntk", "--arms", "rope,dca", *sets]) == 2
    assert "--arms names ['dca'], which are not among the arms ['ntk', 'rope']" in capsys.readouterr().err
    assert not (tmp_path / "cells").exists()


def test_set_is_refused_naming_the_positional_form(tmp_path, haystack_file, capsys):
    """Checkpoints, YAML files and overrides are told apart by form; `--set` is an error
    that shows the new form."""
    with pytest.raises(SystemExit) as stopped:
        main(["niah-table", str(tmp_path / "m.safetensors"), "--set", "eval.niah.tests_per_length=2"])
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert "--set is gone" in err and "longctx niah-table CKPT experiments/real/smollm2_table1.yaml" in err
    with pytest.raises(SystemExit):
        main(["eval-suite", "CKPT", "--suite", "ruler", "--lengths", "512", "--set", "a.yaml"])
    assert "longctx eval-suite CKPT experiments/real/smollm2_ruler.yaml" in capsys.readouterr().err
    assert main(["niah-table", "run.yaml", "eval.niah.step=64"]) == 2
    assert "no checkpoint among ['run.yaml', 'eval.niah.step=64']" in capsys.readouterr().err


def test_checkpoints_and_config_are_told_apart_by_form():
    from longctx.cli.common import checkpoints_and_config

    items = ["runs/a/last.ckpt", "x.yaml", "hf/smollm2", "eval.niah.step=64", "y.yml"]
    assert checkpoints_and_config(items) == (
        ["runs/a/last.ckpt", "hf/smollm2"],
        ["x.yaml", "eval.niah.step=64", "y.yml"],
    )
