"""Prediction files, as `longctx eval-score` reads them: RULER's format, JSON lines with
`pred` (the generated text) and `outputs` (the references; for an InfiniteBench task the
first is the answer). Every record of an engine cell whose task writes `pred` and `outputs`
(RULER's, InfiniteBench's) is such a line, so a cell's samples.jsonl is a prediction file;
so are the files of the reference scripts. Each benchmark's scorer (its spec's
`score_file`, eval/registry.py) scores what is read here.
"""

from __future__ import annotations

import json
from pathlib import Path

from longctx.errors import DataError


def read_predictions(path: str | Path) -> tuple[list[str], list[list]]:
    """`pred` and `outputs` of every line of a RULER prediction file (JSON lines); outputs as
    written (strings for RULER; InfiniteBench's math answers are numbers)."""
    predictions: list[str] = []
    references: list[list] = []
    with open(path, encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                prediction, outputs = row["pred"], row.get("outputs", [row.get("output", "")])
            except (json.JSONDecodeError, KeyError, TypeError) as error:
                raise DataError(
                    f"{path}:{number}: not a RULER prediction line with 'pred' and 'outputs' ({error})"
                ) from error
            if isinstance(outputs, str):
                outputs = [outputs]
            if not isinstance(prediction, str) or not isinstance(outputs, list) or not outputs:
                raise DataError(f"{path}:{number}: 'pred' must be a string and 'outputs' a non-empty list")
            predictions.append(prediction)
            references.append(outputs)
    if not predictions:
        raise DataError(f"{path}: no predictions")
    return predictions, references
