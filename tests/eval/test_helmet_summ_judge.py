"""HELMET's summary judge (scripts/eval_gpt4_summ.py) with a scripted judge in GPT-4o's place:
the rendered prompts and parse_json against HELMET's own code (tests/fixtures/helmet/
judge_summ.json: sha256, length and tail of each prompt, and parse_json's results, made by
executing that file's prompt strings, format calls and parse_json at the commit it names:
tools/fixtures/make_helmet_fixtures.py),
the F1 formula on hand-worked rows, and `eval-score --judge` end to end on HELMET's output
format and on longctx's prediction lines, with key points from tests/fixtures/helmet/data."""

import hashlib
import json
from pathlib import Path

import pytest

from longctx.cli import main
from longctx.config import ExperimentConfig
from longctx.eval.helmet import HelmetError, judge
from longctx.eval.helmet.summ_judge import (
    SummaryRow,
    judged_summaries,
    parse_json,
    row_scores,
    summary_prompts,
    summary_rows,
)
from longctx.eval.suite_table import suite_tasks
from longctx.model.inference.generation import Generation

FIXTURES = Path(__file__).parents[1] / "fixtures" / "helmet"
DATA = FIXTURES / "data"
HELMET = json.loads((FIXTURES / "judge_summ.json").read_text(encoding="utf-8"))


@pytest.mark.parametrize("item", HELMET["rows"], ids=lambda item: item["task"])
def test_prompts_are_helmets(item):
    task, row = item["task"], item["row"]
    keypoints = {str(row["id"]): {"keypoints": row["keypoints"], "summary/short_keypoints": row["keypoints"]}}
    golds = row.get("answer", [""])
    (built,) = summary_rows(task, [row], [row["output"]], [golds], keypoints, "fixture")
    for name, prompt in zip(("fluency", "recall", "precision"), summary_prompts(task, built), strict=True):
        expected = item["prompts"][name]
        assert prompt[-300:] == expected["tail"] and len(prompt) == expected["chars"], name
        assert hashlib.sha256(prompt.encode()).hexdigest() == expected["sha256"], name


def test_parse_json_is_helmets():
    for case in HELMET["parse_json"]:
        assert parse_json(case["reply"]) == case["parsed"], case["reply"]


def _replies(fluency, recall, precision, count):
    return [
        f'Fluent. {{"fluency": {fluency}}}',
        f'Reasoning: ... Output: {{"recall": {recall}}}',
        f'Output: {{"precision": {precision}, "sentence_count": {count}}}',
    ]


def test_row_scores_by_hand():
    # 4 key points, 2 found: recall 1/2; 3 of 5 sentences: precision 3/5; F1 = 2 x 0.3 / 1.1 = 6/11
    scores = row_scores(4, _replies(1, 2, 3, 5))
    assert scores == pytest.approx({"fluency": 1, "recall": 0.5, "precision": 0.6, "f1": 6 / 11})
    # fluency 0 gates F1 to 0; recall and precision stand
    assert row_scores(4, _replies(0, 2, 3, 5)) == pytest.approx(
        {"fluency": 0, "recall": 0.5, "precision": 0.6, "f1": 0}
    )
    # no key points: recall 0, and F1 = 2 x 0 x 0.6 / 0.6 = 0
    assert row_scores(0, _replies(1, 2, 3, 5))["f1"] == 0
    # no sentences counted and nothing found: both 0, F1 0 (no division by zero)
    assert row_scores(4, _replies(1, 0, 3, 0)) == {"fluency": 1, "recall": 0, "precision": 0, "f1": 0}
    # a judge counting 3 of 2 key points: recall 1.5, unclamped as in HELMET; precision 1/2: F1 = 1.5/2 = 0.75
    assert row_scores(2, _replies(1, 3, 1, 2)) == pytest.approx(
        {"fluency": 1, "recall": 1.5, "precision": 0.5, "f1": 0.75}
    )


