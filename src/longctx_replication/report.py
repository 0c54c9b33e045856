"""Last step of `make replicate`: read the runs of every seed, judge each finding, write the results.

    python -m longctx_replication.report runs/replicate_cpu --docs docs --name cpu
    python -m longctx_replication.report runs/replicate_tuning --docs docs --name tuning --tuning

Reads what the sweeps wrote under ROOT (layout fixed by sweeps/replicate_*.yaml; the seed
is a grid dimension of every sweep):

    ROOT/pretrain/w<L>_s<seed>/                 one pretraining run per (window, seed):
                                                metrics.jsonl, niah/step-*/niah.json,
                                                answer_masking.json
    ROOT/table1/s<seed>/name=<method>/          `longctx niah` at the largest window
    ROOT/sft/<variant>-<rope>/s<seed>/          `longctx sft` runs; niah_after_sft/niah.json

applies the seed-level rules of longctx_replication/seed_verdicts.py, draws the figures
(longctx_replication/report_figures.py) into DOCS/replication/NAME/, and writes
DOCS/replication_summary_NAME.json and the generated results block
DOCS/replication/NAME/results.md, which docs/replication.md links to (the page itself
is written by hand). With `--notebooks` the analysis notebooks also run on the runs.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
from pathlib import Path

from longctx.eval.stats import wilson_interval
from longctx_replication import report_figures as replication_figures
from longctx_replication.findings import Finding, checkout_commit, findings_markdown, write_summary
from longctx_replication.seed_verdicts import (
    Probe,
    SeedInterval,
    chance_table,
    effective_below_window,
    effective_length_grows,
    f_aligns,
    failures_far_from_question,
    first_third_excess,
    leave_chance_step,
    skipalign_beyond_window,
    string_beats_rope,
)

RUN_NAME = re.compile(r"w(\d+)_s(\d+)$")
MAKE_TARGETS = {
    "cpu": "make replicate",
    "full": "make replicate-full",
    "gpu": "make replicate-gpu",
    "smoke": "make replicate-smoke",
}
SFT_ARMS = ("normal-none", "normal-ntk", "skipalign-ntk")
"""Normal SFT, Normal SFT with SkipAlign's NTK scaling (the confound-free control), SkipAlign."""


def _read(path: Path) -> dict:
    return json.loads(path.read_text())


def pretrain_runs(root: Path) -> dict[tuple[int, int], Path]:
    """{(seed, window): run directory} under ROOT/pretrain."""
    runs = {}
    for path in sorted((root / "pretrain").glob("w*_s*")):
        match = RUN_NAME.match(path.name)
        if match:
            runs[int(match.group(2)), int(match.group(1))] = path
    if not runs:
        raise FileNotFoundError(f"{root / 'pretrain'} holds no w<window>_s<seed> run directory")
    return runs


