"""InfiniteBench's synthetic tasks: the generators' rules (OpenBMB/InfiniteBench
data/construct_synthetic_dataset.py), STRING's Llama templates, middle truncation, and
STRING's compute_scores on hand-worked predictions."""

import itertools
import json
import re
import statistics

import numpy as np
import pytest

from longctx.eval import infinitebench as ib
from longctx.eval.prompt_pieces import NOISE


@pytest.fixture(scope="module")
def generator(llama3):
    return ib.InfiniteBenchGenerator(llama3, seed=3)


def test_passkey_and_number_string_layout(generator, llama3):
    for task, question, tail in (
        ("passkey", "What is the pass key?", "The pass key is"),
        ("number_string", "What is the sequence of digits?", "The sequence of digits is"),
    ):
        for index in (0, 7, 23, 49):
            sample = generator.sample(task, 8192, index)
            head, body = sample.text.split("\n\n", 1)
            assert head.startswith("There is an important info hidden inside a lot of irrelevant text. Find it")
            context, rest = body.rsplit("\n\n\n", 1)
            assert rest == f"{question}\n\n{tail}"
            lines = context.split("\n")
            noise = [line for line in lines if line == NOISE]
            assert len(noise) == 326 and len(lines) == 327  # InfiniteBench's 8K table: 326 noise sentences
            depth = lines.index(next(line for line in lines if line != NOISE))
            repeats = 5 if task == "passkey" else 10
            assert depth == (index // repeats) * 6  # its 8K step
            key = sample.answer
            assert lines[depth] == (
                f"The pass key is {key}. Remember it. {key} is the pass key."
                if task == "passkey"
                else f"The sequence of digits is {key}. Remember it. {key} is the sequence of digits."
            )
            assert re.fullmatch(r"\d{5}" if task == "passkey" else r"\d{10}", key)
            assert sample.tokens_to_generate == (6 if task == "passkey" else 12)
            assert sample.input_ids.tolist() == llama3.encode(sample.text) and not sample.truncated


def test_number_string_duplicates_five_digits_in_place(generator):
    for index in range(20):
        key = generator.sample("number_string", 2048, index).answer
        # five insertions of a copy next to its original: at least 5 adjacent equal pairs in total
        assert sum(a == b for a, b in itertools.pairwise(key)) >= 5


def test_kv_retrieval_is_valid_json_and_asks_a_present_key(generator, llama3):
    for index in (0, 250, 499):
        sample = generator.sample("kv_retrieval", 16384, index)
        assert sample.text.startswith(
            "Extract the value corresponding to the specified key in the JSON object below.\n\n"
        )
        body = sample.text.split("JSON data:\n", 1)[1]
        records = json.loads(body.split("\n\n\nKey: ", 1)[0])
        assert len(records) == round(16384 * 2500 / 131072)
        key = re.search(
            r'\nKey: "([0-9a-f-]{36})"\nThe value associated with the specified key is: $', sample.text
        ).group(1)
        assert records[key] == sample.answer
        assert list(records).index(key) == int(index * len(records) / 500)
        assert sample.input_ids.tolist() == llama3.encode(sample.text)


def test_math_find_answers_recomputed_from_the_list(generator):
    kinds = {}
    for index in range(0, 350, 25):
        sample = generator.sample("math_find", 4096, index)
        kind = ib.MATH_TASKS[index // 50]
        values = json.loads(re.search(r"\n\n(\[.*\])\n\n", sample.text).group(1))
        assert len(values) == round(4096 * 60000 / 131072)
        distinct = sorted(set(values))
        expected = {
            "largest number": distinct[-1],
            "second largest number": distinct[-2],
            "third largest number": distinct[-3],
            "smallest number": distinct[0],
            "second smallest number": distinct[1],
            "third smallest number": distinct[2],
            "median": statistics.median(values),
        }[kind]
        assert sample.answer == expected
        word = "median number" if kind == "median" else kind
        assert sample.text.startswith(f"What is the {word} in the following list?\n\n[")
        assert sample.text.endswith(
            f"\n\nYou should answer with only one number, no other words. The {word} of the list is: "
        )
        kinds[kind] = True
    assert len(kinds) == 7


def test_middle_truncation_keeps_both_ends():
    ids = np.arange(10)
    assert ib.truncate_middle(ids, 6).tolist() == [0, 1, 2, 7, 8, 9]
    assert ib.truncate_middle(ids, 7).tolist() == [0, 1, 2, 7, 8, 9]  # STRING: split = max // 2 on both sides
    assert ib.truncate_middle(ids, 10).tolist() == list(range(10))


def test_long_prompts_are_cut_to_the_length(generator):
    sample = generator.sample("math_find", 8192, 0)  # ~3 tokens per number: more than 8K
    assert sample.truncated > 0 and len(sample.input_ids) == 8192


@pytest.mark.parametrize(
    ("task", "prediction", "answer", "score"),
    [
        ("passkey", " 12345. Remember", "12345", 1.0),
        ("passkey", "is 123456", "12345", 0.0),  # the first digit run must equal it
        ("number_string", "the digits: 9988776655", "9988776655", 1.0),
        ("kv_retrieval", '"abc-1": value', "abc-1", 1.0),
        ("kv_retrieval", "abc-12", "abc-1", 0.0),
        ("math_find", "  58.0 is it", 58, 1.0),
        ("math_find", "7", 7.5, 0.0),
        ("math_find", "7.5", 7.5, 1.0),
        ("math_find", "none", 3, 0.0),
    ],
)
def test_string_compute_scores_by_hand(task, prediction, answer, score):
    assert ib.sample_score(task, prediction, answer) == score


def test_task_score_is_a_percentage():
    assert ib.task_score("passkey", ["1", "2", "3", "x"], ["1", "2", "0", "0"]) == 50.0
