"""RULER's scorer on hand-worked examples (NVIDIA/RULER scripts/eval/evaluate.py and
scripts/eval/synthetic/constants.py), and `longctx eval-score` on a RULER prediction file."""

import json

import pytest

from longctx.cli import main
from longctx.eval import stats
from longctx.eval.ruler import scoring
from longctx.eval.ruler.tokens import RulerError


def test_postprocess_strips_and_turns_control_characters_into_newlines():
    assert scoring.postprocess("  \x02 The answer:\tAB\x1fcd \n") == "The answer:\nAB\ncd"


def test_string_match_all_by_hand():
    # sample 1: both of 2 found (case-insensitive) -> 1; sample 2: 1 of 4 -> 0.25; sample 3: none -> 0
    predictions = ["The numbers are 1234567 and ABC-def.", "only 42", ""]
    references = [["1234567", "abc-DEF"], ["42", "43", "44", "45"], ["x"]]
    # (1 + 0.25 + 0) / 3 * 100 = 41.666... -> 41.67
    assert scoring.task_score("niah_multivalue", predictions, references) == 41.67


def test_string_match_part_by_hand():
    # qa: any reference counts; sample 2 has none of its answers
    predictions = [" Denver Broncos", "Carolina", "the  Panthers"]
    references = [["Denver Broncos", "Broncos"], ["Panthers"], ["Panthers", "x"]]
    assert scoring.task_score("qa_1", predictions, references) == 66.67


def test_match_is_plain_substring_after_postprocessing():
    # RULER does not collapse whitespace nor look at word boundaries
    assert scoring.sample_score("niah_single_1", "x1234567y", ["1234567"]) == 1.0
    assert scoring.sample_score("niah_single_1", "123 4567", ["1234567"]) == 0.0
    assert scoring.sample_score("vt", "AAAAA\x00BBBBB", ["AAAAA\nBBBBB"]) == 1.0


def test_effective_length_is_the_largest_length_above_85_6():
    scores = {4096: 95.0, 8192: 86.0, 16384: 85.6, 32768: 90.0, 65536: 40.0}
    assert scoring.effective_length(scores) == 32768  # the largest passing one, as RULER reads its tables
    assert scoring.effective_length({4096: 85.6}) is None


def test_averages_by_hand():
    # scores 90, 80, 70 at increasing lengths: inc weights 1,2,3 / 6, dec 3,2,1 / 6
    result = stats.averages({8192: 80.0, 4096: 90.0, 16384: 70.0})
    assert result["avg"] == pytest.approx(80.0)
    assert result["wavg_inc"] == pytest.approx((90 + 160 + 210) / 6)
    assert result["wavg_dec"] == pytest.approx((270 + 160 + 70) / 6)


def test_suite_names_never_call_eleven_tasks_ruler():
    from longctx.eval.ruler import SYNTHETIC_TASKS, TASKS

    assert scoring.suite_name(TASKS) == "RULER"
    assert scoring.suite_name(SYNTHETIC_TASKS) == "RULER-11"
    assert scoring.suite_name(["vt", "cwe"]) == "RULER subset (2 tasks)"


def test_eval_score_prints_one_json_line(tmp_path, capsys):
    path = tmp_path / "niah_multivalue.jsonl"
    rows = [
        {
            "index": 0,
            "pred": "1111111, 2222222, 3333333 and 4444444",
            "outputs": ["1111111", "2222222", "3333333", "4444444"],
        },
        {"index": 1, "pred": "I think 5555555", "outputs": ["5555555", "6666666", "7777777", "8888888"]},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["eval-score", "--task", "niah_multivalue", str(path)]) == 0
    assert json.loads(capsys.readouterr().out) == {"task": "niah_multivalue", "score": 62.5, "n": 2}


def test_eval_score_infinitebench_task(tmp_path, capsys):
    path = tmp_path / "math.jsonl"
    path.write_text('{"pred": "58.0", "outputs": [58]}\n{"pred": "The answer is 7", "outputs": [8]}\n')
    assert main(["eval-score", "--task", "math_find", str(path)]) == 0
    assert json.loads(capsys.readouterr().out)["score"] == 50.0
    assert main(["eval-score", "--task", "math_find", "--compat", "infinitebench", str(path)]) == 0
    assert json.loads(capsys.readouterr().out)["score"] == 0.0


def test_eval_score_names_the_bad_line(tmp_path, capsys):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"pred": "x", "outputs": ["x"]}\n{"prediction": "y"}\n')
    assert main(["eval-score", "--task", "vt", str(path)]) == 2
    assert f"{path}:2" in capsys.readouterr().err
    with pytest.raises(RulerError, match="not one of"):
        scoring.metric_of("niah_single_9")
