"""Seed-level verdict rules (longctx_replication/seed_verdicts.py) on inputs whose verdicts are worked by hand."""

import math

import pytest

from longctx_replication.findings import FAILS, HOLDS, INCONCLUSIVE
from longctx_replication.seed_verdicts import (
    Probe,
    SeedInterval,
    alignment_gap,
    chance_table,
    effective_below_window,
    effective_length_grows,
    f_aligns,
    failures_far_from_question,
    first_third_excess,
    leave_chance_step,
    skipalign_beyond_window,
    string_beats_rope,
    t_quantile,
)

# Two-sided 95% Student t quantiles from a printed table (t_{0.975, df}).
T_TABLE = {1: 12.7062, 2: 4.3027, 4: 2.7764, 9: 2.2622, 30: 2.0423}


@pytest.mark.parametrize("df", sorted(T_TABLE))
def test_t_quantile_matches_the_printed_table(df):
    assert t_quantile(0.975, df) == pytest.approx(T_TABLE[df], abs=2e-4)


def test_seed_interval_by_hand():
    # values 256, 128, 192: mean 192, sd sqrt((64^2 + 64^2 + 0) / 2) = 64, half 4.3027 * 64 / sqrt(3)
    interval = SeedInterval.of([256, 128, 192])
    half = 4.3027 * 64 / math.sqrt(3)
    assert (interval.mean, interval.low, interval.high) == pytest.approx((192, 192 - half, 192 + half), abs=0.02)
    with pytest.raises(ValueError, match=">= 2 seeds"):
        SeedInterval.of([1.0])


def test_finding1_holds_is_reversed_and_inconclusive():
    # per-seed differences L_eff(512) - L_eff(256): 256, 128, 192 -> [33, 351]: holds
    holds = effective_length_grows(
        {0: {256: 256, 384: 256, 512: 512}, 1: {256: 256, 384: 384, 512: 384}, 2: {256: 128, 384: 256, 512: 320}}
    )
    assert holds.verdict == HOLDS and holds.numbers["per_seed"] == [256, 128, 192]
    assert holds.numbers["interval"][0] == pytest.approx(192 - 4.3027 * 64 / math.sqrt(3), abs=0.02)
    # -256, -192, -224: mean -224, sd 32, half 4.3027 * 32 / sqrt(3) = 79.5 -> [-303.5, -144.5]: reversed
    reversed_ = effective_length_grows({0: {256: 256, 512: 0}, 1: {256: 256, 512: 64}, 2: {256: 288, 512: 64}})
    assert reversed_.verdict == FAILS
    # 256, -128, 64: mean 64, the interval contains 0
    mixed = effective_length_grows({0: {256: 0, 512: 256}, 1: {256: 256, 512: 128}, 2: {256: 192, 512: 256}})
    assert mixed.verdict == INCONCLUSIVE and "contains 0" in mixed.why
    # every seed equal across windows: the interval is the point 0, no effect at all
    flat = effective_length_grows({s: {256: 256, 512: 256} for s in range(3)})
    assert flat.verdict == FAILS
    # two seeds retrieve: too few for a verdict
    assert effective_length_grows({0: {256: 0, 512: 256}, 1: {256: 0, 512: 256}}).verdict == INCONCLUSIVE


def test_alignment_gap_by_hand():
    # window 256 reaches L_eff 256 at step 200 (2e6 tokens) with f = 1000; window 512 at step 100
    # (1e6 tokens) with f = 100. Only 256 is shared (512 is reached by one window):
    # spread log10 f = 3 - 2 = 1, spread log10 tokens = log10 2, gap = 1 - 0.30103.
    curves = {
        256: [Probe(100, 1e6, 0, 0.0), Probe(200, 2e6, 256, 1000.0)],
        512: [Probe(100, 1e6, 256, 100.0), Probe(200, 2e6, 512, 50.0)],
    }
    gap, detail = alignment_gap(curves)
    assert gap == pytest.approx(1 - math.log10(2))
    assert detail["shared_lengths"] == [256]
    # no effective length shared by two windows: no statistic; a curve that jumps past a
    # length (0 -> 320) has no point there, so 256 is not shared with it
    assert alignment_gap({256: [Probe(100, 1e6, 0, 0.0)], 512: [Probe(100, 1e6, 256, 9.0)]}) is None
    assert alignment_gap({256: [Probe(100, 1e6, 320, 5.0)], 512: [Probe(100, 1e6, 256, 9.0)]}) is None


