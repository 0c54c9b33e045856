"""The tokenizer a model comes with: the one lookup every command uses (docs/design.md §14).

    tokenizer = tokenizer_for_model("hf/SmolLM2-135M-Instruct")           # its tokenizer.json
    tokenizer = tokenizer_for_model("runs/a/checkpoints/last.ckpt")       # the run's data.tokenizer
    tokenizer = tokenizer_for_model(path, override="llama3")              # the user's, with a warning

Prompts must be written in the model's own tokenizer: a smaller foreign vocabulary passes
every shape check and yields fluent-looking garbage (a bpe-8192 NIAH prompt fed to a
49,152-token model scored "effective length 0" and exited 0). So, per kind of model path:

- an HF directory (config.json): its tokenizer.json + tokenizer_config.json (BOS/EOS,
  `add_bos_token`); a directory without tokenizer.json is an error unless the user names one;
- a Lightning checkpoint (.ckpt/.pt): the `data.tokenizer` its run recorded;
- a file that records none (our .safetensors): the default `bpe-8192` when the model's
  vocab_size is its size, else an error asking for one;
- no model (pretraining from scratch): the user's, else the default.

A tokenizer the user gives (`data.tokenizer`, `--tokenizer`) overrides the model's, with a
warning when their definitions differ. A tokenizer with more ids than the model has
embedding rows is an error naming both numbers and both sources; fewer is fine
(embeddings are often padded: Qwen2.5 has 151,936 rows for 151,665 ids).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from longctx.data.tokenizer import DEFAULT_VOCAB_SIZE, Tokenizer, TokenizerError, load_tokenizer
from longctx.model.hf import TOKENIZER_FILE
from longctx.model.hf_config import CONFIG_FILE

log = logging.getLogger(__name__)

DEFAULT_TOKENIZER = f"bpe-{DEFAULT_VOCAB_SIZE}"


def model_vocab_size(path: str | Path) -> tuple[int, str]:
    """(embedding rows, the file that says so) of a model, read without loading its weights."""
    from safetensors import safe_open

    from longctx.errors import CheckpointError
    from longctx.model.checkpoint import CONFIG_METADATA_KEY

    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    if path.is_dir():
        config_file = path / CONFIG_FILE
        if not config_file.is_file():
            raise CheckpointError(f"{path} is a directory without {CONFIG_FILE}: not a Hugging Face model directory")
        values = json.loads(config_file.read_text("utf-8"))
        if "vocab_size" not in values:
            raise CheckpointError(f"{config_file}: no 'vocab_size'")
        return int(values["vocab_size"]), str(config_file)
    if path.suffix == ".safetensors":
        with safe_open(str(path), framework="pt") as handle:
            metadata = handle.metadata() or {}
        if CONFIG_METADATA_KEY not in metadata:
            raise CheckpointError(f"{path}: no '{CONFIG_METADATA_KEY}' metadata; was it written by longctx save_model?")
        return int(json.loads(metadata[CONFIG_METADATA_KEY])["vocab_size"]), str(path)
    import torch

    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as error:  # torch raises RuntimeError/UnpicklingError/EOFError on damaged files
        raise CheckpointError(f"{path}: cannot be read as a torch checkpoint ({error})") from None
    model = (checkpoint.get("hyper_parameters") or {}).get("model") if isinstance(checkpoint, dict) else None
    if not isinstance(model, dict) or "vocab_size" not in model:
        raise CheckpointError(f"{path}: hyper_parameters['model'] (the model config) is missing")
    return int(model["vocab_size"]), str(path)


def own_tokenizer_spec(path: str | Path) -> str | None:
    """The tokenizer a model records: an HF directory's own files, a training checkpoint's
    `data.tokenizer`; None when it records none. An HF directory without tokenizer.json
    is an error (it cannot be evaluated or fine-tuned without one)."""
    from longctx.model.checkpoint import experiment_settings

    path = Path(path)
    if path.is_dir():
        if not (path / TOKENIZER_FILE).is_file():
            raise TokenizerError(
                f"{path} has no {TOKENIZER_FILE}: a Hugging Face model directory needs its tokenizer "
                "(tokenizer.json + tokenizer_config.json); copy them in or set data.tokenizer"
            )
        return str(path)
    recorded = ((experiment_settings(path) or {}).get("data") or {}).get("tokenizer")
    return recorded or None


def tokenizer_for_model(path: str | Path | None, override: str | None = None) -> Tokenizer:
    """The tokenizer to write `path`'s inputs in (the module docstring's rules); `override`
    is the user's spec (None or '' = not given)."""
    if not path:
        return load_tokenizer(override or DEFAULT_TOKENIZER)
    vocab_size, vocab_source = model_vocab_size(path)
    try:
        own = own_tokenizer_spec(path)
    except TokenizerError:
        if not override:
            raise
        own = None
    if override:
        tokenizer = load_tokenizer(override)
        if own is not None and load_tokenizer(own).fingerprint != tokenizer.fingerprint:
            log.warning("data.tokenizer=%s overrides the tokenizer of %s (%s): they differ", override, path, own)
    elif own is not None:
        tokenizer = load_tokenizer(own)
    elif vocab_size == DEFAULT_VOCAB_SIZE:
        tokenizer = load_tokenizer(DEFAULT_TOKENIZER)
    else:
        raise TokenizerError(
            f"{path} does not record its tokenizer and its vocab_size {vocab_size} is not that of "
            f"{DEFAULT_TOKENIZER}; set data.tokenizer (--tokenizer) to the one it was trained with"
        )
    check_vocabulary(tokenizer, vocab_size, vocab_source)
    return tokenizer


def check_vocabulary(tokenizer: Tokenizer, vocab_size: int, source: str) -> None:
    """A token id the model has no embedding row for would fail deep in the forward pass."""
    if tokenizer.vocab_size > vocab_size:
        raise TokenizerError(
            f"tokenizer {tokenizer.name} has {tokenizer.vocab_size} tokens, the model's vocab_size is {vocab_size} "
            f"({source}): not the tokenizer this model was trained with; set data.tokenizer to it"
        )
