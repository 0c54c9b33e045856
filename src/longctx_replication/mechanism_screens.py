"""The mechanism screens' table: effective length against tokens for each screen run.

A screen (docs/replication_log.md, 2026-11-26) trains cpu_base at one window with one lever
and probes NIAH every 200 steps on a fine grid (eval.niah.step=32). Per run this reads each
probe's `niah/step-NNNNNNN/niah.json` and the run's metrics.jsonl and reports:

- the curve: (step, tokens, L_eff, pass rate at the shortest length) at every probe;
- at the last probe: L_eff, the pass rate at max(256, window/2), the answer loss, and the
  f(i) probe's counts at the window's last distance, f(L-1), and at the effective length
  (how rarely the longest distances were trained against how far the model retrieves);
- the screens' target for the run: L_eff <= 0.75 x window, pass rate >= 0.8 at
  max(256, window/2), and L_eff at the last probe above L_eff at the first probe that
  passes at the shortest length (the effective length grows with tokens).

    python -m longctx_replication.mechanism_screens runs/mechanism/pretrain --window 512

Several directories of runs (screens from different pinned worktrees) make one table;
`--figure out.png` also draws every run's curve of L_eff against tokens (Fig. 2a's axes)
with the window and the target (0.75 x window) marked.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from longctx.analysis import figures

TARGET_SHARE = 0.75
"""The screens' target: the effective length at most this share of the window."""
SHORT_PASS_RATE = 0.8
"""The screens' target: the pass rate the model keeps at max(256, window / 2)."""


@dataclass(frozen=True)
class ProbePoint:
    step: int
    tokens: float
    effective_length: int
    rates: dict[int, float]
    """Pass rate per tested length (the search stops at the first failing length)."""


@dataclass(frozen=True)
class Screen:
    name: str
    window: int
    curve: list[ProbePoint]
    answer_loss: float | None
    """answers/loss at the last step that logged it."""
    f_last_distance: float | None
    """fi/f@L-1 at the last step that logged it: relative distance window - 1."""
    f_at_effective_length: float | None
    """niah/f_at_effective_length at the last step that logged it (absent while L_eff = 0)."""

    @property
    def last(self) -> ProbePoint:
        return self.curve[-1]

    @property
    def short_length(self) -> int:
        return max(256, self.window // 2)

    def short_rate(self, point: ProbePoint) -> float:
        """Pass rate at max(256, window/2); 0 where the search stopped before it."""
        return point.rates.get(self.short_length, 0.0)

    def meets_target(self) -> bool:
        first = next((p for p in self.curve if p.effective_length > 0), None)
        return (
            first is not None
            and self.last.effective_length <= TARGET_SHARE * self.window
            and self.short_rate(self.last) >= SHORT_PASS_RATE
            and self.last.effective_length > first.effective_length
        )


def read_screen(run_dir: Path, window: int) -> Screen:
    """The probes of one run directory (at least one niah.json)."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    tokens = {r["step"]: r["train/tokens_seen"] for r in rows if "train/tokens_seen" in r}
    per_step = max((t / s for s, t in tokens.items() if s > 0), default=0.0)

    def last_logged(key: str) -> float | None:
        logged = [(r["step"], r[key]) for r in rows if key in r]
        return max(logged)[1] if logged else None

    curve = []
    for path in sorted(run_dir.glob("niah/step-*/niah.json")):
        step = int(path.parent.name.removeprefix("step-"))
        niah = json.loads(path.read_text())
        rates = {int(row["length"]): float(row["rate"]) for row in niah["per_length"]}
        curve.append(ProbePoint(step, tokens.get(step, step * per_step), int(niah["effective_length"]), rates))
    if not curve:
        raise FileNotFoundError(f"{run_dir} has no niah/step-*/niah.json yet")
    return Screen(
        run_dir.name,
        window,
        curve,
        last_logged("answers/loss"),
        last_logged("fi/f@L-1"),
        last_logged("niah/f_at_effective_length") if curve[-1].effective_length > 0 else None,
    )


def screen_table(screens: list[Screen]) -> str:
    """Markdown: one row per run (last probe) and its curve of L_eff against tokens."""
    lines = [
        "| run | steps | L_eff at last probe | pass rate at max(256, L/2) | answer loss | f(L-1) | f(L_eff) "
        "| target | curve: step (M tokens) L_eff |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for screen in screens:
        last = screen.last
        curve = ", ".join(f"{p.step} ({p.tokens / 1e6:.1f}M) {p.effective_length}" for p in screen.curve)
        loss = "-" if screen.answer_loss is None else f"{screen.answer_loss:.2f}"
        f_tail = "-" if screen.f_last_distance is None else f"{screen.f_last_distance:,.0f}"
        f_leff = "-" if screen.f_at_effective_length is None else f"{screen.f_at_effective_length:,.0f}"
        lines.append(
            f"| {screen.name} | {last.step} | {last.effective_length} | {screen.short_rate(last):.2f} | {loss} | "
            f"{f_tail} | {f_leff} | {'met' if screen.meets_target() else 'not met'} | {curve} |"
        )
    return "\n".join(lines)


def screen_frame(screens: list[Screen]) -> pd.DataFrame:
    """One row per probe: run, step, tokens_seen, effective_length (Fig. 2a's frame)."""
    rows = [
        {"run": s.name, "step": p.step, "tokens_seen": p.tokens, "effective_length": p.effective_length}
        for s in screens
        for p in s.curve
    ]
    return pd.DataFrame(rows, columns=["run", "step", "tokens_seen", "effective_length"])


def style_by_lever(axis) -> None:
    """Colour each run's line by its lever and style it by its seed (labels `<lever>_s<seed>`):
    a dozen runs outnumber a colour cycle, and a lever's seeds read best side by side."""
    lines = axis.get_lines()
    names = [line.get_label().rpartition("_s")[::2] for line in lines]  # ("", label) without "_s"
    levers = list(dict.fromkeys(lever or seed for lever, seed in names))
    seeds = sorted({seed for _, seed in names})
    for line, (lever, seed) in zip(lines, names, strict=True):
        line.set_color(f"C{levers.index(lever or seed) % 10}")
        line.set_linestyle(["-", "--", ":", "-."][seeds.index(seed) % 4])


def plot_screens(screens: list[Screen], window: int, path: Path) -> Path:
    """Each run's L_eff against tokens, the window and the screens' target as horizontal lines."""
    figure = figures.plot_effective_length_vs_tokens(
        screen_frame(screens), title=f"Mechanism screens: effective length vs tokens (window {window})"
    )
    axis = figure.axes[0]
    style_by_lever(axis)
    axis.legend(fontsize="small", loc="center left", bbox_to_anchor=(1.01, 0.5))  # beside the curves
    figure.set_size_inches(figure.get_figwidth() + 2, figure.get_figheight())
    axis.axhline(window, color="gray", linestyle="--", linewidth=1)
    axis.axhline(TARGET_SHARE * window, color="tab:red", linestyle=":", linewidth=1)
    figure.tight_layout()
    return figures.save(figure, path.parent, path.stem)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", type=Path, nargs="+", help="directories of run directories")
    parser.add_argument("--window", type=int, required=True, help="the runs' training window")
    parser.add_argument("--figure", type=Path, help="also write the curves of L_eff against tokens (PNG)")
    args = parser.parse_args(argv)
    run_dirs = [d for root in args.runs for d in sorted(root.iterdir()) if any(d.glob("niah/step-*"))]
    screens = [read_screen(d, args.window) for d in run_dirs]
    print(screen_table(screens))
    if args.figure:
        print(f"wrote {plot_screens(screens, args.window, args.figure)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
