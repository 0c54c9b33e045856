"""`longctx lm-eval ARGS...`: lm-evaluation-harness's own command line with the `longctx`
model registered (src/longctx/eval/lm_eval.py), and longctx's attention functions
registered in transformers (longctx.hf_attention), so lm-eval's own `hf` model runs them:

    longctx lm-eval --model longctx --tasks niah_single_1 --metadata '{"max_seq_lengths": [4096]}' \\
        --model_args pretrained=runs/a/checkpoints/last.ckpt position_method=string string.shift=1365
    longctx lm-eval --model hf --tasks niah_single_1 \\
        --model_args pretrained=hf/SmolLM2,attn_implementation=longctx_string

lm-eval 0.4.13 finds models only in its own registry (no entry points), so its `lm-eval`
script cannot see `longctx`; this command imports the module that registers it and runs
lm-eval's CLI on ARGS, unchanged (`longctx lm-eval ls tasks`, `--help`, `run ...` too).
"""

from __future__ import annotations

import argparse
import sys


def cmd_lm_eval(args: argparse.Namespace) -> int:
    from lm_eval.__main__ import cli_evaluate

    import longctx.eval.lm_eval  # registers the model name "longctx"
    import longctx.hf_attention  # noqa: F401  (registers attn_implementation=longctx_string, ... for `--model hf`)

    sys.argv = ["lm-eval", *args.arguments]
    cli_evaluate()
    return 0


def register(commands: argparse._SubParsersAction) -> None:
    # prefix_chars="+": every argument, "--model" included, is lm-eval's, passed on untouched
    harness = commands.add_parser(
        "lm-eval",
        help="lm-evaluation-harness's CLI with the longctx model (--model longctx) and the longctx_* attention "
        "implementations for --model hf (needs longctx[lm-eval])",
        add_help=False,
        prefix_chars="+",
    )
    harness.add_argument("arguments", nargs=argparse.REMAINDER, help="lm-eval's arguments")
    harness.set_defaults(run=cmd_lm_eval)
