"""HELMET's long-document, summarization and ALCE metrics on hand-worked cases (utils.py's
calculate_metrics, data.py's default / choice post-processing, eval_alce.py's str_em,
QAMPARI scores and AutoAIS citation recall / precision with a fake NLI), ROUGE-L against an
independent LCS, the judge's formula with a fake judge, and `eval-score --task helmet_<task>`
on rows written in HELMET's output format, scored by hand."""

import json
import re

import pytest

from longctx.cli import main
from longctx.eval.helmet import HelmetError
from longctx.eval.helmet.citations import citation_scores, load_nli, row_citations
from longctx.eval.helmet.judge import judge_prompt, judge_scores, judged_score
from longctx.eval.helmet.scoring import choice_correct, post_processed, qampari_scores, rouge, str_em

pytest.importorskip("rouge_score")


def _lcs_f1(prediction: str, gold: str) -> float:
    """ROUGE-L F1 by hand: lower-cased alphanumeric tokens, LCS by dynamic programming."""
    p, g = re.findall(r"[a-z0-9]+", prediction.lower()), re.findall(r"[a-z0-9]+", gold.lower())
    table = [[0] * (len(g) + 1) for _ in range(len(p) + 1)]
    for i, a in enumerate(p):
        for j, b in enumerate(g):
            table[i + 1][j + 1] = table[i][j] + 1 if a == b else max(table[i][j + 1], table[i + 1][j])
    lcs = table[-1][-1]
    return 0.0 if lcs == 0 else 2 * lcs / (len(p) + len(g))


@pytest.mark.parametrize(
    ("prediction", "gold"),
    [
        ("the cat sat on the mat", "the cat is on the mat"),  # LCS 5 of 6 and 6: 5/6
        ("keeper of the light", "the light keeper"),
        ("Paris, France!", "paris"),
        ("", "nothing here"),
    ],
)
def test_rouge_l_is_the_lcs_f1(prediction, gold):
    assert rouge(prediction, gold)["rougeL_f1"] == pytest.approx(_lcs_f1(prediction, gold), abs=1e-12)


def test_rouge_l_hand_values_and_the_stemmer():
    assert rouge("the cat sat on the mat", "the cat is on the mat")["rougeL_f1"] == pytest.approx(5 / 6)
    assert rouge("running dogs", "run dog")["rougeL_f1"] == 1.0  # Porter: running -> run, dogs -> dog
    assert rouge("a b c", "a b c d e f")["rougeL_recall"] == pytest.approx(0.5)


def test_default_post_process_takes_the_max_of_output_and_parse():
    whole = post_processed("Answer: the old keeper\nmore", ["Keeper 2"])
    # output: "answer the old keeper more" (5 rouge tokens) vs "keeper 2": LCS 1 -> 2/7; parsed
    # "the old keeper" (3): 2/5 = 0.4; F1 (normalised, articles out): "old keeper" vs "keeper 2" = 0.5
    assert whole["rougeL_f1"] == pytest.approx(0.4) and whole["f1"] == pytest.approx(0.5)
    assert whole["substring_exact_match"] == 0.0 and whole["exact_match"] == 0.0
    assert post_processed("Answer: Keeper 2", ["Keeper 2"])["exact_match"] == 1.0


def test_choice_post_process():
    answers = ["C", "C. Blue"]
    assert choice_correct("Answer: C", answers) == 1.0  # the parse equals the letter
    assert choice_correct("I think c. blue is right", answers) == 1.0  # "c. blue" inside the output
    assert choice_correct("C) Blue", answers) == 1.0  # normalised "c blue" equals the second gold
    assert choice_correct("Answer: Blue", answers) == 0.0
    assert choice_correct("Answer: B", answers) == 0.0


