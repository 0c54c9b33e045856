"""The wheels staged for the GPU image meet every requirement there, checked without network
(tools/gpu/staging.py): the committed locks against the committed image package list."""

import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
SAVED_PATH = list(sys.path)
sys.path.insert(0, str(ROOT / "tools" / "gpu"))
import staging  # noqa: E402  (a script directory, not a package)

sys.path[:] = SAVED_PATH

SETS = staging.load_sets()


@pytest.mark.parametrize("name", sorted(SETS))
def test_every_staged_wheel_has_what_it_needs_on_the_image(name):
    staging_set = SETS[name]
    wheels = staging.read_lock(staging.lock_path(name))
    assert staging.unmet(wheels, staging.load_image(), staging_set.allow, staging_set.no_deps) == []


@pytest.mark.parametrize("name", sorted(SETS))
def test_the_lock_holds_every_pin_at_its_version(name):
    """A pin edited in sets.toml without `make device*` leaves a stale lock."""
    locked = {wheel.name: wheel.version for wheel in staging.read_lock(staging.lock_path(name))}
    for pin in SETS[name].pins:
        requirement = Requirement(pin)
        pinned = canonicalize_name(requirement.name)
        assert pinned in locked, f"{name}: {pin} is not in {staging.lock_path(name).name}"
        assert requirement.specifier.contains(locked[pinned]), f"{name}: {pin}, locked {locked[pinned]}"


def test_the_first_h100_runs_hand_written_hf_set_fails():
    """The nine wheels `make device-hf` staged for the first H100 run (their Requires-Dist
    recorded from the wheels): huggingface-hub 2.4.0's httpx2 needs httpcore2 and truststore,
    which neither that set nor the image had, and typer 0.29.2 needs pydantic."""
    wheels = staging.read_lock(ROOT / "tests" / "tools" / "fixtures" / "hf_before_resolution.lock.json")
    gaps = staging.unmet(wheels, staging.load_image(), {}, {})
    needed = sorted(gap.split(" needs ")[1].split(";")[0].split("=")[0].split(">")[0] for gap in gaps)
    assert needed == ["httpcore2", "pydantic", "truststore"]


def wheel(name, version, *requires):
    return staging.Wheel(name, version, f"{name}-{version}.whl", requires)


def test_the_image_version_is_checked_where_it_is_known_and_markers_and_extras_are_evaluated():
    image = {"torch": Version("2.11.0"), "numpy": None}
    wheels = [
        wheel("a", "1", "torch>=2.12", "numpy>=9", "b<2", 'c; sys_platform == "win32"', 'd; extra == "dev"'),
        wheel("b", "2"),
    ]
    # torch 2.11 on the image misses >=2.12; numpy's version is not recorded (met by name);
    # staged b 2 shadows and misses <2; c and d do not apply on the image.
    assert staging.unmet(wheels, image, {}, {}) == ["a 1 needs torch>=2.12", "a 1 needs b<2"]
    assert staging.unmet(wheels, image, {"torch": "why", "b": "why"}, {}) == ["a 1 needs b<2"]
    assert staging.unmet(wheels, image, {}, {"a": "why"}) == []


def test_unknown_keys_in_the_sets_file_are_errors(tmp_path):
    path = tmp_path / "sets.toml"
    path.write_text('[x]\ndest = ".d"\npins = []\npin = ["typo"]\n')
    with pytest.raises(ValueError, match=r"sets.toml: \[x\] has unknown keys \['pin'\]"):
        staging.load_sets(path)


def test_the_image_list_has_the_versions_the_first_h100_run_recorded():
    image = staging.load_image()
    assert image["torch"] == Version("2.11.0") and image["transformers"] == Version("5.17.0")
    assert "wandb" not in image and "omegaconf" not in image and "pytest" in image
