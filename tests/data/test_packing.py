"""Packing: the batch contract, exact coverage of the token stream, world-size invariance."""

import itertools
import signal
from contextlib import contextmanager
from fractions import Fraction

import numpy as np
import pytest
import torch

from longctx.batch import check_batch
from longctx.data.batch_plan import tokens_per_step
from longctx.data.packing import (
    IGNORE_INDEX,
    Mixture,
    PackedRows,
    PackedSource,
    contract_from_blocks,
    pad_documents_row,
)
from longctx.errors import ConfigError, DataError
from tests.data.helpers import EOS, random_documents, write_token_dataset


def brute_force_contract(row: list[int], doc_mask: bool):
    """Walk the block token by token: what the contract must say for it."""
    inputs, targets = row[:-1], row[1:]
    positions, documents, labels = [], [], []
    doc, pos = 0, 0
    for t, token in enumerate(inputs):
        positions.append(pos if doc_mask else t)
        documents.append(doc if doc_mask else 0)
        labels.append(IGNORE_INDEX if doc_mask and token == EOS else targets[t])
        if token == EOS:
            doc, pos = doc + 1, 0
        else:
            pos += 1
    return inputs, labels, positions, documents


@pytest.mark.parametrize("doc_mask", [True, False])
def test_contract_matches_a_token_by_token_walk(doc_mask):
    rng = np.random.default_rng(0)
    blocks = torch.as_tensor(rng.integers(1, 50, size=(4, 65)))
    blocks[rng.random(blocks.shape) < 0.1] = EOS
    blocks[0, 0] = EOS  # a row that starts with a document end
    contract = contract_from_blocks(blocks, EOS, doc_mask)
    check_batch(contract)
    for b in range(4):
        inputs, labels, positions, documents = brute_force_contract(blocks[b].tolist(), doc_mask)
        assert contract["input_ids"][b].tolist() == inputs
        assert contract["labels"][b].tolist() == labels
        assert contract["position_ids"][b].tolist() == positions
        assert contract["document_ids"][b].tolist() == documents


def test_doc_mask_rows_never_attend_across_a_boundary():
    blocks = torch.tensor([[5, 6, EOS, 7, 8, 9, EOS, EOS, 3, 4, 5]])
    contract = contract_from_blocks(blocks, EOS, doc_mask=True)
    docs = contract["document_ids"][0]
    # Every EOS is the last token of its document: the next token is in a new one.
    eos_positions = (contract["input_ids"][0] == EOS).nonzero().flatten().tolist()
    for t in eos_positions:
        assert docs[t + 1] == docs[t] + 1
    assert contract["position_ids"][0].tolist() == [0, 1, 2, 0, 1, 2, 3, 0, 0, 1]


def test_every_token_appears_exactly_once_per_epoch(tmp_path):
    docs = random_documents(60, seed=1)
    write_token_dataset(tmp_path, docs)  # 1 KB chunks: many chunk edges inside rows
    window = 37
    source = PackedSource(tmp_path, seed=3)
    total = source.epoch_tokens
    assert total == sum(len(d) for d in docs)
    # doc_mask=False keeps every label, so input_ids + the last label are the raw block.
    rows = PackedRows([source], [1.0], window=window, eos_id=EOS, doc_mask=False)
    consumed = []
    for row in rows:
        consumed += [*row["input_ids"].tolist(), row["labels"][-1].item()]
        if len(consumed) >= total:
            break
    first_epoch = consumed[:total]
    # Exactly the multiset of all tokens, each document contiguous and intact.
    assert sorted(first_epoch) == sorted(np.concatenate(docs).tolist())
    ends = [i for i, token in enumerate(first_epoch) if token == EOS]
    starts = [0] + [e + 1 for e in ends[:-1]]
    pieces = sorted(tuple(first_epoch[s : e + 1]) for s, e in zip(starts, ends, strict=True))
    assert pieces == sorted(tuple(d.tolist()) for d in docs)


def test_epochs_reshuffle_and_seeds_reproduce(tmp_path):
    write_token_dataset(tmp_path, random_documents(40, seed=2))
    source = PackedSource(tmp_path, seed=5)
    assert not np.array_equal(source.document_order(0), source.document_order(1))
    again = PackedSource(tmp_path, seed=5)
    assert np.array_equal(source.document_order(3), again.document_order(3))
    assert torch.equal(source.read(123, 500), again.read(123, 500))