def test_str_em_and_qampari_by_hand():
    pairs = [{"short_answers": ["City 0", "C0"]}, {"short_answers": ["Paris"]}]
    assert str_em("It is City 0 [1]. Not sure.\nAlso Paris[2]", pairs) == 1.0
    assert str_em("It is city 0 [1].", pairs) == 0.5
    scores = qampari_scores("Book A [1], book b [2], Book C [3].", [["Book A", "A"], ["Book B"]])
    # normalised predictions: "book" ("a" is an article), "book b", "book c"; golds "book", "", "book b"
    assert scores["prec"] == pytest.approx(2 / 3) and scores["rec"] == 1.0 and scores["rec_top5"] == 1.0
    assert scores["f1"] == pytest.approx(0.8)


DOCS = [
    {"title": "A", "text": "Paris is the capital of France."},
    {"title": "B", "text": "Berlin is in Germany."},
    {"title": "C", "text": "France has Paris as its capital city."},
]


def fake_nli(premise: str, hypothesis: str) -> bool:
    """Entailed when the premise names the city the claim names."""
    return any(city in premise and city in hypothesis for city in ("Paris", "Berlin"))


def test_citation_recall_and_precision_by_hand():
    pytest.importorskip("punkt")
    output = "Paris is the capital of France [1][2]. Berlin is German [2]. No citation here at all. Bad [7]."
    # S1 cites 1,2: jointly entailed; doc 1 alone entails (counts), doc 2 alone does not and doc 1
    # without it entails (over-cited). S2 cites 2: entailed. S3 cites none: 0. S4 cites 7 of 3: 0.
    # recall 2/4; precision 2 counted of 3 citations (S4's are out of range, not counted)
    rows = [
        {"output": output, "question": "q", "docs": DOCS},
        {"output": "", "question": "q", "docs": DOCS},  # no sentence: left out of the means
    ]
    scores = citation_scores(rows, fake_nli, qampari=False)
    assert scores == {"citation_rec": pytest.approx(50.0), "citation_prec": pytest.approx(200 / 3)}
    calls = []
    row_citations("Paris [1], Berlin [3]", "Cities:", DOCS, lambda p, h: calls.append(h) or True, True, str.split)
    assert calls == ["Cities: Paris", "Cities: Berlin"]  # QAMPARI: question + each comma item, citations out


def test_citations_and_nli_loading_refuse_without_a_model():
    with pytest.raises(HelmetError, match="need an NLI model: eval-score --nli PATH"):
        citation_scores([{"output": "x", "question": "q", "docs": DOCS}], None, qampari=False)
    with pytest.raises(HelmetError, match="need an NLI model"):
        load_nli("")


def test_judge_formula_with_a_fake_judge():
    prompt = judge_prompt("Where?", ["the pole", "north"], "Answer: at the pole\nand more")
    assert prompt.endswith("Question: Where?\nCorrect answers: ['the pole', 'north']\nAnswer: at the pole and more\n")
    replies = iter(['reasoning {"fluency": 1, "correctness": 3}', '{"fluency": 0, "correctness": 2}', "no json"])
    result = judged_score([("q", ["a"], "o")] * 3, lambda prompt: next(replies))
    assert result == {"judge_score": pytest.approx(100 / 3 * 1.5), "judged": 2}  # (3 + 0) / 2 rows judged
    with pytest.raises(HelmetError, match="--judge /nonexistent: not a model directory"):
        judge_scores("narrativeqa", [("q", ["a"], "o")], "/nonexistent")


def _helmet_file(tmp_path, name, rows):
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps({"data": rows, "averaged_metrics": {}}))
    return str(path)


