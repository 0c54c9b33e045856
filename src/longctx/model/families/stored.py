"""Checkpoints whose files name or lay out tensors otherwise than transformers' modules do.

transformers 5 converts some checkpoints as it loads them and converts back as it saves
(its `conversion_mapping`): OLMo Hybrid's files hold `attention_layer_norm` /
`feedforward_layer_norm` for the modules' `input_layernorm` / `post_attention_layernorm`,
and each linear layer's convolution as three tensors `q_conv1d`, `k_conv1d`, `v_conv1d`
(OLMo-core's layout) where the module has one `conv1d` of their rows stacked. A family
with a `StoredForm` reads either form (the files as released and saved, or the modules'
names) and writes the released one, so the directory is what transformers itself saves:

    files = family.stored.view(WeightFiles.find(directory))   # the modules' names, lazily
    tensors = family.stored.write(tensors, config)             # the modules' names -> the files'

Qwen3-Next's RMSNorms multiply by 1 + weight. Imported, the model keeps that form
(`model.norm_offset`); a model trained without the offset writes weight - 1 for those norms
(`offset_norms`), the same product 1 + (w - 1) = w up to one rounding of w - 1.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from longctx.config.model import ModelConfig
from longctx.errors import CheckpointError


@dataclass(frozen=True)
class Join:
    """One module tensor stored as several, stacked along dim 0 in `parts` order."""

    name: str
    """The module's name, a suffix of the HF name (`linear_attn.conv1d.weight`)."""
    parts: tuple[str, ...]
    """The stored names, suffixes replacing `name` (`linear_attn.q_conv1d.weight`, ...)."""
    rows: Callable[[ModelConfig], tuple[int, ...]]
    """config -> the rows of each part (to split the module's tensor on export)."""


@dataclass(frozen=True)
class StoredForm:
    """How a family's files differ from its modules' names (module docstring)."""

    renames: tuple[tuple[str, str], ...] = ()
    """(stored, module) name components: `.{stored}.` in a file's name is the module's `.{module}.`."""
    joins: tuple[Join, ...] = ()
    offset_norms: tuple[str, ...] = ()
    """HF name suffixes of the norms that multiply by 1 + weight: written as weight - 1 from a
    model without `norm_offset`."""

    def view(self, files) -> StoredView:
        return StoredView(files, self)

    def write(self, tensors: dict[str, torch.Tensor], config: ModelConfig) -> dict[str, torch.Tensor]:
        """The modules' names -> the files' (renamed, joins split, offsets removed)."""
        out = {}
        for name, tensor in tensors.items():
            if not config.norm_offset and name.endswith(self.offset_norms):
                tensor = tensor - 1
            join = next((join for join in self.joins if name.endswith("." + join.name)), None)
            if join is None:
                out[self._stored(name)] = tensor
                continue
            prefix = name.removesuffix(join.name)
            for part, piece in zip(join.parts, tensor.split(list(join.rows(config))), strict=True):
                out[self._stored(prefix + part)] = piece.contiguous()
        return out

    def _stored(self, name: str) -> str:
        for stored, module in self.renames:
            name = name.replace(f".{module}.", f".{stored}.")
        return name

    def module_name(self, name: str) -> str:
        for stored, module in self.renames:
            name = name.replace(f".{stored}.", f".{module}.")
        return name


class StoredView:
    """A family's weight files under its modules' names (WeightFiles' interface): renamed
    tensors read as they are, joined ones stacked when read. A name found in both forms is
    an error naming both."""

    def __init__(self, files, form: StoredForm):
        self.files = files
        self.parts: dict[str, list[str]] = {}
        for stored in files.names():
            name, index = form.module_name(stored), None
            for join in form.joins:
                for position, part in enumerate(join.parts):
                    if name.endswith("." + part):
                        name, index = name.removesuffix(part) + join.name, (position, len(join.parts))
            if index is None:
                if name in self.parts:
                    raise CheckpointError(f"{files.source(stored)}: {stored} and {self.parts[name][0]} are both {name}")
                self.parts[name] = [stored]
                continue
            slots = self.parts.setdefault(name, [""] * index[1])
            if len(slots) != index[1] or slots[index[0]]:
                raise CheckpointError(f"{files.source(stored)}: {stored} is stored twice or beside {name}")
            slots[index[0]] = stored
        for name, slots in self.parts.items():
            if "" in slots:
                present = next(slot for slot in slots if slot)
                raise CheckpointError(
                    f"{files.source(present)}: {name} is stored in {len(slots)} parts, "
                    f"{slots.count('')} of them missing beside {present}"
                )

    def names(self) -> dict[str, list[str]]:
        return self.parts

    def shape(self, name: str) -> tuple[int, ...]:
        shapes = [self.files.shape(part) for part in self.parts[name]]
        if any(shape[1:] != shapes[0][1:] for shape in shapes):
            raise CheckpointError(f"{self.source(name)}: the parts of {name} have shapes {shapes}, unequal past dim 0")
        return (sum(shape[0] for shape in shapes), *shapes[0][1:])

    def read(self, name: str) -> torch.Tensor:
        parts = [self.files.read(part) for part in self.parts[name]]
        return parts[0] if len(parts) == 1 else torch.cat(parts)

    def source(self, name: str) -> Path:
        return self.files.source(self.parts[name][0])
