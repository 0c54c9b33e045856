"""SFT chat data: the template typed out by hand, labels against the assistant texts,
malformed-line reporting, the embedded set's long-range answers, the rows of Normal-SFT,
PackedSFT-k and SkipAlign, and the relative-distance histogram against a brute-force
pair count."""

import json
import logging
import re
from collections import Counter

import numpy as np
import pytest
import torch

from longctx.batch import check_batch
from longctx.data.packing import IGNORE_INDEX
from longctx.data.sft import (
    SFTDataError,
    SFTReport,
    SFTRows,
    embedded_conversations,
    load_sft_samples,
    read_conversations,
    tokenize_conversations,
)
from longctx.data.tokenizer import EOS_TOKEN, load_tokenizer
from longctx.probes.dataset_fi import relative_distance_histogram

INSTR, R = "instruction", "response"

CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "The code of the red box is 1234."},
    {"role": "assistant", "content": "Noted."},
    {"role": "user", "content": "What is the code of the red box?"},
    {"role": "assistant", "content": "It is 1234."},
]
# The documented template, typed out: role markers as text, EOS after each answer.
CONVERSATION_TEXT = (
    "<|system|>\nBe brief.\n<|user|>\nThe code of the red box is 1234.\n<|assistant|>\n"
    f"Noted.{EOS_TOKEN}"
    "<|user|>\nWhat is the code of the red box?\n<|assistant|>\n"
    f"It is 1234.{EOS_TOKEN}"
)
# Two answers in a row and a trailing question (a generation prompt).
ODD_CONVERSATION = [
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello."},
    {"role": "assistant", "content": "How can INSTR help?"},
    {"role": "user", "content": "Tell me a joke."},
]


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("bpe-8192")


@pytest.fixture(scope="module")
def samples(tokenizer):
    return load_sft_samples("embedded", tokenizer, max_sample_length=512, embedded_samples=60, seed=3)[0]


def label_runs(labels: np.ndarray) -> list[list[int]]:
    """Maximal runs of consecutive labelled tokens' labels."""
    runs, current = [], []
    for label in labels.tolist():
        if label == IGNORE_INDEX:
            if current:
                runs.append(current)
            current = []
        else:
            current.append(label)
    return runs + ([current] if current else [])


def documents(row: dict) -> list[tuple[int, int]]:
    """(start, end) of the maximal runs of equal document ids."""
    doc = row["document_ids"].tolist()
    starts = [t for t in range(len(doc)) if t == 0 or doc[t] != doc[t - 1]]
    return list(zip(starts, [*starts[1:], len(doc)], strict=True))


def chat_line(question: str, answer: str) -> str:
    return json.dumps({"messages": [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]})


def write_jsonl(path, lines):
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


# --- template and labels ----------------------------------------------------------------


def test_template_renders_the_documented_text_in_alternating_blocks(tokenizer):
    (sample,) = tokenize_conversations([CONVERSATION], tokenizer)
    assert tokenizer.decode(sample.input_ids.tolist()) == CONVERSATION_TEXT
    assert sample.roles == (INSTR, R, INSTR, R)
    first_block = sample.input_ids[: sample.block_lengths[0]].tolist()
    assert tokenizer.decode(first_block) == CONVERSATION_TEXT[: CONVERSATION_TEXT.index("Noted.")]
    (odd,) = tokenize_conversations([ODD_CONVERSATION], tokenizer)
    assert odd.roles == (INSTR, R, INSTR, R, INSTR)
    assert tokenizer.decode(odd.input_ids.tolist()) == (
        f"<|user|>\nHi\n<|assistant|>\nHello.{EOS_TOKEN}<|assistant|>\nHow can INSTR help?{EOS_TOKEN}"
        "<|user|>\nTell me a joke.\n<|assistant|>\n"
    )


