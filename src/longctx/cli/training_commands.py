"""`longctx pretrain`, `sft`, `merge` (LongRecipe Eq. 7) and `impactful-tokens` (LongRecipe
§3.1)."""

from __future__ import annotations

import argparse

from longctx import config as config_module
from longctx.cli.common import split_overrides, user_tokenizer


def check_world_size(cfg: config_module.ExperimentConfig, paths: list[str], overrides: list[str]) -> None:
    """The global batch against this launch's world size, before any data is prepared: a
    config written for fewer devices than torchrun started is a `ConfigError` on
    `train.global_batch_tokens` naming the nearest valid values and where it was set."""
    from longctx.errors import ConfigError
    from longctx.train.trainer import batch_plan, world_size_from_environment

    try:
        batch_plan(cfg, world_size_from_environment(cfg))
    except ConfigError as error:
        raise config_module.locate(error, paths, overrides) from None


def cmd_pretrain(args: argparse.Namespace) -> int:
    from longctx.data.dataset_sources import prepared_sources
    from longctx.model_tokenizer import tokenizer_for_model
    from longctx.train.trainer import pretrain

    paths, overrides = split_overrides(args.items)
    cfg = config_module.load(paths, overrides)
    check_world_size(cfg, paths, overrides)
    tokenizer = tokenizer_for_model(cfg.init, user_tokenizer(cfg.data.tokenizer))
    sources = prepared_sources(cfg, tokenizer)
    trainer = pretrain(cfg, sources, tokenizer)
    if trainer.is_global_zero:
        print(f"run directory: {cfg.train.out_dir}\ncheckpoint:    {cfg.train.out_dir}/checkpoints/last.ckpt")
    return 0


def cmd_sft(args: argparse.Namespace) -> int:
    from longctx.model_tokenizer import tokenizer_for_model
    from longctx.train.sft import check_not_derived, check_sft_config, finetune

    paths, overrides = split_overrides(args.items)
    cfg = config_module.load(paths, overrides)
    check_not_derived(config_module.where_set(paths, overrides))
    check_sft_config(cfg)
    check_world_size(cfg, paths, overrides)
    trainer = finetune(cfg, tokenizer_for_model(cfg.init, user_tokenizer(cfg.data.tokenizer)))
    if trainer.is_global_zero:
        print(f"run directory: {cfg.train.out_dir}\ncheckpoint:    {cfg.train.out_dir}/checkpoints/last.ckpt")
    return 0


def cmd_merge(args: argparse.Namespace) -> int:
    from longctx.model.merge import merge_checkpoints, save_merged

    result = merge_checkpoints(args.checkpoints, args.weights, args.config_from)
    out = save_merged(result, args.out)
    for field, values in result.differing_fields.items():
        print(
            f"note: {field} differs: " + ", ".join(f"{v} ({c})" for v, c in zip(values, args.checkpoints, strict=True))
        )
    print(f"wrote {out} (config from {result.config_source})")
    return 0


def cmd_impactful_tokens(args: argparse.Namespace) -> int:
    from longctx.data.impactful_selection import REPORT_FILE, format_report
    from longctx.data.prepare import read_manifest
    from longctx.data.tokenizer import load_tokenizer
    from longctx.model_tokenizer import DEFAULT_TOKENIZER, tokenizer_for_model
    from longctx.probes.impactful_scoring import impactful_tokens

    manifest = read_manifest(args.data) or {}
    data_tokenizer = args.tokenizer or manifest.get("tokenizer", DEFAULT_TOKENIZER)
    if args.method == "digits":
        tokenizer = load_tokenizer(data_tokenizer)
    else:
        # The data's tokenizer, which the models' own must agree with (a warning when not).
        tokenizer = tokenizer_for_model(args.base, data_tokenizer)
        tokenizer_for_model(args.extended, data_tokenizer)
    report, selection = impactful_tokens(
        args.data,
        args.out,
        tokenizer,
        method=args.method,
        base=args.base,
        extended=args.extended,
        samples=args.samples,
        length=args.length,
        score=args.score,
        fraction=args.fraction,
        anchor_classes=args.anchor_classes.split(",") if args.anchor_classes else None,
        keep_other=args.keep_other,
        seed=args.seed,
        device=args.device,
    )
    if report["method"] == "logits":
        print(format_report(report))
    print(
        f"anchor classes {selection['anchor_classes']}: kept {selection['tokens_out']:,} of "
        f"{selection['tokens_in']:,} tokens in {selection['documents_out']} documents; wrote {args.out} "
        f"(report: {args.out}/{REPORT_FILE})"
    )
    return 0


def register(commands: argparse._SubParsersAction) -> None:
    train = commands.add_parser("pretrain", help="pretrain a model (also under torchrun)")
    train.add_argument(
        "items", nargs="*", metavar="CFG.yaml|key=value", help="YAML files and overrides, merged in order"
    )
    train.set_defaults(run=cmd_pretrain)
    sft = commands.add_parser("sft", help="supervised fine-tuning: normal, packed or SkipAlign rows (init=CKPT)")
    sft.add_argument("items", nargs="*", metavar="CFG.yaml|key=value", help="YAML files and overrides, merged in order")
    sft.set_defaults(run=cmd_sft)
    merge = commands.add_parser("merge", help="LongRecipe model merging: a weighted average of checkpoints (Eq. 7)")
    merge.add_argument("checkpoints", nargs="+", help="two or more checkpoints (.safetensors, .ckpt, HF directories)")
    merge.add_argument("--weights", type=float, nargs="+", help="one per checkpoint, summing to 1 (default: equal)")
    merge.add_argument(
        "--config-from",
        type=int,
        default=-1,
        help="index of the checkpoint whose config (max_position, RoPE) the result keeps (default: last)",
    )
    merge.add_argument("--out", required=True, help="output .safetensors file")
    merge.set_defaults(run=cmd_merge)
    impact = commands.add_parser(
        "impactful-tokens", help="LongRecipe §3.1: score tokens base vs extended, keep anchor sentences"
    )
    impact.add_argument("base", help="base model checkpoint (H)")
    impact.add_argument("extended", help="context-extended model checkpoint (H')")
    impact.add_argument("data", help="prepared dataset directory (longctx prepare)")
    impact.add_argument("--out", required=True, help="output directory: a prepared dataset of the kept sentences")
    impact.add_argument(
        "--method",
        choices=("logits", "digits"),
        default="logits",
        help="logits (score differences) | digits (the authors' digit heuristic; models unused)",
    )
    impact.add_argument("--fraction", type=float, default=0.2, help="top share of tokens by |delta| (paper: 0.2)")
    impact.add_argument("--score", choices=("logprob", "logit"), default="logprob", help="S in delta = S_H' - S_H")
    impact.add_argument("--samples", type=int, default=8, help="long samples scored")
    impact.add_argument("--length", type=int, default=0, help="tokens per sample (default: the extended max_position)")
    impact.add_argument("--anchor-classes", default="", help="comma list overriding the classes with lift > 1")
    impact.add_argument(
        "--keep-other",
        type=float,
        default=None,
        help="probability of keeping a sentence without an anchor (default 0; digits: 0.3)",
    )
    impact.add_argument("--tokenizer", default="", help="default: the dataset manifest's tokenizer")
    impact.add_argument("--seed", type=int, default=0, help="seed of the keep-other draws")
    impact.add_argument("--device", default="cpu", help="torch device for scoring")
    impact.set_defaults(run=cmd_impactful_tokens)
