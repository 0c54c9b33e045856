"""A model file larger than one device call carries, sent in parts and joined there.

    python3 tools/gpu/gguf_parts.py split FILE DIR --part-mib 32
    python3 tools/gpu/gguf_parts.py join DIR OUT --sha256 HEX

A device call takes along at most the lender's carry_mib (tools/lender.toml), the working
tree and `.device` (the wheels, ~24 MiB) included; the SmolLM2-135M-Instruct Q4_1 GGUF file
(`fetch_smollm2`) is 98,362,432 bytes. `split` cuts FILE into DIR/part-<k>-of-<n> of `--part-mib` MiB each,
and writes DIR/parts.json (each part's size and SHA-256, the whole file's); each quick
device call carries one part and parks it in a temporary folder there. `join` checks
that every part k of n is present (naming the missing ones), concatenates them in order
into OUT (written beside as OUT.partial, renamed when whole) and checks the SHA-256 of
the result against `--sha256` (the hash of the original, stated in docs/real_models.md
before any transfer); a mismatch removes OUT and is an error naming both hashes. The
exact device calls: docs/real_models.md, "On the GPU".
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
from pathlib import Path

from longctx.errors import LongctxError

MIB = 2**20
CHUNK = 4 * MIB
PART = re.compile(r"part-(\d+)-of-(\d+)$")


class PartsError(LongctxError):
    """Parts missing, inconsistent, or joined into a file whose hash is not the expected one."""


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(CHUNK):
            digest.update(block)
    return digest.hexdigest()


def split(file: Path, directory: Path, part_mib: float) -> list[Path]:
    """Cut `file` into parts of `part_mib` MiB in `directory` (+ parts.json); the parts."""
    if part_mib <= 0:
        raise PartsError(f"--part-mib must be > 0, got {part_mib}")
    size, part_bytes = file.stat().st_size, int(part_mib * MIB)
    count = max(1, -(-size // part_bytes))
    directory.mkdir(parents=True, exist_ok=True)
    parts = []
    with file.open("rb") as source:
        for index in range(count):
            path = directory / f"part-{index:03d}-of-{count:03d}"
            path.write_bytes(source.read(part_bytes))
            parts.append(path)
    listing = {
        "file": file.name,
        "bytes": size,
        "sha256": sha256_of(file),
        "parts": [{"name": p.name, "bytes": p.stat().st_size, "sha256": sha256_of(p)} for p in parts],
    }
    (directory / "parts.json").write_text(json.dumps(listing, indent=1) + "\n")
    return parts


def _parts_in(directory: Path) -> list[Path]:
    """Every part of one split, in order; PartsError naming what is missing or mixed."""
    found = {}
    for path in directory.iterdir():
        match = PART.match(path.name)
        if match:
            found[path] = (int(match.group(1)), int(match.group(2)))
    if not found:
        raise PartsError(f"{directory} holds no part-<k>-of-<n> file")
    counts = {n for _, n in found.values()}
    if len(counts) != 1:
        raise PartsError(f"{directory} mixes parts of different splits (of {sorted(counts)})")
    (count,) = counts
    have = {k for k, _ in found.values()}
    missing = [f"part-{k:03d}-of-{count:03d}" for k in range(count) if k not in have]
    if missing:
        raise PartsError(f"{directory} lacks {', '.join(missing)} (has {len(have)} of {count})")
    return sorted(found, key=lambda p: found[p][0])


def join(directory: Path, out: Path, sha256: str) -> Path:
    """Concatenate the parts in `directory` into `out` and check its SHA-256."""
    parts = _parts_in(directory)
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(out.name + ".partial")
    digest = hashlib.sha256()
    with partial.open("wb") as target:
        for path in parts:
            with path.open("rb") as source:
                while block := source.read(CHUNK):
                    digest.update(block)
                    target.write(block)
    if digest.hexdigest() != sha256.lower():
        partial.unlink()
        raise PartsError(
            f"joined {len(parts)} parts of {directory} have SHA-256 {digest.hexdigest()}, expected {sha256.lower()}: "
            "a part is damaged or from another file; nothing written"
        )
    partial.replace(out)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    cut = commands.add_parser("split", help="cut FILE into parts in DIR")
    cut.add_argument("file", type=Path)
    cut.add_argument("directory", type=Path)
    cut.add_argument("--part-mib", type=float, required=True, help="size of each part, MiB")
    glue = commands.add_parser("join", help="join the parts in DIR into OUT and check its SHA-256")
    glue.add_argument("directory", type=Path)
    glue.add_argument("out", type=Path)
    glue.add_argument("--sha256", required=True, help="the expected SHA-256 of the whole file (hex)")
    args = parser.parse_args(argv)
    try:
        if args.command == "split":
            for path in split(args.file, args.directory, args.part_mib):
                print(f"{path}  {path.stat().st_size:,} bytes")
            print(f"sha256 {json.loads((args.directory / 'parts.json').read_text())['sha256']}")
        else:
            print(f"{join(args.directory, args.out, args.sha256)}: SHA-256 {args.sha256.lower()} checked")
    except (PartsError, OSError) as error:
        print(f"error: {error}")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