def metric_rows(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: the report reads each run's own metrics file")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _step_of(path: Path) -> int:
    match = re.search(r"step-(\d+)", str(path))
    if match is None:
        raise ValueError(f"{path} is not under a niah/step-NNNNNNN directory")
    return int(match.group(1))


def probes(run_dir: Path, rows: list[dict]) -> list[tuple[Probe, dict]]:
    """Every in-training NIAH probe of a run, with its niah.json; f(L_eff - 1) and tokens
    consumed come from the same step's metrics (0 where not logged)."""
    f_at = {r["step"]: r["niah/f_at_effective_length"] for r in rows if "niah/f_at_effective_length" in r}
    tokens = {r["step"]: r["train/tokens_seen"] for r in rows if "train/tokens_seen" in r}
    per_step = statistics.median(t / s for s, t in tokens.items() if s > 0) if tokens else 0.0
    result = []
    for path in sorted(run_dir.glob("niah/step-*/niah.json")):
        step, niah = _step_of(path), _read(path)
        probe = Probe(step, tokens.get(step, step * per_step), int(niah["effective_length"]), f_at.get(step, 0.0))
        result.append((probe, niah))
    return result


def _at_length(niah: dict, length: int) -> tuple[int, int]:
    row = [r for r in niah["per_length"] if int(r["length"]) == length]
    return (int(row[0]["passed"]), int(row[0]["tests"])) if row else (0, 0)


def _excess(niah: dict) -> float | None:
    """first_third_excess of a probe, needles spread evenly over the bands that hold any."""
    recall = niah["depth_recall"]
    tests = sum(int(r["tests"]) for r in niah["per_length"])
    needles = [0 if r is None else 4 * tests / len(recall) for r in recall]
    try:
        return first_third_excess(niah["depth_edges"], recall, needles)
    except ValueError:  # nothing missed: no share of failures to place
        return None


def judge(root: Path) -> tuple[list[Finding], dict]:
    """The findings of the runs under `root`, and the tables behind them (meta)."""
    runs = pretrain_runs(root)
    seeds = sorted({s for s, _ in runs})
    windows = sorted({w for _, w in runs})
    largest = windows[-1]
    rows = {key: metric_rows(path) for key, path in runs.items()}
    run_probes = {key: probes(path, rows[key]) for key, path in runs.items()}
    losses = {key: [(r["step"], r["answers/loss"]) for r in rows[key] if "answers/loss" in r] for key in runs}
    chance = {key: leave_chance_step(losses[key]) for key in runs}
    # a seed counts when every window's model left chance (answer loss < 2.0 nats)
    retrieving = [s for s in seeds if all((s, w) in runs and chance[s, w] is not None for w in windows)]
    last = {key: run_probes[key][-1] for key in runs if run_probes[key]}
    effective = {s: {w: last[s, w][0].effective_length for w in windows} for s in retrieving}
    findings = [
        effective_length_grows(effective),
        f_aligns({s: {w: [p for p, _ in run_probes[s, w]] for w in windows} for s in retrieving}),
    ]
    excess = {s: _excess(last[s, largest][1]) for s in retrieving}
    findings.append(failures_far_from_question({s: e for s, e in excess.items() if e is not None}))
    findings.append(effective_below_window(largest, {s: effective[s][largest] for s in retrieving}))

    # the tables show every seed; the verdicts read only the seeds whose models retrieve
    table1 = {
        (s, p.name.removeprefix("name=")): _read(p / "niah.json")
        for s in seeds
        for p in (root / "table1" / f"s{s}").glob("name=*")
        if (p / "niah.json").exists()
    }
    methods = sorted({m for _, m in table1})
    at_window = {key: _at_length(niah, largest) for key, niah in table1.items()}
    findings.append(
        string_beats_rope(
            largest,
            {s: at_window[s, "rope"] for s in retrieving if (s, "rope") in at_window},
            {s: at_window[s, "string"] for s in retrieving if (s, "string") in at_window},
        )
    )
    sft = {
        (arm, s): int(_read(path)["effective_length"])
        for arm in SFT_ARMS
        for s in seeds
        if (path := root / "sft" / arm / f"s{s}" / "niah_after_sft" / "niah.json").exists()
    }
    by_arm = {arm: {s: v for (a, s), v in sft.items() if a == arm} for arm in SFT_ARMS}
    judged = {arm: {s: v for s, v in by_arm[arm].items() if s in retrieving} for arm in SFT_ARMS}
    findings.append(
        skipalign_beyond_window(largest, judged["skipalign-ntk"], judged["normal-ntk"], judged["normal-none"])
    )
    masked: dict[int, list[list[int]]] = {}  # window -> [cut, answers] per source, first seed's run
    for (_, window), path in sorted(runs.items()):
        if window not in masked and (path / "answer_masking.json").exists():
            sources = _read(path / "answer_masking.json")["sources"]
            masked[window] = [[src.get("cut", 0), src.get("answers", 0)] for src in sources]
    meta = {
        "root": str(root),
        "seeds": seeds,
        "windows": windows,
        "retrieving_seeds": retrieving,
        "leave_chance": chance_table(chance),
        "effective_length": {
            s: [last[s, w][0].effective_length if (s, w) in last else None for w in windows] for s in seeds
        },
        "probe_steps": {s: [last[s, w][0].step if (s, w) in last else None for w in windows] for s in seeds},
        "table1": {m: {s: list(at_window[s, m]) for s in seeds if (s, m) in at_window} for m in methods},
        "sft": by_arm,
        "masked_answers": masked,
    }
    return findings, {**meta, "_probes": run_probes}


def _interval_cells(values: list[float]) -> str:
    return SeedInterval.of(values).text(0) if len(values) >= 2 else f"{len(values)} seed(s) retrieve"


def results_block(name: str, findings: list[Finding], meta: dict, figures: list[str]) -> str:
    """The generated results (Markdown): verdicts, the seeds x windows tables, figures."""
    windows, seeds = meta["windows"], meta["seeds"]
    command = MAKE_TARGETS.get(name, "python -m longctx_replication.report")
    lines = [f"# Results: {name} (generated by `{command}`)", "", f"Code: commit {meta.get('commit', 'unknown')}.", ""]
    lines += [findings_markdown(findings), ""]
    lines += ["Step at which each run left chance (held-out answer loss < 2.0 nats; - = never):", ""]
    lines += ["| seed | " + " | ".join(f"L={w}" for w in windows) + " |", "|---" * (len(windows) + 1) + "|"]
    for seed, steps in zip(seeds, meta["leave_chance"]["steps"], strict=True):
        lines.append(f"| {seed} | " + " | ".join("-" if s is None else str(s) for s in steps) + " |")
    recipe = meta["leave_chance"]
    lines += [
        "",
        f"Seeds leaving chance at every window: {len(recipe['seeds_leaving_at_every_window'])} of {len(seeds)} "
        f"(the recipe works when >= 80%: {'yes' if recipe['recipe_works'] else 'no'}).",
        "",
        "Effective length at the last probe (mean [95% t interval] across seeds that retrieve):",
        "",
        "| seed | " + " | ".join(f"L={w}" for w in windows) + " |",
        "|---" * (len(windows) + 1) + "|",
    ]
    for seed in seeds:
        cells = ["-" if v is None else str(v) for v in meta["effective_length"][seed]]
        lines.append(f"| {seed} | " + " | ".join(cells) + " |")
    retrieving = meta["retrieving_seeds"]
    mean_cells = [_interval_cells([meta["effective_length"][s][i] for s in retrieving]) for i in range(len(windows))]
    lines.append("| mean | " + " | ".join(mean_cells) + " |")
    if meta["table1"]:
        lines += ["", f"Table 1 at L={windows[-1]} (passed/tests per seed, Wilson 95%):", ""]
        for method, by_seed in meta["table1"].items():
            cells = []
            for seed, (passed, tests) in sorted(by_seed.items()):
                low, high = wilson_interval(passed, tests)
                cells.append(f"s{seed} {passed}/{tests} [{low:.2f}, {high:.2f}]")
            lines.append(f"- {method}: " + "; ".join(cells))
    if any(meta["sft"].values()):
        lines += ["", "Effective length after SFT, per seed:", ""]
        lines += [
            f"- {arm}: " + ", ".join(f"s{s} {v}" for s, v in sorted(by.items())) for arm, by in meta["sft"].items()
        ]
    if meta["masked_answers"]:
        lines += ["", "Answers a row edge cut from their fact (label -100), per source, first seed's run:", ""]
        for window, sources in meta["masked_answers"].items():
            cells = [f"{cut:,} of {total:,} ({cut / total:.0%})" if total else "none" for cut, total in sources]
            lines.append(f"- L={window}: " + "; ".join(cells))
    lines += [""] + [f"![{Path(f).stem}]({Path(f).name})" for f in figures]
    return "\n".join(lines) + "\n"


def tuning_block(root: Path, commit: str) -> tuple[str, dict]:
    """The recipe check of tuning runs (sweeps/replicate_tuning.yaml: answer probes only,
    each run ending at its first probe below 2.0 nats): the seeds x windows table of the
    step at which each run left chance, and whether >= 4 of 5 seeds left it at every window.
    A run still going shows the last step it reached."""
    runs = pretrain_runs(root)
    rows = {key: metric_rows(path) for key, path in runs.items()}
    losses = {key: [(r["step"], r["answers/loss"]) for r in rows[key] if "answers/loss" in r] for key in runs}
    exact = {
        key: max((r["step"], r["answers/value_exact"]) for r in found)[1]
        for key in runs
        if (found := [r for r in rows[key] if "answers/value_exact" in r])
    }
    table = chance_table({key: leave_chance_step(losses[key]) for key in runs})

    def cell(seed: int, window: int, step: int | None) -> str:
        if not losses.get((seed, window)):
            return "not run"
        copied = f" ({exact[seed, window]:.0%} exact)" if (seed, window) in exact else ""
        if step is not None:
            return f"**{step}**{copied}"
        last_step, last_loss = max(losses[seed, window])
        return f"- (to {last_step}: {last_loss:.2f}){copied}"

    windows, seeds = table["windows"], table["seeds"]
    lines = [
        "Step at which each tuning run left chance (held-out answer loss < 2.0 nats per value token; "
        "`- (to S: x)`: still at chance at its last probe S, loss x). In brackets, the share of held-out "
        "values copied exactly at the run's last probe: a loss that drifts just below 2.0 (a few % exact) "
        "is not yet retrieval, a sharp drop (tens of %) is:",
        "",
        "| seed | " + " | ".join(f"L={w}" for w in windows) + " |",
        "|---" * (len(windows) + 1) + "|",
    ]
    for seed, steps in zip(seeds, table["steps"], strict=True):
        lines.append(f"| {seed} | " + " | ".join(cell(seed, w, s) for w, s in zip(windows, steps, strict=True)) + " |")
    every = table["seeds_leaving_at_every_window"]
    lines += [
        "",
        f"Seeds leaving chance at every window: {len(every)} of {len(seeds)} "
        f"(the recipe works when >= 80%: {'yes' if table['recipe_works'] else 'no'}). Code: commit {commit}.",
    ]
    return "\n".join(lines) + "\n", table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", type=Path, help="the sweeps' output root, e.g. runs/replicate_cpu")
    parser.add_argument("--docs", type=Path, default=Path("docs"), help="where the summary and results go")
    parser.add_argument("--name", default="cpu", help="label of this replication (cpu | full | gpu | smoke)")
    parser.add_argument(
        "--tuning", action="store_true", help="ROOT holds tuning runs: write only the leave-chance table"
    )
    args = parser.parse_args(argv)
    if args.tuning:
        block, table = tuning_block(args.root, checkout_commit(args.root))
        out = args.docs / "replication" / args.name
        out.mkdir(parents=True, exist_ok=True)
        (out / "leave_chance.md").write_text(block)
        (out / "leave_chance.json").write_text(json.dumps(table, indent=1) + "\n")
        print(block + f"wrote {out / 'leave_chance.md'}")
        return 0
    findings, meta = judge(args.root)
    run_probes = meta.pop("_probes")
    figures_dir = args.docs / "replication" / args.name
    figures_dir.mkdir(parents=True, exist_ok=True)
    figures = replication_figures.draw_all(run_probes, meta["windows"][-1], figures_dir)
    meta["commit"] = checkout_commit(args.root)
    summary = write_summary(findings, args.docs / f"replication_summary_{args.name}.json", meta)
    results = figures_dir / "results.md"
    results.write_text(results_block(args.name, findings, meta, [str(f) for f in figures]))
    print(findings_markdown(findings))
    print(f"wrote {summary} and {results}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