def test_ranks_partition_the_global_row_sequence(tmp_path):
    write_token_dataset(tmp_path, random_documents(50, seed=4))

    def rows_of(rank, world, start=0, count=12):
        rows = PackedRows(
            [PackedSource(tmp_path, seed=9)],
            [1.0],
            window=16,
            eos_id=EOS,
            doc_mask=True,
            rank=rank,
            world_size=world,
            start_row=start,
        )
        out = []
        for row in rows:
            out.append(row["input_ids"])
            if len(out) == count:
                return out

    single = rows_of(0, 1, count=24)
    rank0, rank1 = rows_of(0, 2), rows_of(1, 2)
    for k in range(12):
        assert torch.equal(rank0[k], single[2 * k]) and torch.equal(rank1[k], single[2 * k + 1])
    resumed = rows_of(1, 2, start=10, count=3)  # rows 11, 13, 15
    for k, global_row in enumerate((11, 13, 15)):
        assert torch.equal(resumed[k], single[global_row])


def smooth_round_robin(weights, count):
    """Reference: smooth weighted round-robin in exact arithmetic, replayed row by row
    (every source earns its share, the one with most credit is picked and pays 1)."""
    shares = [Fraction(str(w)) / sum(Fraction(str(v)) for v in weights) for w in weights]
    credit, taken, out = [Fraction(0)] * len(shares), [0] * len(shares), []
    for _ in range(count):
        credit = [c + share for c, share in zip(credit, shares, strict=True)]
        chosen = max(range(len(credit)), key=credit.__getitem__)
        credit[chosen] -= 1
        out.append((chosen, taken[chosen]))
        taken[chosen] += 1
    return out


@pytest.mark.parametrize("weights", [[0.6, 0.4], [1.0, 1.0], [3.0, 2.0], [0.7, 0.3], [0.05, 0.95]])
def test_two_source_mixture_is_the_smooth_round_robin(weights):
    mixture = Mixture(weights)
    assert [mixture.locate(k) for k in range(3000)] == smooth_round_robin(weights, 3000)


@pytest.mark.parametrize("weights", [[0.5, 0.3, 0.2], [1.0, 7.0, 2.0, 0.25]])
def test_mixture_rows_are_consecutive_and_within_one_row_of_the_shares(weights):
    mixture = Mixture(weights)
    taken = [0] * len(weights)
    for k in range(4000):
        source, row = mixture.locate(k)
        assert row == taken[source]  # every source's rows in order, none skipped or repeated
        taken[source] += 1
        for count, weight in zip(taken, weights, strict=True):
            assert abs(count - (k + 1) * weight / sum(weights)) < 1


def test_mixture_rejects_bad_weights():
    for weights in ([], [1.0, 0.0], [1.0, -2.0], [float("nan")]):
        with pytest.raises(ValueError, match="mixture weights must be positive"):
            Mixture(weights)


def test_mixture_draws_rows_from_both_sources(tmp_path):
    long_dir, short_dir = tmp_path / "long", tmp_path / "short"
    long_dir.mkdir(), short_dir.mkdir()
    write_token_dataset(long_dir, random_documents(20, seed=1, low=200, high=400))
    write_token_dataset(short_dir, [d + 500_000 * (d != EOS) for d in random_documents(20, seed=2)])
    rows = PackedRows(
        [PackedSource(long_dir, seed=1), PackedSource(short_dir, seed=2)],
        [3.0, 2.0],
        window=32,
        eos_id=EOS,
        doc_mask=True,
    )
    from_short = []
    for i, row in enumerate(rows):
        from_short.append(bool((row["input_ids"] > 500_000).any()))
        if i == 49:
            break
    assert sum(from_short) == 20


def test_tokens_per_step_equal_at_2k_and_4k():
    acc_2k, rows_2k = tokens_per_step(2048, 8, 4, 4 * 2**20)
    acc_4k, rows_4k = tokens_per_step(4096, 8, 4, 4 * 2**20)
    assert rows_2k * 2048 == rows_4k * 4096 == 4 * 2**20
    assert (acc_2k, acc_4k) == (64, 32)  # 4 Mi tokens / (window x 8 rows x 4 ranks)
    # With the micro-batch halved at 4K (same tokens per forward), accumulation doubles (STRING A.2).
    assert tokens_per_step(4096, 4, 4, 4 * 2**20)[0] == 2 * acc_4k


def test_impossible_batch_for_the_world_size():
    with pytest.raises(
        ValueError, match="not a multiple of data.window x train.micro_batch_size x world size = 2048 x 8 x 3"
    ):
        tokens_per_step(2048, 8, 3, 4 * 2**20)


def test_missing_or_unprepared_directory(tmp_path):
    with pytest.raises(FileNotFoundError, match="no index.json"):
        PackedSource(tmp_path / "nothing", seed=0)


