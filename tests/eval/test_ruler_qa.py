"""qa_1 / qa_2 from SQuAD v2 and HotpotQA dev files given by path (small files in their format)."""

import json
import re

import pytest

from longctx.eval.ruler import RulerContext, RulerError, RulerOptions, make_sample


def _paragraph(article: int, number: int) -> str:
    return (
        f"Article {article} paragraph {number} says that the colour of item {article}-{number} is shade {number * 7}. "
        * 3
    )


@pytest.fixture(scope="module")
def squad_file(tmp_path_factory):
    data = {"version": "v2.0", "data": []}
    for article in range(12):
        paragraphs = []
        for number in range(4):
            context = _paragraph(article, number)
            qas = [
                {
                    "id": f"{article}-{number}",
                    "question": f"What is the colour of item {article}-{number}?",
                    "answers": [
                        {"text": f"shade {number * 7}", "answer_start": 0},
                        {"text": f"{number * 7}", "answer_start": 0},
                    ],
                    "is_impossible": False,
                },
                {"id": f"{article}-{number}-x", "question": "Unanswerable?", "answers": [], "is_impossible": True},
            ]
            paragraphs.append({"context": context, "qas": qas})
        data["data"].append({"title": f"A{article}", "paragraphs": paragraphs})
    path = tmp_path_factory.mktemp("qa") / "dev-v2.0.json"
    path.write_text(json.dumps(data))
    return path


@pytest.fixture(scope="module")
def hotpot_file(tmp_path_factory):
    rows = []
    for q in range(30):
        context = [[f"Title {q}-{k}", [f"Fact {q}-{k} one. ", f"Fact {q}-{k} two."]] for k in range(10)]
        rows.append(
            {"_id": str(q), "question": f"Which fact pairs with {q}?", "answer": f"fact {q}-0", "context": context}
        )
    path = tmp_path_factory.mktemp("qa") / "hotpot_dev_distractor_v1.json"
    path.write_text(json.dumps(rows))
    return path


def _documents(text: str) -> list[str]:
    body = text.split("The following are given documents.\n\n", 1)[1].split("\n\nAnswer the question based", 1)[0]
    parts = re.split(r"(?:^|\n\n)Document (\d+):\n", body)
    assert parts[0] == "" and [int(n) for n in parts[1::2]] == list(range(1, len(parts) // 2 + 1))
    return parts[2::2]


def test_qa_1_golden_then_same_article_paragraphs_and_answers(llama3, squad_file):
    ctx = RulerContext(llama3, options=RulerOptions(squad_path=str(squad_file)))
    for index in range(6):
        sample = make_sample(ctx, "qa_1", 1024, index)
        article, number = divmod(index, 4)  # answerable questions in file order
        assert sample.outputs == (f"shade {number * 7}", f"{number * 7}")
        assert sample.metric == "string_match_part" and sample.tokens_to_generate == 32
        docs = _documents(sample.text)
        assert _paragraph(article, number) in docs
        same_article = [d for d in docs if d.startswith(f"Article {article} ")]
        assert len(same_article) == min(4, len(docs))  # the other paragraphs of its article come next
        assert len(docs) == len(set(docs))
        assert sample.text.endswith(f"Question: What is the colour of item {article}-{number}? Answer:")
        assert len(sample.input_ids) + 32 <= 1024 and sample.input_ids.tolist() == llama3.encode(sample.text)


def test_qa_2_all_paragraphs_of_the_question_and_distractors(llama3, hotpot_file):
    ctx = RulerContext(llama3, options=RulerOptions(hotpotqa_path=str(hotpot_file)))
    sample = make_sample(ctx, "qa_2", 2048, 3)
    docs = _documents(sample.text)
    assert {f"Title 3-{k}\nFact 3-{k} one. Fact 3-{k} two." for k in range(10)} <= set(docs)
    assert len(docs) > 10 and sample.outputs == ("fact 3-0",)
    assert 2048 - 60 < len(sample.input_ids) + 32 <= 2048


def test_qa_without_its_file_is_a_clear_error(llama3, tmp_path):
    with pytest.raises(RulerError, match="eval.ruler.squad_path"):
        make_sample(RulerContext(llama3), "qa_1", 1024, 0)
    bad = tmp_path / "bad.json"
    bad.write_text('{"data": [{"no": 1}]}')
    with pytest.raises(RulerError, match="is not a squad file"):
        make_sample(RulerContext(llama3, options=RulerOptions(squad_path=str(bad))), "qa_1", 1024, 0)