@pytest.mark.parametrize(
    "replies",
    [
        ["no json", '{"recall": 1}', '{"precision": 1, "sentence_count": 1}'],  # HELMET: parse_json None, row skipped
        ['{"fluency": 1}', '{"recall": 1}', '{"precision": 1, "sentence_count": {"n": 1}}'],  # nested: unreadable
        ['{"fluency": 1}', '{"score": 1}', '{"precision": 1, "sentence_count": 1}'],  # HELMET: KeyError
        ['{"fluency": "1"}', '{"recall": 1}', '{"precision": 1, "sentence_count": 1}'],  # HELMET: TypeError
        ['{"fluency": 1}', "[1, 2]", '{"precision": 1, "sentence_count": 1}'],  # JSON, not an object
    ],
)
def test_an_unreadable_reply_leaves_the_row_out(replies):
    assert row_scores(3, replies) is None


def test_judged_summaries_mean_the_rows_judged():
    rows = [SummaryRow("Summary: a.", ("p1", "p2", "p3", "p4"), "Expert.")] * 3
    replies = iter([*_replies(1, 2, 3, 5), *_replies(1, 4, 2, 2), "I cannot judge.", *_replies(1, 1, 1, 1)[1:]])
    prompts = []
    result = judged_summaries("multi_lexsum", rows, lambda prompt: prompts.append(prompt) or next(replies))
    # row 1: recall 0.5, precision 0.6, F1 6/11; row 2: recall 1, precision 1, F1 1; row 3 unread
    assert result == pytest.approx(
        {
            "judge_score": round(100 * (6 / 11 + 1) / 2, 4),
            "judge_recall": 75.0,
            "judge_precision": 80.0,
            "judge_fluency": 100.0,
            "judged": 2,
            "unread": 1,
        }
    )
    assert len(prompts) == 9 and "evaluate the fluency" in prompts[0] and '"recall": 2' in prompts[1]
    with pytest.raises(HelmetError, match="no reply of the judge held HELMET's JSON scores"):
        judged_summaries("infbench_sum", rows[:1], lambda prompt: "nothing")


def scripted_judge(log):
    """A judge whose replies are fixed by the prompt's kind: fluent, 1 key point found, 2 of 4
    sentences supported."""

    def reply(prompt: str) -> str:
        log.append(prompt)
        if "evaluate the fluency" in prompt:
            return 'The text is coherent. {"fluency": 1}'
        if "Recall:" in prompt:
            return 'Key point 1 is present. Output: {"recall": 1}'
        return 'Sentences 1 and 3 are supported.\n```json\n{"precision": 2, "sentence_count": 4}\n```'

    return reply


@pytest.fixture
def fake_judge(monkeypatch):
    log, loads = [], []

    def load(path, max_new_tokens=1024):
        loads.append((path, max_new_tokens))
        return scripted_judge(log)

    monkeypatch.setattr(judge, "load_judge", load)
    return log, loads


def _helmet_file(tmp_path, rows):
    path = tmp_path / "multi_lexsum_8192.json"
    path.write_text(json.dumps({"data": rows, "averaged_metrics": {}}))
    return str(path)


