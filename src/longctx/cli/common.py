"""What the command modules share: overrides split from YAML paths, the user's tokenizer,
`${key}` references in checkpoint paths, and the evaluation commands' set-up."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from longctx import config as config_module
from longctx.errors import ConfigError


def split_overrides(items: list[str]) -> tuple[list[str], list[str]]:
    paths = [item for item in items if "=" not in item]
    overrides = [item for item in items if "=" in item]
    return paths, overrides


CONFIG_SUFFIXES = (".yaml", ".yml")


def checkpoints_and_config(items: list[str]) -> tuple[list[str], list[str]]:
    """The positional items of a command over several checkpoints, told apart by form:
    `key=value` (an `=`) and `CFG.yaml` (its suffix) configure, anything else is a
    checkpoint; each kind keeps its order."""
    configuring = [item for item in items if "=" in item or item.endswith(CONFIG_SUFFIXES)]
    return [item for item in items if item not in configuring], configuring


class RefusedSet(argparse.Action):
    """`--set`, which the evaluation commands no longer take: an error naming the new form."""

    def __init__(self, option_strings, dest, example: str = "", **kwargs):
        self.example = example
        super().__init__(option_strings, dest, nargs=1, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        parser.error(
            f"--set {values[0]}: --set is gone; give CFG.yaml and key=value positionally after the checkpoints, "
            f"as pretrain, sft and niah take them: {self.example}"
        )


def user_tokenizer(configured: str) -> str | None:
    """data.tokenizer when the user set it: a value other than the default (the default
    itself cannot be told apart from an unset key, so it never overrides a model's own)."""
    from longctx.config import DataConfig

    return None if configured == DataConfig.tokenizer else configured


def interpolate(path: str, cfg) -> str:
    """A checkpoint path with `${key}` references to config keys filled in (as an override's
    interpolation is), so one sweep can point each grid point at its own checkpoint:
    `runs/x/w512_s${train.seed}/checkpoints/last.ckpt`."""
    import re

    from omegaconf import OmegaConf

    values = OmegaConf.create(config_module.as_dict(cfg))

    def value(match: re.Match) -> str:
        found = OmegaConf.select(values, match.group(1), default=None)
        if found is None:
            raise ConfigError(
                match.group(1), f"is not a config key with a value; the checkpoint path {path} refers to it"
            )
        return str(found)

    return re.sub(r"\$\{([A-Za-z0-9_.]+)\}", value, path)


def evaluation_setup(items: list[str], checkpoints: list[str]):
    """(config, the checkpoints' tokenizer (`tokenizer_for_model`: one for all of them), the
    haystack tokenised in it, checkpoints with their `${key}` references filled in)."""
    from longctx.eval.niah.evaluation import load_haystack
    from longctx.model_tokenizer import tokenizer_for_model

    paths, overrides = split_overrides(items)
    cfg = config_module.load(paths, overrides)
    checkpoints = [interpolate(path, cfg) for path in checkpoints]
    if cfg.eval.threads:
        import torch

        torch.set_num_threads(cfg.eval.threads)
    override = user_tokenizer(cfg.data.tokenizer)
    tokenizers = {path: tokenizer_for_model(path, override) for path in checkpoints}
    if len({t.fingerprint for t in tokenizers.values()}) > 1:
        listing = ", ".join(f"{path}: {t.name}" for path, t in tokenizers.items())
        raise ConfigError("data.tokenizer", f"the checkpoints come with different tokenizers ({listing})")
    tokenizer = next(iter(tokenizers.values()))
    return cfg, tokenizer, load_haystack(cfg, tokenizer), checkpoints


def table_setup(command: str, items: list[str], out: str, cells: str):
    """A table over several checkpoints (eval-suite, niah-table): `evaluation_setup` of the
    checkpoints among `items`, then the output directory (that of `out`, else eval.out_dir)
    and the cell directory (`cells`, else cells/ in it)."""
    checkpoints, configuring = checkpoints_and_config(items)
    if not checkpoints:
        raise ConfigError(command, f"no checkpoint among {items} (CFG.yaml and key=value configure)")
    cfg, tokenizer, haystack, checkpoints = evaluation_setup(configuring, checkpoints)
    out_dir = Path(out).parent if out else Path(cfg.eval.out_dir)
    return cfg, tokenizer, haystack, checkpoints, out_dir, Path(cells) if cells else out_dir / "cells"


def evaluation_ranks(cfg):
    """The evaluation's ranks (eval/ranks.py): torchrun's process group joined on each rank's
    eval.device (cuda:LOCAL_RANK), or this process alone; a context manager."""
    from longctx.eval.model_setup import evaluation_device
    from longctx.eval.ranks import Ranks

    return Ranks.joined(evaluation_device(cfg.eval.device))


def table_arms(cfg, methods: str, subset: str = "") -> dict:
    """The table's arms: `eval.arms` when the config names them, else one arm per name in
    `methods` (a registered method or arm, e.g. string-repo; empty = every registered
    method) under eval.position_method's settings; `subset` keeps only the arms it names."""
    from longctx.config.methods.registry import method_names
    from longctx.config.position_methods import arm_config

    names = methods.split(",") if methods else list(method_names())
    arms = cfg.eval.arms or {name: arm_config(name, cfg.eval.position_method, "--methods") for name in names}
    if not subset:
        return arms
    unknown = [name for name in subset.split(",") if name not in arms]
    if unknown:
        raise ConfigError("eval.arms", f"--arms names {unknown}, which are not among the arms {sorted(arms)}")
    return {name: arms[name] for name in subset.split(",")}


def load_table_models(checkpoints: list[str], cfg) -> dict:
    """Each checkpoint's model in host memory (`place_models` puts it on eval.device), named
    by its run directory (a .ckpt's runs/NAME/checkpoints/last.ckpt) or its own directory /
    file name."""
    from longctx.eval.model_setup import with_eval_temperature
    from longctx.model.checkpoint import load_model

    models = {}
    for path in checkpoints:
        name = Path(path).parent.parent.name if path.endswith(".ckpt") else Path(path).name
        models[name] = with_eval_temperature(load_model(path), cfg.eval).fuse_projections_()
    return models


def place_models(models: dict, cfg, ranks, lengths: list[int], tests: int):
    """The models on each rank's eval.device, whole or sharded over the node's ranks as the
    memory estimate of the longest length decides (eval/layout.py; rank 0 prints the
    estimate and the layout first); returns the ranks the grid is dealt to."""
    import sys

    from longctx.eval.cells import Decoding
    from longctx.eval.layout import choose_layout
    from longctx.eval.layout import place_models as place
    from longctx.eval.model_setup import evaluation_device

    device = evaluation_device(cfg.eval.device)
    longest = max(lengths)
    largest = max(models.values(), key=lambda model: model.config.num_parameters())
    layout = choose_layout(
        largest.config,
        ranks,
        device,
        length=longest,
        rows=Decoding(batch_tokens=cfg.eval.niah.batch_tokens).rows(longest),
        tests=tests,
        new_tokens=cfg.eval.niah.max_new_tokens,
        prefill_chunk_tokens=cfg.eval.niah.prefill_chunk_tokens,
        limit_gib=cfg.eval.memory_limit_gib,
    )
    if ranks.lead:
        print(layout.describe(), file=sys.stderr, flush=True)
    return place(models, layout, ranks, device)


def write_table(out: str, text: str, table: dict) -> None:
    """The Markdown table at `out` and its numbers beside it as .json (nothing when out is empty)."""
    if not out:
        return
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(text + "\n")
    Path(out).with_suffix(".json").write_text(json.dumps(table, indent=1) + "\n")
