"""RULER's 11 synthetic tasks: 20 samples per task at two lengths obey RULER's rules
(NVIDIA/RULER scripts/data/synthetic/*.py, synthetic.yaml): template and answer prefix,
needle / chain / word counts, depths in sentence units, the length window, the reference
answers, and prompts that tokenise as their text does."""

import re
from collections import Counter

import numpy as np
import pytest

from longctx.eval.prompt_pieces import NOISE
from longctx.eval.ruler import SYNTHETIC_TASKS, RulerContext, RulerOptions, make_sample
from longctx.eval.ruler.constants import DEPTHS
from longctx.eval.ruler.sources import punkt_english, wonderwords_lists

LENGTHS = (2048, 4096)
SAMPLES = 20
NUMBER = re.compile(r"^\d{7}$")
UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$")
NEEDLE = re.compile(r"One of the special magic (numbers|uuids|words) for (\S+) is: (\S+)\.")
WINDOW = {"niah_multikey_3": 90, "niah_multikey_2": 40, "cwe": 60}
"""Most tokens one more haystack unit can take (a UUID needle; a number needle; a word x 3)."""


@pytest.fixture(scope="module")
def samples(ruler_ctx):
    return {
        (task, length): [make_sample(ruler_ctx, task, length, i) for i in range(SAMPLES)]
        for task in SYNTHETIC_TASKS
        for length in LENGTHS
    }


def _words():
    lists = wonderwords_lists()
    return set(lists["adjectives"]), set(lists["nouns"])


@pytest.mark.parametrize("task", SYNTHETIC_TASKS)
def test_length_rule_and_window(samples, llama3, task):
    for length in LENGTHS:
        for sample in samples[task, length]:
            used = len(sample.input_ids) + sample.tokens_to_generate
            assert used <= length
            assert used > length - WINDOW.get(task, 30), (task, length, used)
            assert sample.input_ids.tolist() == llama3.encode(sample.text)  # pieces tokenise as the text
            assert sample.text.endswith(sample.answer_prefix)


@pytest.mark.parametrize("task", [t for t in SYNTHETIC_TASKS if t.startswith("niah")])
def test_niah_needles_keys_values_and_template(samples, task):
    from longctx.eval.ruler.constants import TASKS

    args = TASKS[task].args
    adjectives, nouns = _words()
    kind = args["type_needle_v"]
    single = args["num_needle_q"] * args["num_needle_v"] == 1
    for length in LENGTHS:
        for sample in samples[task, length]:
            text = sample.text
            needles = NEEDLE.findall(text)
            assert all(k == kind for k, _, _ in needles)
            answers = [(key, value) for _, key, value in needles if value in sample.outputs]
            assert sorted(v for _, v in answers) == sorted(sample.outputs)
            assert len(sample.outputs) == args["num_needle_q"] * args["num_needle_v"]
            key_of = {value: key for key, value in answers}
            asked = list(dict.fromkeys(key_of[value] for value in sample.outputs))  # query order
            assert len(asked) == args["num_needle_q"]
            query = asked[0] if len(asked) == 1 else None
            if args["type_haystack"] != "needle":
                assert len(needles) == args["num_needle_k"] * args["num_needle_v"]
                assert len({key for _, key, _ in needles}) == args["num_needle_k"]
            for key, value in answers:
                assert (NUMBER if kind == "numbers" else UUID).match(value)
                if args["type_needle_k"] == "words":
                    assert any(key.startswith(a + "-") and key[len(a) + 1 :] in nouns for a in adjectives), key
                else:
                    assert UUID.match(key)
            if single:
                assert text.startswith(
                    f"A special magic {kind[:-1]} is hidden within the following text. Make sure to memorize it. "
                    f"I will quiz you about the {kind[:-1]} afterwards.\n"
                )
                assert text.endswith(
                    f"\nWhat is the special magic {kind[:-1]} for {query} mentioned in the provided text? "
                    f"The special magic {kind[:-1]} for {query} mentioned in the provided text is"
                )
            else:
                keys = asked[0] if len(asked) == 1 else ", ".join(asked[:-1]) + ", and " + asked[-1]
                assert text.startswith("Some special magic numbers are hidden within the following text.")
                assert f"\nWhat are all the special magic numbers for {keys} mentioned in the provided text?" in text
                assert text.endswith(f" The special magic numbers for {keys} mentioned in the provided text are")


