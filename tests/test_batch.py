"""The batch contract: boundaries against brute-force loops, invariant checks naming the fault."""

import pytest
import torch

from longctx.batch import (
    IGNORE_INDEX,
    check_batch,
    cu_seqlens,
    document_segments,
    document_start_index,
    document_start_mask,
)


def random_documents(rows: int, length: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    starts = torch.rand(rows, length, generator=generator) < 0.15
    starts[:, 0] = True
    return starts.long().cumsum(dim=1) - 1


def brute_start_index(document_ids: torch.Tensor) -> list[list[int]]:
    result = []
    for row in document_ids.tolist():
        starts, current = [], 0
        for t, document in enumerate(row):
            if t == 0 or document != row[t - 1]:
                current = t
            starts.append(current)
        result.append(starts)
    return result


@pytest.mark.parametrize("seed", range(5))
def test_document_starts_match_a_loop(seed):
    documents = random_documents(3, 50, seed)
    assert document_start_index(documents).tolist() == brute_start_index(documents)
    expected_mask = [[t == s for t, s in enumerate(row)] for row in brute_start_index(documents)]
    assert document_start_mask(documents).tolist() == expected_mask


@pytest.mark.parametrize("q_len", [50, 17, 1])
def test_document_segments_match_a_loop(q_len):
    documents = random_documents(3, 50, seed=7)
    starts, k_lengths, q_lengths = document_segments(documents, q_len)
    expected = []  # (flat start, keys, queries among the last q_len positions of the row)
    for b, row in enumerate(brute_start_index(documents)):
        for start in sorted(set(row)):
            end = start + row.count(start)
            queries = sum(1 for t in range(start, end) if t >= 50 - q_len)
            expected.append((b * 50 + start, end - start, queries))
    assert list(zip(starts.tolist(), k_lengths.tolist(), q_lengths.tolist(), strict=True)) == expected
    cumulative = cu_seqlens(k_lengths)
    assert cumulative.dtype == torch.int32 and cumulative[0] == 0 and cumulative[-1] == 150
    assert torch.equal(cumulative[1:] - cumulative[:-1], k_lengths.to(torch.int32))


def contract(documents: torch.Tensor, positions: torch.Tensor) -> dict[str, torch.Tensor]:
    ids = torch.ones_like(documents)
    return {
        "input_ids": ids,
        "labels": torch.full_like(ids, IGNORE_INDEX),
        "position_ids": positions,
        "document_ids": documents,
    }


def test_check_batch_accepts_packed_and_skipped_ids():
    documents = torch.tensor([[0, 0, 0, 1, 1, 2]])
    check_batch(contract(documents, torch.tensor([[0, 1, 2, 0, 1, 0]])))
    check_batch(contract(documents, torch.tensor([[0, 5, 9, 3, 40, 0]])))  # SkipAlign/PoSE-style gaps


@pytest.mark.parametrize(
    "change,message",
    [
        ({"document_ids": torch.tensor([[0, 0, 1, 1, 0, 0]])}, r"row 0: document 0 resumes at index 4"),
        (
            {"position_ids": torch.tensor([[0, 1, 1, 0, 1, 2]])},
            r"ids must increase inside a document, got 1 -> 1 at index 2",
        ),
        ({"labels": torch.zeros(1, 5, dtype=torch.long)}, r"batch\['labels'\] has shape \(1, 5\)"),
        ({"position_ids": torch.zeros(1, 6)}, r"batch\['position_ids'\] must hold integers"),
    ],
)
def test_check_batch_names_the_fault(change, message):
    batch = {**contract(torch.tensor([[0, 0, 0, 1, 1, 1]]), torch.tensor([[0, 1, 2, 0, 1, 2]])), **change}
    with pytest.raises(ValueError, match=message):
        check_batch(batch)


def test_check_batch_names_missing_keys():
    with pytest.raises(ValueError, match=r"lacks \['document_ids'\]"):
        check_batch(
            {
                "input_ids": torch.zeros(1, 2, dtype=torch.long),
                "labels": torch.zeros(1, 2, dtype=torch.long),
                "position_ids": torch.zeros(1, 2, dtype=torch.long),
            }
        )
