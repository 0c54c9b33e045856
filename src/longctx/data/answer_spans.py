"""Where each retrieval answer and the fact it copies sit in a prepared document, in tokens.

STRING trains on one concatenated stream cut into rows (§2.2), so a row edge can fall
between a needle and the question asking for it. In natural text such a target is merely
hard; in a retrieval document its answer tokens can only be guessed, and
docs/replication_log.md measured that supervising them keeps a 2-layer model at chance.
Keeping the stream (documents running across row edges, the same tokens for every
window, so the window is the only variable) while leaving those answers unsupervised
needs, per document, the token span of every answer and the token of its fact:

    answers.npy   int64 [answers, 4]: (item, answer start, answer end, fact start),
                  token offsets inside item `item` of the prepared dataset (end exclusive)

An answer's tokens are those whose characters overlap the value in the answer; its fact
start is the first token overlapping the value in the needle (a BPE merge with the space
before a value makes that token the one holding the space and the first digit). Offsets
come from the same encoding `longctx prepare` stores (`encode(text)`, EOS appended
after), so they index the stored ids exactly.

A row of the stream holds tokens [o, o + n) as inputs and o + 1 .. o + n - 1 as labels
(data/packing.py). An answer token p (a label of that row) is *cut* when its fact starts
before o: the row cannot see the value it must copy, so its label becomes -100. Every
other label is untouched. `cut_positions` finds them for one row; `masking_report`
counts the answers cut over the rows a run trains.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from longctx.config.data import RetrievalConfig
from longctx.data import storage
from longctx.data.retrieval import RetrievalDocument, filler_sentences, make_document
from longctx.errors import DataError

ANSWERS_FILE = "answers.npy"


def document_answers(encoding, document: RetrievalDocument) -> list[tuple[int, int, int]]:
    """[(answer start, answer end, fact start)] in the tokens of `encoding` (a Hugging Face
    `Encoding` of `document.text`, as `longctx prepare` encodes it)."""
    starts = np.asarray([start for start, _ in encoding.offsets], dtype=np.int64)
    ends = np.asarray([end for _, end in encoding.offsets], dtype=np.int64)

    def overlapping(begin: int, length: int) -> tuple[int, int]:
        inside = np.nonzero((starts < begin + length) & (ends > begin))[0]
        if len(inside) == 0:
            raise DataError(f"no token covers characters [{begin}, {begin + length}) of a retrieval document")
        return int(inside[0]), int(inside[-1]) + 1

    rows = []
    for fact, offset in document.answer_offsets:
        length = len(document.values[fact])
        first, end = overlapping(offset, length)
        fact_start, _ = overlapping(document.fact_offsets[fact], length)
        rows.append((first, end, fact_start))
    return rows


def answer_table(
    config: RetrievalConfig, tokenizer, lengths: np.ndarray, filler: Sequence[str] | None = None, batch: int = 1024
) -> np.ndarray:
    """The answers table of the retrieval source `config` prepared with `tokenizer`, item k
    being document k; `lengths` (the dataset's lengths.npy) checks that pairing."""
    if len(lengths) != config.documents:
        raise DataError(f"a prepared retrieval source holds {len(lengths)} items, its config {config.documents}")
    filler = filler_sentences() if filler is None else filler
    rows = []
    for begin in range(0, config.documents, batch):
        documents = [make_document(config, k, filler) for k in range(begin, min(begin + batch, config.documents))]
        encodings = tokenizer.hf_tokenizer.encode_batch([d.text for d in documents], add_special_tokens=False)
        for k, (document, encoding) in enumerate(zip(documents, encodings, strict=True), start=begin):
            if len(encoding.ids) + 1 != lengths[k]:
                raise DataError(
                    f"item {k} of the prepared retrieval source has {lengths[k]} tokens, document {k} encodes "
                    f"to {len(encoding.ids)} + EOS: the items are not the documents in order"
                )
            rows += [(k, *span) for span in document_answers(encoding, document)]
    return np.asarray(rows, dtype=np.int64).reshape(-1, 4)


def write_answers(directory, table: np.ndarray) -> None:
    storage.write_array(storage.join(directory, ANSWERS_FILE), np.asarray(table, dtype=np.int64).reshape(-1, 4))


def read_answers(directory) -> np.ndarray | None:
    """The answers table of a prepared dataset, or None when it has none (not a retrieval source)."""
    path = storage.join(directory, ANSWERS_FILE)
    if not storage.exists(path):
        return None
    table = storage.read_array(path).astype(np.int64)
    if table.ndim != 2 or table.shape[1] != 4:
        raise DataError(f"{path}: expected an int table [answers, 4], got shape {table.shape}")
    return table


class AnswerIndex:
    """The answers table grouped by item: the answers of item k are rows ptr[k]:ptr[k + 1]."""

    def __init__(self, table: np.ndarray, items: int):
        table = table[np.argsort(table[:, 0], kind="stable")]
        if len(table) and (table[0, 0] < 0 or table[-1, 0] >= items):
            raise DataError(f"{ANSWERS_FILE} names items outside [0, {items})")
        self.spans = table[:, 1:]
        self.ptr = np.searchsorted(table[:, 0], np.arange(items + 1))

    def of(self, item: int) -> np.ndarray:
        """int64 [answers, 3]: (answer start, answer end, fact start) of one item."""
        return self.spans[self.ptr[item] : self.ptr[item + 1]]


def cut_positions(pieces: Iterable[tuple[int, int, int]], index: AnswerIndex, count: int) -> np.ndarray:
    """Positions q in [1, count) of a row whose token is an answer cut from its fact.

    `pieces` lists the row's documents as (item, first token of the item in the row, row
    position of that token). Position q's label is row token q (labels are inputs shifted
    by one), so q = 0 is never a label and is never returned.
    """
    cut: list[np.ndarray] = []
    for item, first, at in pieces:
        spans = index.of(item)
        if len(spans) == 0:
            continue
        blind = spans[spans[:, 2] < first]  # the fact starts before this row sees the item
        for start, end, _ in blind:
            low, high = max(start - first + at, 1), min(end - first + at, count)
            if low < high:
                cut.append(np.arange(low, high))
    return np.concatenate(cut) if cut else np.empty(0, dtype=np.int64)


def masking_report(answers: int, cut: int) -> dict[str, float]:
    """{answers, cut, cut_share}: answers with a label in the trained rows and those masked."""
    return {"answers": answers, "cut": cut, "cut_share": cut / answers if answers else 0.0}
