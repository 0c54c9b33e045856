"""`longctx eval-score`: a prediction file scored by RULER's or InfiniteBench's rules.

    longctx eval-score --task niah_multikey_2 pred/niah_multikey_2.jsonl
    {"task": "niah_multikey_2", "score": 87.4, "n": 500}

The file is RULER's prediction format: one JSON object per line with `pred` (the generated
text) and `outputs` (the references; for an InfiniteBench task the first is the answer).
The score (0-100) is the one longctx's own evaluation computes, so predictions made
elsewhere (vLLM, the reference scripts) compare with ours.
"""

from __future__ import annotations

import argparse
import json


def cmd_eval_score(args: argparse.Namespace) -> int:
    from longctx.eval import infinitebench
    from longctx.eval.ruler import scoring
    from longctx.eval.ruler.constants import TASKS
    from longctx.eval.ruler.tokens import RulerError

    predictions, references = scoring.read_predictions(args.predictions)
    if args.task in TASKS:
        score = scoring.task_score(args.task, predictions, references)
    elif args.task in infinitebench.TASKS:
        answers = [outputs[0] for outputs in references]
        score = round(infinitebench.task_score(args.task, predictions, answers, compat=args.compat), 2)
    else:
        raise RulerError(
            f"--task {args.task!r} is not a RULER task {list(TASKS)} or InfiniteBench task {list(infinitebench.TASKS)}"
        )
    print(json.dumps({"task": args.task, "score": score, "n": len(predictions)}))
    return 0


def register(commands: argparse._SubParsersAction) -> None:
    score = commands.add_parser("eval-score", help="score a RULER-format prediction file (RULER or InfiniteBench task)")
    score.add_argument("predictions", help="JSON lines with 'pred' and 'outputs'")
    score.add_argument("--task", required=True, help="RULER task (niah_single_1 ... qa_2) or InfiniteBench task")
    score.add_argument(
        "--compat",
        default="string",
        choices=("string", "infinitebench"),
        help="math_find: STRING's int(float(x)) (default) or InfiniteBench's int(x)",
    )
    score.set_defaults(run=cmd_eval_score)
