"""Pretraining on a retrieval mixture: the answer-loss probe and the count of cut answers."""

import json

import pytest
import torch

from longctx import config as config_module
from longctx.cli import main
from longctx.data.tokenizer import load_tokenizer
from longctx.errors import ConfigError
from longctx.model.checkpoint import load_model
from longctx.probes.retrieval_answers import answer_metrics
from tests.train.helpers import overrides


def retrieval_args(workspace, tmp_path, **extra) -> list[str]:
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
    settings = {
        "data.path": "''",
        "data.mixture": source,
        "data.window": 256,
        "model.max_position": 256,
        "train.global_batch_tokens": 1024,
        "train.max_steps": 4,
        "probe.answer_every_steps": 2,
        "probe.answer_documents": 4,
    }
    return overrides(workspace, tmp_path / "run", **{**settings, **extra})


@pytest.fixture(scope="module")
def retrieval_run(workspace, tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("retrieval_run")
    args = retrieval_args(workspace, tmp_path)
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


def test_a_run_ends_at_the_first_answer_probe_below_the_stop_threshold(workspace, tmp_path, retrieval_run):
    first_probe = {json.loads(line)["step"]: json.loads(line) for line in (retrieval_run[0] / "metrics.jsonl").open()}
    threshold = first_probe[2]["answers/loss"] + 1e-3  # the fixture's model at step 2 is just below it
    args = retrieval_args(workspace, tmp_path, **{"train.max_steps": 8, "probe.answer_stop_below": threshold})
    assert main(["pretrain", *args]) == 0
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows if "answers/loss" in row] == [2]
    assert max(row["step"] for row in rows) == 2
    assert torch.load(tmp_path / "run" / "checkpoints" / "last.ckpt", weights_only=False)["global_step"] == 2


def test_the_stop_threshold_needs_the_probe(workspace, tmp_path):
    args = retrieval_args(workspace, tmp_path, **{"probe.answer_every_steps": 0, "probe.answer_stop_below": 2.0})
    with pytest.raises(ConfigError, match="probe.answer_stop_below"):
        config_module.load([], args)


def test_answer_probe_leaves_out_the_repeat_drill(workspace, tmp_path):
    """answers/loss is the NIAH answers' loss: a `template: repeat` source in the mixture
    (a copying drill) is not probed, the retrieval sources keep their mixture index."""
    from longctx.train.callbacks.answer import AnswerLossCallback

    drill = {"kind": "retrieval", "retrieval": {"template": "repeat", "queries": 0, "facts": 8}}
    niah = {"kind": "retrieval", "retrieval": {"template": "niah", "queries": 0}}
    args = retrieval_args(workspace, tmp_path, **{"data.mixture": json.dumps([drill, niah])})
    config = config_module.load([], args)
    callback = AnswerLossCallback(config, tokenizer=None, out_dir=tmp_path)
    assert [(index, source.template) for index, source in callback.sources] == [(1, "niah")]
