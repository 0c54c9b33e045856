"""Resume checks compatibility first: a checkpoint continues only the run that wrote it.

`train.resume=auto|PATH` restores weights, AdamW state, schedule, step and the probes'
state (train/trainer.py). Before any of it is loaded, the run config saved in the
checkpoint (its `hyper_parameters["config"]`, `LanguageModelModule.save_hyperparameters`)
is compared with this run's, and every key of `RESUME_FIXED` that differs is named with
the checkpoint's value and the run's, in one `ConfigError`:

- the model's shapes (`config.model.SHAPE_FIELDS`: vocabulary, width, depth, heads, FFN,
  tying, biases): the state would not load;
- its positions (`max_position`, `rope_base`, `rope_scaling.*`) and `norm_eps`: the same
  tensors would compute another function, so the saved optimizer state and schedule no
  longer belong to it;
- the vocabulary the rows are tokenised with (`data.tokenizer`), the window and the
  position transform (`data.window`, `data.position_transform`, `data.target_length`):
  the rows, the data position (global row step x rows per step) and the f(i) probe's
  histogram (sized by the window) would not continue.

Starting a new run from the checkpoint's weights under a changed window, positions or RoPE
is what `init=PATH` does (context extension; the shapes must still agree).

Everything else may change on resume, among them (tests/train/test_resume_check.py and
tests/train/test_pretrain.py resume with each changed): the schedule length
(`train.max_steps`: the LR lambda is rebuilt from the run's config), the checkpoint,
logging and probe cadences (`train.checkpoint_every_steps`, `log.*`, `probe.*`), and the
world size (`train.devices`, `train.num_nodes`, torchrun's): checkpoints are consolidated
(one file, also under FSDP2) and the data position is global, so they reshard on load.
"""

from __future__ import annotations

from pathlib import Path

from longctx.config import ExperimentConfig, as_dict
from longctx.config.model import SHAPE_FIELDS
from longctx.errors import ConfigError

RESUME_FIXED = (
    *(f"model.{field}" for field in SHAPE_FIELDS),
    "model.head_dim",  # SHAPE_FIELDS has the resolved head_size, which the saved config does not hold
    "model.rotary_fraction",
    "model.partial_rotary",
    "model.attn_temperature",
    "model.max_position",
    "model.rope_base",
    "model.rope_scaling",
    "model.norm_eps",
    "data.tokenizer",
    "data.window",
    "data.position_transform",
    "data.target_length",
)
"""Dotted config keys (or sections) a resumed run must share with its checkpoint."""


def dotted(values: dict, prefix: str = "") -> dict[str, object]:
    """A nested dict as one level keyed by dotted paths ({"a": {"b": 1}} -> {"a.b": 1})."""
    flat: dict[str, object] = {}
    for key, value in values.items():
        if isinstance(value, dict):
            flat.update(dotted(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def resume_mismatches(saved: dict, config: ExperimentConfig) -> list[str]:
    """'key: checkpoint VALUE, this run VALUE' for every `RESUME_FIXED` key that differs."""
    old, new = dotted(saved), dotted(as_dict(config))
    mismatches = []
    for key in sorted(set(old) | set(new)):
        if not any(key == fixed or key.startswith(f"{fixed}.") for fixed in RESUME_FIXED):
            continue
        if key in old and old[key] != new.get(key):
            mismatches.append(f"{key}: checkpoint {old[key]!r}, this run {new.get(key)!r}")
    return mismatches


def check_resume_compatible(path: Path, checkpoint: dict, config: ExperimentConfig) -> None:
    """Raise ConfigError naming every key whose change makes `checkpoint` unusable here."""
    saved = checkpoint.get("hyper_parameters", {}).get("config")
    if saved is None:
        return  # written without the run config (by another tool): nothing to compare
    mismatches = resume_mismatches(saved, config)
    if mismatches:
        raise ConfigError(
            "train.resume",
            f"{path} cannot continue this run: its config differs in keys a resumed run must keep:\n  "
            + "\n  ".join(mismatches)
            + f"\nRestore those keys to resume, or start a new run from its weights with init={path} in a new "
            "train.out_dir (init= allows another window, position transform, max_position and RoPE; "
            "the shapes must match)",
        )
