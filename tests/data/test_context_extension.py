"""Context-extension transforms in the data path: PoSE (paper/repo), RandPos and LongRecipe
PIT, checked against brute-force invariants, an exhaustive enumeration of Algorithm 1's
placements, a brute-force f(i) pair count, and resumed / multi-rank packed rows."""

import itertools
from collections import Counter

import numpy as np
import pytest
import torch

from longctx import config as config_module
from longctx.data.packing import PackedRows, PackedSource, contract_from_blocks
from longctx.data.positions import (
    longrecipe_position_ids,
    pose_position_ids,
    randpos_position_ids,
)
from longctx.data.sentences import sentence_lengths
from longctx.data.transforms import PositionTransform
from longctx.errors import ConfigError
from longctx.probes.position_frequency import relative_position_counts
from tests.data.helpers import EOS, random_documents, write_token_dataset

SEEDS = range(300)


def check_ids(ids, n, target_length, from_zero=True):
    """The invariants every transform promises, checked element by element (RandPos ids
    need not start at 0)."""
    assert ids.dtype == np.int64 and ids.shape == (n,)
    assert (ids[0] == 0 or not from_zero) and ids[0] >= 0 and ids[-1] < target_length
    for a, b in itertools.pairwise(ids):
        assert b > a
    skipped = sum(int(b - a - 1) for a, b in itertools.pairwise(ids))
    assert skipped <= target_length - n  # the budget of free ids


def random_sentences(rng, most=8, longest=6):
    return [int(x) for x in rng.integers(1, longest + 1, size=int(rng.integers(1, most + 1)))]


def sentence_spans(lengths):
    starts = np.cumsum([0, *lengths[:-1]])
    return [(int(s), int(s + n)) for s, n in zip(starts, lengths, strict=False)]


# --- the pure functions, many seeds --------------------------------------------------------


@pytest.mark.parametrize("compat", ["paper", "repo"])
def test_pose_invariants_over_many_seeds(compat):
    for seed in SEEDS:
        rng = np.random.default_rng(seed)
        chunks = 2 if compat == "repo" else int(rng.integers(1, 6))
        n = int(rng.integers(chunks, 40))
        target_length = n + int(rng.integers(0, 200))
        ids = pose_position_ids(n, target_length, rng, chunks, compat)
        check_ids(ids, n, target_length)
        jumps = [t for t in range(1, n) if ids[t] != ids[t - 1] + 1]
        assert len(jumps) <= chunks - 1


def test_pose_paper_chunk_lengths_are_a_uniform_composition():
    """N = 2: the cut point is uniform on {1, ..., n-1} (repo caps it at ceil(n/2))."""
    n, draws = 9, 8000
    rng = np.random.default_rng(3)
    cuts = Counter()
    for _ in range(draws):
        ids = pose_position_ids(n, 10**12, rng, 2, "paper")
        (cut,) = [t for t in range(1, n) if ids[t] != ids[t - 1] + 1]
        cuts[cut] += 1
    assert set(cuts) == set(range(1, n))
    expected = draws / (n - 1)
    assert sum((c - expected) ** 2 / expected for c in cuts.values()) < 30  # df 7


def test_randpos_invariants_over_many_seeds():
    for seed in SEEDS:
        rng = np.random.default_rng(seed)
        n = int(rng.integers(1, 40))
        target_length = n + int(rng.integers(0, 200))
        check_ids(randpos_position_ids(n, target_length, rng), n, target_length, from_zero=False)


def test_longrecipe_paper_invariants_over_many_seeds():
    for seed in SEEDS:
        rng = np.random.default_rng(seed)
        lengths = random_sentences(rng)
        n = sum(lengths)
        target_length = n + int(rng.integers(0, 100))
        ids = longrecipe_position_ids(lengths, target_length, rng)
        check_ids(ids, n, target_length)
        for start, end in sentence_spans(lengths):  # contiguous inside each sentence
            assert list(ids[start:end]) == list(range(ids[start], ids[start] + end - start))


def test_longrecipe_repo_invariants_over_many_seeds():
    """Unfiltered sentences may cover more tokens than the context; the head is contiguous,
    and each sentence is contiguous after the head."""
    for seed in SEEDS:
        rng = np.random.default_rng(seed)
        lengths = random_sentences(rng)
        total = sum(lengths)
        context = int(rng.integers(max(lengths), total + 1))
        target_length = total + int(rng.integers(0, 100))
        ids = longrecipe_position_ids(lengths, target_length, rng, "repo", context)
        check_ids(ids, context, target_length)
        head = next((t for t in range(context) if ids[t] != t), context)
        assert head >= 1 or context == 1
        for start, end in sentence_spans(lengths):
            start, end = max(start, head), min(end, context)
            if start < end:
                assert list(ids[start:end]) == list(range(ids[start], ids[start] + end - start))


