"""Resolved-config snapshot: every YAML in experiments/ and every grid point of sweeps/
must resolve to the committed `longctx config` output.

A refactor of the config code (moving sections between modules, changing how they
validate) keeps every resolved value; this test proves it key by key. A change that adds
or renames a config key changes the snapshot on purpose: regenerate and commit it with the
reason in the message:

    .venv/bin/python -m tests.test_config_snapshot --update
"""

import json
import sys
from pathlib import Path

import pytest

from longctx.config import load, to_yaml
from longctx.sweep import load_sweep, plan

SNAPSHOT_FILE = Path(__file__).parent / "golden" / "config_snapshot.json"
EXPERIMENTS = sorted(Path("experiments").rglob("*.yaml"))
SWEEPS = sorted(Path("sweeps").glob("*.yaml"))


def sweep_point_sources(path: Path) -> dict[str, tuple[list[str], list[str]]]:
    """(config files, overrides) of each grid point, named `sweeps/X.yaml#index`: the words
    after the subcommand (and the checkpoint of `niah`) of the argv the runner builds."""
    sweep = load_sweep(path)
    points = {}
    for point in plan(sweep):
        words = point.command[point.command.index("longctx") + 1 :]
        items = words[2:] if words[0] == "niah" else words[1:]
        files = [word for word in items if "=" not in word]
        overrides = [word for word in items if "=" in word]
        points[f"{path}#{point.index}"] = (files, overrides)
    return points


def resolved_configs() -> dict[str, str]:
    """Name -> the resolved config's YAML, for every experiment file and sweep point."""
    sources = {str(path): ([str(path)], []) for path in EXPERIMENTS}
    for path in SWEEPS:
        sources.update(sweep_point_sources(path))
    return {name: to_yaml(load(files, overrides)) for name, (files, overrides) in sources.items()}


def test_every_experiment_and_sweep_point_resolves_as_snapshotted():
    snapshot = json.loads(SNAPSHOT_FILE.read_text())
    current = resolved_configs()
    assert sorted(current) == sorted(snapshot), "experiment files or sweep points were added or removed"
    changed = [name for name in snapshot if current[name] != snapshot[name]]
    assert not changed, (
        f"resolved configs changed: {changed[:5]} (of {len(changed)}); if intended, regenerate with "
        "`python -m tests.test_config_snapshot --update`"
    )


def test_the_snapshot_covers_every_file_and_point():
    """Both kinds of source are in it, and a sweep contributes one entry per grid point."""
    snapshot = json.loads(SNAPSHOT_FILE.read_text())
    assert {name for name in snapshot if "#" not in name} == {str(path) for path in EXPERIMENTS}
    ablation = [name for name in snapshot if name.startswith("sweeps/string_ablation.yaml#")]
    assert len(ablation) == 4 * 5  # local_window x shift_ratio
    assert "local_window: 16" in snapshot["sweeps/string_ablation.yaml#0"]


if __name__ == "__main__" and sys.argv[1:] == ["--update"]:
    SNAPSHOT_FILE.write_text(json.dumps(resolved_configs(), indent=1, sort_keys=True) + "\n")
    print(f"wrote {SNAPSHOT_FILE}")
elif __name__ == "__main__":
    pytest.fail("usage: python -m tests.test_config_snapshot --update")