@pytest.mark.parametrize("task", ["niah_single_1", "niah_multikey_2", "niah_multikey_3"])
def test_line_haystacks_hold_only_noise_or_needles(samples, task):
    for sample in samples[task, 4096]:
        body = sample.text.split("afterwards.\n", 1)[1].split("\nWhat ", 1)[0]
        lines = body.split("\n")
        needles = [line for line in lines if NEEDLE.fullmatch(line)]
        noise = [line for line in lines if line == NOISE]
        assert len(needles) + len(noise) == len(lines)
        assert (len(needles), bool(noise)) == (1, True) if task == "niah_single_1" else not noise


@pytest.mark.parametrize("task", ["niah_single_2", "niah_multikey_1", "niah_multivalue", "niah_multiquery"])
def test_essay_needles_sit_at_ruler_depths_in_punkt_sentences(samples, task):
    """Take the needles out, split the essay text with punkt: each needle went in before
    sentence p = int(S * d / 100) for distinct d of RULER's 40 depths."""
    for length in LENGTHS:
        for sample in samples[task, length]:
            body = sample.text.split("afterwards.\n", 1)[1].rsplit("\nWhat ", 1)[0]
            pieces = NEEDLE.split(body)
            essay_parts = pieces[::4]
            haystack = " ".join(part.strip() for part in essay_parts if part.strip())
            spans = list(punkt_english().span_tokenize(haystack))
            starts = np.array([len(haystack[:start].split()) for start, _ in spans] + [len(haystack.split())])
            count = len(spans)
            words_before = np.cumsum([len(p.split()) for p in essay_parts])[:-1]
            points = [int(np.searchsorted(starts, w)) for w in words_before]
            assert all(starts[p] == w for p, w in zip(points, words_before, strict=True))  # at sentence starts
            depths = [[d for d in DEPTHS if int(count * d / 100) == p] for p in points]
            assert all(depths), (points, count)
            used: set[int] = set()
            for options in sorted(depths, key=len):  # distinct depths can explain the points
                free = [d for d in options if d not in used]
                assert free
                used.add(free[0])


def test_vt_chain_example_and_answer(samples):
    for length in LENGTHS:
        for sample in samples["vt", length]:
            example, task_text = sample.text.split("\nMemorize and track", 1)
            assert example.startswith("Memorize and track the chain(s) of variable assignment")
            example_chain = re.findall(r"VAR ([A-Z]{3}) = (?:VAR ([A-Z]{3})|(\d{5}))", example)
            assert len(example_chain) == 5
            chain = re.findall(r"VAR ([A-Z]{5}) = (?:VAR ([A-Z]{5}) |(\d{5})\n)", task_text)
            assert len(chain) == 5
            names = [chain[0][0]]
            for name, previous, _ in chain[1:]:
                assert previous == names[-1]
                names.append(name)
            value = chain[0][2]
            assert list(sample.outputs) == names and 10000 <= int(value) < 99999
            assert sample.answer_prefix == (
                " Answer: According to the chain(s) of variable assignment in the text above, 5 variables are "
                f"assigned the value {value}, they are: "
            )
            assert f"Question: Find all variables that are assigned the value {value} in the text above." in task_text
            lines = task_text.split("text.\n\n", 1)[1].split("\nQuestion:", 1)[0].split("\n")
            assert all(line == NOISE or line.startswith("VAR ") for line in lines)


def test_vt_string_copy_spells_its_answer_prefix_typo(llama3):
    ctx = RulerContext(llama3, options=RulerOptions(copy="string"))
    assert "variables are assgined the value" in make_sample(ctx, "vt", 2048, 0).answer_prefix


