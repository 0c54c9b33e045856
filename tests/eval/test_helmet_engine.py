"""HELMET on the engine: its tasks and categories through `eval-suite --suite helmet`, the
samples of the file tasks (fit, stop at a newline, truncation, refusal), the category
means of the table, and a cell's samples.jsonl scored by `eval-score` as the cell scored it."""

import json
from pathlib import Path

import pytest

from longctx.cli import main
from longctx.config import ExperimentConfig
from longctx.config.model import ModelConfig
from longctx.errors import ConfigError
from longctx.eval.cells import Cell, CellResult
from longctx.eval.helmet import HelmetPromptTooShortError
from longctx.eval.suite_table import assemble, format_markdown, suite_tasks
from longctx.model.checkpoint import save_model
from longctx.model.inference.generation import Generation
from longctx.model.llama import Llama

DATA = Path(__file__).parents[1] / "fixtures" / "helmet" / "data"


@pytest.fixture
def config():
    config = ExperimentConfig()
    config.eval.benchmarks.helmet_dir = str(DATA)
    return config


def test_categories_select_their_tasks(config):
    names = [t.name for t in suite_tasks("helmet", ["rag", "rerank"], config)]
    assert names == ["helmet-nq", "helmet-triviaqa", "helmet-hotpotqa", "helmet-popqa", "helmet-msmarco"]
    assert [t.name for t in suite_tasks("helmet", ["icl"], config)][-1] == "helmet-nlu"


@pytest.mark.parametrize("task", ["nq", "popqa", "msmarco", "trec_coarse", "banking77"])
def test_file_task_samples_fit_stop_at_newline_and_score_their_references(task, config, tokenizer):
    (engine,) = suite_tasks("helmet", [task], config)
    samples = engine.samples(0, 1024, 2, tokenizer)
    assert engine.samples(0, 1024, 1, tokenizer)[0].prompt_ids == samples[0].prompt_ids
    for sample in samples:
        assert len(sample.prompt_ids) + sample.max_new_tokens <= 1024
        assert sample.stop.stop_strings == ("\n",)
        if task == "msmarco":  # the gold ranking: ids by label
            qrels = sample.metadata["references"]
            ranking = " > ".join(d for d, _ in sorted(qrels, key=lambda pair: int(pair[1]), reverse=True))
            assert engine.score(sample, Generation([], " " + ranking, "eos")) == 1.0
        else:
            assert engine.score(sample, Generation([], " " + sample.references[0], "eos")) == 1.0
            assert engine.score(sample, Generation([], "", "eos")) == 0.0
        details = engine.details(sample, Generation([], " x", "eos"))
        assert details["pred"].endswith(": x") and json.dumps(details)


def test_a_short_length_truncates_the_context_then_refuses(config, tokenizer):
    (engine,) = suite_tasks("helmet", ["nq"], config)
    full = engine.samples(0, 4096, 1, tokenizer)[0]
    assert full.metadata["truncated"] == 0
    short = engine.samples(0, len(full.prompt_ids) - 30 + 20, 1, tokenizer)[0]
    assert short.metadata["truncated"] >= 30 and len(short.prompt_ids) <= len(full.prompt_ids) - 30
    with pytest.raises(HelmetPromptTooShortError):
        engine.samples(0, 200, 1, tokenizer)


def test_file_tasks_need_the_directory(tokenizer):
    (engine,) = suite_tasks("helmet", ["nq"], ExperimentConfig())
    with pytest.raises(ConfigError, match="eval.benchmarks.helmet_dir: is empty"):
        engine.samples(0, 1024, 1, tokenizer)


def _result(task, length, scores):
    summary = {"score": sum(scores) / len(scores), "count": len(scores)}
    return CellResult(Cell("m", "rope", task, length), [{"score": s} for s in scores], summary)


def test_the_table_has_category_means():
    results = [
        _result("helmet-nq", 1024, [1.0, 0.0]),
        _result("helmet-popqa", 1024, [1.0, 1.0]),
        _result("helmet-trec_coarse", 1024, [0.0, 0.0]),
    ]
    table = assemble(results, "helmet")
    assert table["categories"] == {"rag": ["nq", "popqa"], "icl": ["trec_coarse"]}
    entries = table["lengths"]["1024"]["m"]["rope"]
    assert entries["mean:rag"] == pytest.approx(75.0) and entries["mean:icl"] == 0.0
    assert entries["mean"] == pytest.approx(50.0)
    text = format_markdown(table)
    assert "| method | nq | popqa | trec_coarse | rag | icl | helmet mean (3 tasks) |" in text
    assert "| 75.0 | 0.0 | 50.0 |" in text


@pytest.mark.slow  # decoding on CPU: 3 tasks x 2 samples at 512 tokens
def test_eval_suite_helmet_on_a_tiny_model(tmp_path, capsys):
    pytest.importorskip("wonderwords")
    checkpoint = tmp_path / "m.safetensors"
    save_model(Llama(ModelConfig.from_preset("debug", max_position=1024)), checkpoint)
    out = tmp_path / "out" / "helmet.md"
    sets = ["eval.benchmarks.samples_per_length=2", "log.wandb_mode=disabled", f"eval.benchmarks.helmet_dir={DATA}"]
    args = [
        "eval-suite",
        str(checkpoint),
        "--suite",
        "helmet",
        "--tasks",
        "nq,trec_coarse,json_kv",
        "--lengths",
        "1024",
    ]
    assert main([*args, *sets, "--out", str(out), "--quiet"]) == 0
    table = json.loads(out.with_suffix(".json").read_text())
    assert table["categories"] == {"rag": ["nq"], "icl": ["trec_coarse"], "recall": ["json_kv"]}
    assert "mean:recall" in table["lengths"]["1024"]["m.safetensors"]["rope"]
    cell = tmp_path / "out" / "cells" / "m.safetensors" / "rope" / "helmet-nq" / "L1024"
    capsys.readouterr()
    assert main(["eval-score", "--task", "helmet_nq", str(cell / "samples.jsonl")]) == 0
    summary = json.loads((cell / "summary.json").read_text())
    assert json.loads(capsys.readouterr().out)["score"] == pytest.approx(100 * summary["score"])


@pytest.mark.parametrize("task", ["json_kv", "ruler_niah_mk_2"])
def test_recall_prompts_leave_room_for_helmets_generation(task, config, tokenizer, haystack):
    pytest.importorskip("wonderwords")
    (engine,) = suite_tasks("helmet", [task], config, haystack)
    (sample,) = engine.samples(0, 1024, 1, tokenizer)
    assert sample.max_new_tokens == {"json_kv": 100, "ruler_niah_mk_2": 50}[task]
    assert 1024 - 130 < len(sample.prompt_ids) + sample.max_new_tokens <= 1024
