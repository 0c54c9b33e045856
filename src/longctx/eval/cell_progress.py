"""Progress of an evaluation: a bar per cell (a grid: one bar for the whole grid) and a line
per finished cell.

    model rope paper L=8192 ━━━━━━━━━━━━━━━━━━━━━━━━━━━ 3/8 0:01:12 • 0:02:00 0.04it/s
    done  smollm2 rope niah-paper L=8192: 0.750 (6/8, Wilson 95% [0.41, 0.93]) in 3.1 min

A grid (`grid_started`, eval/cells.py `run_grid`) has one bar for all its cells: samples
decoded of the samples to decode (a cell's samples that an earlier run decoded leave the
total when the cell starts), the rate and the time left of this run, the running cell as
its description. Under torchrun only rank 0 shows it: its own batches count as they finish,
the other ranks' when they are gathered (a spread cell's at its end, the whole cells after
every rank has run its own), so while ranks run whole cells the rate is rank 0's alone.

The display is the one Lightning's training bar uses (train/progress_bar.py): Rich with
Lightning's own columns (description, bar, done/total, elapsed • remaining, rate) when Rich
is installed, else Lightning's tqdm bar; lines print above the bar. `quiet=True` shows
nothing. The bar counts the samples of the cell; a resumed cell starts at the samples its
records already hold, so the rate and ETA are those of this run.
"""

from __future__ import annotations

import sys
from typing import Any, TextIO

from lightning.pytorch.utilities.imports import _RICH_AVAILABLE

from longctx.eval.cells import Cell, CellResult


def describe(result: CellResult, reused: bool = False) -> str:
    """One line of a finished cell: its score, passes and Wilson interval when pass/fail, time."""
    summary = result.summary
    text = f"{result.cell.name}: {summary['score']:.3f}"
    if "passed" in summary:
        low, high = summary["wilson"]
        text += f" ({summary['passed']}/{summary['count']}, Wilson 95% [{low:.2f}, {high:.2f}])"
    else:
        text += f" (n={summary['count']})"
    if reused:
        return f"kept  {text} (from an earlier run)"
    return f"done  {text} in {summary.get('seconds', 0.0) / 60:.1f} min"


class CellProgress:
    """The bar of the running cell and the lines of finished ones (module docstring)."""

    def __init__(self, quiet: bool = False, stream: TextIO | None = None):
        self.quiet = quiet
        self.stream = stream or sys.stderr
        self._progress: Any = None  # rich Progress, started at the first cell
        self._task: Any = None
        self._bar: Any = None  # Lightning's Tqdm without Rich
        self._grid = False  # one bar for a whole grid

    def grid_started(self, total: int, layout: str = "") -> None:
        """One bar for the grid's `total` samples from now on; `layout`: how ranks share it."""
        if self.quiet:
            return
        if layout:
            print(f"evaluating on {layout}", file=self.stream, flush=True)
        self._grid = True
        self._start_bar("grid", total, 0)

    def __enter__(self) -> CellProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def cell_started(self, cell: Cell, total: int, done: int) -> None:
        if self.quiet:
            return
        if not self._grid:
            self._start_bar(cell.name, total, done)
        elif self._progress is not None and self._task is not None:
            task = self._progress.tasks[self._task]
            self._progress.update(self._task, description=cell.name, total=task.total - done)
        elif self._bar is not None:
            self._bar.set_description(cell.name)
            self._bar.total -= done
            self._bar.refresh()

    def _start_bar(self, description: str, total: int, done: int) -> None:
        if _RICH_AVAILABLE:
            self._rich_bar(description, total, done)
        else:
            from lightning.pytorch.callbacks.progress.tqdm_progress import Tqdm

            self._close_bar()
            self._bar = Tqdm(total=total, initial=done, desc=description, unit="sample", file=self.stream)

    def _rich_bar(self, description: str, total: int, done: int) -> None:
        from lightning.pytorch.callbacks.progress.rich_progress import (
            BatchesProcessedColumn,
            CustomBarColumn,
            CustomProgress,
            CustomTimeColumn,
            ProcessingSpeedColumn,
            RichProgressBarTheme,
        )
        from rich.console import Console
        from rich.progress import TextColumn

        if self._progress is None:
            theme = RichProgressBarTheme()
            self._progress = CustomProgress(
                TextColumn("[progress.description]{task.description}"),
                CustomBarColumn(
                    complete_style=theme.progress_bar,
                    finished_style=theme.progress_bar_finished,
                    pulse_style=theme.progress_bar_pulse,
                ),
                BatchesProcessedColumn(style=theme.batch_progress),
                CustomTimeColumn(style=theme.time),
                ProcessingSpeedColumn(style=theme.processing_speed),
                console=Console(file=self.stream),
                auto_refresh=True,
                refresh_per_second=2,
            )
            self._progress.start()
        if self._task is not None:
            self._progress.remove_task(self._task)
        self._task = self._progress.add_task(description, total=total, completed=done)

    def advance(self, samples: int) -> None:
        if self.quiet:
            return
        if self._progress is not None and self._task is not None:
            self._progress.advance(self._task, samples)
        elif self._bar is not None:
            self._bar.update(samples)

    def cell_done(self, result: CellResult, reused: bool) -> None:
        if self.quiet:
            return
        line = describe(result, reused)
        if self._progress is not None:
            if self._task is not None and not self._grid:
                self._progress.remove_task(self._task)
                self._task = None
            self._progress.console.print(line, highlight=False, markup=False)
        elif self._grid and self._bar is not None:
            self._bar.write(line, file=self.stream)
        else:
            self._close_bar()
            print(line, file=self.stream, flush=True)

    def _close_bar(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def close(self) -> None:
        self._close_bar()
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
            self._task = None
