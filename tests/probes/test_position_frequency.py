"""Position-frequency counters against a brute-force pair count, STRING Eq. 1-2 and hand-worked rows."""

import math
import multiprocessing
import random
import socket

import pytest
import torch
import torch.distributed as dist

from longctx.probes import position_frequency
from longctx.probes.position_frequency import (
    IGNORE_INDEX,
    METHODS,
    PositionFrequency,
    absolute_position_counts,
    downsample,
    relative_position_counts,
)
from tests.helpers import packed_document_ids, reset_position_ids


def brute_force(position_ids, document_ids, max_distance, labels=None):
    """(counts [max_distance], overflow) from every (query, key) pair: same row, same
    document id, key index <= query index, query labelled."""
    counts, overflow = [0] * max_distance, 0
    for row in range(position_ids.shape[0]):
        pos, doc = position_ids[row].tolist(), document_ids[row].tolist()
        for q in range(len(pos)):
            if labels is not None and labels[row, q] == IGNORE_INDEX:
                continue
            for k in range(q + 1):
                if doc[k] != doc[q]:
                    continue
                d = pos[q] - pos[k]
                if d < max_distance:
                    counts[d] += 1
                else:
                    overflow += 1
    return torch.tensor(counts), overflow


def random_batch(rng: random.Random):
    """[B, T] ids: several documents per row (some of length 1), each with contiguous ids
    from 0, contiguous ids from an offset, or increasing ids with random gaps; labels mask
    random tokens and whole spans. Document ids repeat across rows (a row start must end
    a document) and are distinct within a row."""
    batch, seq = rng.randint(1, 3), rng.randint(1, 48)
    positions, documents, labels = [], [], []
    for _ in range(batch):
        pos, doc = [], []
        while len(pos) < seq:
            length = min(rng.choice([1, 1, 2, 3, 5, 8, 13, 30]), seq - len(pos))
            style = rng.choice(["reset", "offset", "gaps"])
            start = 0 if style == "reset" else rng.randint(0, 50)
            ids = [start]
            for _ in range(length - 1):
                ids.append(ids[-1] + (1 if style != "gaps" or rng.random() < 0.6 else rng.randint(2, 12)))
            pos += ids
            doc += [len(set(doc))] * length
        row_labels = [IGNORE_INDEX if rng.random() < 0.3 else 7 for _ in range(seq)]
        if rng.random() < 0.5:
            a = rng.randrange(seq)
            b = rng.randint(a, seq)
            row_labels[a:b] = [IGNORE_INDEX] * (b - a)
        positions.append(pos)
        documents.append(doc)
        labels.append(row_labels)
    return torch.tensor(positions), torch.tensor(documents), torch.tensor(labels)


# --- relative_position_counts -----------------------------------------------------------


def test_matches_brute_force_on_random_batches():
    rng = random.Random(0)
    for _ in range(200):
        position_ids, document_ids, labels = random_batch(rng)
        max_distance = rng.choice([1, 3, 16, 64, 200])
        for row_labels in (None, labels):
            expected_counts, expected_overflow = brute_force(position_ids, document_ids, max_distance, row_labels)
            for method in METHODS:
                counts, overflow = relative_position_counts(
                    position_ids, document_ids, max_distance, labels=row_labels, method=method
                )
                assert counts.dtype == torch.int64
                assert torch.equal(counts, expected_counts), (method, position_ids, document_ids, row_labels)
                assert int(overflow) == expected_overflow


