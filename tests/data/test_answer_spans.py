"""Answers cut from their facts by a row edge: which labels are masked, nothing else, the count."""

import numpy as np
import pytest
import torch

from longctx.batch import IGNORE_INDEX
from longctx.config.data import RetrievalConfig
from longctx.data.answer_spans import ANSWERS_FILE, answer_table, write_answers
from longctx.data.packing import PackedRows, PackedSource
from longctx.data.retrieval import make_document
from longctx.data.tokenizer import train_bpe
from tests.data.helpers import EOS, write_token_dataset

FILLER = tuple(f" Filler sentence {word} is here." for word in ("one", "two", "three", "four", "five", "six"))


def _source(tmp_path, documents, answers, shuffle=False, seed=0):
    directory = tmp_path / "data"
    write_token_dataset(directory, [np.asarray(d, dtype=np.int32) for d in documents])
    write_answers(directory, np.asarray(answers, dtype=np.int64).reshape(-1, 4))
    return PackedSource(directory, seed=seed, shuffle=shuffle)


def _rows(source, window, count, mask, packing="stream"):
    rows = PackedRows(
        [source],
        [1.0],
        window=window,
        eos_id=EOS,
        doc_mask=True,
        packing=packing,
        mask_cut_answers=mask,
    )
    iterator = iter(rows)
    return [next(iterator) for _ in range(count)], rows


def test_hand_worked_stream_masks_only_the_answer_token_past_the_edge(tmp_path):
    # Window 7: rows are stream tokens [0, 8) and [8, 16); row r's labels are tokens 8r+1 .. 8r+7.
    # Document A (item 0): 12 tokens, fact at token 2; answer 1 at tokens 5-6, answer 2 at 7-9.
    # Document B (item 1): 5 tokens at stream 12-16, fact at its token 0, answer at its token 2.
    doc_a = [*range(101, 112), EOS]
    doc_b = [201, 202, 203, 204, EOS]
    answers = [(0, 5, 7, 2), (0, 7, 10, 2), (1, 2, 3, 0)]
    source = _source(tmp_path, [doc_a, doc_b], answers)
    plain, _ = _rows(source, 7, 2, mask=False)
    masked, rows = _rows(source, 7, 2, mask=True)
    # Answer 2's token 9 is stream 9 = row 1, position 1 -> label index 0; its fact (stream 2)
    # lies in row 0. Its token 8 starts row 1 (an input only); its token 7 is row 0's label 6.
    expected = plain[1]["labels"].clone()
    expected[0] = IGNORE_INDEX
    assert plain[1]["labels"][0] == 110  # the target that was trained before masking
    assert torch.equal(masked[1]["labels"], expected)
    assert torch.equal(masked[0]["labels"], plain[0]["labels"])
    for key in ("input_ids", "position_ids", "document_ids"):
        assert torch.equal(masked[1][key], plain[1][key])
    # Three answers have a label in the two rows; one of them (A's second) is cut.
    assert rows.masking_report(2) == [{"answers": 3, "cut": 1, "cut_share": 1 / 3}]


def _reference_cut_labels(stream_items, lengths, answers, window, rows):
    """Brute force: lay the documents out token by token and test every label of every row."""
    owner, offset = [], []
    for item in stream_items:
        owner += [item] * lengths[item]
        offset += list(range(lengths[item]))
    block = window + 1
    by_item = {}
    for item, start, end, fact in answers:
        by_item.setdefault(item, []).append((start, end, fact))
    cut, seen, cut_keys = set(), set(), set()
    for row in range(rows):
        for q in range(1, block):
            p = row * block + q
            item, token = owner[p], offset[p]
            doc_start = p - token
            occurrence = sum(1 for i in range(doc_start) if offset[i] == 0 and owner[i] == item)
            for k, (start, end, fact) in enumerate(by_item.get(item, [])):
                if start <= token < end:
                    seen.add((item, k, occurrence))
                    if doc_start + fact < row * block:
                        cut.add((row, q - 1))
                        cut_keys.add((item, k, occurrence))
    return cut, len(seen), len(cut_keys)


