"""Position-id transforms: validity, where SkipAlign may skip, and the distributions of
SkipAlign Eq. 3-4, PoSE (Zhu et al. 2023 §3.2) and RandPos, checked by chi-square tests
with fixed seeds and loose bounds."""

import math

import numpy as np
import pytest

from longctx.data.positions import pose_position_ids, randpos_position_ids, skipalign_position_ids

INSTR, R = "instruction", "response"
HUGE = 10**12  # an extended length whose budget no test can spend


def chi_square(observed, expected_each: float) -> float:
    observed = np.asarray(observed, dtype=np.float64)
    return float(((observed - expected_each) ** 2 / expected_each).sum())


def skip_starts(ids: np.ndarray) -> set[int]:
    """Token indices whose id is not previous id + 1 (where a skip lands)."""
    return set((np.flatnonzero(np.diff(ids) != 1) + 1).tolist())


def boundaries(lengths, roles, kinds) -> set[int]:
    """Token index of each block start whose boundary is of a kind in `kinds`:
    inner = instruction -> response, outer = response -> instruction."""
    starts, result = np.cumsum(lengths)[:-1].tolist(), set()
    for block in range(1, len(lengths)):
        kind = "inner" if (roles[block - 1], roles[block]) == (INSTR, R) else "outer"
        if kind in kinds:
            result.add(starts[block - 1])
    return result


ALLOWED = {"all": {"inner", "outer"}, "inner": {"inner"}, "outer": {"outer"}}


def random_structure(rng: np.random.Generator, max_blocks: int = 12):
    blocks = int(rng.integers(1, max_blocks + 1))
    first = int(rng.integers(2))
    roles = [(INSTR, R)[(first + b) % 2] for b in range(blocks)]
    lengths = [int(n) for n in rng.integers(1, 30, size=blocks)]
    return lengths, roles


def assert_valid(ids: np.ndarray, n: int, limit: int) -> None:
    assert ids.dtype == np.int64 and ids.shape == (n,)
    assert ids[0] == 0
    assert (np.diff(ids) >= 1).all()
    assert ids[-1] < limit


# --- SkipAlign --------------------------------------------------------------------------


@pytest.mark.parametrize("p_scope", ["boundary", "sample"])
@pytest.mark.parametrize("strategy", ["all", "inner", "outer"])
def test_skipalign_ids_start_at_zero_increase_and_stay_below_the_extended_length(strategy, p_scope):
    rng = np.random.default_rng(0)
    for _ in range(300):
        lengths, roles = random_structure(rng)
        total = sum(lengths)
        max_length = total + int(rng.integers(0, 200))  # includes L = |m|: no budget at all
        p = float(rng.choice([0.0, 0.3, 1.0]))
        ids = skipalign_position_ids(lengths, roles, max_length, strategy, p, rng, p_scope)
        assert_valid(ids, total, max_length)
        # Block tokens keep consecutive ids: skips only at block starts.
        assert skip_starts(ids) <= set(np.cumsum(lengths)[:-1].tolist())


@pytest.mark.parametrize("p_scope", ["boundary", "sample"])
@pytest.mark.parametrize("strategy", ["all", "inner", "outer"])
def test_skipalign_skips_exactly_at_the_boundaries_its_strategy_allows(strategy, p_scope):
    rng = np.random.default_rng(1)
    for _ in range(200):
        lengths, roles = random_structure(rng)
        ids = skipalign_position_ids(lengths, roles, HUGE, strategy, 1.0, rng, p_scope)
        # p = 1 and an unspendable budget: every allowed boundary skips, no other one does.
        assert skip_starts(ids) == boundaries(lengths, roles, ALLOWED[strategy])
    # inner never between a response and the next instruction; outer never inside a pair.
    lengths, roles = [3, 4, 5, 6, 7], [INSTR, R, INSTR, R, INSTR]
    inner = skip_starts(skipalign_position_ids(lengths, roles, HUGE, "inner", 1.0, rng, p_scope))
    outer = skip_starts(skipalign_position_ids(lengths, roles, HUGE, "outer", 1.0, rng, p_scope))
    assert inner == {3, 12} and outer == {7, 18}


