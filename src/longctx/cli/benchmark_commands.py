"""`longctx eval-suite` (a registered benchmark's tasks as tables on the evaluation engine),
`longctx eval-score` (a prediction file scored by its benchmark's rules) and `longctx
benchmarks` (the registered benchmarks, their categories and tasks).

    longctx eval-suite hf/smollm2 --suite ruler --lengths 1024,2048,4096 --methods rope,string \
        eval.benchmarks.samples_per_length=50 --out runs/ruler/table.md

    longctx eval-score --task niah_multikey_2 pred/niah_multikey_2.jsonl
    {"task": "niah_multikey_2", "score": 87.4, "n": 500}

The file is RULER's prediction format: one JSON object per line with `pred` (the generated
text) and `outputs` (the references; for an InfiniteBench task the first is the answer); a
benchmark may read its own format too (HELMET: its eval.py's output JSON, `--task helmet_nq`).
The score (0-100) is the one longctx's own evaluation computes, so predictions made
elsewhere (vLLM, the reference scripts) compare with ours. `--suite`'s choices, `--tasks`
and `--task` are read from the benchmark registry (longctx.eval.registry).
"""

from __future__ import annotations

import argparse
import json

from longctx.cli.common import (
    RefusedSet,
    evaluation_ranks,
    load_table_models,
    place_models,
    table_arms,
    table_setup,
    write_table,
)


def cmd_eval_suite(args: argparse.Namespace) -> int:
    from longctx.eval.cell_progress import CellProgress
    from longctx.eval.suite_table import format_markdown, log_suite, run_suite, suite_tasks

    cfg, tokenizer, haystack, checkpoints, out_dir, cells_dir = table_setup(
        "eval-suite", args.items, args.out, args.cells
    )
    arms = table_arms(cfg, args.methods)
    names = args.tasks.split(",") if args.tasks else None
    tasks = suite_tasks(args.suite, names, cfg, haystack)
    lengths = [int(length) for length in args.lengths.split(",")]
    with evaluation_ranks(cfg) as ranks:
        models = load_table_models(checkpoints, cfg)
        ranks = place_models(models, cfg, ranks, lengths, cfg.eval.benchmarks.samples_per_length)
        with CellProgress(quiet=args.quiet or not ranks.lead) as progress:
            table, results = run_suite(
                models,
                arms,
                cfg,
                tokenizer,
                tasks,
                lengths,
                suite=args.suite,
                cells_dir=cells_dir,
                progress=progress,
                ranks=ranks,
            )
    if not ranks.lead:  # rank 0 writes and logs the table every rank assembled
        return 0
    text = format_markdown(table)
    print(text)
    write_table(args.out, text, table)
    log_suite(cfg, table, results, out_dir)
    return 0


def cmd_eval_score(args: argparse.Namespace) -> int:
    from longctx.eval.predictions import read_predictions
    from longctx.eval.registry import scored_task

    spec, task = scored_task(args.task)
    assert spec.score_file is not None  # scored_task returns only benchmarks that score files
    predictions, references = (spec.read_file or read_predictions)(args.predictions)
    options = {
        "compat": args.compat,
        "nli": args.nli,
        "judge": args.judge,
        "helmet_data": args.helmet_data,
        "path": args.predictions,
    }
    score = spec.score_file(task, predictions, references, options)
    scores = score if isinstance(score, dict) else {"score": score}
    print(json.dumps({"task": task, **scores, "n": len(predictions)}))
    return 0


def cmd_benchmarks(args: argparse.Namespace) -> int:
    """Every registered benchmark (plugins included): what `--suite` takes, its tasks by
    category (what `--tasks` takes; a category stands for its tasks), and whether
    `eval-score` scores its prediction files."""
    from longctx.eval.registry import benchmark_names, benchmark_spec

    for name in benchmark_names():
        spec = benchmark_spec(name)
        origin = "" if spec.in_tree else f", plugin from {spec.origin}"
        scores = ", eval-score" if spec.score_file else ""
        print(f"{name}  [{len(spec.tasks)} tasks{scores}{origin}]  {spec.summary}")
        grouped = spec.categories()
        for category, tasks in grouped.items():
            print(f"    {category}: {', '.join(tasks)}")
        plain = [task for task, category in spec.tasks.items() if not category]
        if plain:
            print(f"    {', '.join(plain)}")
    return 0