def test_longrecipe_paper_draws_every_placement_of_algorithm_1_equally_often():
    """Enumerate every id assignment Algorithm 1 allows (sentence 1 at 0, sentences in order,
    contiguous, all ids < L_t) and check each is drawn with equal frequency."""
    lengths, target_length, draws = [2, 1, 2], 8, 6000
    allowed = []
    for second, third in itertools.product(range(target_length), repeat=2):
        ids = [0, 1, second, third, third + 1]
        if second >= 2 and third > second and third + 1 < target_length:
            allowed.append(tuple(ids))
    rng = np.random.default_rng(5)
    seen = Counter(tuple(longrecipe_position_ids(lengths, target_length, rng).tolist()) for _ in range(draws))
    assert set(seen) == set(allowed) and len(allowed) == 10
    expected = draws / len(allowed)
    assert sum((c - expected) ** 2 / expected for c in seen.values()) < 35  # df 9


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda r: longrecipe_position_ids([3, 4], 6, r), "target_length=6 is shorter"),
        (
            lambda r: longrecipe_position_ids([3, 9], 20, r, "repo", 5),
            r"sentence_lengths\[1\]=9 is longer than context_length=5",
        ),
        (lambda r: longrecipe_position_ids([3, 4], 20, r, "paper", 5), "compat='paper' places exactly"),
        (lambda r: longrecipe_position_ids([3, 0], 20, r), r"sentence_lengths\[1\] is 0"),
        (lambda r: longrecipe_position_ids([3], 20, r, "bogus"), "compat must be one of"),
        (lambda r: pose_position_ids(5, 4, r), "target_length=4 is shorter"),
    ],
)
def test_bad_input_names_the_argument(call, message):
    with pytest.raises(ValueError, match=message):
        call(np.random.default_rng(0))


# --- sentences ------------------------------------------------------------------------------


def test_sentence_lengths_split_after_delimiter_tokens():
    ends = np.zeros(10, dtype=bool)
    ends[[3, 7]] = True  # two delimiter tokens
    tokens = np.array([1, 2, 3, 4, 3, 5, 7, 7, 9])
    # sentences: [1 2 3] [4 3] [5 7] [7] [9]
    assert sentence_lengths(tokens, ends).tolist() == [3, 2, 2, 1, 1]
    assert sentence_lengths(np.array([3]), ends).tolist() == [1]
    with pytest.raises(ValueError, match=r"token ids must lie in \[0, 10\)"):
        sentence_lengths(np.array([1, 12]), ends)


def test_sentence_table_of_the_bpe_tokenizer_splits_text_on_delimiters(tokenizer):
    from longctx.data.sentences import sentence_end_table

    table = sentence_end_table(tokenizer)
    text = "One fish. Two fish!\nRed fish? Blue fish"
    tokens = np.asarray(tokenizer.encode(text))
    pieces = np.split(tokens, np.cumsum(sentence_lengths(tokens, table))[:-1])
    decoded = [tokenizer.decode(piece.tolist()) for piece in pieces]
    assert "".join(decoded) == text
    # "!" and "\n" are two tokens: each ends a sentence, as in the authors' code
    assert decoded == ["One fish.", " Two fish!", "\n", "Red fish?", " Blue fish"]


# --- rows of the data pipeline ----------------------------------------------------------------


def transformed_row(method, row_index=0, doc_mask=True, **kwargs):
    rng = np.random.default_rng(11)
    block = torch.as_tensor(np.concatenate(random_documents(6, seed=2, high=12))[:49])[None]
    row = {k: v[0] for k, v in contract_from_blocks(block, EOS, doc_mask).items()}
    ends = np.zeros(10_000, dtype=bool)
    ends[rng.integers(1000, 7000, size=3000)] = True
    transform = PositionTransform(method, 200, seed=7, ends_sentence=ends, **kwargs)
    return row, transform.apply(row, row_index), ends


@pytest.mark.parametrize("method", ["pose", "randpos", "longrecipe"])
@pytest.mark.parametrize("doc_mask", [True, False])
def test_row_transform_keeps_the_contract_and_transforms_each_document(method, doc_mask):
    row, out, ends = transformed_row(method, doc_mask=doc_mask)
    for key in ("input_ids", "labels", "document_ids"):
        assert torch.equal(out[key], row[key])
    assert out["position_ids"].dtype == torch.int64
    documents = row["document_ids"].tolist()
    for doc in set(documents):
        where = [t for t, d in enumerate(documents) if d == doc]
        ids = out["position_ids"][where].numpy()
        check_ids(ids, len(where), 200, from_zero=method != "randpos")
        if method == "longrecipe":  # jumps only where a sentence starts
            tokens = row["input_ids"][where].numpy()
            for t in range(1, len(where)):
                if ids[t] != ids[t - 1] + 1:
                    assert ends[tokens[t - 1]]
    again = transformed_row(method, doc_mask=doc_mask)[1]
    assert torch.equal(again["position_ids"], out["position_ids"])
    other = transformed_row(method, row_index=1, doc_mask=doc_mask)[1]
    assert not torch.equal(other["position_ids"], out["position_ids"])


