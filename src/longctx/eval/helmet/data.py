"""HELMET's released files, read by path under eval.benchmarks.helmet_dir (the `data/`
directory of HELMET's data.tar.gz; nothing is downloaded): the rows of a task at a length
and each sample's prompt fields.

    kilt/<set>-dev-multikilt_1000_k{k}_dep{d}.jsonl   RAG test rows (question, answers, ctxs)
    kilt/<set>-train-multikilt_1000_k3_dep{d}.jsonl   RAG demonstrations (PopQA: its test file)
    msmarco/test_reranking_data_k{k}_dep3.jsonl       re-ranking rows (qid, query, ctxs with labels)
    msmarco/test_reranking_data_k10_dep3.jsonl        re-ranking demonstrations
    icl/<set>/<split>.jsonl                           the Hugging Face data set HELMET loads, one row
                                                      a line in its order (Dataset.to_json), its fields
    narrativeqa/, infbench/, multi_lexsum/, alce/, prompts/   long-document QA, summarization and
                                                      citations (eval/helmet/longdoc.py)

Sample i of (task, length) is row i of the test file in its order (HELMET draws
max_test_samples rows with Python's global random state; longctx takes the file's order, so
a sample depends on its index alone). ICL's test rows are HELMET's own selection (seed 42).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

from longctx.errors import ConfigError
from longctx.eval.helmet.generator import (
    LONG_KINDS,
    POPQA_THRESHOLD,
    RAG_SHOTS,
    RERANK_SHOTS,
    SEED,
    TASKS,
    HelmetError,
    hf_train_test_split,
    icl_fields,
    icl_shots,
    icl_test_rows,
    rag_fields,
    rerank_demo_pool,
    rerank_fields,
    sized,
)

DIR_KEY = "eval.benchmarks.helmet_dir"


@cache
def read_jsonl(path: str, task: str) -> tuple[dict[str, Any], ...]:
    """The rows of a JSON-lines file; HelmetError naming the file and the task when absent."""
    file = Path(path)
    if not file.is_file():
        raise HelmetError(f"HELMET task {task} needs {file} ({DIR_KEY}; HELMET's data: docs/helmet.md), not found")
    with file.open(encoding="utf-8") as lines:
        return tuple(json.loads(line) for line in lines if line.strip())


class HelmetData:
    """The rows of HELMET's files under `root`, read once per file."""

    def __init__(self, root: str):
        if not root:
            raise ConfigError(DIR_KEY, "is empty: HELMET's RAG, re-ranking and ICL tasks read its data files from it")
        self.root = Path(root)

    def _rows(self, relative: str, task: str) -> tuple[dict[str, Any], ...]:
        return read_jsonl(str(self.root / relative), task)

    def files(self, task: str, length: int) -> list[str]:
        """The files a (task, length) cell reads, relative to the root."""
        info = TASKS[task]
        if info.kind in ("rag", "rerank"):
            return [info.files[0].format(k=info.k[sized(info, length)]), info.files[1]]
        return list(info.files)

    def _test_and_demos(self, task: str, length: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        test_file, demo_file = self.files(task, length)
        tests, demos = list(self._rows(test_file, task)), list(self._rows(demo_file, task))
        if task == "popqa":
            tests = [r for r in tests if math.log10(r["s_pop"]) < POPQA_THRESHOLD]
            demos = [r for r in demos if math.log10(r["s_pop"]) < POPQA_THRESHOLD]
        if TASKS[task].kind == "rerank":
            demos = rerank_demo_pool(demos, tests)
        return tests, demos

    def _icl(self, task: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        info = TASKS[task]
        if task == "nlu":  # HELMET splits the one split itself: train_test_split(test_size=0.1, seed=42)
            train, test = hf_train_test_split(self._rows(info.files[0], task), 0.1, SEED)
        else:
            train, test = list(self._rows(info.files[0], task)), list(self._rows(info.files[1], task))
        return train, icl_test_rows(test, info)

    def _long(self, task: str) -> tuple[Any, list[dict[str, Any]]]:
        from longctx.eval.helmet.longdoc import LongDocRows

        rows = LongDocRows(self.root, task, TASKS[task].files)
        return rows, rows.tests()

    def sample_fields(self, task: str, length: int, index: int) -> tuple[dict[str, Any], Any]:
        """(the prompt's fields, the references): golds, for msmarco [doc id, label] pairs, for
        ALCE {question, docs, qa_pairs | answers} (eval/helmet/longdoc.py)."""
        info = TASKS[task]
        key = (str(self.root), task)
        if info.kind in LONG_KINDS:
            rows, tests = _cached(key, lambda: self._long(task))
            return rows.fields(_indexed(tests, index, task, info.files[0]), sized(info, length))
        if info.kind == "icl":
            train, tests = _cached(key, lambda: self._icl(task))
            row = _indexed(tests, index, task, info.files[-1])
            fields = icl_fields(row, train, info, icl_shots(info, length))
            return fields, [fields["answer"]]
        files = tuple(self.files(task, length))
        tests, demos = _cached((*key, files), lambda: self._test_and_demos(task, length))
        row = _indexed(tests, index, task, files[0])
        if info.kind == "rag":
            return rag_fields(row, demos, RAG_SHOTS, task == "popqa"), list(row["answers"])
        return rerank_fields(row, demos, RERANK_SHOTS), [[c["id"], str(c["label"])] for c in row["ctxs"]]


def _indexed(rows: list[dict[str, Any]], index: int, task: str, file: str) -> dict[str, Any]:
    if index >= len(rows):
        raise HelmetError(
            f"HELMET {task}: sample {index} asked, {file} has {len(rows)} (lower eval.benchmarks.samples_per_length)"
        )
    return rows[index]


_CACHE: dict[tuple, Any] = {}
"""The rows of a (data directory, task[, files]), read and prepared once per process."""


def _cached(key: tuple, make: Callable[[], Any]) -> Any:
    if key not in _CACHE:
        _CACHE[key] = make()
    return _CACHE[key]
