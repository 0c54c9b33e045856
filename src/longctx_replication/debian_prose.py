"""The GPU twin's natural text: English manuals from pinned Debian packages, tokenised here.

    python -m longctx_replication.debian_prose .device/twin        # what `make twin-data` runs

The embedded corpus is mostly code (the stdlib) and the retrieval documents' filler is
Python's pydoc help; a GPU-sized model needs prose too. The GPU
machine reaches no network and runs another Python (another stdlib, so another `bpe-N`
cache key), so everything it trains on is decided here:

1. `apt-get download NAME=VERSION` of each package in `TWIN_PACKAGES` into the download
   cache (`$LONGCTX_CACHE/debian`), checked against the SHA-256 of the Debian archive
   (bookworm, main), unpacked with `dpkg -x` (no root rights, nothing installed);
2. each English HTML page -> one document (`data/html_text.py`: paragraphs, headings,
   list items; no shell listings, tables or navigation);
3. the twin's tokenizer (`bpe-2048`, trained on the embedded corpus by the Python here)
   written as `DIR/tokenizer.json` (+ `tokenizer_config.json`), the file the twin configs
   name, so the GPU machine tokenises its retrieval documents with byte-identical merges;
4. `longctx prepare` of the documents with that file into `DIR/prose`, the manifest
   holding the packages, versions and hashes.

No source is an evaluation text: NIAH's haystack is Paul Graham's essays, the retrieval
filler Python's pydoc topics; these are Debian's own manuals (the Administrator's
Handbook, the Debian Reference, the Developer's Reference, the Policy Manual, the FAQ),
each at its bookworm release build, free (GPL-2, GPL-2+ or CC-BY-SA-3.0: `licence`).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from longctx.data.corpus import CorpusReport, Document
from longctx.data.html_text import html_text
from longctx.data.prepare import prepare
from longctx.data.tokenizer import EOS_TOKEN, PAD_TOKEN, default_cache_dir, load_tokenizer
from longctx.errors import DataError

TWIN_TOKENIZER = "bpe-2048"
"""The twin's vocabulary (experiments/replicate/gpu_base.yaml: model.vocab_size 2048)."""
TOKENIZER_FILE = "tokenizer.json"
PROSE_DIR = "prose"


@dataclass(frozen=True)
class ProsePackage:
    """A Debian package of English HTML documentation, pinned to one build."""

    name: str
    version: str
    sha256: str
    """Of the .deb, as the archive's Packages index lists it."""
    pages: str
    """Glob of the English HTML pages, relative to the unpacked tree."""
    licence: str
    exclude: tuple[str, ...] = ("genindex.html", "search.html")
    """File names of generated pages (Sphinx's index of terms, its search page): not prose."""


TWIN_PACKAGES = (
    ProsePackage(
        "debian-handbook",
        "11.20220922",
        "3d5dbeac1f1afc9c094eab9d0f701f6ecff99c4927d5a4794cf6c85678134faa",
        "usr/share/doc/debian-handbook/html/en-US/*.html",
        "GPL-2+ or CC-BY-SA-3.0",
    ),
    ProsePackage(
        "debian-reference-en",
        "2.100",
        "9f31d3a17df505de09689ca255512ea58c1fc47c59bb1b0c7bf1c23362e9743f",
        "usr/share/debian-reference/*.en.html",
        "GPL-2+",
    ),
    ProsePackage(
        "developers-reference",
        "12.18",
        "0dba82f6fa16e373f2a84ad07e7971aa9264ad2e7d2ae46b37edbc9c5fd57e2e",
        "usr/share/developers-reference/*.html",
        "GPL-2",
    ),
    ProsePackage(
        "debian-policy",
        "4.6.2.0",
        "ef9d01b625c3b87c3a845c2cd1b66f1a16e9240b2b9e5bee53472a00e8457a39",
        "usr/share/doc/debian-policy/policy.html/*.html",
        "GPL-2",
    ),
    ProsePackage(
        "debian-faq",
        "11.1",
        "427426e0cfa6888622fc1d72631071cb4b5a1f86ccde722e7820bcef284de5d0",
        "usr/share/doc/debian/FAQ/*.en.html",
        "GPL-2+",
    ),
)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fetch(package: ProsePackage, directory: Path) -> Path:
    """The package's .deb in `directory`, downloaded with apt-get unless already there;
    raises DataError when apt-get fails or the file is not the pinned build."""
    directory.mkdir(parents=True, exist_ok=True)
    deb = directory / f"{package.name}_{package.version}_all.deb"
    if not deb.is_file():
        done = subprocess.run(
            ["apt-get", "download", f"{package.name}={package.version}"],
            cwd=directory,
            capture_output=True,
            text=True,
        )
        if done.returncode or not deb.is_file():
            raise DataError(
                f"apt-get download {package.name}={package.version} failed (exit {done.returncode}): "
                f"{done.stderr.strip()[-500:]} -- is the Debian bookworm archive in the apt sources?"
            )
    found = _sha256(deb)
    if found != package.sha256:
        raise DataError(f"{deb} has SHA-256 {found}, not the pinned {package.sha256}: delete it and fetch again")
    return deb