def _numbered(text: str) -> list[str]:
    parts = re.split(r"(?:^| )(\d+)\. ", text)  # wonderwords has entries like "creme brulee"
    assert parts[0] == "" and [int(n) for n in parts[1::2]] == list(range(1, len(parts) // 2 + 1))
    return parts[2::2]


def test_cwe_counts_example_and_answers(samples):
    vocabulary = {word for words in wonderwords_lists().values() for word in words}
    for length in LENGTHS:
        short = length < 4096
        for sample in samples["cwe", length]:
            example, task_text = sample.text.split("\nBelow is a numbered list", 1)
            example_list, example_answer = example.split(
                " Answer: The top 10 words that appear most often in the list are: "
            )
            example_counts = Counter(_numbered(example_list.split("often.\n", 1)[1].split("\nQuestion")[0]))
            expected = Counter({3: 10, 1: 10}) if short else Counter({10: 10, 3: 30})
            assert Counter(example_counts.values()) == expected
            assert set(_numbered(example_answer)) == {w for w, c in example_counts.items() if c == max(expected)}
            words = _numbered(task_text.split("often.\n", 1)[1].split("\nQuestion:")[0])
            counts = Counter(words)
            common, rare = (6, 1) if short else (30, 3)
            assert {w for w, c in counts.items() if c == common} == set(sample.outputs)
            assert len(sample.outputs) == 10 and set(counts.values()) == {common, rare}
            assert set(counts) <= vocabulary
            assert task_text.endswith(" Answer: The top 10 words that appear most often in the list are:")


def test_fwe_zipf_counts_and_answers(samples):
    for length in LENGTHS:
        for sample in samples["fwe", length]:
            coded = sample.text.split("coded words. ", 1)[1].split("\nQuestion:", 1)[0].split(" ")
            counts = Counter(coded)
            ranked = [w for w, _ in counts.most_common()]
            assert ranked[0] == "..." and list(sample.outputs) == ranked[1:4]
            assert all(re.fullmatch(r"[a-z]{6}", w) for w in ranked[1:])
            total = sample.info["haystack_size"]
            zeta2 = np.pi**2 / 6
            expected = [int(total * k**-2.0 / zeta2) for k in range(1, sample.info["vocab_size"] + 1)]
            assert sorted(counts.values(), reverse=True) == sorted((c for c in expected if c), reverse=True)
            assert sample.info["vocab_size"] == (length - 50) // 50


def test_riemann_zeta_is_scipys_and_the_closed_forms():
    from longctx.eval.ruler.words import riemann_zeta

    assert riemann_zeta(2.0) == pytest.approx(np.pi**2 / 6, rel=1e-15, abs=0)
    assert riemann_zeta(4.0) == pytest.approx(np.pi**4 / 90, rel=1e-15, abs=0)
    special = pytest.importorskip("scipy.special")  # RULER's own call; present here through lm-eval
    for alpha in (1.1, 1.5, 2.0, 2.5, 3.0):
        assert riemann_zeta(alpha) == pytest.approx(special.zeta(alpha), rel=1e-15, abs=0)


def test_a_sample_depends_only_on_seed_task_length_and_index(llama3, ruler_ctx):
    fresh = RulerContext(llama3, seed=7)
    for task in ("niah_multikey_2", "vt", "cwe", "niah_multivalue"):
        alone = make_sample(fresh, task, 2048, 13)
        again = make_sample(ruler_ctx, task, 2048, 13)
        assert alone.text == again.text and alone.outputs == again.outputs
    assert make_sample(fresh, "vt", 2048, 1).text != make_sample(fresh, "vt", 2048, 2).text


def test_chat_frame_wraps_the_task_and_the_answer_prefix_follows(tmp_path):
    from longctx.eval.prompt_frame import prompt_frame
    from longctx.model_tokenizer import tokenizer_for_model
    from tests.chat_tokenizer import write_chat_tokenizer, write_hf_config

    tokenizer = tokenizer_for_model(write_hf_config(write_chat_tokenizer(tmp_path, vocab_size=400), vocab_size=400))
    frame = prompt_frame(tokenizer, "auto")
    ctx = RulerContext(tokenizer, frame=frame)
    for task in ("niah_single_1", "vt", "fwe"):
        sample = make_sample(ctx, task, 1024, 0)
        ids = sample.input_ids.tolist()
        prefix_ids = tokenizer.encode(sample.answer_prefix)
        assert ids[: len(frame.head)] == list(frame.head)
        assert ids[len(ids) - len(prefix_ids) - len(frame.tail) : len(ids) - len(prefix_ids)] == list(frame.tail)
        assert len(ids) + sample.tokens_to_generate <= 1024
