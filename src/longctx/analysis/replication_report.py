"""Step 4 of `make replicate`: read the runs, judge each finding, run the notebooks, write the docs.

    python -m longctx.analysis.replication_report runs/replicate_cpu --docs docs --name cpu

Reads what the three sweeps wrote under ROOT (layout fixed by sweeps/replicate_*.yaml):

    ROOT/pretrain/w<L>/          one pretraining run per window: niah/step-*/niah.json, fi/*.npz
    ROOT/table1/name=<method>/   `longctx niah` at the training window, one per position method
    ROOT/sft/<variant>/          `longctx sft` runs; niah_after_sft/niah.json

then applies the verdict rules of longctx/replication.py, executes the analysis notebooks
(nbclient, as tests/analysis does) on those runs with figures going to DOCS/replication/,
writes DOCS/replication_summary[_NAME].json and replaces the generated block of
DOCS/replication.md (between `<!-- results:begin NAME -->` and `<!-- results:end NAME -->`,
appended when absent). A notebook that fails is reported in the block, not hidden.
"""

from __future__ import annotations

import argparse
import json
import re
import time
from pathlib import Path

from longctx.analysis.fi import read_snapshot, snapshot_files
from longctx.replication import (
    Finding,
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

NOTEBOOKS = {
    "string_figures.ipynb": lambda root, figures, window: {
        "LONGCTX_RUNS": str(root / "pretrain" / "*"),
        "LONGCTX_FIGURES": str(figures),
        "LONGCTX_WINDOW": str(window),
    },
    "string_ablation.ipynb": lambda root, figures, window: {
        "LONGCTX_NIAH": str(root / "table1"),
        "LONGCTX_FIGURES": str(figures),
    },
    "skipalign.ipynb": lambda root, figures, window: {
        "LONGCTX_SFT_RUNS": str(root / "sft" / "*"),
        "LONGCTX_FIGURES": str(figures),
    },
}


def _read(path: Path) -> dict:
    return json.loads(path.read_text())


def _rows(result: dict) -> list[LengthPass]:
    return [LengthPass(int(r["length"]), int(r["passed"]), int(r["tests"])) for r in result["per_length"]]


def last_probe(run_dir: Path) -> tuple[int, dict]:
    """(step, niah.json) of a pretraining run's last NIAH probe."""
    files = sorted(run_dir.glob("niah/step-*/niah.json"))
    if not files:
        raise FileNotFoundError(f"{run_dir} has no niah/step-*/niah.json (probe.niah_every_steps must be > 0)")
    step = re.search(r"step-(\d+)", str(files[-1]))
    assert step is not None, files[-1]  # the glob above matched `step-*`
    return int(step.group(1)), _read(files[-1])


def f_at_effective_length(run_dir: Path, effective_length: int) -> float:
    """f(L_eff - 1) in the run's last f(i) snapshot: the pairs trained at the longest relative
    distance an effective length L_eff spans (its distances are 0 .. L_eff - 1), as the
    training probe logs `niah/f_at_effective_length`; 0 for L_eff = 0."""
    relative = read_snapshot(snapshot_files(run_dir)[-1][1])["relative"]
    return float(relative[effective_length - 1]) if 0 < effective_length <= len(relative) else 0.0


def far_near_counts(result: dict, needles_per_test: int = 4) -> tuple[tuple[int, int], tuple[int, int]]:
    """(found, needles) in the haystack's first half (far from the question) and second half.

    niah.json stores recall per depth band, not counts; depths are uniform, so each band
    holds about needles / bands of the tested needles and found = recall x that count.
    """
    recall, edges = result["depth_recall"], result["depth_edges"]
    needles = sum(r["tests"] for r in result["per_length"]) * needles_per_test
    per_band = needles / len(recall)
    far = [r for r, low in zip(recall, edges[:-1], strict=True) if low < 0.5 and r is not None]
    near = [r for r, low in zip(recall, edges[:-1], strict=True) if low >= 0.5 and r is not None]

    def found_of_total(bands: list[float]) -> tuple[int, int]:
        return round(sum(bands) * per_band), round(len(bands) * per_band)

    return found_of_total(far), found_of_total(near)


def judge(root: Path) -> tuple[list[Finding], dict]:
    """The findings of the runs under `root`, and the numbers behind them (meta)."""
    runs = {int(p.name[1:]): p for p in (root / "pretrain").glob("w*") if p.name[1:].isdigit()}
    probes = {w: last_probe(p) for w, p in sorted(runs.items())}
    effective = {w: probe[1]["effective_length"] for w, probe in probes.items()}
    rows = {w: _rows(probe[1]) for w, probe in probes.items()}
    threshold = next(iter(probes.values()))[1]["config"]["pass_threshold"]
    largest = max(runs)
    findings = [
        effective_length_grows(effective, rows),
        f_at_effective_length_aligns({w: f_at_effective_length(runs[w], effective[w]) for w in runs}, effective),
        failures_far_from_question(*far_near_counts(probes[largest][1])),
        effective_below_window(largest, effective[largest], rows[largest], threshold),
    ]
    table1 = {
        p.name.removeprefix("name="): _read(p / "niah.json")
        for p in (root / "table1").glob("name=*")
        if (p / "niah.json").exists()
    }

    def at_window(method: str) -> tuple[int, int]:
        row = [r for r in _rows(table1[method]) if r.length == largest] if method in table1 else []
        return (row[0].passed, row[0].tests) if row else (0, 0)

    findings.append(string_beats_rope(at_window("rope"), at_window("string"), largest))
    sft = {
        v: _read(root / "sft" / v / "niah_after_sft" / "niah.json")
        for v in ("normal", "skipalign")
        if (root / "sft" / v / "niah_after_sft" / "niah.json").exists()
    }
    if len(sft) == 2:
        findings.append(
            skipalign_beyond_window(
                sft["normal"]["effective_length"],
                sft["skipalign"]["effective_length"],
                largest,
                _rows(sft["normal"]),
                _rows(sft["skipalign"]),
            )
        )
    meta = {
        "root": str(root),
        "windows": sorted(runs),
        "probe_steps": {w: p[0] for w, p in probes.items()},
        "table1": {m: list(at_window(m)) for m in sorted(table1)},
        "per_length": {w: [[r.length, r.passed, r.tests] for r in rows[w]] for w in rows},
    }
    return findings, meta


def run_notebooks(root: Path, figures: Path, window: int, executed: Path) -> dict[str, str]:
    """Execute each analysis notebook on the runs; {notebook: 'ok (N s)' or the error}."""
    import os

    import nbformat
    from nbclient import NotebookClient

    repository = Path(__file__).resolve().parents[3]
    executed.mkdir(parents=True, exist_ok=True)
    status = {}
    for name, environment in NOTEBOOKS.items():
        saved = dict(os.environ)
        os.environ.update(environment(root.resolve(), figures.resolve(), window))
        notebook = nbformat.read(repository / "analysis" / name, as_version=4)
        start = time.monotonic()
        try:
            NotebookClient(
                notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(repository)}}
            ).execute()
            status[name] = f"ok ({time.monotonic() - start:.0f} s)"
        except Exception as error:  # reported in the docs: a failing notebook is a finding about the chain
            last_line = ANSI_COLOUR.sub("", str(error).strip().splitlines()[-1])
            status[name] = f"failed: {type(error).__name__}: {last_line[:200]}"
        finally:
            os.environ.clear()
            os.environ.update(saved)
        nbformat.write(notebook, executed / name)
    return status