def test_exactly_the_assistant_content_and_its_eos_are_predicted(tokenizer):
    conversations = [CONVERSATION, ODD_CONVERSATION, *embedded_conversations(20, seed=1)]
    for messages, sample in zip(conversations, tokenize_conversations(conversations, tokenizer), strict=True):
        labels, ids = sample.labels, sample.input_ids
        answers = [m["content"] for m in messages if m["role"] == "assistant"]
        # One run of labels per answer: its content's tokens then EOS, in order.
        assert label_runs(labels) == [[*tokenizer.encode(answer), tokenizer.eos_id] for answer in answers]
        assert tokenizer.decode(labels[labels != IGNORE_INDEX].tolist()) == "".join(a + EOS_TOKEN for a in answers)
        # Next-token shift: label t is token t + 1.
        labelled = np.flatnonzero(labels != IGNORE_INDEX)
        np.testing.assert_array_equal(labels[labelled], ids[labelled + 1])
        assert labels[-1] == IGNORE_INDEX
        # Each answer is predicted from the end of its header.
        for t in labelled:
            if labels[t - 1] == IGNORE_INDEX:
                assert tokenizer.decode(ids[: t + 1].tolist()).endswith("<|assistant|>\n")


def test_truncation_cuts_at_the_limit_and_drops_samples_left_without_answers(tokenizer, tmp_path, caplog):
    long_answer = " ".join(["word"] * 200)
    lines = [
        chat_line("Say words.", long_answer),
        chat_line(long_answer, "ok"),
        json.dumps({"messages": ODD_CONVERSATION[:2]}),  # short: kept whole
    ]
    path = write_jsonl(tmp_path / "chat.jsonl", lines)
    (full,) = tokenize_conversations([json.loads(lines[0])["messages"]], tokenizer)
    with caplog.at_level(logging.WARNING, logger="longctx.data.sft"):
        kept, report = load_sft_samples(path, tokenizer, max_sample_length=64)
    assert (report.truncated, report.without_labels, report.samples) == (2, 1, 2)
    assert "1 dropped without a response token" in caplog.text
    cut = kept[0]
    assert len(cut) == 64 and sum(cut.block_lengths) == 64 and cut.roles == (INSTR, R)
    np.testing.assert_array_equal(cut.input_ids, full.input_ids[:64])
    np.testing.assert_array_equal(cut.labels[:-1], full.labels[:63])
    assert cut.labels[-1] == IGNORE_INDEX
    assert tokenize_conversations([ODD_CONVERSATION[:2]], tokenizer)[0].input_ids.tolist() == kept[1].input_ids.tolist()
    one = write_jsonl(tmp_path / "one.jsonl", lines[:1])
    for limit in range(len(full) - 2, len(full) + 2):
        (sample,), report = load_sft_samples(one, tokenizer, max_sample_length=limit)
        assert len(sample) == min(limit, len(full)) and report.truncated == int(limit < len(full))


# --- malformed lines --------------------------------------------------------------------


BAD_LINES = [
    json.dumps({"messages": CONVERSATION}),
    '{"messages": [{"role": "user", "content": "hi"}',  # 2: bad JSON
    json.dumps({"messages": [{"role": "robot", "content": "x"}, {"role": "assistant", "content": "y"}]}),  # 3
    json.dumps({"messages": [{"role": "user", "content": "only a question"}]}),  # 4: no assistant
    json.dumps({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "  "}]}),  # 5
    json.dumps({"conversation": []}),  # 6: no messages list
    "",  # 7: blank, ignored
    json.dumps({"messages": ODD_CONVERSATION, "dataset": "extra keys are fine"}),
]


def test_malformed_lines_are_reported_with_line_numbers_and_skipped(tmp_path, tokenizer, caplog):
    path = write_jsonl(tmp_path / "chat.jsonl", BAD_LINES)
    report = SFTReport(str(path))
    conversations = read_conversations(path, "skip", report)
    assert conversations == [CONVERSATION, ODD_CONVERSATION]
    assert [line for line, _ in report.bad] == [2, 3, 4, 5, 6]
    reasons = dict(report.bad)
    assert "bad JSON" in reasons[2] and "unknown role 'robot'" in reasons[3]
    assert reasons[4] == "no assistant turn" and "empty content" in reasons[5] and "'messages' list" in reasons[6]
    with caplog.at_level(logging.WARNING, logger="longctx.data.sft"):
        kept, report = load_sft_samples(path, tokenizer)
    assert len(kept) == 2 and report.samples == 2 and len(report.bad) == 5
    assert "5 malformed lines skipped" in caplog.text


