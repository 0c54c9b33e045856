"""data.pipeline: the trainer's rows from a data config (and benchmarks/loader.py's, analysis/recipe_fi.py's)."""

import itertools

import pytest

from longctx.config import load
from longctx.data.packing import PackedRows, PackedSource
from longctx.data.pipeline import packed_rows, position_transform
from tests.data.helpers import EOS, random_documents, write_token_dataset


def ids(rows, count):
    return [row["input_ids"].tolist() for row in itertools.islice(iter(rows), count)]


@pytest.fixture
def dataset(tmp_path):
    write_token_dataset(tmp_path / "data", random_documents(60, seed=3))
    return tmp_path / "data"


def test_ranks_split_one_stream_and_start_row_resumes_it(dataset):
    """Two ranks interleave the single-rank stream, and starting at global row k continues it exactly."""
    data = load([], [f"data.path={dataset}", "data.window=64"]).data
    sources = [(str(dataset), 1.0)]
    single = ids(packed_rows(data, sources, eos_id=EOS), 12)
    rank0 = ids(packed_rows(data, sources, eos_id=EOS, rank=0, world_size=2), 6)
    rank1 = ids(packed_rows(data, sources, eos_id=EOS, rank=1, world_size=2), 6)
    assert rank0 == single[0::2] and rank1 == single[1::2]
    assert ids(packed_rows(data, sources, eos_id=EOS, start_row=5), 7) == single[5:]


def test_rows_follow_the_data_config(dataset):
    """Window, seed, document masks and packing come from the config: the same rows as a
    PackedRows built from those values by hand, and other rows under another seed."""
    data = load([], [f"data.path={dataset}", "data.window=32", "data.seed=7", "data.doc_mask=false"]).data
    by_hand = PackedRows([PackedSource(str(dataset), seed=7)], [1.0], window=32, eos_id=EOS, doc_mask=False)
    rows = list(itertools.islice(iter(packed_rows(data, [(str(dataset), 1.0)], eos_id=EOS)), 4))
    expected = list(itertools.islice(iter(by_hand), 4))
    for row, reference in zip(rows, expected, strict=True):
        assert row.keys() == reference.keys()
        assert all(row[key].tolist() == reference[key].tolist() for key in row)
    assert all(len(set(row["document_ids"].tolist())) == 1 for row in rows)  # doc_mask=false: one document
    reseeded = load([], [f"data.path={dataset}", "data.window=32", "data.seed=8", "data.doc_mask=false"]).data
    assert ids(packed_rows(reseeded, [(str(dataset), 1.0)], eos_id=EOS), 4) != [r["input_ids"].tolist() for r in rows]


def test_position_transform_is_built_from_the_config(tokenizer):
    none = load([], ["data.window=128"]).data
    assert position_transform(none, tokenizer) is None
    pose = load([], ["data.window=128", "data.position_transform=pose", "data.target_length=512"]).data
    transform = position_transform(pose, tokenizer)
    assert transform is not None and transform.method == "pose" and transform.target_length == 512
    longrecipe = load([], ["data.window=128", "data.position_transform=longrecipe", "data.target_length=512"]).data
    ends = position_transform(longrecipe, tokenizer).ends_sentence
    assert ends is not None and len(ends) == tokenizer.vocab_size
    assert ends[tokenizer.encode(".")[-1]] and not ends[tokenizer.encode(" the")[-1]]