def test_randpos_document_goes_to_the_fft_and_stays_exact(monkeypatch):
    """RandPos ids (runs of ~1 token): `auto` must send that document to the FFT (the runs
    method would take ~R^2 / 2 = 40,000 run pairs) and the contiguous one to the runs
    method, and still match the brute-force count."""
    rng = random.Random(2)
    n = 400
    position_ids = torch.tensor([sorted(rng.sample(range(4 * n), n)) + list(range(50))])
    document_ids = torch.tensor([[0] * n + [1] * 50])
    labels = torch.where(torch.rand(position_ids.shape) < 0.2, IGNORE_INDEX, 1)
    expected = brute_force(position_ids, document_ids, 4 * n, labels)
    for method in METHODS:
        counts, overflow = relative_position_counts(position_ids, document_ids, 4 * n, labels=labels, method=method)
        assert torch.equal(counts, expected[0]) and int(overflow) == expected[1], method
    fft_documents = []

    def spy(positions, document, query, use_fft, fft_length, max_distance):
        fft_documents.append(use_fft.tolist())
        return fft_counts(positions, document, query, use_fft, fft_length, max_distance)

    fft_counts = position_frequency._fft_counts
    monkeypatch.setattr(position_frequency, "_fft_counts", spy)
    assert torch.equal(relative_position_counts(position_ids, document_ids, 4 * n, labels=labels).counts, expected[0])
    assert fft_documents == [[True, False]]


def test_fft_is_exact_over_a_wide_id_span():
    """PoSE-like ids: 40 runs of 500 tokens spread over 2^18 ids, counts up to ~1e8 per bin;
    the float64 FFT must round to the integer runs method's counts."""
    generator = torch.Generator().manual_seed(3)
    starts = torch.randperm(512, generator=generator)[:40].sort().values * 512
    position_ids = torch.cat([torch.arange(start, start + 500) for start in starts.tolist()])[None]
    document_ids = torch.zeros_like(position_ids)
    labels = torch.where(torch.rand(position_ids.shape, generator=generator) < 0.3, IGNORE_INDEX, 1)
    by_runs = relative_position_counts(position_ids, document_ids, 2**18, labels=labels, method="runs")
    by_fft = relative_position_counts(position_ids, document_ids, 2**18, labels=labels, method="fft")
    assert torch.equal(by_runs.counts, by_fft.counts)
    assert by_runs.overflow == by_fft.overflow == 0
    assert int(by_runs.counts.sum()) == int(((labels[0] != IGNORE_INDEX) * torch.arange(1, 20_001)).sum())


def test_one_document_gives_n_minus_d():
    """STRING Eq. 1: f(i) = L - i for one sequence; the ids' offset does not matter."""
    n = 300
    document_ids = torch.zeros(1, n, dtype=torch.long)
    expected = torch.arange(n, 0, -1)
    for start in (0, 1000):
        counts, overflow = relative_position_counts(torch.arange(start, start + n)[None], document_ids, n)
        assert torch.equal(counts, expected)
        assert overflow == 0


def test_packed_documents_follow_eq2():
    """STRING Eq. 2: f(i) = sum_s max(|s| - i, 0), documents with reset positions."""
    lengths = [37, 5, 1, 85, 1, 20]
    counts, overflow = relative_position_counts(
        reset_position_ids(lengths, batch=2), packed_document_ids(lengths, batch=2), 100
    )
    expected = torch.tensor([2 * sum(max(n - i, 0) for n in lengths) for i in range(100)])
    assert torch.equal(counts, expected)
    assert overflow == 0


def test_rows_without_document_mask():
    """doc_mask=false: one document per row, positions 0..T-1 -> f(i) = rows * (T - i).
    Every row has document id 0, so row boundaries alone must separate them."""
    rows, seq = 3, 128
    position_ids = torch.arange(seq).expand(rows, seq)
    counts, overflow = relative_position_counts(position_ids, torch.zeros(rows, seq, dtype=torch.long), seq)
    assert torch.equal(counts, rows * (seq - torch.arange(seq)))
    assert overflow == 0