def test_malformed_line_fails_the_load_when_asked(tmp_path, tokenizer):
    path = write_jsonl(tmp_path / "chat.jsonl", BAD_LINES)
    with pytest.raises(SFTDataError, match=r"chat.jsonl:2: bad JSON"):
        load_sft_samples(path, tokenizer, on_bad_sample="error")
    with pytest.raises(ValueError, match="on_bad_sample"):
        load_sft_samples(path, tokenizer, on_bad_sample="ignore")
    with pytest.raises(FileNotFoundError, match="missing.jsonl"):
        load_sft_samples(tmp_path / "missing.jsonl", tokenizer)
    empty = write_jsonl(tmp_path / "bad.jsonl", BAD_LINES[1:6])
    with pytest.raises(SFTDataError, match="no usable SFT sample"):
        load_sft_samples(empty, tokenizer)


# --- embedded dataset -------------------------------------------------------------------

FACT_PATTERNS = [  # (statement, question) with the key as group 1 and the value as group 2
    (r"The code of the (\w+ \w+) is (\d+)\.", r"What is the code of the (\w+ \w+)\?"),
    (r"(\w+) lives in (\w+)\.", r"Where does (\w+) live\?"),
    (r"(\w+'s \w+) is (\d+) years old\.", r"How old is (\w+'s \w+)\?"),
]


def test_embedded_set_is_deterministic_and_extends_with_its_size():
    assert embedded_conversations(30, seed=5) == embedded_conversations(30, seed=5)
    assert embedded_conversations(50, seed=5)[:30] == embedded_conversations(30, seed=5)
    assert embedded_conversations(30, seed=5) != embedded_conversations(30, seed=6)


def test_embedded_answers_recall_facts_stated_in_earlier_user_turns():
    recalls, distances = 0, []
    for messages in embedded_conversations(300, seed=0):
        users = [k for k, message in enumerate(messages) if message["role"] == "user"]
        turns = [(messages[k]["content"], messages[k + 1]["content"]) for k in users]
        assert len(turns) >= 3 and all(m["role"] in ("system", "user", "assistant") for m in messages)
        stated = {}  # key -> (value, turn)
        for turn, (question, answer) in enumerate(turns):
            asked = [(k, p) for k, (_, p) in enumerate(FACT_PATTERNS) if re.fullmatch(p, question)]
            if asked:
                kind, pattern = asked[0]
                key = re.fullmatch(pattern, question).group(1)
                value, told_at = stated[(kind, key)]  # KeyError: asked before being told
                assert told_at < turn and value in answer and value not in question
                recalls += 1
                distances.append(turn - told_at)
            for kind, (statement, _) in enumerate(FACT_PATTERNS):
                for match in re.finditer(statement, question):
                    assert (kind, match.group(1)) not in stated  # one value per key
                    stated[(kind, match.group(1))] = (match.group(2), turn)
            sums = re.fullmatch(r"What is (\d+) plus (\d+)\?", question)
            if sums:
                assert answer == f"{sums[1]} plus {sums[2]} is {int(sums[1]) + int(sums[2])}."
        last_question = turns[-1][0]
        assert any(re.fullmatch(p, last_question) for _, p in FACT_PATTERNS)  # the last turn recalls
    assert recalls >= 300 and max(distances) >= 5


def test_embedded_samples_fit_the_tiny_windows(tokenizer):
    samples, report = load_sft_samples("embedded", tokenizer, max_sample_length=4096, embedded_samples=300)
    lengths = np.array([len(s) for s in samples])
    assert report.truncated == 0 and lengths.min() >= 100 and lengths.max() <= 512
    assert 200 <= np.median(lengths) <= 400


