"""The statistics the evaluation tables report: the Wilson score interval of a pass rate,
as every table and the effective-length search report it (STRING reports rates over 500
tests; our CPU runs use fewer, so each rate carries its interval), and the averages over
lengths of eval-suite's tables.

For k passes of n tests, p = k / n and z = 1.96 (95%):

    centre = (p + z^2 / 2n) / (1 + z^2 / n)
    half   = z / (1 + z^2 / n) * sqrt(p (1 - p) / n + z^2 / 4n^2)

(Wilson 1927; unlike the normal approximation it stays inside [0, 1] and is not empty at
k = 0 or k = n: at n = 500 a rate of 0.5 is known to +-0.044, at n = 50 to +-0.13).

Averages over n lengths in ascending order (RULER, Hsieh et al. 2024, Table 3): Avg. is the
mean, wAvg. (inc) / (dec) weight the i-th length by i / sum(1..n) / by (n + 1 - i) / sum(1..n).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

WILSON_Z = 1.96


def wilson_interval(successes: int, trials: int, z: float = WILSON_Z) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion (see the module docstring); (0, 1) for 0 trials."""
    if not 0 <= successes <= trials:
        raise ValueError(f"need 0 <= successes <= trials, got {successes} of {trials}")
    if trials == 0:
        return 0.0, 1.0
    p = successes / trials
    denominator = 1 + z * z / trials
    centre = (p + z * z / (2 * trials)) / denominator
    half = z / denominator * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials))
    return max(0.0, centre - half), min(1.0, centre + half)


def averages(scores_by_length: Mapping[int, float]) -> dict[str, float]:
    """Avg., wAvg. (inc) and wAvg. (dec) over the lengths in ascending order (module docstring)."""
    scores = [scores_by_length[length] for length in sorted(scores_by_length)]
    n = len(scores)
    total = n * (n + 1) / 2
    return {
        "avg": sum(scores) / n,
        "wavg_inc": sum((i + 1) * s for i, s in enumerate(scores)) / total,
        "wavg_dec": sum((n - i) * s for i, s in enumerate(scores)) / total,
    }
