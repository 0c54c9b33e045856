"""Each document padded to a multiple of g (data/row_padding.py): the layout, the packing
that makes room for it, and that the padding changes neither the loss (float64, 1e-12)
nor f(i) (exactly)."""

import itertools

import torch

from longctx.batch import check_batch
from longctx.config import load
from longctx.data.packing import IGNORE_INDEX, PackedRows, PackedSource, pad_documents_row
from longctx.data.row_padding import pad_each_document
from longctx.model.llama import Llama
from longctx.probes.position_frequency import PositionFrequency
from tests.data.helpers import EOS, random_documents, write_token_dataset


def test_each_document_is_followed_by_its_own_unlabelled_padding():
    row = pad_documents_row(torch.tensor([5, 6, EOS, 7, EOS]), block=13, eos_id=EOS, doc_mask=True)
    padded = pad_each_document(row, real=5, granule=4)
    check_batch({key: value[None] for key, value in padded.items()})
    assert padded["input_ids"].tolist() == [5, 6, EOS, EOS, 7, EOS, EOS, EOS] + [EOS] * 4
    assert padded["labels"].tolist() == [6, EOS] + [IGNORE_INDEX] * 2 + [EOS] + [IGNORE_INDEX] * 7
    assert padded["document_ids"].tolist() == [0] * 4 + [1] * 4 + [2] * 4
    assert padded["position_ids"].tolist() == [0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3]


def contract_rows(directory, granule: int, count: int) -> list[dict[str, torch.Tensor]]:
    source = PackedSource(directory, seed=2)
    rows = PackedRows(
        [source], [1.0], window=40, eos_id=EOS, doc_mask=True, packing="documents", document_granule=granule
    )
    return list(itertools.islice(iter(rows), count))


def labelled_pairs(row: dict[str, torch.Tensor]) -> list[tuple[int, int]]:
    keep = row["labels"] != IGNORE_INDEX
    return list(zip(row["input_ids"][keep].tolist(), row["labels"][keep].tolist(), strict=True))


def test_documents_packing_with_a_granule_pads_every_document_and_keeps_every_labelled_token(tmp_path):
    write_token_dataset(tmp_path, random_documents(60, seed=6, high=60))
    plain, padded = contract_rows(tmp_path, 1, 40), contract_rows(tmp_path, 4, 60)
    for row in padded:
        check_batch({key: value[None] for key, value in row.items()})
        _, sizes = torch.unique_consecutive(row["document_ids"], return_counts=True)
        assert (sizes % 4 == 0).all(), sizes
    # the same labelled (input, target) pairs in the same order, over more rows
    stream = [pair for row in padded for pair in labelled_pairs(row)]
    expected = [pair for row in plain for pair in labelled_pairs(row)]
    assert stream[: len(expected)] == expected


def test_the_padding_changes_neither_the_loss_nor_f_i():
    config = load([], ["model.vocab_size=97", "model.d_model=32", "model.attention_backend=sdpa"])
    torch.manual_seed(0)
    model = Llama(config.model).double()
    tokens = torch.tensor([5, 6, 9, 11, EOS, 7, 3, 4, EOS, 12, 13, 14, 15, 16, EOS])
    row = pad_documents_row(tokens, block=33, eos_id=EOS, doc_mask=True)
    padded = pad_each_document(row, real=len(tokens), granule=8)

    def loss(contract):
        ids = (contract["input_ids"][None], contract["position_ids"][None], contract["document_ids"][None])
        return model(*ids, labels=contract["labels"][None])

    with torch.no_grad():
        assert abs(float(loss(row)) - float(loss(padded))) < 1e-12
    counts = []
    for contract in (row, padded):
        frequency = PositionFrequency(32, 32)
        frequency.update({key: value[None] for key, value in contract.items()})
        counts.append(frequency.state_dict())
    assert all(torch.equal(counts[0][key], counts[1][key]) for key in counts[0])
