"""Findings of the miniature replication (longctx/replication.py): summary and table."""

import json

from longctx.replication import (
    HOLDS,
    INCONCLUSIVE,
    Finding,
    findings_markdown,
    write_summary,
)
from tests.helpers import read_verdicts


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