def brute_force_fi(positions, documents, labels, bins):
    counts = np.zeros(bins, dtype=np.int64)
    for q in range(len(positions)):
        if labels[q] == -100:
            continue
        for k in range(q + 1):
            if documents[k] == documents[q]:
                counts[positions[q] - positions[k]] += 1
    return counts


@pytest.mark.parametrize("method", ["pose", "randpos", "longrecipe"])
def test_fi_of_a_transformed_row_matches_a_brute_force_pair_count(method):
    _, out, _ = transformed_row(method)
    batch = {k: v[None] for k, v in out.items()}
    fast = relative_position_counts(batch["position_ids"], batch["document_ids"], 200, batch["labels"])
    reference = brute_force_fi(out["position_ids"].tolist(), out["document_ids"].tolist(), out["labels"].tolist(), 200)
    np.testing.assert_array_equal(fast.counts.numpy(), reference)
    assert int(fast.overflow) == 0


@pytest.mark.parametrize("method", ["pose", "longrecipe"])
def test_resumed_and_two_rank_runs_draw_the_same_transformed_ids(tmp_path, method):
    write_token_dataset(tmp_path, random_documents(40, seed=4))
    ends = np.zeros(100_000, dtype=bool)
    ends[np.random.default_rng(0).integers(1000, 50_000, size=20_000)] = True
    transform = PositionTransform(method, 64, seed=3, ends_sentence=ends)

    def rows_of(rank, world, start=0, count=8):
        rows = PackedRows(
            [PackedSource(tmp_path, seed=9)],
            [1.0],
            window=16,
            eos_id=EOS,
            doc_mask=True,
            rank=rank,
            world_size=world,
            start_row=start,
            transform=transform,
        )
        return [row["position_ids"] for row, _ in zip(rows, range(count), strict=False)]

    single = rows_of(0, 1, count=16)
    assert any(int(ids.max()) >= 16 for ids in single)  # the ids really reach beyond the window
    resumed = rows_of(0, 1, start=5, count=6)
    for k in range(6):
        assert torch.equal(resumed[k], single[5 + k])
    rank1 = rows_of(1, 2, count=6)
    for k in range(6):
        assert torch.equal(rank1[k], single[2 * k + 1])


# --- configuration -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (["data.position_transform=rope"], "data.position_transform"),
        (["data.position_transform=pose", "data.window=256", "data.target_length=128"], "data.target_length"),
        (["data.position_transform=longrecipe", "data.target_length=4096"], "data.target_length"),
        (["data.pose.compat=repo", "data.pose.chunks=3"], "data.pose.chunks"),
        (["data.pose.skip=3"], "data.pose.skip"),
        (["data.longrecipe.compat=official"], "data.longrecipe.compat"),
        (["data.long_share=0.6"], "data.long_share"),
    ],
)
def test_bad_config_names_the_key(overrides, key):
    with pytest.raises(ConfigError) as error:
        config_module.load([], overrides)
    assert error.value.key == key


def test_target_length_defaults_to_the_final_max_position_and_long_share_sets_the_weights():
    cfg = config_module.load([], ["model.max_position=2048", "data.window=512", "data.position_transform=pose"])
    assert cfg.data.target_length == 2048
    cfg = config_module.load([], ["data.mixture=[{path: a, weight: 1}, {path: b, weight: 1}]", "data.long_share=0.6"])
    assert cfg.data.source_weights() == [0.6, 0.4]


def test_sft_refuses_a_pretraining_position_transform(tmp_path, capsys):
    from longctx.cli import main

    assert main(["sft", "init=missing.ckpt", "data.position_transform=pose", f"train.out_dir={tmp_path}"]) == 2
    assert "data.position_transform" in capsys.readouterr().err


def test_longrecipe_stage_configs_load_and_stage_2_anneals_to_zero():
    from pathlib import Path

    from longctx.train.module import learning_rate

    configs = {path.stem: config_module.load([path]) for path in Path("experiments/longrecipe").glob("*.yaml")}
    assert configs["stage1"].data.position_transform == "longrecipe"
    assert configs["stage1"].data.path == "data/longrecipe-selected"
    replay = configs["stage2_replay"]
    assert replay.data.position_transform == "none" and replay.data.mixture and replay.train.min_lr == 0
    assert replay.train.max_steps == configs["stage1"].train.max_steps // 10
    train = replay.train
    last = learning_rate(
        train.max_steps,
        warmup=train.warmup_steps,
        total=train.max_steps,
        peak=train.lr,
        floor=train.min_lr,
        shape=train.schedule,
    )
    assert last == 0.0
    assert configs["prolong_mix"].data.source_weights() == [0.6, 0.4]
    assert configs["prolong_mix"].model.rope_base == 40000.0
