"""The matrix covers what ships: every file under experiments/ is a cell's or named as none."""

from fnmatch import fnmatch

from tests.composition.helpers import CONFIGS, NOT_CELLS, ROOT


def test_every_shipped_configuration_is_a_cell_or_named_as_none():
    experiments = ROOT / "experiments"
    shipped = {path.relative_to(experiments).as_posix() for path in experiments.rglob("*.yaml")}
    in_cells = {f.removeprefix("experiments/") for config in CONFIGS for f in config.files}
    named = {path for path in shipped for pattern in NOT_CELLS if fnmatch(path, pattern)}
    uncovered, unknown = sorted(shipped - in_cells - named), sorted(in_cells - shipped)
    assert not uncovered, f"shipped configurations no cell runs (add a cell or a NOT_CELLS entry): {uncovered}"
    assert not unknown, f"cells name files that are not under experiments/: {unknown}"
    for pattern in NOT_CELLS:
        assert any(fnmatch(path, pattern) for path in shipped), f"{pattern} matches nothing"
