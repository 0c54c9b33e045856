"""`longctx eval-suite`: RULER / InfiniteBench cells on the engine, the STRING Table 2/3
layout, cells that are RULER prediction files for `longctx eval-score`."""

import json

import pytest

from longctx.cli import main
from longctx.config.model import ModelConfig
from longctx.eval.cells import Cell, CellResult
from longctx.eval.suite_table import assemble, format_markdown
from longctx.model.checkpoint import save_model
from longctx.model.llama import Llama

pytest.importorskip("wonderwords")


def _result(method, task, length, scores):
    summary = {"score": sum(scores) / len(scores), "count": len(scores)}
    return CellResult(Cell("m", method, task, length), [{"score": s} for s in scores], summary)


def test_assemble_means_averages_and_effective_length():
    results = [
        _result("rope", "ruler-vt", 1024, [1.0, 1.0]),
        _result("rope", "ruler-cwe", 1024, [1.0, 0.8]),  # mean 0.9
        _result("rope", "ruler-vt", 2048, [1.0, 0.0]),
        _result("rope", "ruler-cwe", 2048, [0.5, 0.5]),
    ]
    table = assemble(results, "ruler")
    assert table["tasks"] == ["vt", "cwe"] and table["mean_name"] == "RULER subset (2 tasks)"
    by_length = table["summary"]["m"]["rope"]["by_length"]
    assert by_length == {1024: pytest.approx(95.0), 2048: pytest.approx(50.0)}
    assert table["summary"]["m"]["rope"]["effective_length"] == 1024
    assert table["summary"]["m"]["rope"]["wavg_inc"] == pytest.approx((95 + 2 * 50) / 3)
    low, high = table["lengths"]["1024"]["m"]["rope"]["cwe"]["interval"]
    assert low < 90 < high
    text = format_markdown(table)
    assert "| rope | 100.0" in text and "RULER subset (2 tasks) by length" in text


@pytest.mark.slow  # ~100 s on 2 loaded cores (bpe tokenizer, 16 cells of decoding)
def test_eval_suite_command_on_a_tiny_model(tmp_path, capsys):
    checkpoint = tmp_path / "m.safetensors"
    save_model(Llama(ModelConfig.from_preset("debug", max_position=512)), checkpoint)
    out = tmp_path / "out" / "ruler.md"
    items = ["eval.benchmarks.samples_per_length=2", "log.wandb_mode=disabled", "eval.niah.max_new_tokens=8"]
    sets = items
    args = ["eval-suite", str(checkpoint), "--suite", "ruler", "--tasks", "niah_single_1,fwe", "--lengths", "512,1024"]
    assert main([*args, *sets, "--methods", "rope,string", "--out", str(out), "--quiet"]) == 0
    table = json.loads(out.with_suffix(".json").read_text())
    assert table["mean_name"] == "RULER subset (2 tasks)"
    assert set(table["lengths"]) == {"512", "1024"}
    assert set(table["lengths"]["512"]["m.safetensors"]) == {"rope", "string"}
    cell = tmp_path / "out" / "cells" / "m.safetensors" / "rope" / "ruler-fwe" / "L1024"
    records = [json.loads(line) for line in (cell / "samples.jsonl").read_text().splitlines()]
    assert len(records) == 2 and all(r["prompt_tokens"] + 50 <= 1024 for r in records)
    assert all(len(r["outputs"]) == 3 and "pred" in r for r in records)
    capsys.readouterr()
    assert main(["eval-score", "--task", "fwe", str(cell / "samples.jsonl")]) == 0
    scored = json.loads(capsys.readouterr().out)
    summary = json.loads((cell / "summary.json").read_text())
    assert scored["score"] == round(100 * summary["score"], 2) and scored["n"] == 2
    first = out.read_text()
    assert main([*args, *sets, "--methods", "rope,string", "--out", str(out), "--quiet"]) == 0  # cells reused
    assert out.read_text() == first


@pytest.mark.slow
def test_eval_suite_infinitebench_passkey(tmp_path):
    checkpoint = tmp_path / "m.safetensors"
    save_model(Llama(ModelConfig.from_preset("debug", max_position=512)), checkpoint)
    out = tmp_path / "ib.md"
    sets = ["eval.benchmarks.samples_per_length=2", "log.wandb_mode=disabled"]
    args = ["eval-suite", str(checkpoint), "--suite", "infinitebench", "--tasks", "passkey", "--lengths", "512"]
    assert main([*args, *sets, "--out", str(out), "--quiet"]) == 0
    table = json.loads(out.with_suffix(".json").read_text())
    assert table["lengths"]["512"]["m.safetensors"]["rope"]["passkey"]["n"] == 2


def test_a_chat_template_the_tokenizer_lacks_names_the_benchmarks_key():
    """eval.benchmarks.chat_template=auto on a tokenizer with no template: the error names the
    benchmarks' key, the one the user set (not eval.niah's)."""
    from longctx.config.eval import BenchmarkConfig
    from longctx.data.tokenizer import load_tokenizer
    from longctx.errors import ConfigError
    from longctx.eval.infinitebench.engine_task import InfiniteBenchTask
    from longctx.eval.ruler.engine_task import RulerContexts, RulerTask

    plain = load_tokenizer("bpe-8192")
    settings = BenchmarkConfig(chat_template="auto")
    message = (
        r"eval\.benchmarks\.chat_template: is auto, but tokenizer bpe-8192 has no chat_template \(set eval\.benchmarks"
    )
    with pytest.raises(ConfigError, match=message):
        RulerTask("vt", RulerContexts(settings)).samples(0, 1024, 1, plain)
    with pytest.raises(ConfigError, match=message):
        InfiniteBenchTask("passkey", settings).samples(0, 1024, 1, plain)
