"""The difference of two pass rates measured on the same prompts, with Newcombe's interval.

Two arms of STRING Table 1 run the same n NIAH prompts (test i is the same prompt for
every arm), so their outcomes are paired. Per prompt: a = both pass, b = only the first
arm passes, c = only the second, d = neither. The difference of pass rates is
D = p1 - p2 = (b - c) / n, with p1 = (a + b) / n and p2 = (a + c) / n.

Its 95% interval is Newcombe's method 10 for paired proportions (R. G. Newcombe,
"Improved confidence intervals for the difference between binomial proportions based on
paired data", Statistics in Medicine 17:2635-2650, 1998): the Wilson intervals
[l1, u1] of p1 and [l2, u2] of p2 (longctx.eval.stats.wilson_interval) combined by
"square and add" with the correlation of the pairs,

    L = D - sqrt((p1 - l1)^2 - 2 phi (p1 - l1)(u2 - p2) + (u2 - p2)^2)
    U = D + sqrt((p2 - l2)^2 - 2 phi (p2 - l2)(u1 - p1) + (u1 - p1)^2)

with phi = C / sqrt((a+b)(c+d)(a+c)(b+d)), C = ad - bc - n/2 when ad - bc > n/2, 0 when
0 <= ad - bc <= n/2, ad - bc when it is negative, and phi = 0 when a margin is empty.
Treating the arms as independent would ignore that most prompts pass or fail in both, and
give a wider interval; McNemar's test reads only b and c, this interval all four.

The rules of docs/real_models.md ("Rules", committed before the n=500 run) read it:
StRing as released beats RoPE when the `string-repo` minus `rope` interval lies above 0;
the temperature explains the gain when the `string-repo` minus `rope-repo-temperature`
interval contains 0.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from longctx.eval.stats import WILSON_Z, wilson_interval


@dataclass(frozen=True)
class PairedDifference:
    both: int
    only_first: int
    only_second: int
    neither: int
    difference: float
    low: float
    high: float

    @property
    def tests(self) -> int:
        return self.both + self.only_first + self.only_second + self.neither

    def text(self) -> str:
        return f"{self.difference:+.3f} [{self.low:+.3f}, {self.high:+.3f}] (n={self.tests}, b={self.only_first}, c={self.only_second})"


def newcombe_paired(
    both: int, only_first: int, only_second: int, neither: int, z: float = WILSON_Z
) -> PairedDifference:
    """Method 10 of Newcombe (1998) on the paired counts (module docstring)."""
    a, b, c, d = both, only_first, only_second, neither
    if min(a, b, c, d) < 0 or a + b + c + d == 0:
        raise ValueError(f"need non-negative counts and at least one pair, got a={a} b={b} c={c} d={d}")
    n = a + b + c + d
    p1, p2 = (a + b) / n, (a + c) / n
    l1, u1 = wilson_interval(a + b, n, z)
    l2, u2 = wilson_interval(a + c, n, z)
    margins = (a + b) * (c + d) * (a + c) * (b + d)
    cross = a * d - b * c
    corrected = cross - n / 2 if cross > n / 2 else (0.0 if cross >= 0 else float(cross))
    phi = corrected / math.sqrt(margins) if margins else 0.0
    low = (p1 - p2) - math.sqrt((p1 - l1) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2) + (u2 - p2) ** 2)
    high = (p1 - p2) + math.sqrt((p2 - l2) ** 2 - 2 * phi * (p2 - l2) * (u1 - p1) + (u1 - p1) ** 2)
    return PairedDifference(a, b, c, d, p1 - p2, low, high)


def paired_difference(first: Sequence[bool], second: Sequence[bool]) -> PairedDifference:
    """The Newcombe interval of first minus second, test i of one paired with test i of the other."""
    if len(first) != len(second):
        raise ValueError(f"paired outcomes need the same prompts: {len(first)} against {len(second)} tests")
    pairs = list(zip(map(bool, first), map(bool, second), strict=True))
    return newcombe_paired(
        sum(x and y for x, y in pairs),
        sum(x and not y for x, y in pairs),
        sum(y and not x for x, y in pairs),
        sum(not x and not y for x, y in pairs),
    )


def table1_rules(passes: Mapping[str, Sequence[bool]]) -> dict:
    """The two committed rules on per-prompt outcomes {arm: [passed, ...]} at one length."""
    beats = paired_difference(passes["string-repo"], passes["rope"])
    temperature = paired_difference(passes["string-repo"], passes["rope-repo-temperature"])
    return {
        "string_repo_minus_rope": beats,
        "string_beats_rope": beats.low > 0,
        "string_repo_minus_temperature": temperature,
        "temperature_explains_gain": temperature.low <= 0 <= temperature.high,
    }
