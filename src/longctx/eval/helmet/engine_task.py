"""HELMET's tasks as tasks of the evaluation engine (eval/task.py), `helmet-<task>`.

`HelmetTask` (RAG, re-ranking, ICL, long-document QA, summarization, citations; the long
documents first cut to HELMET's length, eval/helmet/longdoc.py): sample i of (task, length) is the prompt of row i of
HELMET's file for that length (eval/helmet/data.py, eval/helmet/generator.py) in the model's
tokenizer and chat frame, decoded greedily for the config's generation length, stopping at
EOS and, where the config sets stop_new_line, at the first newline; scored by HELMET's
metric (eval/helmet/scoring.py) on HELMET's output (the system template, then the
generation, when the chat template is off).

`RecallTask` (JSON KV, RULER MK-2, MK-3, MV): longctx's own generator of that task, found
through the registry (niah-helmet-json-kv, ruler-niah_multikey_2 ...), at any length with
no data file, decoded for HELMET's generation length and scored by HELMET's metric.

Every record keeps `pred` (HELMET's output) and `outputs` (the golds; msmarco: the qrels),
so a cell's samples.jsonl is a prediction file `longctx eval-score --task` reads.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from longctx.config import ExperimentConfig
from longctx.eval.helmet.data import HelmetData
from longctx.eval.helmet.generator import LONG_KINDS, SYSTEM_TEMPLATES, TASKS, HelmetError, fit_context
from longctx.eval.helmet.longdoc import truncate_document
from longctx.eval.helmet.scoring import sample_score
from longctx.eval.helmet.templates import CONTEXT_RESERVE
from longctx.eval.prompt_frame import BENCHMARKS_TEMPLATE_KEY, TextTokenizer, prompt_frame
from longctx.eval.registry import owner_of
from longctx.eval.task import Sample, Task, stop_at_eos
from longctx.model.inference.generation import Generation

JUDGE_FIELDS = ("question", "id", "summary/long")
"""A long-document sample's fields its record keeps for eval-score --judge: NarrativeQA's
question; the summaries' row id (HELMET's key points are found by it) and Multi-LexSum's
expert summary (the precision prompt's reference)."""


def _golds(references: Any) -> tuple[str, ...]:
    """The sample's references as strings: golds, msmarco's "doc:label", ALCE's short answers."""
    if isinstance(references, str):
        return (references,)
    if isinstance(references, dict):  # ALCE
        if "qa_pairs" in references:
            return tuple(a for pair in references["qa_pairs"] for a in pair["short_answers"])
        return tuple(a for answers in references["answers"] for a in answers)
    return tuple(r if isinstance(r, str) else ":".join(r) for r in references)


def _output(task: str, text: str, chat: bool) -> str:
    """HELMET's output: the system template prepended when the chat template is off."""
    kind = TASKS[task].kind
    return text if chat or kind == "ruler" else SYSTEM_TEMPLATES[kind] + text


class HelmetTask(Task):
    def __init__(self, task: str, config: ExperimentConfig):
        if task not in TASKS or TASKS[task].kind in ("json_kv", "ruler"):
            raise HelmetError(f"HELMET task {task!r} is not a data-file task of HELMET")
        self.task = task
        self.info = TASKS[task]
        self.settings_ = config.eval.benchmarks
        self.chat = self.settings_.chat_template == "auto"
        self.name = f"helmet-{task}"

    def samples(self, seed: int, length: int, count: int, tokenizer: TextTokenizer) -> list[Sample]:
        data = HelmetData(self.settings_.helmet_dir)  # ConfigError when unset: the task needs its files
        frame = prompt_frame(tokenizer, self.settings_.chat_template, BENCHMARKS_TEMPLATE_KEY)
        budget = length - self.info.generation_length - len(frame.head) - len(frame.tail)
        stop = stop_at_eos(tokenizer)
        if self.info.stop_new_line:
            stop = dataclasses.replace(stop, stop_strings=("\n",))
        samples = []
        for index in range(count):
            fields, references = data.sample_fields(self.task, length, index)
            document_cut = False
            if self.info.kind in CONTEXT_RESERVE:  # HELMET's truncate_llama2, before the prompt's own rule
                limit = length - CONTEXT_RESERVE[self.info.kind]
                fields["context"], document_cut = truncate_document(
                    fields["context"], limit, tokenizer.encode, tokenizer.decode
                )
            ids, cut = fit_context(
                self.info.kind, fields, self.chat, budget, tokenizer.encode, tokenizer.decode, self.name
            )
            samples.append(
                Sample(
                    index=index,
                    prompt_ids=(*frame.head, *ids, *frame.tail),
                    max_new_tokens=self.info.generation_length,
                    stop=stop,
                    references=_golds(references),
                    metadata={"references": references, "truncated": cut, "document_cut": document_cut}
                    | ({k: fields[k] for k in JUDGE_FIELDS if k in fields} if self.info.kind in LONG_KINDS else {}),
                )
            )
        return samples

    def score(self, sample: Sample, generation: Generation) -> float:
        return sample_score(
            self.task, _output(self.task, generation.text or "", self.chat), sample.metadata["references"]
        )

    def details(self, sample: Sample, generation: Generation) -> dict[str, Any]:
        output = _output(self.task, generation.text or "", self.chat)
        references = sample.metadata["references"]
        record = {"pred": output, "outputs": [references] if isinstance(references, dict) else references}
        record |= {k: sample.metadata[k] for k in JUDGE_FIELDS if k in sample.metadata}  # the judge reads them
        return {**record, "truncated": sample.metadata["truncated"]}

    def settings(self) -> dict[str, Any]:
        return {
            "task": self.task,
            "helmet_dir": self.settings_.helmet_dir,
            "chat_template": self.settings_.chat_template,
            "generation_length": self.info.generation_length,
        }


class RecallTask(Task):
    """HELMET's recall task on longctx's generator of it (module docstring)."""

    def __init__(self, task: str, config: ExperimentConfig, haystack: Any = None):
        info = TASKS.get(task)
        if info is None or info.category != "recall":
            raise HelmetError(f"HELMET task {task!r} is not a recall task")
        owner = owner_of(info.recall_task)
        if owner is None:
            raise HelmetError(f"HELMET {task} runs {info.recall_task}, whose benchmark is not registered")
        spec, inner = owner
        self.inner = spec.engine_tasks([inner], config, haystack)[0]
        self.task = task
        self.info = info
        self.chat = config.eval.benchmarks.chat_template == "auto"
        self.name = f"helmet-{task}"

    def samples(self, seed: int, length: int, count: int, tokenizer: TextTokenizer) -> list[Sample]:
        """The inner task's samples with HELMET's generation length, prompt + generation <=
        length (model_utils.tokenize's rule): NIAH's JSON KV prompt fills the length it is
        given, so it is asked for the length less the generation; RULER's leave room already."""
        inner_length = length - self.info.generation_length if self.info.kind == "json_kv" else length
        return [
            dataclasses.replace(s, max_new_tokens=self.info.generation_length)
            for s in self.inner.samples(seed, inner_length, count, tokenizer)
        ]

    def score(self, sample: Sample, generation: Generation) -> float:
        return sample_score(self.task, _output(self.task, generation.text or "", self.chat), sample.references)

    def details(self, sample: Sample, generation: Generation) -> dict[str, Any]:
        return {"pred": _output(self.task, generation.text or "", self.chat), "outputs": list(sample.references)}

    def settings(self) -> dict[str, Any]:
        return {
            "task": self.task,
            "runs": self.inner.name,
            "generation_length": self.info.generation_length,
            "inner": self.inner.settings(),
        }