def test_eval_score_judges_multi_lexsum(tmp_path, capsys, fake_judge):
    log, loads = fake_judge
    rows = [
        {
            "id": "case-0",
            "output": "Summary: Case 0 was settled.",
            "answer": "Case 0 was settled.",
            "summary/long": "L0.",
        },
        {
            "id": "case-2",
            "output": "Summary: The city won.",
            "answer": "Case 2 was settled.",
        },  # its file's summary/long
    ]
    path = _helmet_file(tmp_path, rows)
    args = ["eval-score", "--task", "helmet_multi_lexsum", path, "--judge", str(tmp_path), "--helmet-data", str(DATA)]
    assert main(args) == 0
    printed = json.loads(capsys.readouterr().out)
    # each row: 2 key points, 1 found -> 1/2; 2 of 4 sentences -> 1/2; F1 1/2, fluency 1
    assert printed["judge"] == {
        "judge_score": 50.0,
        "judge_recall": 50.0,
        "judge_precision": 50.0,
        "judge_fluency": 100.0,
        "judged": 2,
        "unread": 0,
        "judge_model": str(tmp_path),
    }
    assert printed["score"] == printed["rougeL_f1"] == 50.0  # ROUGE-L beside it: 1 and 0 after "Summary:"
    assert loads == [(str(tmp_path), 4096)] and len(log) == 6
    assert "1. Case 0 was brought against the city.\n2. Case 0 was settled." in log[1]
    assert log[2].endswith('Expert summary: "L0."\n\nProvided summary: "Summary: Case 0 was settled."\n')
    assert 'Expert summary: "Case 2 was brought against the city. The parties settled it."' in log[5]


def test_eval_score_judges_infbench_sum_prediction_lines(tmp_path, capsys, fake_judge):
    log, _ = fake_judge
    lines = tmp_path / "samples.jsonl"
    record = {"pred": "Summary: The keeper tends the light.", "outputs": ["The keeper of story 1 tends it."], "id": 1}
    lines.write_text(json.dumps(record) + "\n")
    args = ["eval-score", "--task", "helmet_infbench_sum", str(lines), "--judge", str(tmp_path)]
    assert main([*args, "--helmet-data", str(DATA)]) == 0
    judged = json.loads(capsys.readouterr().out)["judge"]
    # 4 key points, 1 found: recall 1/4; precision 1/2: F1 = 2 x 1/8 / (3/4) = 1/3
    assert judged["judge_score"] == pytest.approx(100 / 3, abs=1e-4) and judged["judge_recall"] == 25.0
    assert "4. The ship arrives safely." in log[1] and "novel" in log[2]
    assert "<start of summary>The keeper of story 1 tends it.<end of summary>" in log[2]


def test_eval_score_summary_judge_errors_name_the_option_or_file(tmp_path, capsys, fake_judge):
    rows = [{"id": "case-9", "output": "Summary: x.", "answer": "y", "summary/long": "z"}]
    path = _helmet_file(tmp_path, rows)
    args = ["eval-score", "--task", "helmet_multi_lexsum", path, "--judge", str(tmp_path)]
    assert main(args) == 2
    assert "eval-score --helmet-data DIR" in capsys.readouterr().err
    assert main([*args, "--helmet-data", str(tmp_path)]) == 2
    assert "multi_lexsum/multi_lexsum_val.jsonl not found" in capsys.readouterr().err
    assert main([*args, "--helmet-data", str(DATA)]) == 2
    assert "row 0's id 'case-9' has no key points" in capsys.readouterr().err
    _, loads = fake_judge
    assert loads == []  # refused before the judge model loads


def test_summary_cells_keep_the_id_and_expert_summary(tokenizer):
    config = ExperimentConfig()
    config.eval.benchmarks.helmet_dir = str(DATA)
    (engine,) = suite_tasks("helmet", ["multi_lexsum"], config)
    sample = engine.samples(0, 2048, 1, tokenizer)[0]
    record = engine.details(sample, Generation([], " Settled.", "eos"))
    source = {r["id"]: r for r in map(json.loads, (DATA / "multi_lexsum" / "validation.jsonl").open())}
    assert record["summary/long"] == source[record["id"]]["summary/long"]
    assert record["outputs"] == source[record["id"]]["summary/short"]
    (engine,) = suite_tasks("helmet", ["infbench_sum"], config)
    record = engine.details(engine.samples(0, 1600, 1, tokenizer)[0], Generation([], " x", "eos"))
    source = {r["id"]: r for r in map(json.loads, (DATA / "infbench" / "longbook_sum_eng.jsonl").open())}
    assert record["outputs"] == source[record["id"]]["answer"]