def test_eval_score_long_document_tasks_by_hand(tmp_path, capsys):
    rows = [
        {"question": "Who?", "output": "Answer: Keeper 3", "answer": ["Keeper 3"]},
        {"question": "Who?", "output": "Answer: the old keeper", "answer": ["Keeper 2"]},
    ]
    assert main(["eval-score", "--task", "helmet_infbench_qa", _helmet_file(tmp_path, "qa", rows)]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["score"] == pytest.approx(100 * (1 + 0.4) / 2) and printed["rougeL_f1"] == printed["score"]
    assert printed["exact_match"] == 50.0 and "judge" not in printed
    choice = [
        {"output": "Answer: B", "answer": ["B", "B. Green"]},
        {"output": "Answer: A", "answer": ["B", "B. Green"]},
    ]
    assert main(["eval-score", "--task", "helmet_infbench_choice", _helmet_file(tmp_path, "mc", choice)]) == 0
    assert json.loads(capsys.readouterr().out)["score"] == 50.0
    assert main(["eval-score", "--task", "helmet_narrativeqa", _helmet_file(tmp_path, "nqa", rows)]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["judge"].startswith("not run: --judge PATH") and printed["rougeL_f1"] == pytest.approx(70.0)


def test_eval_score_alce_refuses_without_nli_and_scores_with_one(tmp_path, capsys, monkeypatch):
    pytest.importorskip("punkt")
    rows = [
        {
            "question": "Capital?",
            "output": "Paris is the capital of France [1][2]. Berlin is German [2]. No citation here at all.",
            "qa_pairs": [{"short_answers": ["Paris"]}, {"short_answers": ["Lyon"]}],
            "docs": DOCS,
        }
    ]
    path = _helmet_file(tmp_path, "alce_asqa", rows)
    assert main(["eval-score", "--task", "helmet_alce_asqa", path]) == 2
    assert "need an NLI model: eval-score --nli PATH" in capsys.readouterr().err
    from longctx.eval.helmet import citations

    monkeypatch.setattr(citations, "load_nli", lambda path: fake_nli)
    assert main(["eval-score", "--task", "helmet_alce_asqa", path, "--nli", str(tmp_path)]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["str_em"] == 50.0 and printed["score"] == 50.0
    assert printed["citation_rec"] == pytest.approx(200 / 3) and printed["citation_prec"] == pytest.approx(200 / 3)


def test_eval_score_summaries_parse_after_their_own_prefix(tmp_path, capsys):
    rows = [{"output": "Summary: the keeper tends the light\nend", "answer": "The keeper tends the light."}]
    # Multi-LexSum parses after "Summary:": "the keeper tends the light", ROUGE-L 1. InfiniteBench
    # Sum parses after "Answer:" (none: the first line, 6 tokens, LCS 5): 10/11; whole output 10/12
    assert main(["eval-score", "--task", "helmet_multi_lexsum", _helmet_file(tmp_path, "lex", rows)]) == 0
    assert json.loads(capsys.readouterr().out)["score"] == 100.0
    assert main(["eval-score", "--task", "helmet_infbench_sum", _helmet_file(tmp_path, "sum", rows)]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["score"] == pytest.approx(100 * 10 / 11, abs=1e-4) and printed["judge"].startswith("not run")


def test_eval_score_qampari_with_a_fake_nli(tmp_path, capsys, monkeypatch):
    pytest.importorskip("punkt")
    from longctx.eval.helmet import citations

    docs = [{"title": "x", "text": "about A"}, {"title": "y", "text": "about B"}]
    rows = [{"question": "Which books?", "output": "Book A [1], Book C [2]", "answers": [["Book A"], ["Book B"]]}]
    rows[0]["docs"] = docs
    # answers "book" ("a" is an article) and "book c": one gold set of two hit, one answer of two right;
    # claims "Which books? Book A" (doc 1 entails) and "Which books? Book C" (doc 2 does not)
    monkeypatch.setattr(citations, "load_nli", lambda path: lambda p, h: "Book A" in h and "about A" in p)
    path = _helmet_file(tmp_path, "alce_qampari", rows)
    assert main(["eval-score", "--task", "helmet_alce_qampari", path, "--nli", str(tmp_path)]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["score"] == printed["qampari_rec_top5"] == printed["qampari_prec"] == 50.0
    assert printed["citation_rec"] == printed["citation_prec"] == 50.0