def test_finding2_holds_when_f_aligns_better_than_tokens():
    # per seed: both windows reach 256 at equal f (spread 0) but at tokens a factor 2 or 4 apart
    def seed(factor):
        return {
            256: [Probe(100 * factor, 1e6 * factor, 256, 500.0)],
            512: [Probe(100, 1e6, 256, 500.0)],
        }

    finding = f_aligns({0: seed(2), 1: seed(4), 2: seed(2)})
    # gaps -log10 2, -log10 4, -log10 2: mean -0.401, sd 0.1738, half 4.3027 * 0.1738 / sqrt(3) = 0.432
    # -> [-0.833, 0.031]: contains 0, inconclusive
    assert finding.numbers["per_seed"] == pytest.approx([-math.log10(2), -math.log10(4), -math.log10(2)])
    assert finding.verdict == INCONCLUSIVE
    assert f_aligns({0: seed(4), 1: seed(4), 2: seed(8), 3: seed(4)}).verdict == HOLDS


def test_first_third_excess_by_hand():
    # 10 bands, 10 needles each; recall 0.5 in bands 0-2 (centres 0.05-0.25, the first third),
    # 0.9 elsewhere: missed 15 of 22 in the first third, where 30 of 100 needles sit.
    edges = [i / 10 for i in range(11)]
    excess = first_third_excess(edges, [0.5] * 3 + [0.9] * 7, [10] * 10)
    assert excess == pytest.approx(15 / 22 - 0.3)
    # a band without needles (recall None) counts neither as needles nor as misses
    excess = first_third_excess(edges, [None, 0.5, 0.5] + [0.9] * 7, [0, 10, 10] + [10] * 7)
    assert excess == pytest.approx(10 / 17 - 20 / 90)
    with pytest.raises(ValueError, match="no needle was missed"):
        first_third_excess(edges, [1.0] * 10, [10] * 10)
    assert failures_far_from_question({0: 0.38, 1: 0.30, 2: 0.34}).verdict == HOLDS


def test_headline_table1_and_skipalign_by_hand():
    # 1 - L_eff / 512 per seed: 0.5, 0.25, 0.375 -> mean 0.375, sd 0.125, half 0.3105: [0.064, 0.686]
    assert effective_below_window(512, {0: 256, 1: 384, 2: 320}).verdict == HOLDS
    assert effective_below_window(512, {0: 512, 1: 512, 2: 512}).verdict == FAILS
    # StRing - RoPE: 0.10, 0.04, 0.20 -> mean 0.113, sd 0.0808, half 0.2008: [-0.087, 0.314]
    table1 = string_beats_rope(512, {0: (40, 50), 1: (45, 50), 2: (30, 50)}, {0: (45, 50), 1: (47, 50), 2: (40, 50)})
    assert table1.verdict == INCONCLUSIVE
    assert table1.numbers["per_seed"] == pytest.approx([0.10, 0.04, 0.20])
    assert table1.numbers["interval"] == pytest.approx([0.1133 - 0.2008, 0.1133 + 0.2008], abs=2e-4)
    # SkipAlign judged against the Normal arm with the same scaling, not the plain one:
    # 256, 192, 256 -> mean 234.7, sd 36.95, half 4.3027 * 36.95 / sqrt(3) = 91.8: [142.9, 326.5]
    skip = skipalign_beyond_window(512, {0: 768, 1: 704, 2: 704}, {0: 512, 1: 512, 2: 448}, {0: 1024, 1: 1024, 2: 1024})
    assert skip.verdict == HOLDS and skip.numbers["per_seed"] == [256, 192, 256]
    assert skip.numbers["interval"] == pytest.approx([142.9, 326.5], abs=0.1)
    # 256, 128, 320: mean 234.7, sd 97.8, half 242.9: the interval contains 0
    wide = skipalign_beyond_window(512, {0: 768, 1: 640, 2: 768}, {0: 512, 1: 512, 2: 448}, {})
    assert wide.verdict == INCONCLUSIVE


def test_leaving_chance_and_the_seeds_by_windows_table():
    assert leave_chance_step([(500, 2.1), (250, 2.36), (750, 1.99), (1000, 0.5)]) == 750
    assert leave_chance_step([(250, 2.3), (500, 2.0)]) is None  # 2.0 itself is not below
    steps = {(s, w): 600 + s for s in range(5) for w in (256, 512)}
    steps[(3, 512)] = None
    table = chance_table(steps)
    assert table["seeds_leaving_at_every_window"] == [0, 1, 2, 4] and table["recipe_works"]
    steps[(1, 256)] = None
    assert not chance_table(steps)["recipe_works"]  # 3 of 5
    assert table["steps"][3] == [603, None]