def test_skipalign_on_single_turn_data_inner_is_all_and_outer_is_normal():
    for seed in range(50):
        lengths, roles = [int(n) for n in np.random.default_rng(seed).integers(1, 40, size=2)], [INSTR, R]
        for p in (0.5, 1.0):
            for p_scope in ("boundary", "sample"):
                inner = skipalign_position_ids(lengths, roles, 500, "inner", p, np.random.default_rng(seed), p_scope)
                every = skipalign_position_ids(lengths, roles, 500, "all", p, np.random.default_rng(seed), p_scope)
                outer = skipalign_position_ids(lengths, roles, 500, "outer", p, np.random.default_rng(seed), p_scope)
                np.testing.assert_array_equal(inner, every)
                np.testing.assert_array_equal(outer, np.arange(sum(lengths)))


@pytest.mark.parametrize("strategy", ["all", "inner", "outer"])
def test_skipalign_with_p_zero_gives_contiguous_ids(strategy):
    rng = np.random.default_rng(2)
    for _ in range(100):
        lengths, roles = random_structure(rng)
        for p_scope in ("boundary", "sample"):
            ids = skipalign_position_ids(lengths, roles, HUGE, strategy, 0.0, rng, p_scope)
            np.testing.assert_array_equal(ids, np.arange(sum(lengths)))


def test_skipalign_first_skip_is_uniform_on_one_to_the_budget():
    # |m| = 20, L = 30: s_1 ~ U{1, 10} (Eq. 3 with u_0 = 0); then s_2 ~ U{1, 10 - s_1}.
    lengths, roles, max_length = [5, 5, 5, 5], [INSTR, R, INSTR, R], 30
    rng = np.random.default_rng(3)
    draws = 20_000
    first, second = np.empty(draws, dtype=np.int64), np.empty(draws, dtype=np.int64)
    for k in range(draws):
        ids = skipalign_position_ids(lengths, roles, max_length, "all", 1.0, rng)
        first[k], second[k] = ids[5] - ids[4] - 1, ids[10] - ids[9] - 1
    assert set(first.tolist()) == set(range(1, 11))
    assert chi_square(np.bincount(first, minlength=11)[1:], draws / 10) < 40  # df 9: P(> 40) ~ 7e-6
    # Second skip: within the remaining budget, none once it is spent, uniform given s_1.
    assert ((second >= 1) & (second <= 10 - first) | (first == 10) & (second == 0)).all()
    given = second[first == 2]
    assert chi_square(np.bincount(given, minlength=9)[1:], len(given) / 8) < 35  # df 7

    # At paper scale (L = 100K, |m| = 4096) the first skip averages (L - |m| + 1) / 2.
    skips = []
    for _ in range(4000):
        ids = skipalign_position_ids([2048, 2048], [INSTR, R], 100_000, "inner", 1.0, rng)
        skips.append(ids[2048] - ids[2047] - 1)
    skips = np.array(skips)
    assert skips.min() >= 1 and skips.max() <= 100_000 - 4096
    assert abs(skips.mean() / ((100_000 - 4096 + 1) / 2) - 1) < 0.03


def test_skipalign_stops_once_the_budget_is_spent():
    lengths, roles = [2] * 12, [INSTR, R] * 6
    rng = np.random.default_rng(4)
    for budget in (1, 3, 8):
        for _ in range(300):
            ids = skipalign_position_ids(lengths, roles, 24 + budget, "all", 1.0, rng)
            spent = int(ids[-1]) - 23
            assert 1 <= spent <= budget
            # p = 1: a boundary without a skip means the budget was spent before it.
            assert spent == budget or skip_starts(ids) == boundaries(lengths, roles, {"inner", "outer"})


