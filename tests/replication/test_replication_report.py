"""The seed-level replication report on synthetic run directories whose verdicts are worked by hand."""

import json
import math

import pytest

from longctx_replication.findings import FAILS, HOLDS, INCONCLUSIVE
from longctx_replication.report import judge, main

TOKENS_PER_STEP = 6144
EDGES = [0.0, 0.25, 0.5, 0.75, 1.0]  # 4 bands; only band 0 (centre 0.125) lies in the first third


def _niah(effective, lengths, recall=(1.0, 1.0, 1.0, 1.0), passed=50, tests=50):
    return {
        "effective_length": effective,
        "per_length": [{"length": n, "passed": passed, "tests": tests} for n in lengths],
        "depth_edges": EDGES,
        "depth_recall": list(recall),
        "heatmap": [[r] * len(lengths) for r in recall],
        "lengths": lengths,
    }


def _run(root, seed, window, probes, losses):
    """probes: [(step, L_eff, f(L_eff - 1), depth recall)]; losses: [(step, answer loss[, exact share])]."""
    run = root / "pretrain" / f"w{window}_s{seed}"
    run.mkdir(parents=True, exist_ok=True)
    rows = [{"step": s, "train/tokens_seen": s * TOKENS_PER_STEP} for s in (100, 200)]
    for step, loss, *exact in losses:
        rows.append({"step": step, "answers/loss": loss} | ({"answers/value_exact": exact[0]} if exact else {}))
    for step, effective, f, recall in probes:
        rows.append({"step": step, "niah/effective_length": effective, "niah/f_at_effective_length": f})
        directory = run / "niah" / f"step-{step:07d}"
        directory.mkdir(parents=True)
        (directory / "niah.json").write_text(json.dumps(_niah(effective, [128, 256, 384], recall)))
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    masking = {"sources": [{"path": "short", "answers": 100, "cut": 40}, {"path": "long", "answers": 50, "cut": 30}]}
    (run / "answer_masking.json").write_text(json.dumps(masking))


def _niah_file(path, effective, length=512, passed=0, tests=50):
    path.mkdir(parents=True)
    (path / "niah.json").write_text(json.dumps(_niah(effective, [length], passed=passed, tests=tests)))


# Final effective lengths (L=256, L=512) and the largest window's depth recall, per seed.
FINAL = {0: (128, 384), 1: (128, 320), 2: (192, 448), 3: (128, 128)}
FAR_RECALL = {0: 0.5, 1: 0.6, 2: 0.4, 3: 0.5}
SFT = {
    0: {"normal-none": 1024, "normal-ntk": 512, "skipalign-ntk": 768},
    1: {"normal-none": 1024, "normal-ntk": 512, "skipalign-ntk": 704},
    2: {"normal-none": 1024, "normal-ntk": 448, "skipalign-ntk": 704},
    3: {"normal-none": 1024, "normal-ntk": 512, "skipalign-ntk": 512},
}


@pytest.fixture
def root(tmp_path):
    root = tmp_path / "runs"
    left = [(100, 2.3), (200, 1.5)]
    for seed, (small, large) in FINAL.items():
        # each window's curve: L=512 reaches the small window's final L_eff first (step 100),
        # at the same f, at half the tokens: the windows share that effective length
        _run(root, seed, 256, [(100, 0, 0.0, (0.0,) * 4), (200, small, 400.0, (1.0,) * 4)], left)
        recall = (FAR_RECALL[seed], 0.9, 0.9, 0.9)
        # seed 3's 512-window run never leaves chance: the seed is left out of every verdict
        _run(root, seed, 512, [(100, small, 400.0, recall), (200, large, 80.0, recall)], left if seed < 3 else [])
        rope, string = {0: (40, 45), 1: (42, 47), 2: (38, 44), 3: (0, 50)}[seed]
        _niah_file(root / "table1" / f"s{seed}" / "name=rope", 0, passed=rope)
        _niah_file(root / "table1" / f"s{seed}" / "name=string", 0, passed=string)
        for arm, effective in SFT[seed].items():
            _niah_file(root / "sft" / arm / f"s{seed}" / "niah_after_sft", effective)
    return root


