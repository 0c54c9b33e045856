"""HELMET's metrics (eval/helmet/scoring.py) on hand-worked cases, nDCG@10 against trec_eval
(pytrec-eval-terrier, the package HELMET scores re-ranking with), and `longctx eval-score`
on HELMET's own output files: tests/fixtures/helmet/outputs/*.json are rows written by hand
in HELMET's eval.py format, their `averaged_metrics` computed by HELMET's own
post-processing (data.py, utils.py) at the commit their args name
(tools/fixtures/make_helmet_fixtures.py)."""

import json
import math
import random
from pathlib import Path

import pytest

from longctx.cli import main
from longctx.eval.helmet import ndcg_at_k, normalise, parse_output, parse_rankings, sample_score, task_score
from longctx.eval.helmet.scoring import f1_score, qa_metrics

OUTPUTS = Path(__file__).parents[1] / "fixtures" / "helmet" / "outputs"


def test_normalisation_and_the_qa_metrics_by_hand():
    assert normalise("The  Eiffel-Tower, an icon!") == "eiffeltower icon"
    metrics = qa_metrics("Answer: the Eiffel Tower", ["Eiffel Tower", "Paris"])
    assert metrics == {"exact_match": 0.0, "f1": pytest.approx(0.8), "substring_exact_match": 1.0}
    # precision 2/3 ("answer eiffel tower" vs "eiffel tower"), recall 1: F1 = 0.8
    assert qa_metrics("Eiffel tower.", "eiffel Tower")["exact_match"] == 1.0
    assert f1_score("yes", "no") == 0.0 and f1_score("no", "no") == 1.0
    assert f1_score("no it is red", "red") == pytest.approx(2 * (1 / 4) * 1 / (1 / 4 + 1))
    assert qa_metrics("orchard", [["apple"], ["the orchard"]])["exact_match"] == 1.0


def test_parsing_follows_helmet():
    assert parse_output("Answer: Paris\nAnswer: Rome") == "Paris"
    assert parse_output("label: label: 5", "label:") == "5"
    assert parse_output("no prefix here\nsecond", "label:") == "no prefix here"
    assert parse_rankings("Ranking: [ID: 3] > [ID: 1] > [ID: 2]") == {"3": 3, "1": 2, "2": 1}
    assert parse_rankings("2 > 2 > 1 and then 4 > 3") == {"2": 3, "1": 1}
    assert parse_rankings("none") == {"none": 1}


def test_ndcg_at_10_by_hand():
    qrels = {"1": 2, "2": 0, "3": 3, "4": 1}
    dcg = 3 / math.log2(2) + 2 / math.log2(3)
    ideal = 3 + 2 / math.log2(3) + 1 / math.log2(4)
    assert ndcg_at_k({"3": 3, "1": 2, "2": 1}, qrels) == pytest.approx(dcg / ideal)
    assert round(dcg / ideal, 5) == 0.895
    assert ndcg_at_k({"9": 1}, qrels) == 0.0 and ndcg_at_k({"1": 1}, {"1": 0}) == 0.0


def test_ndcg_at_10_matches_trec_eval():
    pytrec_eval = pytest.importorskip(
        "pytrec_eval", reason="pytrec-eval-terrier is not installed (longctx[dev] installs it)"
    )
    rng = random.Random(3)
    for trial in range(200):
        docs = [str(rng.randrange(40)) for _ in range(rng.randrange(1, 25))]
        qrels = {d: rng.choice([0, 0, 1, 2, 3]) for d in docs}
        pool = sorted(set(docs) | {"99", "98"})
        ranked = rng.sample(pool, rng.randrange(1, min(8, len(pool)) + 1))
        scores = {d: len(ranked) - i for i, d in enumerate(ranked)}
        if trial % 5 == 0:  # ties, broken as trec_eval breaks them
            scores = {d: rng.randrange(3) for d in ranked}
        evaluator = pytrec_eval.RelevanceEvaluator({"q": qrels}, {"ndcg_cut.10"})
        expected = evaluator.evaluate({"q": {d: float(s) for d, s in scores.items()}})["q"]["ndcg_cut_10"]
        assert ndcg_at_k(scores, qrels) == pytest.approx(expected, abs=1e-9), (scores, qrels)


def test_the_task_metrics_by_hand():
    assert sample_score("nq", "Answer: The castle was built by King Copper.", ["King Copper"]) == 1.0
    assert sample_score("trec_coarse", "label: 3\nlabel: 4", ["4"]) == 0.0
    assert sample_score("json_kv", 'Corresponding value: "A1B2-C3D4".', ["a1b2-c3d4"]) == 1.0
    assert sample_score("ruler_niah_mv", "12, 7 and 5", ["12", "5", "9", "30"]) == 0.5
    assert sample_score("msmarco", "Ranking: 3 > 1 > 2", [["1", "2"], ["2", "0"], ["3", "3"], ["4", "1"]]) == 0.895
    assert task_score("nq", ["Answer: x", "Answer: y"], [["x"], ["z"]]) == 50.0


@pytest.mark.parametrize("task", ["nq", "trec_coarse", "json_kv", "msmarco"])
def test_eval_score_reproduces_helmets_averaged_metric(task, capsys):
    file = OUTPUTS / f"{task}.json"
    expected = next(iter(json.loads(file.read_text())["averaged_metrics"].values()))
    assert main(["eval-score", "--task", f"helmet_{task}", str(file)]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["task"] == task and printed["score"] == pytest.approx(expected, abs=1e-4)


def test_eval_score_reads_longctx_prediction_lines(tmp_path, capsys):
    lines = tmp_path / "samples.jsonl"
    rows = [{"pred": "label: 3", "outputs": ["3"]}, {"pred": "label: 1", "outputs": ["2"]}]
    lines.write_text("".join(json.dumps(row) + "\n" for row in rows))
    assert main(["eval-score", "--task", "trec_coarse", str(lines)]) == 0
    assert json.loads(capsys.readouterr().out)["score"] == 50.0
