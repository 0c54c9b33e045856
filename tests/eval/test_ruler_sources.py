"""RULER's text sources: punkt sentences as NLTK splits them, wonderwords 2.2.0's lists."""

import re

import pytest

pytest.importorskip("punkt")
pytest.importorskip("wonderwords")

from longctx.eval.essays import paul_graham_text
from longctx.eval.ruler.sources import Essay, punkt_english, wonderwords_lists


def test_nltk_punkt_on_the_shipped_parameters_splits_the_essays_as_the_independent_punkt_package():
    import punkt

    text = re.sub(r"\s+", " ", paul_graham_text()).strip()
    assert punkt_english().tokenize(text) == punkt.sent_tokenize(text, "english")


def test_punkt_keeps_abbreviations_inside_sentences():
    assert punkt_english().tokenize("Dr. Smith went home. He was tired.") == ["Dr. Smith went home.", "He was tired."]


def test_essay_sentence_starts_are_word_indices_of_punkt_sentences():
    essay = Essay("Mr. Brown met Ms. Green.  They talked.\nThen it rained. Fin.")
    assert essay.words == ["Mr.", "Brown", "met", "Ms.", "Green.", "They", "talked.", "Then", "it", "rained.", "Fin."]
    assert essay.sentence_starts.tolist() == [0, 5, 7, 10]
    # the text repeated past its end: each copy starts a sentence
    assert essay.sentence_starts_before(14).tolist() == [0, 5, 7, 10, 11]


def test_wonderwords_lists_are_the_2_2_0_release():
    import importlib.metadata

    assert importlib.metadata.version("wonderwords") == "2.2.0"
    lists = wonderwords_lists()
    assert {k: len(v) for k, v in lists.items()} == {"nouns": 6786, "adjectives": 912, "verbs": 1042}
    assert len(set(lists["nouns"] + lists["adjectives"] + lists["verbs"])) == 8169