def test_verdicts_of_synthetic_runs_by_hand(root):
    findings, meta = judge(root)
    verdicts = {f.key: f for f in findings}
    assert meta["retrieving_seeds"] == [0, 1, 2]
    # Finding 1: 384 - 128, 320 - 128, 448 - 192 = 256, 192, 256 -> [142.9, 326.5]
    assert verdicts["effective_length_grows"].numbers["per_seed"] == [256, 192, 256]
    assert verdicts["effective_length_grows"].verdict == HOLDS
    # Finding 2: at the shared length both windows have f = 400, tokens 2x apart: gap -log10 2 per seed
    assert verdicts["f_at_effective_length_aligns"].numbers["per_seed"] == pytest.approx([-math.log10(2)] * 3)
    assert verdicts["f_at_effective_length_aligns"].verdict == HOLDS
    # Fig. 4: missed (1 - far) + 3 x 0.1 per 4 bands; first-third share minus 1/4
    expected = [(1 - r) / (1 - r + 0.3) - 0.25 for r in (0.5, 0.6, 0.4)]
    assert verdicts["failures_far_from_question"].numbers["per_seed"] == pytest.approx(expected)
    assert verdicts["failures_far_from_question"].verdict == HOLDS
    # Headline: 1 - 384/512, 1 - 320/512, 1 - 448/512 = 0.25, 0.375, 0.125: mean 0.25,
    # half 4.3027 x 0.125 / sqrt(3) = 0.31 -> contains 0
    assert verdicts["effective_below_window"].verdict == INCONCLUSIVE
    # Table 1: StRing - RoPE = 0.10, 0.10, 0.12 -> mean 0.1067, half 4.3027 x 0.01155 / sqrt(3) = 0.0287
    assert verdicts["string_beats_rope"].numbers["per_seed"] == pytest.approx([0.10, 0.10, 0.12])
    assert verdicts["string_beats_rope"].verdict == HOLDS
    # SkipAlign vs Normal with the same scaling: 768 - 512, 704 - 512, 704 - 448 = 256, 192, 256;
    # against plain Normal (1,024) it would be reversed, which is why that arm is not the control
    assert verdicts["skipalign_beyond_window"].numbers["per_seed"] == [256, 192, 256]
    assert verdicts["skipalign_beyond_window"].verdict == HOLDS
    assert meta["leave_chance"]["steps"] == [[200, 200]] * 3 + [[200, None]]
    assert not meta["leave_chance"]["recipe_works"]  # 3 of 4 seeds
    assert meta["masked_answers"] == {256: [[40, 100], [30, 50]], 512: [[40, 100], [30, 50]]}


def test_too_few_retrieving_seeds_is_inconclusive(root):
    for seed in (1, 2):
        (root / "pretrain" / f"w256_s{seed}" / "metrics.jsonl").write_text('{"step": 100, "answers/loss": 2.4}\n')
    findings, meta = judge(root)
    assert meta["retrieving_seeds"] == [0]
    assert {f.verdict for f in findings} == {INCONCLUSIVE}
    assert FAILS not in {f.verdict for f in findings}


def test_main_writes_summary_results_and_figures(root, tmp_path):
    docs = tmp_path / "docs"
    assert main([str(root), "--docs", str(docs), "--name", "test"]) == 0
    summary = json.loads((docs / "replication_summary_test.json").read_text())
    assert summary["findings"]["effective_length_grows"]["verdict"] == HOLDS
    assert summary["meta"]["commit"]  # every summary records the code it came from
    results = (docs / "replication" / "test" / "results.md").read_text()
    assert "| 3 | 200 | - |" in results and "40 of 100 (40%)" in results
    for figure in ("fig2a.png", "fig2b.png", "fig4_w512.png"):
        assert (docs / "replication" / "test" / figure).stat().st_size > 0
        assert f"]({figure})" in results


def test_tuning_mode_writes_the_leave_chance_table_by_hand(tmp_path):
    runs = tmp_path / "runs"
    # seed: {window: answer losses by step}; seed 7 leaves at every window, seed 8 not at 512
    losses = {
        7: {256: [(100, 2.4), (200, 1.9)], 512: [(100, 2.3, 0.0), (200, 2.1, 0.02), (300, 1.2, 0.375)]},
        8: {256: [(100, 2.2), (200, 1.1)], 512: [(100, 2.4, 0.01), (200, 2.25, 0.04)]},
    }
    for seed, by_window in losses.items():
        for window, pairs in by_window.items():
            _run(runs, seed, window, [], pairs)
    assert main([str(runs), "--docs", str(tmp_path / "docs"), "--name", "tuning", "--tuning"]) == 0
    out = tmp_path / "docs" / "replication" / "tuning"
    table = json.loads((out / "leave_chance.json").read_text())
    assert table["steps"] == [[200, 300], [200, None]]
    assert table["seeds_leaving_at_every_window"] == [7] and table["recipe_works"] is False
    text = (out / "leave_chance.md").read_text()
    assert "| 7 | **200** | **300** (38% exact) |" in text  # the exact share of the last probe, not the first
    assert "| 8 | **200** | - (to 200: 2.25) (4% exact) |" in text
    assert "1 of 2" in text


def test_the_table_names_the_commit_of_the_checkout_holding_the_runs(tmp_path, monkeypatch):
    """Long runs live in a pinned worktree; the report may run from another checkout: the
    commit it records is the runs' (git-ignored runs/ inside the pinned checkout)."""
    import subprocess

    pinned = tmp_path / "pinned"
    pinned.mkdir()

    def git(*args):
        return subprocess.run(["git", *args], cwd=pinned, check=True, capture_output=True, text=True).stdout.strip()

    git("init", "-q")
    (pinned / ".gitignore").write_text("runs/\n")
    git("add", ".gitignore")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "pinned")
    _run(pinned / "runs", 7, 256, [], [(100, 1.9)])
    monkeypatch.delenv("LONGCTX_COMMIT", raising=False)
    monkeypatch.chdir(tmp_path)  # not a git checkout
    assert main([str(pinned / "runs"), "--docs", str(tmp_path / "docs"), "--name", "t", "--tuning"]) == 0
    text = (tmp_path / "docs" / "replication" / "t" / "leave_chance.md").read_text()
    assert f"commit {git('rev-parse', 'HEAD')}." in text