def test_p_scope_sample_flips_one_coin_per_sample_and_boundary_one_per_boundary():
    lengths, roles = [4, 4, 4, 4, 4, 4, 4, 4], [INSTR, R] * 4  # 3 outer boundaries
    allowed = boundaries(lengths, roles, {"outer"})
    rng = np.random.default_rng(5)
    whole = 0
    for _ in range(2000):
        starts = skip_starts(skipalign_position_ids(lengths, roles, HUGE, "outer", 0.5, rng, "sample"))
        assert starts in (set(), allowed)
        whole += starts == allowed
    assert abs(whole / 2000 - 0.5) < 0.05
    skipped, partial = 0, 0
    for _ in range(2000):
        starts = skip_starts(skipalign_position_ids(lengths, roles, HUGE, "outer", 0.3, rng, "boundary"))
        skipped += len(starts)
        partial += 0 < len(starts) < len(allowed)
    assert abs(skipped / (2000 * len(allowed)) - 0.3) < 0.03
    assert partial > 500  # a third of samples skip at some but not all boundaries


def test_skipalign_is_reproducible_per_seed():
    lengths, roles = [10, 20, 10, 20], [INSTR, R, INSTR, R]
    a = skipalign_position_ids(lengths, roles, 10_000, "all", 0.5, np.random.default_rng([7, 1]))
    b = skipalign_position_ids(lengths, roles, 10_000, "all", 0.5, np.random.default_rng([7, 1]))
    c = skipalign_position_ids(lengths, roles, 10_000, "all", 0.5, np.random.default_rng([7, 2]))
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"block_lengths": [3, 4], "roles": [INSTR]}, ValueError, "roles has 1 entries"),
        ({"roles": [INSTR, "assistant"]}, ValueError, "roles\\[1\\]"),
        ({"roles": [R, R]}, ValueError, "alternate"),
        ({"block_lengths": [3, 0]}, ValueError, "block_lengths\\[1\\]"),
        ({"block_lengths": [], "roles": []}, ValueError, "non-empty"),
        ({"max_length": 6}, ValueError, "max_length=6 is shorter than the sample \\(7 tokens\\)"),
        ({"p": 1.5}, ValueError, "p must be"),
        ({"p": -0.1}, ValueError, "p must be"),
        ({"strategy": "middle"}, ValueError, "strategy"),
        ({"p_scope": "batch"}, ValueError, "p_scope"),
        ({"rng": 42}, TypeError, "numpy.random.Generator"),
    ],
)
def test_skipalign_rejects_bad_input_naming_the_argument(kwargs, error, message):
    arguments = {
        "block_lengths": [3, 4],
        "roles": [INSTR, R],
        "max_length": 100,
        "strategy": "outer",
        "p": 0.5,
        "rng": np.random.default_rng(0),
        "p_scope": "boundary",
    }
    with pytest.raises(error, match=message):
        skipalign_position_ids(**{**arguments, **kwargs})


# --- PoSE -------------------------------------------------------------------------------


def chunk_starts(ids: np.ndarray) -> list[int]:
    return [0, *sorted(skip_starts(ids))]


def test_pose_ids_are_valid_and_have_at_most_n_chunks():
    rng = np.random.default_rng(10)
    for _ in range(500):
        chunks = int(rng.integers(1, 7))
        n = int(rng.integers(chunks, 60))
        target_length = n + int(rng.integers(0, 300))
        ids = pose_position_ids(n, target_length, rng, chunks, compat=("paper", "repo")[chunks % 2])
        assert_valid(ids, n, target_length)
        assert len(skip_starts(ids)) <= chunks - 1
    np.testing.assert_array_equal(pose_position_ids(12, 12, rng, 3), np.arange(12))  # no room to skip
    np.testing.assert_array_equal(pose_position_ids(12, 999, rng, 1), np.arange(12))  # one chunk


