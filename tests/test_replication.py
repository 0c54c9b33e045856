"""Findings of the miniature replication (longctx/replication.py): intervals, summary, table."""

import json
import math

import pytest

from longctx.replication import (
    HOLDS,
    INCONCLUSIVE,
    Finding,
    findings_markdown,
    read_verdicts,
    wilson,
    write_summary,
)


def test_wilson_by_hand():
    # p = 0.5, n = 4, z = 1.96: centre (0.5 + 0.4802) / 1.9604 = 0.5; half = 1.96 sqrt(0.0625 + 0.0600) / 1.9604
    low, high = wilson(2, 4)
    half = 1.96 * math.sqrt(0.25 / 4 + 1.96**2 / 64) / (1 + 1.96**2 / 4)
    assert (low, high) == pytest.approx((0.5 - half, 0.5 + half))
    assert wilson(2, 4) == pytest.approx((0.1500, 0.8500), abs=1e-4)
    # 0 of 10: lower bound 0, upper z^2/(n + z^2) = 3.8416 / 13.8416
    assert wilson(0, 10) == pytest.approx((0.0, 3.8416 / 13.8416), abs=1e-4)
    assert wilson(0, 0) == (0.0, 1.0)


def test_summary_round_trip_and_markdown(tmp_path):
    findings = [
        Finding("string_beats_rope", "Table 1", HOLDS, "StRing above RoPE", {"rope": [1, 10]}),
        Finding("failures_far_from_question", "Fig. 4", INCONCLUSIVE, "nothing missed"),
    ]
    path = write_summary(findings, tmp_path / "s.json", {"config": "cpu"})
    assert read_verdicts(path) == {"string_beats_rope": HOLDS, "failures_far_from_question": INCONCLUSIVE}
    body = json.loads(path.read_text())
    assert body["meta"] == {"config": "cpu"} and body["findings"]["string_beats_rope"]["numbers"]["rope"] == [1, 10]
    table = findings_markdown(findings).splitlines()
    assert table[0] == "| finding | verdict | why |" and len(table) == 4 and "**holds**" in table[2]