def test_hand_worked_gaps_and_labels():
    # ids 0 1 5 6 (a SkipAlign-style skip of 3): pairs q0: 0; q1: 0 1; q5: 0 4 5; q6: 0 1 5 6
    skipped = relative_position_counts(torch.tensor([[0, 1, 5, 6]]), torch.zeros(1, 4, dtype=torch.long), 8)
    assert skipped.counts.tolist() == [4, 2, 0, 0, 1, 2, 1, 0]
    # ids 0..3 with token 2 unlabelled: its pairs (d = 0, 1, 2) vanish, it still serves as a key
    masked = relative_position_counts(
        torch.arange(4)[None], torch.zeros(1, 4, dtype=torch.long), 4, labels=torch.tensor([[5, 5, IGNORE_INDEX, 5]])
    )
    assert masked.counts.tolist() == [3, 2, 1, 1]


def test_overflow_conserves_pairs():
    lengths = [200, 3, 150]
    position_ids, document_ids = reset_position_ids(lengths), packed_document_ids(lengths)
    labels = torch.where(torch.rand(position_ids.shape) < 0.25, IGNORE_INDEX, 1)
    for max_distance in (1, 10, 149, 150, 199, 200, 1000):
        counts, overflow = relative_position_counts(position_ids, document_ids, max_distance, labels=labels)
        all_counts, no_overflow = brute_force(position_ids, document_ids, 1000, labels)
        assert no_overflow == 0
        assert int(counts.sum() + overflow) == int(all_counts.sum())
        assert int(overflow) == int(all_counts[max_distance:].sum())


def test_no_labelled_token_counts_nothing():
    labels = torch.full((2, 10), IGNORE_INDEX)
    position_ids = torch.arange(10).expand(2, 10)
    counts, overflow = relative_position_counts(position_ids, torch.zeros_like(labels), 10, labels=labels)
    assert counts.sum() == 0 and overflow == 0


def test_bad_inputs_raise_clear_errors():
    pos, doc = torch.arange(6).expand(2, 6), torch.zeros(2, 6, dtype=torch.long)
    with pytest.raises(ValueError, match=r"document_ids has shape \(2, 5\)"):
        relative_position_counts(pos, doc[:, :5], 8)
    with pytest.raises(ValueError, match=r"labels has shape \(1, 6\)"):
        relative_position_counts(pos, doc, 8, labels=torch.zeros(1, 6, dtype=torch.long))
    with pytest.raises(ValueError, match=r"position_ids must be \[batch, seq\]"):
        relative_position_counts(pos[0], doc[0], 8)
    with pytest.raises(TypeError, match="position_ids must be an integer tensor"):
        relative_position_counts(pos.float(), doc, 8)
    with pytest.raises(ValueError, match="max_distance must be a positive int"):
        relative_position_counts(pos, doc, 0)
    with pytest.raises(ValueError, match="method must be one of"):
        relative_position_counts(pos, doc, 8, method="dense")
    decreasing = pos.clone()
    decreasing[1, 4] = 2
    with pytest.raises(ValueError, match=r"increase strictly.*row 1, token 4 \(document id 0\) has position 2 after 3"):
        relative_position_counts(decreasing, doc, 8)
    repeated = pos.clone()
    repeated[0, 3] = 2
    with pytest.raises(ValueError, match="row 0, token 3"):
        relative_position_counts(repeated, doc, 8)
    # a decrease at a document boundary is the normal reset, not an error
    relative_position_counts(torch.tensor([[0, 1, 2, 0, 1]]), torch.tensor([[0, 0, 0, 1, 1]]), 8)


# --- absolute_position_counts -----------------------------------------------------------


def test_absolute_counts_match_a_tally():
    rng = random.Random(1)
    for _ in range(50):
        position_ids, _, labels = random_batch(rng)
        max_position = rng.choice([1, 10, 40, 100])
        for row_labels in (None, labels):
            counted = [
                p
                for p, label in zip(position_ids.flatten().tolist(), labels.flatten().tolist(), strict=True)
                if row_labels is None or label != IGNORE_INDEX
            ]
            counts, overflow = absolute_position_counts(position_ids, max_position, labels=row_labels)
            assert counts.tolist() == [counted.count(p) for p in range(max_position)]
            assert int(overflow) == sum(p >= max_position for p in counted)


