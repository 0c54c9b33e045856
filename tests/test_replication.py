"""Verdict rules of the miniature replication (longctx/replication.py) on hand-made inputs."""

import json

import pytest

from longctx.replication import (
    FAILS,
    HOLDS,
    INCONCLUSIVE,
    LengthPass,
    effective_below_window,
    effective_length_grows,
    f_at_effective_length_aligns,
    failures_far_from_question,
    findings_markdown,
    skipalign_beyond_window,
    string_beats_rope,
    write_summary,
)
from tests.helpers import read_verdicts


def rows(*passed, tests=10, step=64):
    return [LengthPass(step * (i + 1), p, tests) for i, p in enumerate(passed)]


def test_finding1_holds_fails_and_is_inconclusive_without_retrieval():
    effective = {128: 64, 256: 128, 512: 192}
    some = {w: rows(9, 8, 2) for w in effective}
    assert effective_length_grows(effective, some).verdict == HOLDS
    assert effective_length_grows({128: 128, 256: 64, 512: 192}, some).verdict == FAILS
    assert effective_length_grows({128: 64, 256: 64, 512: 64}, some).verdict == FAILS
    none = {w: rows(0, 0, 0) for w in effective}
    finding = effective_length_grows(dict.fromkeys(effective, 0), none)
    assert finding.verdict == INCONCLUSIVE and "0/90" in finding.why
    assert effective_length_grows({128: 64, 256: 128}, some).verdict == INCONCLUSIVE


def test_finding2_ratio_rule():
    effective = {128: 64, 256: 128, 512: 192}
    assert f_at_effective_length_aligns({128: 100.0, 256: 150.0, 512: 199.0}, effective).verdict == HOLDS
    finding = f_at_effective_length_aligns({128: 100.0, 256: 150.0, 512: 201.0}, effective)
    assert finding.verdict == FAILS and finding.numbers["ratio"] == pytest.approx(2.01)
    assert f_at_effective_length_aligns({128: 1.0, 256: 1.0, 512: 1.0}, {**effective, 128: 0}).verdict == INCONCLUSIVE


def test_fig4_needs_separated_intervals():
    # far 10/100 -> [0.055, 0.174]; near 60/100 -> [0.502, 0.691]: separated
    assert failures_far_from_question((10, 100), (60, 100)).verdict == HOLDS
    assert failures_far_from_question((60, 100), (10, 100)).verdict == FAILS
    # 4/10 [0.168, 0.687] vs 6/10 [0.313, 0.832] overlap
    assert failures_far_from_question((4, 10), (6, 10)).verdict == INCONCLUSIVE
    assert failures_far_from_question((0, 40), (0, 40)).verdict == INCONCLUSIVE


def test_headline_and_table1_and_skipalign():
    assert effective_below_window(512, 256, rows(9, 9, 9, 9, 2, 0, 0, 0), 0.5).verdict == HOLDS
    assert effective_below_window(512, 512, rows(*[9] * 8), 0.5).verdict == FAILS
    assert effective_below_window(512, 0, rows(*[0] * 8), 0.5).verdict == INCONCLUSIVE
    # 9/10 [0.596, 0.982] vs 1/10 [0.018, 0.404]
    assert string_beats_rope((1, 10), (9, 10), 512).verdict == HOLDS
    assert string_beats_rope((5, 10), (6, 10), 512).verdict == FAILS
    assert string_beats_rope((0, 10), (0, 10), 512).verdict == INCONCLUSIVE
    assert skipalign_beyond_window(256, 768, 512, rows(9), rows(9)).verdict == HOLDS
    assert skipalign_beyond_window(256, 384, 512, rows(9), rows(9)).verdict == FAILS
    assert skipalign_beyond_window(0, 0, 512, rows(0), rows(0)).verdict == INCONCLUSIVE


def test_summary_round_trip_and_markdown(tmp_path):
    findings = [string_beats_rope((1, 10), (9, 10), 512), failures_far_from_question((0, 4), (0, 4))]
    path = write_summary(findings, tmp_path / "s.json", {"config": "cpu"})
    assert read_verdicts(path) == {"string_beats_rope": HOLDS, "failures_far_from_question": INCONCLUSIVE}
    body = json.loads(path.read_text())
    assert body["meta"] == {"config": "cpu"} and body["findings"]["string_beats_rope"]["numbers"]["rope"] == [1, 10]
    table = findings_markdown(findings).splitlines()
    assert table[0] == "| finding | verdict | why |" and len(table) == 4 and "**holds**" in table[2]


def test_far_near_counts_by_hand():
    from longctx.analysis.replication_report import far_near_counts

    # 2 lengths x 5 tests x 4 needles = 40 needles over 4 bands = 10 per band
    result = {
        "depth_recall": [0.1, 0.3, 0.8, None],
        "depth_edges": [0.0, 0.25, 0.5, 0.75, 1.0],
        "per_length": [{"tests": 5}, {"tests": 5}],
    }
    far, near = far_near_counts(result)
    assert far == (4, 20)  # (0.1 + 0.3) x 10 of 2 bands x 10
    assert near == (8, 10)  # the empty band (no needle fell there) is left out


def test_f_at_effective_length_reads_the_longest_distance_it_spans(tmp_path):
    """An effective length equal to the window (256 in a 256-window run) spans distances 0..255:
    f(255), the last bin, not a bin past the array (which read as 0 and broke Finding 2)."""
    import numpy as np

    from longctx.analysis.replication_report import f_at_effective_length

    (tmp_path / "fi").mkdir()
    relative = np.arange(256, 0, -1, dtype=np.int64)  # f(d) = 256 - d
    np.savez(tmp_path / "fi" / "fi-step-0000010.npz", relative=relative, overflow=np.int64(0), tokens_seen=np.int64(9))
    assert f_at_effective_length(tmp_path, 256) == 1.0
    assert f_at_effective_length(tmp_path, 64) == 256 - 63
    assert f_at_effective_length(tmp_path, 0) == 0.0
