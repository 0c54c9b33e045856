"""eval/cell_progress.py: one bar for a whole grid (samples to decode, the running cell as
its description; samples an earlier run decoded leave the total) and a line per cell."""

import io

from longctx.eval.cell_progress import CellProgress
from longctx.eval.cells import Cell, CellResult


def test_a_grid_has_one_bar_whose_total_drops_by_what_earlier_runs_decoded():
    stream = io.StringIO()
    first, second = Cell("m", "rope", "copy", 24), Cell("m", "rope", "copy", 40)
    with CellProgress(stream=stream) as progress:
        progress.grid_started(10, "2 ranks (1 node(s) x 2)")
        progress.cell_started(first, total=5, done=2)  # 2 samples from an earlier run
        progress.advance(3)
        summary = {"count": 5, "score": 0.4, "passed": 2, "wilson": [0.1, 0.8], "seconds": 6.0}
        progress.cell_done(CellResult(first, [], summary, decoded=3), reused=False)
        progress.cell_started(second, total=5, done=0)
        if progress._progress is not None:  # Rich: one task for the grid, described by its running cell
            [task] = progress._progress.tasks
            assert (task.total, task.completed, task.description) == (8, 3, second.name)
        else:
            assert (progress._bar.total, progress._bar.n) == (8, 3)
    text = stream.getvalue()
    assert text.startswith("evaluating on 2 ranks (1 node(s) x 2)\n")
    assert "done  m rope copy L=24: 0.400 (2/5, Wilson 95% [0.10, 0.80]) in 0.1 min" in text


def test_quiet_shows_nothing():
    stream = io.StringIO()
    with CellProgress(quiet=True, stream=stream) as progress:
        progress.grid_started(10, "2 ranks")
        progress.cell_started(Cell("m", "rope", "copy", 24), total=5, done=0)
        progress.advance(5)
    assert stream.getvalue() == ""
