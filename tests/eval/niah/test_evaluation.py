"""NIAH evaluation wiring: `longctx niah`, `longctx niah-table`, and the training callback."""

import itertools
import json
import math

import pytest
import torch

from longctx.analysis.wandb_offline import offline_runs, read_history, read_run
from longctx.cli import main
from longctx.config.model import ModelConfig
from longctx.data.corpus import embedded_documents
from longctx.eval.effective_length import EffectiveLengthResult
from longctx.eval.niah.evaluation import peak_failure_depth
from longctx.eval.niah.table import format_table
from longctx.model.checkpoint import save_model
from longctx.model.llama import Llama
from tests.eval.niah.helpers import eval_args


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("model") / "model.safetensors"
    save_model(Llama(ModelConfig.from_preset("debug", max_position=256)), path)
    return path


def test_niah_command_writes_the_search_and_heatmap(checkpoint, haystack_file, tmp_path, capsys):
    args = [*eval_args(haystack_file), "log.wandb_mode=offline", f"train.out_dir={tmp_path}"]
    assert main(["niah", str(checkpoint), *args, "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "niah.json").read_text())
    logged = [row for row in read_history(offline_runs(tmp_path)[0]) if "niah/effective_length" in row]
    assert logged[0]["niah/effective_length"] == result["effective_length"]
    assert result["lengths"][0] == 128 and result["per_length"][0]["tests"] == 2
    assert result["effective_length"] == 0  # an untrained model finds no needle
    assert (tmp_path / "niah_heatmap.png").stat().st_size > 5_000
    assert "effective length: 0" in capsys.readouterr().out


def test_niah_command_logs_into_its_output_directory_with_a_progress_bar(checkpoint, haystack_file, tmp_path, capsys):
    """The W&B run goes under --out (not train.out_dir, which every point of a sweep
    shares); each length is a cell with a progress bar and a line when done, which a rerun
    keeps."""
    args = [
        *eval_args(haystack_file),
        "log.wandb_mode=offline",
        f"train.out_dir={tmp_path / 'train'}",
        "log.run_name=point_7",
    ]
    assert main(["niah", str(checkpoint), *args, "--out", str(tmp_path / "eval")]) == 0
    assert not (tmp_path / "train").exists()
    [run] = offline_runs(tmp_path / "eval")
    assert read_run(run)["name"] == "point_7"
    err = capsys.readouterr().err
    result = json.loads((tmp_path / "eval" / "niah.json").read_text())
    for length in result["lengths"]:
        assert f"done  model rope niah-paper L={length}: 0.000 (0/2" in err
    assert (tmp_path / "eval" / "cells" / "model" / "rope" / "niah-paper" / "L128" / "samples.jsonl").is_file()
    assert main(["niah", str(checkpoint), *args, "--out", str(tmp_path / "eval")]) == 0
    assert "kept  model rope niah-paper L=128" in capsys.readouterr().err


def test_niah_command_with_string_records_the_method_where_the_sweep_points_it(checkpoint, haystack_file, tmp_path):
    """eval.out_dir interpolates the point's settings (as sweeps/string_ablation.yaml does),
    and niah.json records the method, so the ablation loader needs no directory names."""
    from longctx.analysis.niah_results import load_niah

    out_dir = f"eval.out_dir={tmp_path}/W${{eval.position_method.string.local_window}}"
    args = [
        *eval_args(haystack_file),
        "eval.position_method.name=string",
        "eval.position_method.string.local_window=16",
        "eval.position_method.string.shift_ratio=0.25",
        out_dir,
    ]
    assert main(["niah", str(checkpoint), *args]) == 0
    written = json.loads((tmp_path / "W16" / "niah.json").read_text())
    assert written["per_length"]
    assert written["position_method"]["name"] == "string" and written["position_method"]["local_window"] == 16
    assert written["position_method"]["resolved"] == {"shift": 64, "local_window": 16, "compat": "paper"}  # 0.25 * 256
    row = load_niah(tmp_path).results.iloc[0]
    assert (row["method"], row["local_window"], row["shift_ratio"]) == ("string", 16, 0.25)


def test_niah_table_layout(checkpoint, haystack_file, tmp_path, capsys):
    sets = eval_args(haystack_file)
    out = tmp_path / "table.md"
    assert (
        main(
            [
                "niah-table",
                str(checkpoint),
                "--methods",
                "rope,string",
                *sets,
                "eval.position_method.string.local_window=16",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    lines = out.read_text().splitlines()
    assert lines[0] == "| method | model.safetensors |"
    assert lines[2].startswith("| rope | 0.0") and lines[3].startswith("| string | 0.0")


def test_peak_failure_depth_and_table_format():
    result = EffectiveLengthResult(
        effective_length=128,
        per_length=[],
        depth_edges=[0.0, 0.25, 0.5, 0.75, 1.0],
        depth_recall=[0.9, 0.2, math.nan, 0.6],
        heatmap=torch.zeros(4, 1).numpy(),
    )
    assert peak_failure_depth(result) == (0.25, 0.5)
    table = {"a": {"rope": {"accuracy": 0.5, "peak_failure_depth": (0.25, 0.5)}}}
    assert format_table(table, ["rope"]).splitlines()[2] == "| rope | 50.0 |"
    assert format_table(table, ["rope"]).splitlines()[-1] == "| a | 25-50% |"


def test_training_logs_effective_length_next_to_fi(haystack_file, tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(
        "".join(json.dumps({"text": d.text}) + "\n" for d in itertools.islice(embedded_documents(("prose",)), 60))
    )
    assert main(["prepare", str(corpus), str(tmp_path / "data"), "--tokenizer", "bpe-8192"]) == 0
    args = [
        *eval_args(haystack_file),
        f"data.path={tmp_path / 'data'}",
        "model.max_position=256",
        "data.window=256",
        "train.micro_batch_size=2",
        "train.global_batch_tokens=512",
        "train.max_steps=2",
        "train.warmup_steps=1",
        f"train.out_dir={tmp_path / 'run'}",
        "log.wandb_mode=offline",
        "log.every_steps=1",
        "probe.niah_every_steps=1",
        "probe.niah_tests_per_length=1",
        "probe.fi_every_steps=1",
    ]
    assert main(["pretrain", *args]) == 0
    history = read_history(offline_runs(tmp_path / "run")[0])
    # on the step axis of Lightning's own metrics: train/loss of optimizer step k is at k - 1
    loss_steps = [row["trainer/global_step"] for row in history if "train/loss" in row]
    assert [row["trainer/global_step"] for row in history if "niah/effective_length" in row] == loss_steps == [0, 1]
    assert any("niah/pass_rate.path" in row for row in history)
    assert (tmp_path / "run" / "niah" / "step-0000002" / "niah_heatmap.png").exists()


def test_niah_lengths_evaluates_every_given_length_without_the_search(checkpoint, haystack_file, tmp_path):
    """The search stops at an untrained model's first length; --lengths evaluates all."""
    assert (
        main(["niah", str(checkpoint), *eval_args(haystack_file), "--lengths", "256,128", "--out", str(tmp_path)]) == 0
    )
    result = json.loads((tmp_path / "niah.json").read_text())
    assert result["lengths"] == [128, 256]
    assert [row["tests"] for row in result["per_length"]] == [2, 2]


def test_niah_lengths_must_be_positive(checkpoint, haystack_file, tmp_path, capsys):
    assert main(["niah", str(checkpoint), *eval_args(haystack_file), "eval.niah.lengths=[128,0]"]) == 2
    assert "eval.niah.lengths" in capsys.readouterr().err


@pytest.fixture(scope="module")
def bpe512_checkpoint(tmp_path_factory):
    """A Lightning-layout checkpoint of a vocabulary-512 model whose run recorded data.tokenizer=bpe-512."""
    from longctx.config import ExperimentConfig, as_dict
    from longctx.config.model import config_dict

    model = Llama(ModelConfig.from_preset("debug", vocab_size=512, max_position=512))
    experiment = as_dict(ExperimentConfig())
    experiment["data"]["tokenizer"] = "bpe-512"
    path = tmp_path_factory.mktemp("ckpt") / "last.ckpt"
    torch.save(
        {
            "state_dict": {f"model.{name}": tensor for name, tensor in model.state_dict().items()},
            "hyper_parameters": {"config": experiment, "model": config_dict(model.config)},
        },
        path,
    )
    return path


def test_niah_command_writes_prompts_in_the_checkpoints_tokenizer(bpe512_checkpoint, haystack_file, tmp_path):
    """No data.tokenizer given: the prompts use the recorded bpe-512 (the default bpe-8192 would
    index past the 512-row embedding); overrides may follow the options."""
    out = tmp_path / "eval"
    assert main(["niah", str(bpe512_checkpoint), "--lengths", "256", "--out", str(out), *eval_args(haystack_file)]) == 0
    result = json.loads((out / "niah.json").read_text())
    assert [row["length"] for row in result["per_length"]] == [256]


def test_niah_command_lets_the_user_override_the_checkpoints_tokenizer(
    bpe512_checkpoint, haystack_file, caplog, capsys
):
    """data.tokenizer overrides the recorded bpe-512 with a warning; bpe-1024 then has more ids
    than the model's 512 embedding rows, an error naming both."""
    args = eval_args(haystack_file)
    with caplog.at_level("WARNING"):
        assert main(["niah", str(bpe512_checkpoint), *args, "data.tokenizer=bpe-1024"]) == 2
    assert f"data.tokenizer=bpe-1024 overrides the tokenizer of {bpe512_checkpoint} (bpe-512)" in caplog.text
    assert f"has 1024 tokens, the model's vocab_size is 512 ({bpe512_checkpoint})" in capsys.readouterr().err


def test_niah_command_names_a_tokenizer_larger_than_the_vocabulary(haystack_file, tmp_path, capsys):
    """A safetensors file records no tokenizer and its 512 rows are not the default bpe-8192's:
    an error asks for one; a named tokenizer with more ids than rows is an error naming both."""
    path = tmp_path / "small.safetensors"
    save_model(Llama(ModelConfig.from_preset("debug", vocab_size=512, max_position=512)), path)
    assert main(["niah", str(path), *eval_args(haystack_file)]) == 2
    assert f"{path} does not record its tokenizer and its vocab_size 512 is not that of bpe-8192" in (
        capsys.readouterr().err
    )
    assert main(["niah", str(path), *eval_args(haystack_file), "data.tokenizer=bpe-1024"]) == 2
    assert f"bpe-1024 has 1024 tokens, the model's vocab_size is 512 ({path})" in capsys.readouterr().err
