"""One finished seed of the GPU twin as one small archive of its records, committed under
docs/replication/gpu/ (docs/replication.md, "The GPU twin").

    docs/replication/gpu/seed-10.tar.xz     # written by the twin's driver (tools/twin/gpu_twin.py)

A seed's runs (three pretraining windows, its SFT arms, its Table 1 evaluations) write
metrics.jsonl, NIAH results (niah.json), answer-masking counts and f(i) arrays (fi/*.npz)
beside checkpoints of ~250 MB. The archive keeps the records the report reads and drops
the rest: files ending in RECORD_SUFFIXES, outside the directories in LEFT_OUT_DIRS
(checkpoints, W&B's files), each stored under its path relative to the runs' root, so
extracting every archive into one directory rebuilds the layout
longctx_replication.report reads. `manifest.json` inside names the seed, the
commit, the training steps and every file left out.

Of the records, the f(i) arrays of every checkpoint step but each run's last are the ones
the report can do without (it draws f at the last probe): `earlier_fi` names them, for a
caller that must keep an archive under a size limit of its own (the twin's driver does,
tools/twin/lease.py). xz at preset 9: the arrays are int64 counts, mostly high zero bytes.
"""

from __future__ import annotations

import io
import json
import lzma
import tarfile
from collections.abc import Iterable, Sequence
from pathlib import Path

from longctx.errors import LongctxError

RECORD_SUFFIXES = (".json", ".jsonl", ".npz")
LEFT_OUT_DIRS = frozenset({"checkpoints", "wandb"})
MANIFEST = "manifest.json"


class SeedArchiveError(LongctxError):
    """An archive with nothing to hold, one that cannot be kept within its size limit, or one
    that is malformed."""


def archive_path(directory: Path, seed: int) -> Path:
    return directory / f"seed-{seed}.tar.xz"


def finished_seeds(directory: Path) -> list[int]:
    """The seeds with an archive in `directory`."""
    return sorted(int(p.name.removeprefix("seed-").removesuffix(".tar.xz")) for p in directory.glob("seed-*.tar.xz"))


def record_files(root: Path, run_dirs: Iterable[Path]) -> list[Path]:
    """Every record file under `run_dirs` (RECORD_SUFFIXES, outside LEFT_OUT_DIRS), sorted."""
    found = []
    for run_dir in run_dirs:
        for path in sorted(run_dir.rglob("*")):
            inside = path.relative_to(root).parts
            if path.is_file() and path.suffix in RECORD_SUFFIXES and not LEFT_OUT_DIRS.intersection(inside):
                found.append(path)
    return found


def earlier_fi(files: Sequence[Path]) -> list[Path]:
    """The f(i) arrays of every checkpoint step but the last of their run."""
    by_run: dict[Path, list[Path]] = {}
    for path in files:
        if path.parent.name == "fi" and path.suffix == ".npz":
            by_run.setdefault(path.parent, []).append(path)
    return [path for paths in by_run.values() for path in sorted(paths)[:-1]]


def pack_records(root: Path, files: Sequence[Path], manifest: dict) -> bytes:
    buffer = io.BytesIO()
    with lzma.open(buffer, "wb", preset=9) as packed, tarfile.open(fileobj=packed, mode="w") as tar:
        body = json.dumps(manifest, indent=1).encode() + b"\n"
        info = tarfile.TarInfo(MANIFEST)
        info.size = len(body)
        tar.addfile(info, io.BytesIO(body))
        for path in files:
            tar.add(path, arcname=str(path.relative_to(root)), recursive=False)
    return buffer.getvalue()


def write_archive(path: Path, body: bytes) -> None:
    """Write a packed archive to `path` atomically (beside it as .partial, then renamed)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_bytes(body)
    partial.replace(path)


def write_seed_archive(root: Path, run_dirs: Sequence[Path], path: Path, meta: dict) -> dict:
    """Archive every record of `run_dirs` (under `root`) into `path`; returns the manifest
    (meta + files + left_out + bytes)."""
    files = record_files(root, run_dirs)
    if not files:
        raise SeedArchiveError(f"no record files under {', '.join(map(str, run_dirs))}: nothing to archive")
    manifest = {**meta, "files": [str(p.relative_to(root)) for p in files], "left_out": []}
    body = pack_records(root, files, manifest)
    write_archive(path, body)
    return {**manifest, "bytes": len(body)}


def read_manifest(path: Path) -> dict:
    with tarfile.open(path, "r:xz") as tar:
        member = tar.extractfile(MANIFEST)
        if member is None:
            raise SeedArchiveError(f"{path} has no {MANIFEST}")
        return json.loads(member.read())


def extract_seed_archives(directory: Path, root: Path) -> list[dict]:
    """Extract every seed archive of `directory` into `root` (the layout the report reads);
    their manifests, by seed. Members are only regular files under relative paths
    (tarfile's `data` filter)."""
    manifests = []
    for seed in finished_seeds(directory):
        path = archive_path(directory, seed)
        with tarfile.open(path, "r:xz") as tar:
            members = [m for m in tar.getmembers() if m.name != MANIFEST]
            tar.extractall(root, members=members, filter="data")
        manifests.append(read_manifest(path))
    if not manifests:
        raise SeedArchiveError(f"{directory} holds no seed-<seed>.tar.xz archive")
    return manifests
