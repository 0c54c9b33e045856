"""Pretraining on a retrieval mixture: the answer-loss probe and the count of cut answers."""

import json

import pytest

from longctx import config as config_module
from longctx.cli import main
from longctx.data.tokenizer import load_tokenizer
from longctx.model.checkpoint import load_model
from longctx.probes.retrieval_answers import answer_metrics
from tests.train.helpers import overrides


@pytest.fixture(scope="module")
def retrieval_run(workspace, tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("retrieval_run")
    source = json.dumps(
        [
            {
                "kind": "retrieval",
                "path": str(tmp_path / "retrieval"),
                "retrieval": {
                    "documents": 80,
                    "template": "niah",
                    "queries": 0,
                    "filler_max": 2,
                    "value_digits": 4,
                    "value_digits_max": 9,
                },
            }
        ]
    )
    args = overrides(
        workspace,
        tmp_path / "run",
        **{
            "data.path": "''",
            "data.mixture": source,
            "data.window": 256,
            "model.max_position": 256,
            "train.global_batch_tokens": 1024,
            "train.max_steps": 4,
            "probe.answer_every_steps": 2,
            "probe.answer_documents": 4,
        },
    )
    assert main(["pretrain", *args]) == 0
    return tmp_path / "run", args


def test_answer_probe_logs_the_loss_of_the_model_at_that_step(retrieval_run):
    out, args = retrieval_run
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    logged = {row["step"]: row["answers/loss"] for row in rows if "answers/loss" in row}
    assert sorted(logged) == [2, 4]
    config = config_module.load([], args)
    tokenizer = load_tokenizer(config.data.tokenizer)
    model = load_model(out / "checkpoints" / "last.ckpt")
    again = answer_metrics(model, tokenizer, config.data.mixture[0].retrieval, 256, documents=4)
    assert logged[4] == pytest.approx(again["answer_loss"], rel=1e-5)


def test_run_counts_the_answers_a_row_edge_cut(retrieval_run):
    out, _ = retrieval_run
    report = json.loads((out / "answer_masking.json").read_text())
    assert report["packing"] == "stream" and report["masked"] and report["rows"] == 4 * 4
    (source,) = report["sources"]
    assert 0 < source["cut"] < source["answers"]
