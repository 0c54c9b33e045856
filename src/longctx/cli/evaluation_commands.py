"""`longctx niah` (the effective-length search) and `niah-table` (STRING Table 1 / Table 4)."""

from __future__ import annotations

import argparse
from pathlib import Path

from longctx.cli.common import (
    RefusedSet,
    evaluation_ranks,
    evaluation_setup,
    load_table_models,
    place_models,
    table_arms,
    table_setup,
    write_table,
)


def cmd_niah(args: argparse.Namespace) -> int:
    from longctx.eval.cell_progress import CellProgress
    from longctx.eval.model_setup import with_eval_temperature
    from longctx.eval.niah.evaluation import (
        SEARCH_MODEL,
        evaluate,
        format_search,
        log_to_wandb,
        method_settings,
        search_settings,
        write_result,
    )
    from longctx.model.checkpoint import load_model

    items = [*args.items, f"eval.niah.lengths=[{args.lengths}]"] if args.lengths else args.items
    cfg, tokenizer, haystack, (checkpoint,) = evaluation_setup(items, [args.checkpoint])
    with evaluation_ranks(cfg) as ranks:
        model = with_eval_temperature(load_model(checkpoint), cfg.eval).fuse_projections_()
        lengths = search_settings(cfg, model).evaluated_lengths() or [model.config.max_position]
        ranks = place_models({SEARCH_MODEL: model}, cfg, ranks, lengths, cfg.eval.niah.tests_per_length)
        out_dir = args.out or cfg.eval.out_dir
        with CellProgress(quiet=not ranks.lead) as progress:
            cells = Path(out_dir) / "cells"
            result = evaluate(model, cfg, tokenizer, haystack, progress=progress, cells_dir=cells, ranks=ranks)
    if not ranks.lead:  # rank 0 writes and logs the result every rank computed
        return 0
    print(format_search(result))
    title = f"{checkpoint} ({cfg.eval.position_method.name})"
    numbers, figure = write_result(result, out_dir, title, position_method=method_settings(cfg, model))
    log_to_wandb(result, cfg, figure, job="niah", out_dir=out_dir)
    print(f"wrote {numbers} and {figure}")
    return 0


def cmd_niah_table(args: argparse.Namespace) -> int:
    from longctx.eval.cell_progress import CellProgress
    from longctx.eval.niah.table import format_table, log_table, method_table

    cfg, tokenizer, haystack, checkpoints, out_dir, cells_dir = table_setup(
        "niah-table", args.items, args.out, args.cells
    )
    arms = table_arms(cfg, args.methods, args.arms)
    lengths = [int(length) for length in args.lengths.split(",")] if args.lengths else None
    with evaluation_ranks(cfg) as ranks:
        models = load_table_models(checkpoints, cfg)
        tested = lengths or [model.config.max_position for model in models.values()]
        ranks = place_models(models, cfg, ranks, tested, cfg.eval.niah.tests_per_length)
        with CellProgress(quiet=args.quiet or not ranks.lead) as progress:
            table, results = method_table(
                models, arms, cfg, tokenizer, haystack, lengths, cells_dir=cells_dir, progress=progress, ranks=ranks
            )
    if not ranks.lead:  # rank 0 writes and logs the table every rank assembled
        return 0
    text = format_table(table, list(arms))
    print(text)
    write_table(args.out, text, table)
    log_table(cfg, table, results, list(arms), out_dir)
    return 0


def register(commands: argparse._SubParsersAction) -> None:
    niah = commands.add_parser("niah", help="effective context length by the 4-needle NIAH test")
    niah.add_argument(
        "checkpoint", help="longctx .safetensors, Lightning .ckpt, or HF directory; ${key} takes a config value"
    )
    niah.add_argument("items", nargs="*", metavar="CFG.yaml|key=value", help="eval.* settings (YAML files, overrides)")
    niah.add_argument("--out", default="", help="where niah.json and the heatmap PNG go (default: eval.out_dir)")
    niah.add_argument(
        "--lengths",
        default="",
        help="comma-separated context lengths to evaluate in full, no search (eval.niah.lengths)",
    )
    niah.set_defaults(run=cmd_niah)
    table = commands.add_parser(
        "niah-table", help="STRING Table 1: NIAH accuracy at the training length, methods x models"
    )
    table.add_argument(
        "items",
        nargs="+",
        metavar="CKPT|CFG.yaml|key=value",
        help="checkpoints (each a model column), then eval.* settings: YAML files and overrides (told by .yaml or =)",
    )
    table.add_argument(
        "--methods",
        default="",
        help="comma-separated methods or arms (`longctx methods` lists them; default: every registered method) "
        "under eval.position_method's settings (ignored when the config sets eval.arms)",
    )
    table.add_argument(
        "--arms", default="", help="comma-separated subset of the arms (eval.arms, else --methods) to evaluate"
    )
    table.add_argument(
        "--set",
        action=RefusedSet,
        example="longctx niah-table CKPT experiments/real/smollm2_table1.yaml eval.niah.tests_per_length=2",
        help=argparse.SUPPRESS,
    )
    table.add_argument(
        "--lengths", default="", help="comma-separated test lengths (default: each model's training length)"
    )
    table.add_argument("--out", default="", help="also write the markdown table here (and its numbers as .json)")
    table.add_argument(
        "--cells",
        default="",
        help="where each cell's records and summary go, reused by a rerun (default: cells/ beside --out, "
        "else under eval.out_dir)",
    )
    table.add_argument("--quiet", action="store_true", help="no progress bar and no line per finished cell")
    table.set_defaults(run=cmd_niah_table)
    methods = commands.add_parser("methods", help="the registered position methods and arms, with their parameters")
    methods.set_defaults(run=cmd_methods)


def cmd_methods(args: argparse.Namespace) -> int:
    """Every registered position method (plugins included) with its parameters and
    defaults, then the arms: what `eval.position_method.name`, `--methods` and
    `attn_implementation="longctx_<name>"` accept."""
    import dataclasses

    from longctx.config.methods.registry import arm_names, arm_spec, field_docs, method_names, method_spec

    for name in method_names():
        spec = method_spec(name)
        origin = f"plugin from {spec.plugin}" if spec.plugin else "in-tree"
        print(f"{name}  [{spec.kind}, {origin}]  {spec.summary}")
        docs = field_docs(spec.params)
        for field in dataclasses.fields(spec.params):
            print(f"    {field.name} = {field.default!r}  {docs[field.name]}")
    print("arms:")
    for name in arm_names():
        arm = arm_spec(name)
        presets = ", ".join(f"{key}={value!r}" for key, value in arm.params.items())
        print(f"  {name} = {arm.method} with {presets}  {arm.summary}")
    return 0
