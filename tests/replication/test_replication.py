"""Findings of the miniature replication (longctx_replication/findings.py): summary, table, the commit it records."""

import json
import os
import subprocess

from longctx_replication.findings import (
    HOLDS,
    INCONCLUSIVE,
    Finding,
    checkout_commit,
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


def test_checkout_commit_names_the_commit_and_a_dirty_tree(tmp_path, monkeypatch):
    monkeypatch.delenv("LONGCTX_COMMIT", raising=False)
    assert checkout_commit(tmp_path).startswith("unknown")

    def git(*args: str) -> str:
        env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t"}
        env["GIT_COMMITTER_EMAIL"] = "t@t"
        return subprocess.run(["git", *args], cwd=tmp_path, env=env, check=True, capture_output=True, text=True).stdout

    git("init", "-q")
    (tmp_path / "tracked.txt").write_text("a")
    git("add", "tracked.txt")
    git("commit", "-qm", "one")
    head = git("rev-parse", "HEAD").strip()
    (tmp_path / "untracked.txt").write_text("not part of the code")
    assert checkout_commit(tmp_path) == head
    (tmp_path / "tracked.txt").write_text("b")
    assert checkout_commit(tmp_path) == head + "+dirty"
    monkeypatch.setenv("LONGCTX_COMMIT", "abc123")  # a tree that travelled without its .git
    assert checkout_commit(tmp_path) == "abc123"