def test_absolute_counts_reject_negative_ids():
    with pytest.raises(ValueError, match="row 0, token 1 is -3"):
        absolute_position_counts(torch.tensor([[0, -3]]), 4)


# --- PositionFrequency ------------------------------------------------------------------


def contract_batch(position_ids, document_ids, labels):
    return {
        "input_ids": torch.zeros_like(position_ids),
        "labels": labels,
        "position_ids": position_ids,
        "document_ids": document_ids,
    }


def filled_accumulator(seed: int, count_only_labeled: bool = True, batches: int = 5):
    """An accumulator fed random batches, and the brute-force totals it should hold."""
    rng = random.Random(seed)
    probe = PositionFrequency(64, max_position=80, count_only_labeled=count_only_labeled)
    expected_relative, expected_overflow, expected_tokens = torch.zeros(64, dtype=torch.long), 0, 0
    for _ in range(batches):
        position_ids, document_ids, labels = random_batch(rng)
        probe.update(contract_batch(position_ids, document_ids, labels))
        counts, overflow = brute_force(position_ids, document_ids, 64, labels if count_only_labeled else None)
        expected_relative += counts
        expected_overflow += overflow
        expected_tokens += position_ids.numel()
    return probe, expected_relative, expected_overflow, expected_tokens


@pytest.mark.parametrize("count_only_labeled", [True, False])
def test_accumulator_sums_batches(count_only_labeled):
    probe, relative, overflow, tokens = filled_accumulator(3, count_only_labeled)
    assert torch.equal(probe.relative, relative)
    assert int(probe.overflow) == overflow
    assert int(probe.tokens_seen) == tokens
    assert probe.relative.dtype == probe.absolute.dtype == torch.int64


def test_accumulator_ignores_labels_when_asked():
    probe = PositionFrequency(8, count_only_labeled=False)
    batch = contract_batch(torch.arange(8)[None], torch.zeros(1, 8, dtype=torch.long), None)
    del batch["labels"]
    probe.update(batch)
    assert probe.relative.tolist() == list(range(8, 0, -1))
    assert probe.absolute.tolist() == [1] * 8


def test_accumulator_requires_the_contract_keys():
    probe = PositionFrequency(8)
    batch = contract_batch(torch.arange(8)[None], torch.zeros(1, 8, dtype=torch.long), torch.ones(1, 8))
    del batch["labels"]
    with pytest.raises(KeyError, match="lacks \\['labels'\\]"):
        probe.update(batch)


def test_state_dict_round_trip(tmp_path):
    probe = filled_accumulator(4)[0]
    torch.save(probe.state_dict(), tmp_path / "fi.pt")
    restored = PositionFrequency(64, max_position=80)
    restored.load_state_dict(torch.load(tmp_path / "fi.pt", weights_only=True))
    for key, value in probe.state_dict().items():
        assert torch.equal(restored.state_dict()[key], value), key
    assert restored.summary(64) == probe.summary(64)

    with pytest.raises(ValueError, match=r"'relative' has shape \(64,\).*max_distance=32"):
        PositionFrequency(32, max_position=80).load_state_dict(probe.state_dict())
    with pytest.raises(ValueError, match="count_only_labeled=True"):
        PositionFrequency(64, max_position=80, count_only_labeled=False).load_state_dict(probe.state_dict())


def test_merge_adds_counts():
    first, relative_1, overflow_1, tokens_1 = filled_accumulator(5)
    second, relative_2, overflow_2, tokens_2 = filled_accumulator(6)
    first.merge(second)
    assert torch.equal(first.relative, relative_1 + relative_2)
    assert int(first.overflow) == overflow_1 + overflow_2
    assert int(first.tokens_seen) == tokens_1 + tokens_2
    with pytest.raises(ValueError, match="cannot merge"):
        first.merge(PositionFrequency(32))


