"""analysis/paired.py: Newcombe's paired interval against a published worked example and by
its coverage; the committed Table 1 rules on per-prompt outcomes."""

import numpy as np
import pytest

from longctx.analysis.paired import newcombe_paired, paired_difference, table1_rules


def test_the_published_worked_example():
    # Complete response before and after consolidation therapy (Cavo et al. 2012): a=59,
    # b=6, c=16, d=80, the worked example of Newcombe's square-and-add interval for paired
    # proportions in Fagerland, Lydersen & Laake, "Statistical Analysis of Contingency
    # Tables" (2017), ch. 8: estimate -0.0621, 95% CI -0.1186 to -0.0046.
    found = newcombe_paired(59, 6, 16, 80)
    assert (round(found.difference, 4), round(found.low, 4), round(found.high, 4)) == (-0.0621, -0.1186, -0.0046)
    assert found.tests == 161


def test_coverage_is_near_95_percent_on_correlated_pairs():
    # 2,000 simulated tables of 500 paired prompts, p1 = 0.55, p2 = 0.50, most prompts
    # passing or failing in both arms (as NIAH prompts do): the interval covers the true
    # difference 0.05 in 93-97% of them (Newcombe 1998 reports near-nominal coverage).
    rng = np.random.default_rng(0)
    probabilities = [0.45, 0.10, 0.05, 0.40]  # a, b, c, d: p1 = 0.55, p2 = 0.50
    covered = 0
    for counts in rng.multinomial(500, probabilities, size=2000):
        found = newcombe_paired(*map(int, counts))
        covered += found.low <= 0.05 <= found.high
    assert 0.93 <= covered / 2000 <= 0.97


def test_pairing_narrows_the_interval_of_agreeing_arms():
    # the same margins (p1 = 0.6, p2 = 0.5 of 500), paired tightly or not at all
    agreeing, independent = newcombe_paired(250, 50, 0, 200), newcombe_paired(150, 150, 100, 100)
    assert agreeing.difference == independent.difference == pytest.approx(0.1)
    assert agreeing.high - agreeing.low < 0.5 * (independent.high - independent.low)
    assert agreeing.low > 0


def test_the_table1_rules_on_per_prompt_outcomes():
    n = 500
    rope = [i < 200 for i in range(n)]
    temperature = [i < 260 for i in range(n)]
    string_repo = [i < 262 for i in range(n)]  # 62 prompts more than RoPE, 2 more than the temperature
    rules = table1_rules({"rope": rope, "string-repo": string_repo, "rope-repo-temperature": temperature})
    assert rules["string_beats_rope"] and rules["string_repo_minus_rope"].difference == pytest.approx(62 / n)
    assert rules["temperature_explains_gain"]
    assert (rules["string_repo_minus_rope"].only_first, rules["string_repo_minus_rope"].only_second) == (62, 0)
    with pytest.raises(ValueError, match="same prompts"):
        paired_difference(rope, rope[:-1])