def _rows(sources, weights, start, count, rank=0, world=1):
    rows = PackedRows(
        sources, weights, window=16, eos_id=EOS, doc_mask=True, rank=rank, world_size=world, start_row=start
    )
    out = []
    for row in rows:
        out.append(row["input_ids"])
        if len(out) == count:
            return out


def _mixture_dirs(tmp_path, count):
    dirs = []
    for i in range(count):
        directory = tmp_path / f"source{i}"
        directory.mkdir()
        write_token_dataset(directory, [d + 1000 * i * (d != EOS) for d in random_documents(15, seed=i)])
        dirs.append(directory)
    return dirs


def test_resuming_gives_the_rows_of_an_uninterrupted_run(tmp_path):
    dirs = _mixture_dirs(tmp_path, 3)
    weights = [0.5, 0.3, 0.2]
    uninterrupted = _rows([PackedSource(d, seed=i) for i, d in enumerate(dirs)], weights, 0, 1200)
    for rank, world, start in ((0, 1, 997), (1, 2, 1001), (2, 3, 640)):
        resumed = _rows([PackedSource(d, seed=i) for i, d in enumerate(dirs)], weights, start, 20, rank, world)
        first = start + (rank - start) % world
        for k, row in enumerate(resumed):
            assert torch.equal(row, uninterrupted[first + k * world])


