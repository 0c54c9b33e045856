"""Wheels for the GPU image, staged here and proved complete here, before GPU time is spent.

    python tools/gpu/staging.py stage SET     # network: download, resolve, write the lock
    python tools/gpu/staging.py check [SET]   # no network: every requirement satisfied?

The GPU machine has no network, so what its image lacks travels as wheels (`make device`,
`make device-hf`, `make device-ruler`; the sets are tools/gpu/staging/sets.toml). A
hand-written wheel list misses what the wheels themselves need: the first H100 run lost its
hf attention check to huggingface-hub 2.4.0 needing httpx2, which needs httpcore2 and
truststore, neither staged nor on the image. So staging resolves:

1. each pin is downloaded (`pip download --no-deps` for CPython 3.12 on manylinux x86-64);
2. each staged wheel's Requires-Dist whose marker holds on the image (Python 3.12.3, Linux,
   x86-64, no extras) is satisfied, in this order, by a staged wheel, by the image
   (tools/gpu/staging/image.txt: a package listed with a version must meet the
   specifier; a bare name counts as met, its version was never recorded), by the set's
   `allow` list; else it is downloaded and followed in turn (`no_deps` wheels are not
   followed);
3. the set's lock, tools/gpu/staging/<set>.lock.json, records every staged wheel with
   its Requires-Dist. The lock is committed; `check` (and tests/tools/test_device_staging.py,
   without network) re-derives step 2 from the lock alone and lists what nothing satisfies.
"""

from __future__ import annotations

import argparse
import email.parser
import json
import shutil
import subprocess
import sys
import tempfile
import tomllib
import zipfile
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

REPOSITORY = Path(__file__).resolve().parents[2]
STAGING = Path(__file__).resolve().parent / "staging"
IMAGE_PYTHON = "3.12.3"
MARKER_ENVIRONMENT = {
    "python_version": "3.12",
    "python_full_version": IMAGE_PYTHON,
    "implementation_name": "cpython",
    "implementation_version": IMAGE_PYTHON,
    "platform_python_implementation": "CPython",
    "platform_system": "Linux",
    "sys_platform": "linux",
    "platform_machine": "x86_64",
    "os_name": "posix",
    "platform_release": "",
    "platform_version": "",
    "extra": "",
}
"""The image's interpreter, as packaging's marker evaluation reads it: a requirement behind an
extra (`extra == "..."`) never holds, as nothing installs extras there."""
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")


@dataclass(frozen=True)
class Wheel:
    name: str
    version: str
    file: str
    requires: tuple[str, ...]


@dataclass(frozen=True)
class StagingSet:
    name: str
    dest: str
    pins: tuple[str, ...]
    allow: dict[str, str]
    """Requirement name -> why it is not staged."""
    no_deps: dict[str, str]
    """Wheel name -> why its requirements are not followed."""


def load_sets(path: Path = STAGING / "sets.toml") -> dict[str, StagingSet]:
    raw = tomllib.loads(path.read_text())
    sets = {}
    for name, body in raw.items():
        unknown = set(body) - {"dest", "pins", "allow", "no_deps"}
        if unknown:
            raise ValueError(f"{path}: [{name}] has unknown keys {sorted(unknown)}")
        sets[name] = StagingSet(
            name,
            body["dest"],
            tuple(body["pins"]),
            {canonicalize_name(k): v for k, v in body.get("allow", {}).items()},
            {canonicalize_name(k): v for k, v in body.get("no_deps", {}).items()},
        )
    return sets


def load_image(path: Path = STAGING / "image.txt") -> dict[str, Version | None]:
    """Package name -> its version on the image, None where only the name was recorded."""
    image: dict[str, Version | None] = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        name, _, version = line.partition("==")
        if not name.strip():
            raise ValueError(f"{path}:{number}: no package name in {line!r}")
        image[canonicalize_name(name)] = Version(version) if version else None
    return image