class RegisteredBenchmarks:
    """`--suite`'s choices: the benchmark registry's names, read only when argparse checks a
    value or prints help, so that building the parser imports no benchmark (`longctx
    config` runs without the evaluation code)."""

    @staticmethod
    def names() -> tuple[str, ...]:
        from longctx.eval.registry import benchmark_names

        return benchmark_names()

    def __contains__(self, name: object) -> bool:
        return name in self.names()

    def __iter__(self):
        return iter(self.names())

    def __len__(self) -> int:
        return len(self.names())


def register(commands: argparse._SubParsersAction) -> None:
    suite = commands.add_parser(
        "eval-suite",
        help="a registered benchmark: methods x tasks per length (STRING Tables 2-3)",
    )
    suite.add_argument(
        "items",
        nargs="+",
        metavar="CKPT|CFG.yaml|key=value",
        help="checkpoints or HF directories (each a model), then YAML files and overrides (told by .yaml or =)",
    )
    suite.add_argument(
        "--suite",
        required=True,
        choices=RegisteredBenchmarks(),
        metavar="SUITE",
        help="a registered benchmark: %(choices)s",
    )
    suite.add_argument(
        "--tasks",
        default="",
        help="comma-separated tasks or categories of the suite (`longctx benchmarks` lists them; default: all it can run)",
    )
    suite.add_argument("--lengths", required=True, help="comma-separated context lengths")
    suite.add_argument("--methods", default="rope", help="position methods (ignored when the config sets eval.arms)")
    suite.add_argument(
        "--set",
        action=RefusedSet,
        example="longctx eval-suite CKPT experiments/real/smollm2_ruler.yaml eval.benchmarks.samples_per_length=5 "
        "--suite ruler --lengths 4096",
        help=argparse.SUPPRESS,
    )
    suite.add_argument("--out", default="", help="write the markdown table here (and its numbers as .json)")
    suite.add_argument("--cells", default="", help="cell directory (default: next to --out, or eval.out_dir/cells)")
    suite.add_argument("--quiet", action="store_true", help="no progress bars")
    suite.set_defaults(run=cmd_eval_suite)
    score = commands.add_parser(
        "eval-score",
        help="score a prediction file by its benchmark's rules (RULER, InfiniteBench, HELMET's own output JSON)",
    )
    score.add_argument(
        "predictions", help="JSON lines with 'pred' and 'outputs' (HELMET: also its eval.py's output JSON)"
    )
    score.add_argument(
        "--task",
        required=True,
        help="a task of a benchmark that scores prediction files (RULER's niah_single_1 ... qa_2, InfiniteBench's "
        "passkey ..., HELMET's nq or helmet_nq ...; `longctx benchmarks` lists them)",
    )
    score.add_argument(
        "--compat",
        default="string",
        choices=("string", "infinitebench"),
        help="math_find: STRING's int(float(x)) (default) or InfiniteBench's int(x)",
    )
    score.add_argument(
        "--nli",
        default="",
        help="HELMET's ALCE tasks: a local NLI model directory for citation recall/precision "
        "(HELMET: google/t5_xxl_true_nli_mixture); they are refused without one",
    )
    score.add_argument(
        "--judge",
        default="",
        help="HELMET's NarrativeQA, InfiniteBench Sum and Multi-LexSum: a local chat model directory judging the "
        "outputs by HELMET's GPT-4o prompts (a deviation: HELMET uses GPT-4o); the n-gram metrics are reported beside it",
    )
    score.add_argument(
        "--helmet-data",
        default="",
        help="HELMET's data/ directory (as eval.benchmarks.helmet_dir): the summaries' --judge reads HELMET's key "
        "points there (infbench/longbook_sum_eng_keypoints.jsonl, multi_lexsum/multi_lexsum_val.jsonl)",
    )
    score.set_defaults(run=cmd_eval_score)
    listing = commands.add_parser("benchmarks", help="the registered benchmarks, their categories and tasks")
    listing.set_defaults(run=cmd_benchmarks)