@contextmanager
def _deadline(seconds):
    """Turn a hang (a replay of 10^15 rows) into a failure."""

    def expire(*_):
        raise TimeoutError(f"took more than {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def test_resuming_at_a_huge_step_seeks_instead_of_replaying(tmp_path):
    dirs = _mixture_dirs(tmp_path, 2)
    sources = [PackedSource(d, seed=i) for i, d in enumerate(dirs)]
    # 3:2 repeats every 5 rows: source 0, 1, 0, 1, 0 (the reference replays one period)
    period = smooth_round_robin([3.0, 2.0], 5)
    start = 10**15 + 3
    with _deadline(20):
        resumed = _rows(sources, [3.0, 2.0], start, 6, rank=1, world=2)
    first = start + (1 - start) % 2
    for k, row in enumerate(resumed):
        index = first + 2 * k
        source, within_period = period[index % 5]
        source_row = (index // 5) * (3 if source == 0 else 2) + within_period
        expected = sources[source].read(source_row * 17, 17)[:-1]
        assert torch.equal(row, expected)


def _document_rows(source, window, count, start=0):
    rows = PackedRows([source], [1.0], window=window, eos_id=EOS, doc_mask=True, start_row=start, packing="documents")
    return list(itertools.islice(iter(rows), count))


def test_documents_packing_keeps_every_short_document_whole_and_in_order(tmp_path):
    docs = random_documents(80, seed=6, high=60)  # some longer than a 41-token row
    write_token_dataset(tmp_path, docs)
    window, block = 40, 41
    source = PackedSource(tmp_path, seed=2)
    order = source.document_order(0)
    rows_in_epoch = len(source.document_rows(0, block))
    pieces = [source.read_row(r, block) for r in range(rows_in_epoch)]
    # The rows partition the epoch's documents, in order, each row within its budget ...
    assert torch.equal(torch.cat(pieces), torch.from_numpy(np.concatenate([docs[d] for d in order])).long())
    assert all(0 < len(piece) <= block for piece in pieces)
    # ... and a row is whole documents (starts at one, ends with EOS) or a piece of one long document.
    for piece in pieces:
        owners = sorted({int(t) // 1000 - 1 for t in piece if t != EOS})
        if len(owners) == 1 and len(docs[owners[0]]) > block:
            continue  # a piece of a long document
        assert piece[-1] == EOS and int(piece[0]) % 1000 == 0  # starts a document, ends one
        assert all(len(docs[d]) <= block for d in owners)
    assert sum(len(d) > block for d in docs) > 0 and sum(len(d) <= block for d in docs) > 0
    # The contract rows: valid batches whose padding carries no label.
    rows = _document_rows(source, window, rows_in_epoch + 3)
    for row, piece in zip(rows, pieces, strict=False):
        check_batch({key: value[None] for key, value in row.items()})
        assert torch.equal(row["input_ids"][: len(piece)], piece[:window])
        assert (row["labels"][len(piece) - 1 :] == IGNORE_INDEX).all()
    # rows after the first epoch come from epoch 1's order, and a resume seeks to them
    resumed = _document_rows(PackedSource(tmp_path, seed=2), window, 3, start=rows_in_epoch)
    for got, expected_row in zip(resumed, rows[rows_in_epoch:], strict=True):
        assert torch.equal(got["input_ids"], expected_row["input_ids"])
    assert not torch.equal(rows[rows_in_epoch]["input_ids"], rows[0]["input_ids"])


def test_documents_packing_can_drop_long_documents(tmp_path):
    docs = random_documents(60, seed=9, high=60)
    write_token_dataset(tmp_path, docs)
    block = 41
    source = PackedSource(tmp_path, seed=4)
    order = source.document_order(0)
    table = source.document_rows(0, block, "drop")
    pieces = [source.read_row(r, block, "drop") for r in range(len(table))]
    kept = [d for d in order if len(docs[d]) <= block]
    assert len(kept) < len(order)  # some documents are too long and left out
    assert torch.equal(torch.cat(pieces), torch.from_numpy(np.concatenate([docs[d] for d in kept])).long())
    rows = PackedRows(
        [source], [1.0], window=block - 1, eos_id=EOS, doc_mask=True, packing="documents", long_documents="drop"
    )
    first = next(iter(rows))
    assert torch.equal(first["input_ids"][: len(pieces[0])], pieces[0][: block - 1])
    with pytest.raises(DataError, match="no document fits a row of 1 tokens"):
        source.read_row(0, 1, "drop")


def test_documents_packing_pads_with_one_unlabelled_segment():
    tokens = torch.tensor([5, 6, EOS, 7, EOS])
    row = pad_documents_row(tokens, block=9, eos_id=EOS, doc_mask=True)
    check_batch({key: value[None] for key, value in row.items()})
    assert row["input_ids"].tolist() == [5, 6, EOS, 7, EOS, EOS, EOS, EOS]
    assert row["labels"].tolist() == [6, EOS, IGNORE_INDEX, EOS] + [IGNORE_INDEX] * 4
    assert row["document_ids"].tolist() == [0, 0, 0, 1, 1, 2, 2, 2]
    assert row["position_ids"].tolist() == [0, 1, 2, 0, 1, 0, 1, 2]
    full = pad_documents_row(torch.tensor([5, 6, 7, EOS]), block=4, eos_id=EOS, doc_mask=True)
    assert full["labels"].tolist() == [6, 7, EOS]
    with pytest.raises(ValueError, match="at most 4"):
        pad_documents_row(torch.arange(1, 6), block=4, eos_id=EOS, doc_mask=True)


def test_unknown_packing_is_refused(tmp_path):
    write_token_dataset(tmp_path, random_documents(5, seed=1))
    with pytest.raises(ValueError, match="packing"):
        PackedRows([PackedSource(tmp_path, seed=0)], [1.0], window=8, eos_id=EOS, doc_mask=True, packing="greedy")
    with pytest.raises(ValueError, match="long_documents"):
        PackedRows([PackedSource(tmp_path, seed=0)], [1.0], window=8, eos_id=EOS, doc_mask=True, long_documents="Drop")


@pytest.mark.parametrize("start_row", [0, 11])
def test_loader_workers_yield_the_in_process_batches_in_order(tmp_path, start_row):
    """Workers split whole micro-batches round-robin, so batches (and a resume from
    `start_row`) equal those of the in-process loader: reference = num_workers=0."""
    write_token_dataset(tmp_path, random_documents(50, seed=4))
    micro_batch = 3

    def batches(workers):
        rows = PackedRows(
            [PackedSource(tmp_path, seed=1)],
            [1.0],
            window=23,
            eos_id=EOS,
            doc_mask=True,
            rank=1,
            world_size=2,
            start_row=start_row,
            micro_batch_size=micro_batch,
        )
        loader = torch.utils.data.DataLoader(rows, batch_size=micro_batch, num_workers=workers)
        return list(itertools.islice(iter(loader), 7))

    reference, split = batches(0), batches(2)
    assert len(split) == len(reference) == 7
    for expected, got in zip(reference, split, strict=True):
        assert expected.keys() == got.keys()
        for key in expected:
            assert torch.equal(expected[key], got[key]), key


def test_more_nodes_than_the_config_was_written_for_is_a_located_config_error(monkeypatch, capsys):
    """`torchrun --nnodes 2 ... -m longctx pretrain experiments/pretrain/tiny_512.yaml`: one
    line naming the key, where it was set and the nearest valid values; no traceback, and
    nothing prepared or built first."""
    from longctx.cli import main

    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setattr("longctx.data.dataset_sources.prepared_sources", lambda *a: pytest.fail("prepared data first"))
    assert main(["pretrain", "experiments/pretrain/tiny_512.yaml"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("longctx pretrain: error: train.global_batch_tokens: 4,096 is not a multiple of")
    assert "512 x 8 x 2 = 8,192; the nearest valid values are 8,192 " in err
    assert "divides into world sizes 1" in err and "tiny_512.yaml:13" in err
    with pytest.raises(ConfigError, match="the nearest valid values are 2,048 or 3,072"):
        tokens_per_step(512, 1, 2, 2560)
