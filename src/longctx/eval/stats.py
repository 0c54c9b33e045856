"""The Wilson score interval of a pass rate, as every evaluation table and the
effective-length search report it (STRING reports rates over 500 tests; our CPU runs use
fewer, so each rate carries its interval).

For k passes of n tests, p = k / n and z = 1.96 (95%):

    centre = (p + z^2 / 2n) / (1 + z^2 / n)
    half   = z / (1 + z^2 / n) * sqrt(p (1 - p) / n + z^2 / 4n^2)

(Wilson 1927; unlike the normal approximation it stays inside [0, 1] and is not empty at
k = 0 or k = n: at n = 500 a rate of 0.5 is known to +-0.044, at n = 50 to +-0.13).
"""

from __future__ import annotations

import math

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