# --- rows -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"variant": "shuffled"}, "variant must be one of ('normal', 'packed', 'skipalign'), got 'shuffled'"),
        ({"variant": "skipalign", "strategy": "middle"}, "strategy must be one of"),
        ({"variant": "skipalign", "p_scope": "row"}, "p_scope must be one of"),
        ({"variant": "skipalign", "p": 1.5}, "p must be a probability in [0, 1], got 1.5"),
        ({"variant": "skipalign", "p": True}, "p must be a probability in [0, 1], got True"),
    ],
)
def test_rows_refuse_a_bad_setting_naming_it(samples, tokenizer, settings, message):
    with pytest.raises(ValueError) as error:
        SFTRows(samples, window=512, pad_id=tokenizer.pad_id, **{"variant": "normal", **settings})
    assert message in str(error.value)


def test_normal_rows_hold_one_sample_then_padding_in_its_own_document(samples, tokenizer):
    rows = SFTRows(samples, variant="normal", window=512, pad_id=tokenizer.pad_id)
    assert len(rows) == len(samples) and rows.position_limit == max(len(s) for s in samples)
    for index in range(len(rows)):
        row, sample = rows[index], samples[index]
        n = len(sample)
        assert all(value.shape == (512,) and value.dtype == torch.int64 for value in row.values())
        np.testing.assert_array_equal(row["input_ids"][:n], sample.input_ids)
        np.testing.assert_array_equal(row["labels"][:n], sample.labels)
        np.testing.assert_array_equal(row["position_ids"][:n], np.arange(n))
        assert documents(row) == [(0, n), (n, 512)]
        assert (row["input_ids"][n:] == tokenizer.pad_id).all() and (row["labels"][n:] == IGNORE_INDEX).all()
        np.testing.assert_array_equal(row["position_ids"][n:], np.arange(512 - n))


@pytest.mark.parametrize("variant", ["normal", "skipalign"])
def test_rows_keep_the_batch_contract(samples, tokenizer, variant):
    for pack in (False, True):
        rows = SFTRows(samples, variant=variant, window=1024, pad_id=tokenizer.pad_id, pack=pack, extended_length=5000)
        check_batch({key: torch.stack([rows[i][key] for i in range(len(rows))]) for key in rows[0]})


@pytest.mark.parametrize("variant", ["normal", "skipalign"])
def test_document_packing_keeps_every_sample_whole_in_its_own_document(samples, tokenizer, variant):
    window = 1024
    rows = SFTRows(samples, variant=variant, window=window, pad_id=tokenizer.pad_id, pack=True, extended_length=5000)
    single = SFTRows(samples, variant=variant, window=window, pad_id=tokenizer.pad_id, extended_length=5000)
    by_ids = {tuple(s.input_ids.tolist()): i for i, s in enumerate(samples)}
    seen = []
    for row in (rows[k] for k in range(len(rows))):
        spans = documents(row)
        for start, end in spans[:-1] if (row["labels"][spans[-1][0] :] == IGNORE_INDEX).all() else spans:
            index = by_ids[tuple(row["input_ids"][start:end].tolist())]
            seen.append(index)
            # The same ids as the sample alone in its row: reset per document (normal) or
            # its own SkipAlign draw, independent of the packing.
            np.testing.assert_array_equal(row["position_ids"][start:end], single[index]["position_ids"][: end - start])
            np.testing.assert_array_equal(row["labels"][start:end], samples[index].labels)
    assert sorted(seen) == list(range(len(samples)))
    assert len(rows) < len(samples) / 2