@pytest.mark.parametrize("n", [9, 10])
def test_pose_repo_two_chunks_first_length_is_uniform_on_one_to_half_n(n):
    rng = np.random.default_rng(11)
    draws = 10_000
    first = np.array([chunk_starts(pose_position_ids(n, HUGE, rng, compat="repo"))[1] for _ in range(draws)])
    assert set(first.tolist()) == set(range(1, 6))  # ceil(9 / 2) = ceil(10 / 2) = 5
    assert chi_square(np.bincount(first, minlength=6)[1:], draws / 5) < 30  # df 4


def test_pose_two_chunks_skip_is_uniform_on_zero_to_the_room_left():
    n, target_length, draws = 6, 16, 11_000
    rng = np.random.default_rng(12)
    skip = np.array([pose_position_ids(n, target_length, rng)[-1] - (n - 1) for _ in range(draws)])
    assert set(skip.tolist()) == set(range(0, 11))
    assert chi_square(np.bincount(skip, minlength=11), draws / 11) < 45  # df 10


@pytest.mark.parametrize("chunks", [3, 4])
def test_pose_repo_more_chunks_follow_the_fair_share_lengths_and_nondecreasing_biases(chunks):
    n, draws = 20, 6000
    room = HUGE - n
    rng = np.random.default_rng(13 + chunks)
    first_lengths, biases = [], []
    for _ in range(draws):
        ids = pose_position_ids(n, HUGE, rng, chunks, compat="repo")
        starts = chunk_starts(ids)
        assert len(starts) == chunks  # biases coincide with probability ~1e-12
        lengths = np.diff([*starts, n])
        left = n
        for chunk, length in enumerate(lengths[:-1]):
            assert 1 <= length <= math.ceil(left / (chunks - chunk))
            left -= length
        first_lengths.append(lengths[0])
        biases.append([ids[start] - start for start in starts])
    cap = math.ceil(n / chunks)
    assert chi_square(np.bincount(first_lengths, minlength=cap + 1)[1:], draws / cap) < 40
    biases = np.array(biases, dtype=np.float64)
    assert (biases[:, 0] == 0).all() and (np.diff(biases, axis=1) > 0).all()
    # u_i ~ U{u_{i-1}, room} halves the remaining room on average: E[u_i] = (1 - 2^-i) room.
    for chunk in range(1, chunks):
        assert abs(biases[:, chunk].mean() / room - (1 - 2.0**-chunk)) < 0.02


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((0, 10, 2), "n must be a positive int"),
        ((5, 10, 0), "chunks must be a positive int"),
        ((2, 10, 3), "chunks=3 needs at least as many tokens"),
        ((11, 10, 2), "target_length=10 is shorter"),
    ],
)
def test_pose_rejects_bad_input(args, message):
    n, target_length, chunks = args
    with pytest.raises(ValueError, match=message):
        pose_position_ids(n, target_length, np.random.default_rng(0), chunks)


# --- RandPos ----------------------------------------------------------------------------


def test_randpos_ids_are_sorted_distinct_and_cover_the_target_window_uniformly():
    rng = np.random.default_rng(20)
    n, target_length, draws = 5, 20, 8000
    hits = np.zeros(target_length, dtype=np.int64)
    for _ in range(draws):
        ids = randpos_position_ids(n, target_length, rng)
        assert ids.dtype == np.int64 and ids.shape == (n,)
        assert (np.diff(ids) >= 1).all() and ids[0] >= 0 and ids[-1] < target_length
        hits[ids] += 1
    assert chi_square(hits, draws * n / target_length) < 50  # df 19: P(> 50) ~ 1e-4
    np.testing.assert_array_equal(randpos_position_ids(7, 7, rng), np.arange(7))
    big = randpos_position_ids(4096, 100_000, rng)
    assert len(np.unique(big)) == 4096 and big[-1] < 100_000


def test_randpos_rejects_bad_input():
    with pytest.raises(ValueError, match="target_length=3 is shorter"):
        randpos_position_ids(4, 3, np.random.default_rng(0))
    with pytest.raises(TypeError, match="numpy.random.Generator"):
        randpos_position_ids(4, 30, None)
