"""InfiniteBench's scorer as the STRING repository runs it (HKUNLP/STRING
inifinite_bench/src/compute_scores.py, after " ".join(pred.split())): passkey and
number_string: the first run of digits equals the answer; kv_retrieval: the value is one of
the words after \\n : " ' . , ? ! { } become spaces; math_find: the first number
(\\d+\\.\\d+|\\d+) equals the answer (as int(float(x)) for an integer answer; InfiniteBench's
own int(x) is `compat="infinitebench"`). Task score: 100 x the mean.
"""

from __future__ import annotations

import re

from longctx.eval.infinitebench.generator import TASKS, InfiniteBenchError


def first_int(prediction: str) -> str:
    """The first run of digits (InfiniteBench's first_int_match), "" if none."""
    match = re.search(r"[0-9]+", prediction)
    return match.group(0) if match else ""


def sample_score(task: str, prediction: str, answer: str | int | float, compat: str = "string") -> float:
    """1.0 or 0.0 by STRING's compute_scores for one prediction."""
    prediction = " ".join(prediction.split())
    if task in ("passkey", "number_string"):
        return float(str(answer) == first_int(prediction))
    if task == "kv_retrieval":
        for character in "\n:\"'.,?!{}":
            prediction = prediction.replace(character, " ")
        return float(str(answer) in prediction.split())
    if task == "math_find":
        match = re.search(r"\d+\.\d+|\d+", prediction)
        if match is None:
            return 0.0
        found = match.group(0).strip()
        if isinstance(answer, float):
            return float(float(found) == answer)
        if compat == "infinitebench":
            return float("." not in found and int(found) == int(answer))
        return float(int(float(found)) == int(answer))
    raise InfiniteBenchError(f"InfiniteBench task {task!r} is not one of {list(TASKS)}")


def task_score(task: str, predictions: list[str], answers: list, compat: str = "string") -> float:
    if not predictions or len(predictions) != len(answers):
        raise InfiniteBenchError(f"InfiniteBench {task}: {len(predictions)} predictions for {len(answers)} answers")
    return 100 * sum(sample_score(task, p, a, compat) for p, a in zip(predictions, answers, strict=True)) / len(answers)