def test_all_reduce_without_process_group_is_a_copy():
    probe = filled_accumulator(7)[0]
    reduced = probe.all_reduce()
    assert reduced is not probe
    for key, value in probe.state_dict().items():
        assert torch.equal(reduced.state_dict()[key], value)


def _all_reduce_worker(rank: int, port: int, queue) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        accumulator = filled_accumulator(10 + rank, batches=2)[0]
        reduced = accumulator.all_reduce().state_dict()
        probe = accumulator.state_dict()  # after the reduction: must still be this rank's own counts
        # plain lists: shared-memory tensors die with this process
        local, total = ({key: value.tolist() for key, value in state.items()} for state in (probe, reduced))
        queue.put((rank, local, total))
    finally:
        dist.destroy_process_group()


def test_all_reduce_sums_ranks():
    """Two gloo processes: each gets the sum of both ranks' counts; local counts stay local."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    workers = [context.Process(target=_all_reduce_worker, args=(rank, port, queue)) for rank in range(2)]
    for worker in workers:
        worker.start()
    results = {rank: (local, reduced) for rank, local, reduced in (queue.get(timeout=120) for _ in workers)}
    for worker in workers:
        worker.join(timeout=60)
        assert worker.exitcode == 0
    for rank in range(2):
        local, reduced = results[rank]
        assert local["relative"] == filled_accumulator(10 + rank, batches=2)[0].relative.tolist()
        for key in ("relative", "absolute", "overflow", "absolute_overflow", "tokens_seen"):
            both_ranks = torch.tensor(results[0][0][key]) + torch.tensor(results[1][0][key])
            assert torch.equal(torch.tensor(reduced[key]), both_ranks), key


def test_summary_of_one_document():
    """One document of n = L tokens: f(d) = L - d, pairs at d >= L/2 are sum_{d >= L/2} (L - d)."""
    window = 16
    probe = PositionFrequency(32)
    ids = torch.arange(window)[None]
    probe.update(contract_batch(ids, torch.zeros_like(ids), torch.ones_like(ids)))
    summary = probe.summary(window)
    assert summary == {
        "fi/f@L/4": 12,
        "fi/f@L/2": 8,
        "fi/f@3L/4": 4,
        "fi/f@L-1": 1,
        "fi/share_ge_half": pytest.approx(sum(range(1, 9)) / sum(range(1, 17))),
        "fi/tokens_seen": 16,
    }
    assert math.isnan(PositionFrequency(32).summary(16)["fi/share_ge_half"])
    with pytest.raises(ValueError, match="window must be an int in \\[1, max_distance=32\\]"):
        probe.summary(33)


def test_share_counts_overflow_pairs():
    """Pairs beyond max_distance are beyond L/2 too."""
    probe = PositionFrequency(8, count_only_labeled=False)
    ids = torch.arange(12)[None]
    probe.update({"input_ids": ids, "position_ids": ids, "document_ids": torch.zeros_like(ids)})
    # d = 0..11 with 12 - d pairs each; d >= 4 holds 8 + 7 + ... + 1 = 36 of 78
    assert probe.summary(8)["fi/share_ge_half"] == pytest.approx(36 / 78)


def test_downsample():
    counts = torch.arange(25_000) ** 2
    index, values = downsample(counts, 10_000)
    assert len(index) == 10_000 and index[0] == 0 and index[-1] == 24_999
    assert (index[1:] > index[:-1]).all()
    assert (values == index**2).all()
    small_index, small_values = PositionFrequency(50).downsample()
    assert small_index.tolist() == list(range(50)) and small_values.tolist() == [0] * 50
    with pytest.raises(ValueError, match="max_rows must be an int >= 2"):
        downsample(counts, 1)