def unpack(deb: Path, directory: Path) -> Path:
    """`dpkg -x deb directory` (a fresh directory: no stale pages of another build)."""
    if directory.exists():
        shutil.rmtree(directory)
    directory.mkdir(parents=True)
    subprocess.run(["dpkg", "-x", str(deb), str(directory)], check=True)
    return directory


def package_documents(package: ProsePackage, root: Path, report: CorpusReport | None = None) -> Iterator[Document]:
    """One document per English page under the unpacked tree `root`, sorted by path; a
    page with no prose (a pure table of contents) is recorded in `report` (else raises)."""
    pages = sorted(page for page in root.glob(package.pages) if page.name not in package.exclude)
    if not pages:
        raise DataError(f"{root} holds no page matching {package.pages!r}: not an unpacked {package.name}")
    for page in pages:
        where = f"{package.name}/{page.relative_to(root).as_posix()}"
        text = html_text(page.read_text(encoding="utf-8"))
        if text.strip():
            yield Document(f"debian:{where}", text, "prose")
        elif report is None:
            raise DataError(f"{where}: no prose left after removing navigation, listings and tables")
        else:
            report.reject(where, "empty", "no prose after extraction")


def write_tokenizer(spec: str, directory: Path) -> Path:
    """`spec`'s tokenizer as DIR/tokenizer.json + tokenizer_config.json; checks that the
    written file loads with the same fingerprint (what prepared data is matched against)."""
    tokenizer = load_tokenizer(spec)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / TOKENIZER_FILE
    tokenizer.hf_tokenizer.save(str(path))
    config = {"eos_token": EOS_TOKEN, "pad_token": PAD_TOKEN}
    (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    written = load_tokenizer(str(path))
    if written.fingerprint != tokenizer.fingerprint or written.eos_id != tokenizer.eos_id:
        raise DataError(f"{path} does not reload as {spec} (fingerprint or EOS differs)")
    return path


def prepare_twin_prose(
    out_dir: Path, packages: Sequence[ProsePackage] = TWIN_PACKAGES, downloads: Path | None = None
) -> dict:
    """Steps 1-4 of the module docstring; returns the prose manifest (`out_dir/prose`)."""
    downloads = downloads or default_cache_dir().parent / "debian"
    tokenizer_path = write_tokenizer(TWIN_TOKENIZER, out_dir)
    report = CorpusReport()
    documents: list[Document] = []
    for package in packages:
        root = unpack(fetch(package, downloads), downloads / f"{package.name}_{package.version}")
        documents += package_documents(package, root, report)
    extra = {"packages": [asdict(p) for p in packages], "tokenizer_spec": TWIN_TOKENIZER}
    source = "debian:" + ",".join(f"{p.name}={p.version}" for p in packages)
    return prepare(source, out_dir / PROSE_DIR, str(tokenizer_path), documents=documents, extra=extra)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path, help="where tokenizer.json and prose/ go, e.g. .device/twin")
    args = parser.parse_args(argv)
    manifest = prepare_twin_prose(args.out_dir)
    size = sum(p.stat().st_size for p in (args.out_dir / PROSE_DIR).rglob("*") if p.is_file())
    print(f"{manifest['documents']} documents, {manifest['tokens']:,} tokens, {size / 2**20:.1f} MiB in {args.out_dir}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