def test_packed_sft_rows_are_k_tokens_attend_across_samples_and_lose_nothing(samples, tokenizer):
    k = 300  # shorter than most samples: many are cut by a row boundary
    rows = SFTRows(samples, variant="packed", window=k, pad_id=tokenizer.pad_id, seed=9)
    total = sum(len(s) for s in samples)
    assert len(rows) == -(-total // k) and rows.position_limit == k
    batch = {key: torch.stack([rows[i][key] for i in range(len(rows))]) for key in rows[0]}
    check_batch(batch)
    assert batch["input_ids"].shape == (len(rows), k)
    full = slice(0, len(rows) - 1)
    assert (batch["position_ids"][full] == torch.arange(k)).all() and (batch["document_ids"][full] == 0).all()
    stream = batch["input_ids"].reshape(-1)[:total].numpy()
    labels = batch["labels"].reshape(-1).numpy()
    assert (labels[total:] == IGNORE_INDEX).all()
    assert (batch["document_ids"][-1, total - (len(rows) - 1) * k :] == 1).all()
    # The stream is every sample exactly once, end to end, in some order.
    remaining = Counter(tuple(s.input_ids.tolist()) for s in samples)
    offset, sample_starts = 0, []
    while offset < total:
        match = next(ids for ids in remaining if remaining[ids] and tuple(stream[offset : offset + len(ids)]) == ids)
        remaining[match] -= 1
        sample_starts.append(offset)
        offset += len(match)
    assert offset == total and not +remaining
    # Labels: the next stream token (also across row ends), exactly on every response token.
    labelled = np.flatnonzero(labels != IGNORE_INDEX)
    np.testing.assert_array_equal(labels[labelled], stream[labelled + 1])
    assert len(labelled) == sum(int(s.response_mask.sum()) for s in samples)
    # One document per row: where a sample starts inside a row, it attends to the one before.
    inside = [start for start in sample_starts if start % k and start < (len(rows) - 1) * k]
    assert len(inside) > len(samples) / 2
    for start in inside:
        row, column = divmod(start, k)
        assert batch["document_ids"][row, column] == batch["document_ids"][row, column - 1]


def test_skipalign_rows_skip_only_where_the_strategy_allows(samples, tokenizer):
    for strategy, kinds in (("outer", {(R, INSTR)}), ("inner", {(INSTR, R)}), ("all", {(R, INSTR), (INSTR, R)})):
        rows = SFTRows(
            samples,
            variant="skipalign",
            window=512,
            pad_id=tokenizer.pad_id,
            strategy=strategy,
            extended_length=10**9,
            p=1.0,
        )
        assert rows.position_limit == 10**9
        for index, sample in enumerate(samples):
            n = len(sample)
            positions = rows[index]["position_ids"][:n].numpy()
            assert positions[0] == 0 and (np.diff(positions) >= 1).all() and positions[-1] < 10**9
            starts = np.cumsum(sample.block_lengths)[:-1]
            expected = {int(s) for b, s in enumerate(starts, 1) if (sample.roles[b - 1], sample.roles[b]) in kinds}
            assert set((np.flatnonzero(np.diff(positions) > 1) + 1).tolist()) == expected


def test_skipalign_rows_are_seeded_and_single_turn_outer_is_normal_sft(tokenizer):
    conversations = [[m for m in c if m["role"] != "system"][:2] for c in embedded_conversations(40, seed=2)]
    single_turn = tokenize_conversations(conversations, tokenizer)
    kwargs = {"window": 128, "pad_id": tokenizer.pad_id, "extended_length": 4000, "p": 1.0}
    normal = SFTRows(single_turn, variant="normal", **kwargs)
    outer = SFTRows(single_turn, variant="skipalign", strategy="outer", **kwargs)
    inner = SFTRows(single_turn, variant="skipalign", strategy="inner", seed=4, **kwargs)
    every = SFTRows(single_turn, variant="skipalign", strategy="all", seed=4, **kwargs)
    other = SFTRows(single_turn, variant="skipalign", strategy="all", seed=5, **kwargs)
    for i in range(len(single_turn)):
        for key in normal[i]:
            assert torch.equal(outer[i][key], normal[i][key])
            assert torch.equal(inner[i][key], every[i][key])
    assert any(not torch.equal(every[i]["position_ids"], other[i]["position_ids"]) for i in range(len(single_turn)))
    assert all(not torch.equal(every[i]["position_ids"], normal[i]["position_ids"]) for i in range(len(single_turn)))


def test_skipalign_ids_are_drawn_per_sample(samples, tokenizer):
    copies = [samples[0]] * 50  # identical samples still get independent skips
    kwargs = {"variant": "skipalign", "window": 512, "pad_id": tokenizer.pad_id, "strategy": "all", "p": 1.0}
    rows = SFTRows(copies, extended_length=10**6, **kwargs)
    first = {tuple(rows[i]["position_ids"].tolist()) for i in range(len(copies))}
    assert len(first) == len(copies)
    again = SFTRows(copies, extended_length=10**6, **kwargs)
    assert all(torch.equal(rows[i]["position_ids"], again[i]["position_ids"]) for i in range(len(copies)))


def test_rows_reject_bad_settings(samples, tokenizer):
    with pytest.raises(ValueError, match="variant"):
        SFTRows(samples, variant="long", window=512, pad_id=0)
    with pytest.raises(ValueError, match="has .* tokens but window is 64: set max_sample_length <= window"):
        SFTRows(samples, variant="normal", window=64, pad_id=0)
    with pytest.raises(ValueError, match="extended_length=100 is shorter than the longest sample"):
        SFTRows(samples, variant="skipalign", window=512, pad_id=0, extended_length=100)
    with pytest.raises(ValueError, match="strategy"):
        SFTRows(samples, variant="skipalign", window=512, pad_id=0, strategy="middle")
    with pytest.raises(IndexError, match="row 60"):
        SFTRows(samples, variant="normal", window=512, pad_id=0)[60]


# --- relative-distance histogram (SkipAlign Figure 2) -----------------------------------


def brute_force_histogram(rows, max_distance):
    """Every (query, key) pair of every row: same document, key not after query, query labelled."""
    counts, overflow = np.zeros(max_distance, dtype=np.int64), 0
    for row in rows:
        pos, doc, lab = (row[key].numpy() for key in ("position_ids", "document_ids", "labels"))
        distance = pos[:, None] - pos[None, :]
        pairs = (doc[:, None] == doc[None, :]) & np.tri(len(pos), dtype=bool) & (lab != IGNORE_INDEX)[:, None]
        d = distance[pairs]
        counts += np.bincount(d[d < max_distance], minlength=max_distance)
        overflow += int((d >= max_distance).sum())
    return counts, overflow


@pytest.mark.parametrize("pack", [False, True])
def test_relative_distance_histogram_equals_a_brute_force_pair_count(samples, tokenizer, pack):
    rows = SFTRows(
        samples[:24],
        variant="skipalign",
        window=1024,
        pad_id=tokenizer.pad_id,
        strategy="all",
        pack=pack,
        extended_length=3000,
        p=0.5,
    )
    row_list = [rows[i] for i in range(len(rows))]
    histogram = relative_distance_histogram(row_list, max_distance=1500)
    counts, overflow = brute_force_histogram(row_list, 1500)
    np.testing.assert_array_equal(histogram.counts.numpy(), counts)
    assert int(histogram.overflow) == overflow > 0
    batched = next(iter(torch.utils.data.DataLoader(rows, batch_size=len(rows))))
    assert torch.equal(relative_distance_histogram([batched], 1500).counts, histogram.counts)
    assert torch.equal(relative_distance_histogram(rows, 1500, rows_per_call=5).counts, histogram.counts)


def test_skipalign_moves_distances_beyond_the_sample_length_and_normal_sft_does_not(samples, tokenizer):
    longest = max(len(s) for s in samples)
    common = {"window": 512, "pad_id": tokenizer.pad_id}
    normal = SFTRows(samples, variant="normal", **common)
    skip = SFTRows(samples, variant="skipalign", extended_length=8000, **common)
    f_normal = relative_distance_histogram((normal[i] for i in range(len(normal))), 8000)
    f_skip = relative_distance_histogram((skip[i] for i in range(len(skip))), 8000)
    assert f_normal.counts[longest:].sum() == 0 and f_skip.counts[longest:].sum() > 0
    assert f_normal.counts.sum() == f_skip.counts.sum() and int(f_skip.overflow) == 0  # same pairs, moved
