"""Verdict rules of the miniature replication with the seed as the unit (docs/replication.md).

Fixed in code before the verdict runs, so a finding that does not hold is a result and not
a prompt to tune. A training run's outcome swings with its seed (and with float rounding:
docs/replication_log.md), so no rule pools NIAH tests across seeds: each computes one
number per seed, then a two-sided 95% Student t interval of their mean across seeds,

    mean(d) +- t_{0.975, n-1} * sd(d) / sqrt(n)        (n seeds, sd with n - 1)

and reads it the same way:

    holds          the interval lies wholly on the side the paper claims
    does not hold  it lies wholly on the other side (the effect is reversed), or is the
                   single point 0 (every seed shows no effect at all)
    inconclusive   it contains 0, or fewer than MIN_SEEDS seeds have models that retrieve

The per-seed numbers, each with STRING's / SkipAlign's figure:

- Finding 1 (STRING Fig. 2a): d = L_eff(largest window) - L_eff(smallest window) at the
  last probe (equal tokens); claimed > 0.
- Finding 2 (Fig. 2b): `alignment_gap`: how much tighter the windows' curves line up
  against log10 f(L_eff) than against log10 consumed tokens, at the effective lengths
  where two or more windows' curves have a point; claimed < 0 (f aligns them better).
- Fig. 4: excess share of failures in the first third of the context (far from the
  question) over the share of needles placed there; claimed > 0.
- Headline: 1 - L_eff(largest window) / window; claimed > 0.
- Table 1: pass rate of StRing minus RoPE at the training window; claimed > 0.
- SkipAlign Fig. 3: L_eff after SkipAlign SFT minus after Normal SFT with the same RoPE
  scaling (the confound-free arm); claimed > 0.

"Models that retrieve": a seed counts when every model it contributes left chance, i.e. its
held-out answer loss fell below LEAVES_CHANCE_NATS (2.0 nats per value token; chance for a
digit is ln 10 = 2.30), the criterion of the recipe search, measured by
train/callbacks/answer.py.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from longctx_replication.findings import FAILS, HOLDS, INCONCLUSIVE, Finding

LEAVES_CHANCE_NATS = 2.0
"""A run has left chance once its held-out answer loss is below this (chance: ln 10 = 2.30)."""
MIN_SEEDS = 3
"""Fewest seeds a verdict rests on."""
CONFIDENCE = 0.95


def _t_density(x: float, df: int) -> float:
    log_norm = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)
    return math.exp(log_norm - (df + 1) / 2 * math.log1p(x * x / df))


def t_quantile(probability: float, df: int) -> float:
    """Student t quantile for probability in (0.5, 1): bisection on the CDF, itself Simpson's
    rule on the density over [0, x] (no scipy in the dependencies)."""
    if df < 1 or not 0.5 < probability < 1:
        raise ValueError(f"need df >= 1 and probability in (0.5, 1), got {df}, {probability}")

    def cdf(x: float, steps: int = 2000) -> float:
        h = x / steps
        total = _t_density(0, df) + _t_density(x, df)
        total += sum((4 if k % 2 else 2) * _t_density(k * h, df) for k in range(1, steps))
        return 0.5 + total * h / 3

    low, high = 0.0, 1.0
    while cdf(high) < probability:
        low, high = high, 2 * high
    for _ in range(60):
        middle = (low + high) / 2
        low, high = (middle, high) if cdf(middle) < probability else (low, middle)
    return (low + high) / 2


@dataclass(frozen=True)
class SeedInterval:
    """Mean of per-seed values with its two-sided t interval."""

    values: tuple[float, ...]
    mean: float
    low: float
    high: float

    @classmethod
    def of(cls, values: Sequence[float], confidence: float = CONFIDENCE) -> SeedInterval:
        values = tuple(float(v) for v in values)
        if len(values) < 2:
            raise ValueError(f"an interval across seeds needs >= 2 seeds, got {len(values)}")
        mean = statistics.fmean(values)
        half = t_quantile(0.5 + confidence / 2, len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))
        return cls(values, mean, mean - half, mean + half)

    def text(self, digits: int = 2) -> str:
        return f"{self.mean:.{digits}f} [{self.low:.{digits}f}, {self.high:.{digits}f}]"


def _judge(key: str, title: str, per_seed: Mapping[int, float], claimed: int, what: str, numbers: dict) -> Finding:
    """The shared reading of the module docstring; `claimed` is +1 (> 0) or -1 (< 0)."""
    seeds = sorted(per_seed)
    numbers = {**numbers, "seeds": seeds, "per_seed": [per_seed[s] for s in seeds]}
    if len(seeds) < MIN_SEEDS:
        why = f"{len(seeds)} seed(s) with models that retrieve; a verdict needs {MIN_SEEDS}"
        return Finding(key, title, INCONCLUSIVE, why, numbers)
    interval = SeedInterval.of([per_seed[s] for s in seeds])
    numbers.update(mean=interval.mean, interval=[interval.low, interval.high])
    agreeing = sum(1 for s in seeds if claimed * per_seed[s] > 0)
    why = f"{what} per seed: mean {interval.text()} over {len(seeds)} seeds (95% t), {agreeing} of {len(seeds)} as claimed"
    if claimed * interval.low > 0 and claimed * interval.high > 0:
        return Finding(key, title, HOLDS, why, numbers)
    if (claimed * interval.low < 0 and claimed * interval.high < 0) or interval.low == interval.high == 0:
        return Finding(key, title, FAILS, why, numbers)
    return Finding(key, title, INCONCLUSIVE, why + ": the interval contains 0", numbers)


def leave_chance_step(answer_losses: Sequence[tuple[int, float]]) -> int | None:
    """First probe step with answer loss below LEAVES_CHANCE_NATS; None if the run never did."""
    return next((step for step, loss in sorted(answer_losses) if loss < LEAVES_CHANCE_NATS), None)


def chance_table(steps: Mapping[tuple[int, int], int | None]) -> dict:
    """The seeds x windows table of {(seed, window): step of leaving chance or None}, and
    whether the recipe works: at least 4 of 5 (80%) of seeds leave chance at every window."""
    seeds = sorted({s for s, _ in steps})
    windows = sorted({w for _, w in steps})
    every_window = [s for s in seeds if all(steps.get((s, w)) is not None for w in windows)]
    return {
        "seeds": seeds,
        "windows": windows,
        "steps": [[steps.get((s, w)) for w in windows] for s in seeds],
        "seeds_leaving_at_every_window": every_window,
        "recipe_works": bool(seeds) and 5 * len(every_window) >= 4 * len(seeds),
    }


def effective_length_grows(effective: Mapping[int, Mapping[int, int]]) -> Finding:
    """Finding 1 from {seed: {window: L_eff at the last probe}} (seeds whose models retrieve)."""
    per_seed = {s: float(by[max(by)] - by[min(by)]) for s, by in effective.items()}
    windows = sorted({w for by in effective.values() for w in by})
    return _judge(
        "effective_length_grows",
        "Finding 1 / Fig. 2a: at equal tokens, a larger window gives a longer effective length",
        per_seed,
        +1,
        f"L_eff(L={windows[-1] if windows else '?'}) - L_eff(L={windows[0] if windows else '?'})",
        {"windows": windows, "effective_length": {s: dict(by) for s, by in effective.items()}},
    )


@dataclass(frozen=True)
class Probe:
    """One in-training NIAH probe of one run: step, tokens consumed, L_eff, f(L_eff - 1)."""

    step: int
    tokens: float
    effective_length: int
    f_at_effective_length: float


def alignment_gap(curves: Mapping[int, Sequence[Probe]]) -> tuple[float, dict] | None:
    """Finding 2's statistic for one seed, from {window: that run's probes}.

    Each window's probes are points (L_eff, f(L_eff)) of its Fig. 2b curve. For each
    effective length l > 0 at which at least two windows have a point ("shared"), take
    each such window's first probe with L_eff = l and, across windows, the spread
    (max - min) of log10 f(l) and of log10 tokens consumed at those probes. The statistic is

        gap = mean over shared l of spread_f(l) - mean over shared l of spread_tokens(l)

    Fig. 2b's claim (the curves align when drawn against f) is gap < 0: the windows reach
    each effective length at more similar f than consumed tokens. None when no length is
    shared or an f is 0 (the probe did not log it).
    """
    shared: dict[int, list[Probe]] = {}
    reached = sorted({p.effective_length for probes in curves.values() for p in probes if p.effective_length > 0})
    for length in reached:
        firsts = []
        for probes in curves.values():
            first = next((p for p in sorted(probes, key=lambda p: p.step) if p.effective_length == length), None)
            if first is not None:
                firsts.append(first)
        if len(firsts) >= 2:
            shared[length] = firsts
    if not shared or any(p.f_at_effective_length <= 0 for firsts in shared.values() for p in firsts):
        return None

    def spread(values: list[float]) -> float:
        return max(values) - min(values)

    spread_f = [spread([math.log10(p.f_at_effective_length) for p in firsts]) for firsts in shared.values()]
    spread_tokens = [spread([math.log10(p.tokens) for p in firsts]) for firsts in shared.values()]
    detail = {
        "shared_lengths": sorted(shared),
        "spread_log10_f": spread_f,
        "spread_log10_tokens": spread_tokens,
    }
    return statistics.fmean(spread_f) - statistics.fmean(spread_tokens), detail


def f_aligns(curves: Mapping[int, Mapping[int, Sequence[Probe]]]) -> Finding:
    """Finding 2 from {seed: {window: probes}}; a seed without a shared length is left out."""
    per_seed, details = {}, {}
    for seed, by_window in curves.items():
        result = alignment_gap(by_window)
        if result is not None:
            per_seed[seed], details[seed] = result
    return _judge(
        "f_at_effective_length_aligns",
        "Finding 2 / Fig. 2b: across windows, effective length lines up with f(effective length)",
        per_seed,
        -1,
        "spread of log10 f minus spread of log10 tokens at shared effective lengths",
        {"detail": details},
    )


def first_third_excess(depth_edges: Sequence[float], recall: Sequence[float | None], needles: Sequence[float]) -> float:
    """Share of missed needles in the bands whose centre lies in the context's first third,
    minus the share of needles placed there (Fig. 4: failures far from the question)."""
    missed = [0.0 if r is None else (1 - r) * n for r, n in zip(recall, needles, strict=True)]
    if sum(missed) == 0:
        raise ValueError("no needle was missed: the share of failures is undefined")
    first = [(a + b) / 2 < 1 / 3 for a, b in itertools.pairwise(depth_edges)]
    missed_first = sum(m for m, f in zip(missed, first, strict=True) if f)
    needles_first = sum(n for n, f in zip(needles, first, strict=True) if f)
    return missed_first / sum(missed) - needles_first / sum(needles)


def failures_far_from_question(excess: Mapping[int, float]) -> Finding:
    """Fig. 4 from {seed: first_third_excess of the largest window's last probe} (seeds with
    both hits and misses)."""
    return _judge(
        "failures_far_from_question",
        "Fig. 4: failures concentrate in the first third of the context, far from the question",
        excess,
        +1,
        "share of failures in the first third minus share of needles there",
        {},
    )


def effective_below_window(window: int, effective: Mapping[int, int]) -> Finding:
    """Headline from {seed: L_eff of the largest window} (seeds whose model retrieves)."""
    return _judge(
        "effective_below_window",
        "Headline: effective length < training window (largest window)",
        {s: 1 - e / window for s, e in effective.items()},
        +1,
        f"1 - L_eff / {window}",
        {"window": window, "effective_length": dict(effective)},
    )


def string_beats_rope(
    window: int, rope: Mapping[int, tuple[int, int]], string: Mapping[int, tuple[int, int]]
) -> Finding:
    """Table 1 from {seed: (passed, tests)} at the training window, RoPE and StRing."""
    seeds = sorted(set(rope) & set(string))
    per_seed = {s: string[s][0] / string[s][1] - rope[s][0] / rope[s][1] for s in seeds if rope[s][1] and string[s][1]}
    return _judge(
        "string_beats_rope",
        "Table 1: StRing beats RoPE at the training window",
        per_seed,
        +1,
        f"pass rate StRing - RoPE at L={window}",
        {"window": window, "rope": {s: list(rope[s]) for s in seeds}, "string": {s: list(string[s]) for s in seeds}},
    )


def skipalign_beyond_window(
    window: int, skipalign: Mapping[int, int], normal_scaled: Mapping[int, int], normal: Mapping[int, int]
) -> Finding:
    """SkipAlign Fig. 3 from {seed: L_eff after SFT} of SkipAlign, Normal SFT with the same
    RoPE scaling, and plain Normal SFT (reported, not judged: it differs in two ways)."""
    seeds = sorted(set(skipalign) & set(normal_scaled))
    return _judge(
        "skipalign_beyond_window",
        "SkipAlign Fig. 3: SkipAlign SFT retrieves further than Normal SFT with the same RoPE scaling",
        {s: float(skipalign[s] - normal_scaled[s]) for s in seeds},
        +1,
        "L_eff SkipAlign - Normal (same NTK scaling)",
        {
            "window": window,
            "skipalign": {s: skipalign[s] for s in seeds},
            "normal_same_scaling": {s: normal_scaled[s] for s in seeds},
            "normal": dict(normal),
        },
    )
