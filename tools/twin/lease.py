"""The GPU twin's lease: how a seed's runs fit one call of a rented GPU machine.

    tools/twin/lease.yaml         # the twin's (sweeps/gpu_twin/plan.yaml)
    tools/twin/lease_smoke.yaml   # the smoke plan's, on CPU

The research plan (longctx_replication/twin_plan.py) says what runs; the lease says how
much of it one call may hold. Keys (every one required; an unknown or missing key, or a
value out of range, is a LeaseError naming the file):

    budget_s           wall-clock seconds of one call (at most the lender's command_s,
                       tools/lender.toml, for a call on the device machine)
    max_steps_cuts     train.max_steps of the pretraining runs, largest first: a seed runs at
                       the first cut not recorded in ARCHIVES/cuts.json as too long; a seed
                       that does not finish within its call records its cut there and is run
                       again, from scratch, at the next cut
    archive_max_bytes  the size limit of one seed's archive: committed results travel with
                       every later call, within the lender's carry_mib

`fit_seed_archive` keeps a seed's archive (longctx_replication/seed_archive.py) under the
limit: the full archive when it fits, else without the f(i) arrays the report does not draw
(seed_archive.earlier_fi), else a SeedArchiveError and the runs stay on the machine.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, fields
from pathlib import Path

import yaml

from longctx.errors import LongctxError
from longctx_replication.seed_archive import (
    SeedArchiveError,
    earlier_fi,
    pack_records,
    record_files,
    write_archive,
)

LEASE = Path(__file__).resolve().parent / "lease.yaml"
CUTS_FILE = "cuts.json"


class LeaseError(LongctxError, ValueError):
    """A lease file that is malformed, or a state of the cuts that leaves nothing to run."""


@dataclass(frozen=True)
class Lease:
    budget_s: float
    max_steps_cuts: tuple[int, ...]
    archive_max_bytes: int


def load_lease(path: str | Path = LEASE) -> Lease:
    path = Path(path)
    body = yaml.safe_load(path.read_text())
    if not isinstance(body, dict):
        raise LeaseError(f"{path}: expected a mapping, got {type(body).__name__}")
    names = {field.name for field in fields(Lease)}
    unknown, missing = sorted(set(body) - names), sorted(names - set(body))
    if unknown or missing:
        raise LeaseError(f"{path}: unknown keys {unknown}, missing keys {missing}")
    lease = Lease(
        budget_s=float(body["budget_s"]),
        max_steps_cuts=tuple(int(c) for c in body["max_steps_cuts"]),
        archive_max_bytes=int(body["archive_max_bytes"]),
    )
    cuts = lease.max_steps_cuts
    if not cuts or any(c <= 0 for c in cuts) or list(cuts) != sorted(set(cuts), reverse=True):
        raise LeaseError(f"{path}: max_steps_cuts must be positive and strictly decreasing, got {list(cuts)}")
    if lease.budget_s <= 0 or lease.archive_max_bytes <= 0:
        raise LeaseError(f"{path}: budget_s and archive_max_bytes must be > 0, got {body}")
    return lease


def too_long_cuts(archives: Path) -> dict[str, dict]:
    """{cut: what the call that did not finish at it recorded} from ARCHIVES/cuts.json."""
    path = archives / CUTS_FILE
    return json.loads(path.read_text())["too_long"] if path.is_file() else {}


def cut_in_force(lease: Lease, archives: Path) -> int | None:
    """The first cut not recorded as too long; None when every cut has been."""
    too_long = too_long_cuts(archives)
    return next((c for c in lease.max_steps_cuts if str(c) not in too_long), None)


def record_too_long(archives: Path, cut: int, record: dict) -> Path:
    """Record that a seed did not finish within a call at `cut` (ARCHIVES/cuts.json)."""
    too_long = {**too_long_cuts(archives), str(cut): record}
    path = archives / CUTS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"too_long": too_long}, indent=1) + "\n")
    return path


def fit_seed_archive(root: Path, run_dirs: Sequence[Path], path: Path, meta: dict, max_bytes: int) -> dict:
    """Archive the records of `run_dirs` (under `root`) into `path` within `max_bytes`
    (module docstring); returns the manifest (meta + files + left_out + bytes)."""
    files = record_files(root, run_dirs)
    if not files:
        raise SeedArchiveError(f"no record files under {', '.join(map(str, run_dirs))}: nothing to archive")
    left_out: list[str] = []
    manifest = {**meta, "files": [str(p.relative_to(root)) for p in files], "left_out": left_out}
    body = pack_records(root, files, manifest)
    if len(body) > max_bytes:
        dropped = set(earlier_fi(files))
        left_out += [str(p.relative_to(root)) for p in sorted(dropped)]
        files = [p for p in files if p not in dropped]
        manifest["files"] = [str(p.relative_to(root)) for p in files]
        body = pack_records(root, files, manifest)
    if len(body) > max_bytes:
        raise SeedArchiveError(
            f"the records of seed {meta.get('seed')} take {len(body):,} bytes packed even without the earlier "
            f"f(i) arrays, over the {max_bytes:,}-byte limit; the runs stay in {root}"
        )
    write_archive(path, body)
    return {**manifest, "bytes": len(body)}
