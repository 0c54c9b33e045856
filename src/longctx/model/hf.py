"""Hugging Face interop: directories of the registry's families (config.json + weights).

    longctx export-hf runs/tiny/last.ckpt hf/tiny     # then transformers/vLLM/lm-eval load hf/tiny
    export_hf(model, "hf/tiny");  model = import_hf("hf/tiny", dtype=torch.bfloat16, device="cuda")

Our parameter names are short (`blocks.3.attn.wq`); this module owns the one mapping to
the HF names (`model.layers.3.self_attn.q_proj`; Phi-3's fused `qkv_proj` / `gate_up_proj`
and Qwen3-Next's q_proj of query and gate rows per head read and written by rows,
`Family.fused`; OLMo Hybrid's renamed and split tensors through `Family.stored`; a linear
layer's names by `Family.linear_names`). The channel layout is already HF's rotate-half
RoPE layout, so no weight is permuted. config.json is mapped by
model/hf_config.py (which refuses, by field, what longctx cannot represent); the weight
files are read by model/weight_files.py.

`import_hf` builds the model on the meta device, allocates it once in the target dtype and
device, and copies the tensors in one at a time: peak memory is the model in that dtype
plus the largest tensor as stored (not an fp32 model plus a second copy of every tensor).
Tied embeddings are one Parameter; an `lm_head.weight` a tied file still carries is
ignored, as transformers ignores it.

`export-hf` also writes the run's tokenizer (tokenizer.json + tokenizer_config.json) and the
bos/eos/pad ids (config.json, generation_config.json), so `AutoTokenizer` loads the
directory and `generate()` stops at EOS. A tied model is written as transformers writes
one: `tie_word_embeddings: true` and no `lm_head.weight`.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from longctx.data.tokenizer import Tokenizer
from longctx.errors import CheckpointError
from longctx.model.families import family_for, family_for_export
from longctx.model.families.common import Family, Rows
from longctx.model.families.llama import LLAMA
from longctx.model.hf_config import CONFIG_FILE, hf_config
from longctx.model.llama import Llama
from longctx.model.materialize import materialize, meta_model, weights
from longctx.model.weight_files import WeightFiles

WEIGHTS_FILE = "model.safetensors"
TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
GENERATION_CONFIG_FILE = "generation_config.json"


def hf_name(name: str, family: Family = LLAMA) -> str:
    """Our parameter name -> the HF name in `family` (default: LlamaForCausalLM's)."""
    return family.hf_name(name)


def export_hf(
    model: Llama, out_dir: str | Path, dtype: torch.dtype | None = None, tokenizer: Tokenizer | None = None
) -> Path:
    """Write `model` as an HF directory of the family that carries it (family_for_export); returns it.

    With `tokenizer`, the directory is complete for `AutoTokenizer` + `AutoModelForCausalLM`
    + `generate()`: tokenizer.json and tokenizer_config.json, the bos/eos/pad ids in
    config.json and generation_config.json (without them transformers falls back to
    Llama's eos id 2, an ordinary token of our vocabularies, and generation never stops).
    """
    config = hf_config(model.config)  # first: it refuses what config.json cannot carry
    family = family_for_export(model.config)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tensors = {}
    fused: dict[str, list[tuple[Rows, torch.Tensor]]] = {}
    for name, tensor in weights(model).items():
        tensor = tensor.detach().to("cpu", dtype=dtype or tensor.dtype).contiguous()
        part = family.rows(name, model.config)
        if part is None:
            tensors[family.hf_name(name, model.config)] = tensor
        else:  # Phi-3's qkv_proj / gate_up_proj, Qwen3-Next's q_proj: our tensors stacked by their rows
            fused.setdefault(family.hf_name(name, model.config), []).append((part, tensor))
    for key, parts in fused.items():
        parts.sort(key=lambda part: part[0].start)
        groups, rest = parts[0][0].groups, parts[0][1].shape[1:]
        blocks = [tensor.reshape(groups, -1, *rest) for _, tensor in parts]
        tensors[key] = torch.cat(blocks, dim=1).reshape(-1, *rest)
    if family.stored is not None:
        tensors = family.stored.write(tensors, model.config)
    if dtype is not None:
        config["torch_dtype"] = str(dtype).removeprefix("torch.")
    if tokenizer is not None:
        if tokenizer.vocab_size > model.config.vocab_size:
            raise CheckpointError(
                f"tokenizer {tokenizer.name} has {tokenizer.vocab_size} tokens, the model's vocab_size is "
                f"{model.config.vocab_size}: not the tokenizer this model was trained with"
            )
        special_ids = {
            "bos_token_id": tokenizer.bos_id,
            "eos_token_id": tokenizer.eos_id,
            "pad_token_id": tokenizer.pad_id,
        }
        config.update(special_ids)
        _write_tokenizer(tokenizer, out, model.config.max_position, special_ids)
        (out / GENERATION_CONFIG_FILE).write_text(json.dumps(special_ids, indent=2) + "\n")
    save_file(tensors, out / WEIGHTS_FILE, metadata={"format": "pt"})
    (out / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
    return out


def _write_tokenizer(tokenizer: Tokenizer, out: Path, max_position: int, special_ids: dict) -> None:
    """tokenizer.json (the HF `tokenizers` definition) and the tokenizer_config.json that
    `AutoTokenizer` reads: the special tokens (`special_ids`: `bos_token_id`, ...) by
    spelling, no BOS/EOS added on encode (as `Tokenizer.encode`), the model's context as
    `model_max_length`."""
    tokenizer.hf_tokenizer.save(str(out / TOKENIZER_FILE))
    spelled = {
        key.removesuffix("_id"): None if token_id is None else tokenizer.token(token_id)
        for key, token_id in special_ids.items()
    }
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        **spelled,
        "add_bos_token": False,
        "add_eos_token": False,
        "model_max_length": max_position,
        "clean_up_tokenization_spaces": False,
    }
    (out / TOKENIZER_CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")


def import_hf(directory: str | Path, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu") -> Llama:
    """Load an HF Llama / Mistral / Qwen2 directory into a Llama with parameters of `dtype`
    on `device`, one tensor at a time. Every file, name and shape is checked before the
    model is allocated."""
    directory = Path(directory)
    config_path = directory / CONFIG_FILE
    if not config_path.exists():
        raise FileNotFoundError(f"{config_path} not found: not a Hugging Face model directory")
    try:
        hf = json.loads(config_path.read_text())
    except json.JSONDecodeError as error:
        raise CheckpointError(f"{config_path}: not valid JSON ({error})") from None
    family = family_for(hf.get("model_type"), str(config_path))
    config = family.read(hf, str(config_path))
    found = WeightFiles.find(directory)
    # OLMo Hybrid's files: renamed norms, the convolution in three
    files = found if family.stored is None else family.stored.view(found)
    model = meta_model(config)
    shapes = {name: tuple(t.shape) for name, t in weights(model).items()}
    rows = {name: family.rows(name, config) for name in shapes}
    keys = {name: family.hf_name(name, config) for name in shapes}
    wanted = {key: name for name, key in keys.items()}
    for name, shape in shapes.items():
        key = keys[name]
        if key not in files.names():
            raise CheckpointError(f"{directory}: tensor {key} (for {name}) is missing")
        stored, part = files.shape(key), rows[name]
        expected = shape if part is None else (_fused_rows(key, keys, rows), *shape[1:])
        if stored != expected:
            raise CheckpointError(f"{files.source(key)}: {key} has shape {stored}, expected {expected}")
    ignored = {"lm_head.weight"} if config.tie_embeddings else set()
    unused = [
        k for k in files.names() if k not in wanted and k not in ignored and not k.endswith("rotary_emb.inv_freq")
    ]
    if unused:
        raise CheckpointError(f"{directory}: unexpected tensors {unused[:5]}{' ...' if len(unused) > 5 else ''}")

    def read(name: str) -> torch.Tensor:
        tensor = files.read(keys[name])
        part = rows[name]
        if part is None:
            return tensor
        blocks = tensor.reshape(part.groups, -1, *tensor.shape[1:])
        return blocks[:, part.start : part.stop].reshape(-1, *tensor.shape[1:])

    return materialize(model, read, dtype, device)


def _fused_rows(key: str, keys: dict, rows: dict) -> int:
    """The rows a fused HF tensor must have: the last row of the parts read from it, per block."""
    parts = [rows[name] for name, hf in keys.items() if hf == key and rows[name] is not None]
    return max(part.stop for part in parts) * parts[0].groups