@pytest.mark.parametrize("window", [5, 9, 16])
def test_random_streams_match_a_token_by_token_reference(tmp_path, window):
    rng = np.random.default_rng(window)
    documents, answers = [], []
    for item in range(12):
        n = int(rng.integers(4, 30))
        documents.append([*(1000 * (item + 1) + np.arange(n - 1)), EOS])
        for _ in range(int(rng.integers(0, 3))):
            fact = int(rng.integers(0, n - 3))
            start = int(rng.integers(fact + 1, n - 2))
            answers.append((item, start, int(rng.integers(start + 1, n)), fact))
    source = _source(tmp_path, documents, answers, shuffle=True, seed=3)
    rows_count = 3 * sum(len(d) for d in documents) // (window + 1)  # about three epochs
    stream_items = np.concatenate([source.document_order(epoch) for epoch in range(5)]).tolist()
    plain, _ = _rows(source, window, rows_count, mask=False)
    masked, rows = _rows(source, window, rows_count, mask=True)
    expected, answers_seen, answers_cut = _reference_cut_labels(
        stream_items, source.lengths.tolist(), answers, window, rows_count
    )
    differing = set()
    for r, (a, b) in enumerate(zip(plain, masked, strict=True)):
        for t in torch.nonzero(a["labels"] != b["labels"])[:, 0].tolist():
            assert b["labels"][t] == IGNORE_INDEX
            differing.add((r, t))
    assert differing == expected
    assert answers_cut > 0  # the streams are built to cut some answers
    assert rows.masking_report(rows_count) == [
        {"answers": answers_seen, "cut": answers_cut, "cut_share": answers_cut / answers_seen}
    ]


def test_documents_packing_masks_only_pieces_after_the_first(tmp_path):
    # A 14-token document in rows of 5 + 1 tokens is split into pieces [0, 6), [6, 12), [12, 14);
    # its answer at tokens 7-8 copies the fact at token 3: it lies in piece 1, whose row starts at 6.
    documents = [[*range(301, 314), EOS], [401, 402, EOS]]
    source = _source(tmp_path, documents, [(0, 7, 9, 3), (1, 1, 2, 0)])
    masked, rows = _rows(source, 5, 4, mask=True, packing="documents")
    plain, _ = _rows(source, 5, 4, mask=False, packing="documents")
    # piece 1 = tokens 6..11: answer tokens 7, 8 at positions 1, 2 -> label indices 0, 1
    assert masked[1]["labels"][:2].tolist() == [IGNORE_INDEX, IGNORE_INDEX]
    assert plain[1]["labels"][:2].tolist() == [308, 309]
    assert torch.equal(masked[1]["labels"][2:], plain[1]["labels"][2:])
    for r in (0, 2, 3):
        assert torch.equal(masked[r]["labels"], plain[r]["labels"])
    assert rows.masking_report(4) == [{"answers": 2, "cut": 1, "cut_share": 0.5}]


def test_source_without_answer_spans_is_untouched(tmp_path):
    directory = tmp_path / "plain"
    write_token_dataset(directory, [np.asarray([5, 6, 7, 8, EOS], dtype=np.int32)] * 3)
    source = PackedSource(directory, seed=0)
    assert source.answers is None
    masked, rows = _rows(source, 4, 3, mask=True)
    plain, _ = _rows(source, 4, 3, mask=False)
    assert all(torch.equal(a["labels"], b["labels"]) for a, b in zip(masked, plain, strict=True))
    assert rows.masking_report(3) == [None]
    assert not (directory / ANSWERS_FILE).exists()


def test_answer_table_points_at_the_values_in_the_stored_tokens():
    config = RetrievalConfig(documents=6, template="niah", queries=0, filler_max=5, value_digits=4, value_digits_max=9)
    documents = [make_document(config, k, FILLER) for k in range(config.documents)]
    tokenizer = train_bpe([d.text for d in documents] * 4, vocab_size=300)
    encoded = [tokenizer.encode(d.text) for d in documents]
    table = answer_table(config, tokenizer, np.asarray([len(ids) + 1 for ids in encoded]), FILLER)
    assert len(table) == 4 * config.documents
    for item in range(config.documents):
        document, ids = documents[item], encoded[item]
        rows = table[table[:, 0] == item].tolist()
        # niah template: the list question answers fact j as its j-th value
        for (fact_index, _), (_, start, end, fact) in zip(document.answer_offsets, rows, strict=True):
            value = document.values[fact_index]
            assert value in tokenizer.decode(ids[start:end])
            assert value not in tokenizer.decode(ids[start + 1 : end])  # the span starts at the value
            # the fact token is the first holding a digit of the needle's value, before the answer
            assert fact < start and value in tokenizer.decode(ids[fact : fact + end - start])
            assert value not in tokenizer.decode(ids[fact + 1 : fact + end - start + 1])
    with pytest.raises(Exception, match="item 0 .* not the documents in order"):
        answer_table(config, tokenizer, np.asarray([len(ids) + 2 for ids in encoded]), FILLER)
