"""HELMET's long-document QA, summarization and citation tasks: rows of its files (by path
under eval.benchmarks.helmet_dir), their prompt fields and HELMET's document truncation.

    narrativeqa/test.jsonl, train.jsonl     Hugging Face `narrativeqa` rows (document.text,
                                            question.text, answers[].text); test: HELMET's
                                            selection in its order (docs/helmet.md's export)
    infbench/longbook_{qa,choice,sum}_eng.jsonl  InfiniteBench's released files (id, context,
                                            input, answer, options)
    multi_lexsum/validation.jsonl, train.jsonl   `allenai/multi_lexsum` v20230518 rows
                                            (id, sources, summary/short)
    alce/{asqa,qampari}_eval_gtr_top2000.json    ALCE's files (question, docs, qa_pairs | answers)
    prompts/{asqa,qampari}_revised.json     HELMET's ALCE demonstration files (its prompts/)

Test rows: InfiniteBench, Multi-LexSum (more than 100 rows) and ALCE are shuffled as HELMET
does (`Dataset.shuffle(seed=42)`, then its first 100), so sample i < 100 is HELMET's
sample i; NarrativeQA's file holds HELMET's selection already. Demonstrations: InfiniteBench's
are HELMET's own (the other rows, shuffled with seed 42); ALCE's are the j-th
`random.sample(demos, 2)` after `random.seed(42)` for file row j (HELMET's draw for the first
data set of a run); NarrativeQA's and Multi-LexSum's, which HELMET draws unseeded, are drawn
by the sha256 of the question (or row id), as the RAG demonstrations are.

Truncation (truncate_llama2): a document longer than its limit (length - CONTEXT_RESERVE)
keeps limit - |postfix| - 1 tokens (HELMET counts Llama-2's BOS) and HELMET's postfix; in the
model's own tokenizer, not the gated Llama-2 one (docs/helmet.md: deviations).
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Sequence
from functools import cache
from pathlib import Path
from typing import Any

from longctx.eval.helmet.generator import SEED, HelmetError, _sha_seed, hf_shuffle
from longctx.eval.helmet.templates import (
    ALCE_DOCS,
    INFBENCH_DEMO,
    INFBENCH_DEMOS,
    LEXSUM_DEMOS,
    LONG_SHOTS,
    NARRATIVEQA_DEMO,
    NARRATIVEQA_DEMOS,
    TRUNCATION_POSTFIX,
)

MAX_TEST_SAMPLES = 100
"""max_test_samples of longqa*, summ*, cite*.yaml."""


@cache
def read_rows(path: str, task: str) -> tuple[Any, ...]:
    """A JSON array (ALCE) or JSON-lines file; a JSON object (HELMET's demo prompts) as one
    row. HelmetError naming the file and the task when absent or unreadable."""
    file = Path(path)
    if not file.is_file():
        raise HelmetError(
            f"HELMET task {task} needs {file} (eval.benchmarks.helmet_dir; HELMET's data: docs/helmet.md), not found"
        )
    text = file.read_text(encoding="utf-8")
    try:
        if text.lstrip()[:1] in ("[", "{") and not file.name.endswith(".jsonl"):
            document = json.loads(text)
            return tuple(document) if isinstance(document, list) else (document,)
        return tuple(json.loads(line) for line in text.splitlines() if line.strip())
    except json.JSONDecodeError as error:
        raise HelmetError(f"HELMET task {task}: {file} is not JSON or JSON lines ({error})") from error


def _text(value: Any) -> str:
    """A Hugging Face nested field ({"text": ...}) or a plain string."""
    return value["text"] if isinstance(value, dict) else str(value)


def _field(row: dict[str, Any], key: str, file: str, task: str) -> Any:
    if key not in row:
        raise HelmetError(f"HELMET task {task}: a row of {file} has no {key!r} (fields: {sorted(row)})")
    return row[key]


def truncate_document(
    context: str, limit: int, encode: Callable[[str], list[int]], decode: Callable[[Sequence[int]], str]
) -> tuple[str, bool]:
    """truncate_llama2: a document of more than limit - 1 tokens keeps its first
    limit - |postfix| - 1 and ends with HELMET's postfix; (text, whether it was cut)."""
    ids = encode(context)
    if len(ids) + 1 <= limit:
        return context, False
    keep = max(0, limit - len(encode(TRUNCATION_POSTFIX)) - 1)
    return decode(ids[:keep]) + TRUNCATION_POSTFIX, True


def infbench_row(row: dict[str, Any], task: str, file: str) -> dict[str, Any]:
    """load_infbench's process_example: question = input; MC: options "A. ..\\nB. .." and
    answer [letter, "letter. option"]."""
    update = {"id": row.get("id"), "context": _field(row, "context", file, task), "question": row.get("input", "")}
    answer = list(_field(row, "answer", file, task))
    if task == "infbench_choice":
        options = list(_field(row, "options", file, task))
        if len(options) != 4 or answer[0] not in options:
            raise HelmetError(f"HELMET {task}: row {row.get('id')} of {file} needs 4 options holding its answer")
        letter = chr(ord("A") + options.index(answer[0]))
        update["options"] = "A. {}\nB. {}\nC. {}\nD. {}".format(*options)
        answer = [letter, f"{letter}. {answer[0]}"]
    update["answer"] = answer
    return update


def infbench_demos(rows: Sequence[dict[str, Any]], row: dict[str, Any], task: str, shots: int) -> str:
    """add_demos: the other rows shuffled with seed 42, the first `shots`, story text elided."""
    if shots == 0:
        return ""
    others = hf_shuffle([r for r in rows if r["id"] != row["id"]], SEED)[:shots]
    if task == "infbench_sum":
        items = [INFBENCH_DEMO[task].format(answer=r["answer"][0].strip()) for r in others]
    else:
        items = [
            INFBENCH_DEMO[task].format(question=r["question"], options=r.get("options", ""), answer=r["answer"][0])
            for r in others
        ]
    return INFBENCH_DEMOS.format(demos="\n\n".join(items))


def alce_demo_draws(count: int, demos: int, shots: int) -> list[list[int]]:
    """The demonstration indices of file rows 0..count-1: random.seed(42), then one
    random.sample(range(demos), shots) per row in file order (load_alce's map)."""
    state = random.Random(SEED)
    return [state.sample(range(demos), shots) for _ in range(count)]


def alce_fields(row: dict[str, Any], prompts: dict[str, Any], draw: Sequence[int], num_docs: int) -> dict[str, Any]:
    """load_alce's preprocess_example: the first num_docs passages numbered from 1, the drawn
    demonstrations with all their passages, joined by three newlines."""
    doc_prompt, demo_prompt, instruction = prompts["doc_prompt"], prompts["demo_prompt"], prompts["instruction"]

    def passages(docs: Sequence[dict[str, Any]]) -> str:
        return "\n\n".join(doc_prompt.format(**d, ID=i + 1) for i, d in enumerate(docs))

    chosen = [prompts["demos"][i] for i in draw]
    demo_text = "\n\n\n".join(
        demo_prompt.format(**{**d, "instruction": instruction, "context": passages(d["docs"])}) for d in chosen
    )
    if chosen:
        demo_text += "\n\n\n"
    return {
        "demo_text": demo_text,
        "instruction": instruction,
        "question": row["question"],
        "context": passages(row["docs"][:num_docs]),
    }


class LongDocRows:
    """The test rows and demonstrations of one long-document task under `root`."""

    def __init__(self, root: Path, task: str, files: tuple[str, ...]):
        self.root, self.task, self.files = root, task, files

    def _rows(self, relative: str) -> tuple[Any, ...]:
        return read_rows(str(self.root / relative), self.task)

    def tests(self) -> list[dict[str, Any]]:
        task, file = self.task, self.files[0]
        rows = list(self._rows(file))
        if task == "narrativeqa":
            return [
                {
                    "context": _text(_field(r, "document", file, task)),
                    "question": _text(_field(r, "question", file, task)),
                    "answer": [_text(a) for a in _field(r, "answers", file, task)],
                }
                for r in rows
            ]
        if task.startswith("infbench"):
            return hf_shuffle([infbench_row(r, task, file) for r in rows], SEED)
        if task == "multi_lexsum":
            kept = [r for r in rows if r.get("summary/short") is not None]
            tests = [
                {
                    "id": r.get("id"),
                    "context": "\n\n".join(_field(r, "sources", file, task)),
                    "answer": r["summary/short"],
                    "question": "",
                    "summary/long": r.get("summary/long"),
                }
                for r in kept
            ]
            return hf_shuffle(tests, SEED)[:MAX_TEST_SAMPLES] if len(tests) > MAX_TEST_SAMPLES else tests
        golds = "qa_pairs" if task == "alce_asqa" else "answers"
        for r in rows:  # alce: a missing field is named with its file
            for key in ("question", "docs", golds):
                _field(r, key, file, task)
        indexed = [{**r, "_row": j} for j, r in enumerate(rows)]  # the file row fixes the demo draw
        return hf_shuffle(indexed, SEED)[:MAX_TEST_SAMPLES]

    def fields(self, row: dict[str, Any], size: int) -> tuple[dict[str, Any], Any]:
        """(the prompt's fields, the references) of a test row; `size`: index into HELMET's lengths."""
        task = self.task
        if task == "narrativeqa":
            chosen = hf_shuffle(self._rows(self.files[1]), _sha_seed(row["question"]))[:LONG_SHOTS]
            demos = "\n\n".join(
                NARRATIVEQA_DEMO.format(question=_text(d["question"]), answer=_text(d["answers"][0])) for d in chosen
            )
            return {**row, "demo": NARRATIVEQA_DEMOS.format(demos=demos)}, row["answer"]
        if task.startswith("infbench"):
            rows = [infbench_row(r, task, self.files[0]) for r in self._rows(self.files[0])]  # the file's order
            return {**row, "demo": infbench_demos(rows, row, task, LONG_SHOTS)}, row["answer"]
        if task == "multi_lexsum":
            train = [r for r in self._rows(self.files[1]) if r.get("summary/short") is not None]
            chosen = hf_shuffle(train, _sha_seed(str(row["id"])))[:LONG_SHOTS]
            demos = "\n\n".join("Summary: {}".format(d["summary/short"]) for d in chosen)
            return {**row, "demo": LEXSUM_DEMOS.format(demos=demos)}, row["answer"]
        prompts = self._rows(self.files[1])[0]
        draws = alce_demo_draws(len(self._rows(self.files[0])), len(prompts["demos"]), LONG_SHOTS)
        num_docs = ALCE_DOCS[size]
        fields = alce_fields(row, prompts, draws[row["_row"]], num_docs)
        reference = {
            "question": row["question"],
            "docs": [{"title": d["title"], "text": d["text"]} for d in row["docs"][:num_docs]],
        }
        reference |= {"qa_pairs": row["qa_pairs"]} if "qa_pairs" in row else {"answers": row["answers"]}
        return fields, reference