# The make target that regenerates each named block (anything else: this module run by hand).
MAKE_TARGETS = {"cpu": "make replicate", "gpu": "make replicate-gpu", "smoke": "make replicate-smoke"}
ANSI_COLOUR = re.compile(r"\x1b\[[0-9;]*m")  # nbclient's tracebacks colour the exception name


def results_block(name: str, findings: list[Finding], meta: dict, notebooks: dict[str, str], figures: list[str]) -> str:
    lines = [
        f"<!-- results:begin {name} -->",
        f"### Results: {name} (generated by `{MAKE_TARGETS.get(name, 'python -m longctx.analysis.replication_report')}`)",
        "",
        findings_markdown(findings),
        "",
        "NIAH pass per tested length at each window's last probe (length: passed/tests, Wilson 95%):",
        "",
    ]
    from longctx.niah.search import wilson_interval

    for window, rows in meta["per_length"].items():
        cells = ", ".join(
            f"{length}: {p}/{n} [{wilson_interval(p, n)[0]:.2f}, {wilson_interval(p, n)[1]:.2f}]"
            for length, p, n in rows
        )
        lines.append(f"- L={window} (step {meta['probe_steps'][window]}): {cells or 'no length tested'}")
    lines += ["", "Notebooks: " + "; ".join(f"`{k}` {v}" for k, v in notebooks.items()), ""]
    lines += [f"![{Path(f).stem}]({f})" for f in figures]
    lines.append(f"<!-- results:end {name} -->")
    return "\n".join(lines)


def write_docs(docs: Path, name: str, block: str) -> Path:
    path = docs / "replication.md"
    text = path.read_text() if path.exists() else "# Miniature replication of STRING\n"
    pattern = re.compile(rf"<!-- results:begin {re.escape(name)} -->.*?<!-- results:end {re.escape(name)} -->", re.S)
    text = pattern.sub(lambda _: block, text) if pattern.search(text) else text.rstrip() + "\n\n" + block + "\n"
    path.write_text(text)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", type=Path, help="the sweeps' output root, e.g. runs/replicate_cpu")
    parser.add_argument("--docs", type=Path, default=Path("docs"))
    parser.add_argument("--name", default="cpu", help="label of this replication (cpu | gpu)")
    parser.add_argument("--no-notebooks", action="store_true", help="skip executing the analysis notebooks")
    args = parser.parse_args(argv)
    findings, meta = judge(args.root)
    figures = args.docs / "replication" / args.name
    figures.mkdir(parents=True, exist_ok=True)
    window = max(meta["windows"])
    notebooks = {} if args.no_notebooks else run_notebooks(args.root, figures, window, args.root / "notebooks")
    summary = write_summary(
        findings, args.docs / f"replication_summary_{args.name}.json", {**meta, "notebooks": notebooks}
    )
    pngs = sorted(str(p.relative_to(args.docs)) for p in figures.glob("*.png"))
    write_docs(args.docs, args.name, results_block(args.name, findings, meta, notebooks, pngs))
    print(findings_markdown(findings))
    print(f"wrote {summary} and {args.docs / 'replication.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