def wheel_metadata(path: Path) -> Wheel:
    """Name, version and Requires-Dist from a wheel's .dist-info/METADATA."""
    with zipfile.ZipFile(path) as archive:
        member = next(n for n in archive.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA"))
        message = email.parser.Parser().parsestr(archive.read(member).decode())
    return Wheel(
        canonicalize_name(message["Name"]), message["Version"], path.name, tuple(message.get_all("Requires-Dist") or ())
    )


def applies(requirement: Requirement) -> bool:
    return requirement.marker is None or requirement.marker.evaluate(MARKER_ENVIRONMENT)


def satisfied_by(
    requirement: Requirement, staged: dict[str, Wheel], image: dict[str, Version | None], allow: dict[str, str]
) -> str | None:
    """Who meets `requirement` on the image ('staged', 'image', 'allowed'), None for nobody.
    A staged wheel shadows the image's copy of the same package (it is first on the path)."""
    name = canonicalize_name(requirement.name)
    if name in staged:
        return "staged" if requirement.specifier.contains(staged[name].version, prereleases=True) else None
    if name in image:
        version = image[name]
        if version is None or requirement.specifier.contains(version, prereleases=True):
            return "image"
    return "allowed" if name in allow else None


def unmet(
    wheels: list[Wheel], image: dict[str, Version | None], allow: dict[str, str], no_deps: dict[str, str]
) -> list[str]:
    """'wheel version needs requirement' for every applicable requirement nobody meets."""
    staged = {wheel.name: wheel for wheel in wheels}
    gaps = []
    for wheel in wheels:
        if wheel.name in no_deps:
            continue
        for line in wheel.requires:
            requirement = Requirement(line)
            if applies(requirement) and satisfied_by(requirement, staged, image, allow) is None:
                gaps.append(f"{wheel.name} {wheel.version} needs {line}")
    return gaps


def lock_path(name: str) -> Path:
    return STAGING / f"{name}.lock.json"


def read_lock(path: Path) -> list[Wheel]:
    return [Wheel(w["name"], w["version"], w["file"], tuple(w["requires"])) for w in json.loads(path.read_text())]


def write_lock(path: Path, wheels: list[Wheel]) -> None:
    rows = [{"name": w.name, "version": w.version, "file": w.file, "requires": list(w.requires)} for w in wheels]
    path.write_text(json.dumps(sorted(rows, key=lambda row: row["name"]), indent=1) + "\n")


def download(specifier: str, dest: Path) -> Path:
    """One wheel for the image's interpreter and platform, no dependencies."""
    with tempfile.TemporaryDirectory() as scratch:
        command = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:"]
        command += ["--python-version", "3.12", "--implementation", "cp", "-d", scratch, specifier]
        for platform in PLATFORMS:
            command += ["--platform", platform]
        subprocess.run(command, check=True)
        (wheel,) = Path(scratch).glob("*.whl")
        return Path(shutil.move(wheel, dest / wheel.name))


def stage(staging_set: StagingSet, image: dict[str, Version | None]) -> list[Wheel]:
    """Download the pins and, breadth first, whatever they need that nothing else meets."""
    dest = REPOSITORY / staging_set.dest / "whl"
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    staged: dict[str, Wheel] = {}
    queue = [Requirement(pin) for pin in staging_set.pins]
    while queue:
        requirement = queue.pop(0)
        if canonicalize_name(requirement.name) in staged:
            continue  # a version conflict among staged wheels shows in the final check
        wheel = wheel_metadata(download(str(requirement), dest))
        print(f"staged {wheel.file}", flush=True)
        staged[wheel.name] = wheel
        if wheel.name in staging_set.no_deps:
            continue
        for line in wheel.requires:
            needed = Requirement(line)
            if applies(needed) and satisfied_by(needed, staged, image, staging_set.allow) is None:
                queue.append(needed)
    return list(staged.values())


def check(names: list[str]) -> int:
    sets, image = load_sets(), load_image()
    failed = 0
    for name in names:
        staging_set = sets[name]
        gaps = unmet(read_lock(lock_path(name)), image, staging_set.allow, staging_set.no_deps)
        for gap in gaps:
            print(f"{lock_path(name).relative_to(REPOSITORY)}: {gap}: not staged, not on the image, not allowed")
        failed += bool(gaps)
    return int(failed > 0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("stage").add_argument("set")
    commands.add_parser("check").add_argument("sets", nargs="*")
    args = parser.parse_args()
    sets = load_sets()
    if args.command == "check":
        return check(args.sets or sorted(sets))
    if args.set not in sets:
        parser.error(f"unknown set {args.set!r}; sets.toml has {sorted(sets)}")
    wheels = stage(sets[args.set], load_image())
    write_lock(lock_path(args.set), wheels)
    size = sum((REPOSITORY / sets[args.set].dest / "whl" / w.file).stat().st_size for w in wheels) / 2**20
    print(f"{len(wheels)} wheels, {size:.1f} MiB in {sets[args.set].dest}/whl; lock {lock_path(args.set)}")
    return check([args.set])


if __name__ == "__main__":
    sys.exit(main())
