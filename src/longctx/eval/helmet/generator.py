"""HELMET's prompts (princeton-nlp/HELMET data.py: load_qa, load_msmarco_rerank, load_icl,
load_json_kv; configs/*_short.yaml and *.yaml for lengths, files, shots and generation
lengths), built from rows of its released files and truncated by its rule.

A prompt is HELMET's user template filled in, then "\\n" and the system template ("Answer:",
"Ranking:", "label:") when the chat template is off (`prompt_template`); with the chat
template (eval.benchmarks.chat_template=auto) the user template alone is the user turn and
the assistant turn opens empty, as HELMET's `tokenize` does (add_generation_prompt, no
continue_final_message). HELMET's own system message is not added (longctx's frame has none).

Truncation (model_utils.tokenize): when the prompt's tokens exceed length - generation
length, the context is cut at its end by the excess (HELMET's fast-tokenizer path cuts at the
token's character offset; longctx decodes the kept context ids, HELMET's path for slow
tokenizers) and the prompt rebuilt, repeated while a re-tokenised prompt still overflows.
A prompt whose fixed part (instruction, demonstrations, question) does not fit is refused
(PromptTooShortError: the suite leaves the cell out).
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from longctx.errors import LongctxError
from longctx.eval.errors import PromptTooShortError
from longctx.eval.helmet.templates import ALCE_DOCS, LONG_SYSTEM_TEMPLATES, LONG_USER_TEMPLATES, SEPARATORS


class HelmetError(LongctxError, ValueError):
    """A HELMET sample cannot be built, or a prediction file scored, from these arguments."""


class HelmetPromptTooShortError(HelmetError, PromptTooShortError):
    """The length cannot hold the prompt without its context (instruction, demonstrations, question)."""


SEED = 42
"""HELMET's --seed default: its demonstration and label draws are functions of it."""

HELMET_LENGTHS = (8192, 16384, 32768, 65536, 131072)
"""The lengths of HELMET's configs (*_short.yaml: 8K-64K; *.yaml: 128K)."""


@dataclass(frozen=True)
class HelmetTaskInfo:
    kind: str
    """json_kv | ruler | rag | rerank | icl | narrativeqa | infbench_qa | infbench_choice |
    infbench_sum | multi_lexsum | alce (the prompt template)."""
    category: str
    generation_length: int
    """generation_max_length of its config."""
    stop_new_line: bool
    """Its config's stop_new_line: the row stops at the first "\\n"."""
    files: tuple[str, ...] = ()
    """rag: (test file, demo file) with {k}; rerank: (test, demo); icl: its splits."""
    k: tuple[int, ...] = ()
    """Passages per test file at HELMET_LENGTHS."""
    shots: tuple[int, ...] = ()
    """ICL demonstrations at HELMET_LENGTHS (the `<n>shot` of the data set's name)."""
    labels: int = 0
    """ICL: the number of labels; label_field: the field holding the label id."""
    label_field: str = ""
    recall_task: str = ""
    """The longctx task a recall task runs: `<benchmark>-<task>` through the registry."""


_KILT_K = (50, 105, 220, 440, 1000)


def _rag(test: str, demos: str) -> HelmetTaskInfo:
    """A RAG task (rag*.yaml): its KILT test file by k and its demonstration file, under kilt/."""
    return HelmetTaskInfo("rag", "rag", 20, True, (f"kilt/{test}", f"kilt/{demos}"), _KILT_K)


def _icl(files: tuple[str, ...], shots: tuple[int, ...], labels: int, label_field: str) -> HelmetTaskInfo:
    """A many-shot ICL task (icl*.yaml): its splits, shots at HELMET_LENGTHS, labels and label field."""
    return HelmetTaskInfo("icl", "icl", 20, True, files, (), shots, labels, label_field)


TASKS: dict[str, HelmetTaskInfo] = {
    "json_kv": HelmetTaskInfo("json_kv", "recall", 100, False, recall_task="niah-helmet-json-kv"),
    "ruler_niah_mk_2": HelmetTaskInfo("ruler", "recall", 50, False, recall_task="ruler-niah_multikey_2"),
    "ruler_niah_mk_3": HelmetTaskInfo("ruler", "recall", 100, False, recall_task="ruler-niah_multikey_3"),
    "ruler_niah_mv": HelmetTaskInfo("ruler", "recall", 50, False, recall_task="ruler-niah_multivalue"),
    "nq": _rag("nq-dev-multikilt_1000_k{k}_dep6.jsonl", "nq-train-multikilt_1000_k3_dep6.jsonl"),
    "triviaqa": _rag("triviaqa-dev-multikilt_1000_k{k}_dep6.jsonl", "triviaqa-train-multikilt_1000_k3_dep6.jsonl"),
    "hotpotqa": _rag("hotpotqa-dev-multikilt_1000_k{k}_dep3.jsonl", "hotpotqa-train-multikilt_1000_k3_dep3.jsonl"),
    "popqa": _rag("popqa_test_1000_k{k}_dep6.jsonl", "popqa_test_1000_k3_dep6.jsonl"),
    "msmarco": HelmetTaskInfo(
        "rerank",
        "rerank",
        200,
        True,
        ("msmarco/test_reranking_data_k{k}_dep3.jsonl", "msmarco/test_reranking_data_k10_dep3.jsonl"),
        (50, 130, 285, 600, 1000),
    ),
    "trec_coarse": _icl(
        ("icl/trec/train.jsonl", "icl/trec/test.jsonl"), (400, 800, 1600, 3300, 6600), 6, "coarse_label"
    ),
    "trec_fine": _icl(("icl/trec/train.jsonl", "icl/trec/test.jsonl"), (400, 800, 1600, 3200, 6400), 50, "fine_label"),
    "banking77": _icl(
        ("icl/banking77/train.jsonl", "icl/banking77/test.jsonl"), (360, 720, 1450, 2900, 5900), 77, "label"
    ),
    "clinc150": _icl(
        ("icl/clinc150/train.jsonl", "icl/clinc150/validation.jsonl"), (440, 880, 1750, 3525, 7050), 151, "intent"
    ),
    "nlu": _icl(("icl/nlu/train.jsonl",), (510, 1020, 2040, 4080, 8296), 68, "label"),
    "narrativeqa": HelmetTaskInfo(
        "narrativeqa", "longqa", 100, False, ("narrativeqa/test.jsonl", "narrativeqa/train.jsonl")
    ),
    "infbench_qa": HelmetTaskInfo("infbench_qa", "longqa", 10, False, ("infbench/longbook_qa_eng.jsonl",)),
    "infbench_choice": HelmetTaskInfo("infbench_choice", "longqa", 10, False, ("infbench/longbook_choice_eng.jsonl",)),
    "infbench_sum": HelmetTaskInfo("infbench_sum", "summ", 1200, False, ("infbench/longbook_sum_eng.jsonl",)),
    "multi_lexsum": HelmetTaskInfo(
        "multi_lexsum", "summ", 400, False, ("multi_lexsum/validation.jsonl", "multi_lexsum/train.jsonl")
    ),
    "alce_asqa": HelmetTaskInfo(
        "alce", "cite", 300, False, ("alce/asqa_eval_gtr_top2000.json", "prompts/asqa_revised.json"), ALCE_DOCS
    ),
    "alce_qampari": HelmetTaskInfo(
        "alce", "cite", 300, False, ("alce/qampari_eval_gtr_top2000.json", "prompts/qampari_revised.json"), ALCE_DOCS
    ),
}
"""HELMET's tasks (collect_results.py's names; its clinic150 is spelt clinc150 here, as the
data set is) in its categories: recall, rag, rerank, icl, longqa, summ, cite."""

LONG_KINDS = frozenset(LONG_USER_TEMPLATES)
"""The kinds eval/helmet/longdoc.py builds (long-document QA, summarization, citations)."""

POPQA_THRESHOLD = 3.0
"""kilt_popqa_3: PopQA rows (test and demonstrations) with log10(s_pop) < 3."""

RAG_SHOTS = RERANK_SHOTS = 2
"""shots: 2 in rag*.yaml and rerank*.yaml."""

USER_TEMPLATES = {
    "rag": "Use the given documents to write a concise and short answer to the question. Write your answer in the "
    "following format:\nAnswer: [answer]\n\n{demos}{context}\n\nQuestion: {question}",
    "rerank": "You are provided with a list of documents, each indicated by their ID. Rank each document based on "
    "their relevance to the question in descending order from most relelvant to least relevant texts. Include all "
    "documents in the rankings. Write your answer using the unique IDs, with the following format:\nRanking: "
    "ID3 > ID1 > ID2\n\n{demos}{context}\n\nQuery: {question}",
    "icl": 'Use the provided mapping from the text to label to assign a label to the text. Only output "label: '
    '{{label}}" and nothing else. \n\n{context}\n\n{question}',
}
USER_TEMPLATES |= LONG_USER_TEMPLATES
SYSTEM_TEMPLATES = {"rag": "Answer:", "rerank": "Ranking:", "icl": "label:", "json_kv": "Corresponding value:"}
SYSTEM_TEMPLATES |= LONG_SYSTEM_TEMPLATES
_PASSAGE = "Document (Title: {title}): {text}"
_RAG_DEMO = "{documents}\n\nQuestion: {question}\nAnswer: {answer}"
_ICL_ITEM = "{text}\nlabel: {label}"


def sized(info: HelmetTaskInfo, length: int) -> int:
    """Index into HELMET_LENGTHS for `length`: its own, else the smallest HELMET length above
    it (the context is truncated to fit), else 128K's."""
    for index, helmet_length in enumerate(HELMET_LENGTHS):
        if length <= helmet_length:
            return index
    return len(HELMET_LENGTHS) - 1


def icl_shots(info: HelmetTaskInfo, length: int) -> int:
    """The config's shots at a HELMET length; elsewhere 8K's shots scaled by length / 8192
    (HELMET's shots grow about linearly with the length), at least one."""
    if length in HELMET_LENGTHS:
        return info.shots[HELMET_LENGTHS.index(length)]
    return max(1, round(info.shots[0] * length / HELMET_LENGTHS[0]))


def row_key(row: dict[str, Any]) -> str:
    """load_qa's key: "id" when the rows have one, else the question."""
    return "id" if "id" in row else "question"


def hf_shuffle(rows: Sequence[Any], seed: int) -> list[Any]:
    """datasets.Dataset.shuffle(seed=seed): the rows in np.random.default_rng(seed).permutation order."""
    return [rows[i] for i in np.random.default_rng(seed).permutation(len(rows))]


def first_distinct(rows: Sequence[dict[str, Any]], key: str, count: int) -> list[dict[str, Any]]:
    """drop_duplicates(rows, key).select(range(count))."""
    seen: set[Any] = set()
    kept = []
    for row in rows:
        if row[key] not in seen:
            seen.add(row[key])
            kept.append(row)
    if len(kept) < count:
        raise HelmetError(f"{count} demonstrations asked, {len(kept)} distinct rows to draw them from")
    return kept[:count]


def _sha_seed(text: str) -> int:
    return int(hashlib.sha256(text.encode("utf-8")).hexdigest(), 16) % 2**31


def rag_fields(row: dict[str, Any], demos: Sequence[dict[str, Any]], shots: int, popqa: bool) -> dict[str, Any]:
    """load_qa's update(): demonstrations drawn by the sha256 of the row's key (PopQA: from
    the rows of other keys), the passages of the row as context."""
    key = row_key(row)
    demo_text = ""
    if shots > 0:
        pool = [d for d in demos if d[key] != row[key]] if popqa else list(demos)
        chosen = first_distinct(hf_shuffle(pool, _sha_seed(str(row[key]))), key, shots)
        demo_text = (
            "\n\n".join(
                _RAG_DEMO.format(
                    documents="\n\n".join(_PASSAGE.format(**c) for c in d["ctxs"]),
                    question=d["question"],
                    answer=d["answers"][0],
                )
                for d in chosen
            )
            + "\n\n"
        )
    context = "\n\n".join(_PASSAGE.format(**c) for c in row["ctxs"])
    return {"demos": demo_text, "context": context, "question": row["question"]}


def rerank_fields(row: dict[str, Any], demos: Sequence[dict[str, Any]], shots: int) -> dict[str, Any]:
    """load_msmarco_rerank's update(): passages "[ID: i] Document (Title: t): text" (no title:
    "[ID: i] Document: text"), demonstrations of other queries drawn by the sha256 of the qid,
    each with its gold ranking (ids by label, descending). `demos`: the demo file's rows
    already filtered as HELMET filters them (`rerank_demo_pool`)."""
    template = (
        "[ID: {id}] Document (Title: {title}): {text}" if "title" in row["ctxs"][0] else "[ID: {id}] Document: {text}"
    )
    context = "\n\n".join(template.format(**c) for c in row["ctxs"])
    demo_text = ""
    if shots > 0:
        pool = [d for d in demos if d["qid"] != row["qid"]]
        for d in first_distinct(hf_shuffle(pool, _sha_seed(row["qid"])), "qid", shots):
            ranking = " > ".join(c["id"] for c in sorted(d["ctxs"], key=lambda c: c["label"], reverse=True))
            passages = "\n\n".join(template.format(**c) for c in d["ctxs"])
            demo_text += passages + f"\n\nQuery: {d['query']}\nRanking: {ranking}" + "\n\n"
    return {"demos": demo_text, "context": context, "question": row["query"]}


def rerank_demo_pool(demos: list[dict[str, Any]], tests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """HELMET drops the demonstrations of every test query when the demo file has more than
    twice as many rows as the test set (here: the whole test file)."""
    if len(demos) > 2 * len(tests):
        qids = {t["qid"] for t in tests}
        return [d for d in demos if d["qid"] not in qids]
    return demos


def balance_labels(rows: Sequence[dict[str, Any]], label_field: str, shots: int, seed: int) -> list[dict[str, Any]]:
    """load_icl's balance_labels: rounds of one row per label (labels in first-seen order,
    rows drawn by random.Random(seed)), each round shuffled, the first `shots` rows."""
    rand = random.Random(seed)
    by_label: dict[Any, list[dict[str, Any]]] = {}
    for row in rows:
        by_label.setdefault(row[label_field], []).append(row)
    rounds = math.ceil(shots / len(by_label))
    grouped: list[list[dict[str, Any]]] = [[] for _ in range(rounds)]
    for samples in by_label.values():
        indices = rand.sample(range(len(samples)), rounds % len(samples))
        while len(indices) < rounds:
            indices += rand.sample(range(len(samples)), min(rounds - len(indices), len(samples)))
        for i, index in enumerate(indices):
            grouped[i].append(samples[index])
    for group in grouped:
        rand.shuffle(group)
    return [row for group in grouped for row in group][:shots]


def icl_fields(
    row: dict[str, Any], train: Sequence[dict[str, Any]], info: HelmetTaskInfo, shots: int
) -> dict[str, Any]:
    """load_icl's preprocess() for a "_balance" data set: seed = (sha256(text) + 42) mod 2^31,
    balanced demonstrations, labels mapped to a shuffled permutation of 0..labels-1."""
    local_seed = (int(hashlib.sha256(row["text"].encode("utf-8")).hexdigest(), 16) + SEED) % 2**31
    demos = balance_labels(train, info.label_field, shots, local_seed)
    mapping = list(range(info.labels))
    random.Random(local_seed).shuffle(mapping)
    context = "\n\n".join(_ICL_ITEM.format(text=d["text"], label=str(mapping[int(d[info.label_field])])) for d in demos)
    return {"context": context, "question": row["text"], "answer": str(mapping[int(row[info.label_field])])}


def icl_test_rows(test: Sequence[dict[str, Any]], info: HelmetTaskInfo, count: int = 500) -> list[dict[str, Any]]:
    """load_icl's test set: with more than max_test_samples (500 in icl*.yaml) rows, shuffled
    (seed 42) and label-balanced (seed 42); else as is."""
    if len(test) > count:
        return balance_labels(hf_shuffle(test, SEED), info.label_field, count, SEED)
    return list(test)


def hf_train_test_split(rows: Sequence[Any], test_size: float, seed: int) -> tuple[list[Any], list[Any]]:
    """datasets.Dataset.train_test_split(test_size, seed): the permutation of
    np.random.default_rng(seed), its first ceil(test_size * n) rows the test split."""
    n_test = math.ceil(test_size * len(rows))
    order = np.random.default_rng(seed).permutation(len(rows))
    return [rows[i] for i in order[n_test:]], [rows[i] for i in order[:n_test]]


def prompt_text(kind: str, fields: dict[str, Any], chat: bool) -> str:
    """HELMET's prompt_template (user + separator + system; the separator "\\n", or "\\n\\n"
    for InfiniteBench, Multi-LexSum and ALCE) or, with the chat template, the user template."""
    user = USER_TEMPLATES[kind].format(**fields)
    return user if chat else user + SEPARATORS.get(kind, "\n") + SYSTEM_TEMPLATES[kind]


def fit_context(
    kind: str,
    fields: dict[str, Any],
    chat: bool,
    budget: int,
    encode: Callable[[str], list[int]],
    decode: Callable[[Sequence[int]], str],
    name: str,
) -> tuple[list[int], int]:
    """The prompt's ids within `budget` tokens by HELMET's truncation (module docstring), and
    the context tokens cut."""
    ids = encode(prompt_text(kind, fields, chat))
    cut = 0
    while len(ids) > budget:
        context = encode(fields["context"])
        excess = len(ids) - budget
        if excess >= len(context):
            raise HelmetPromptTooShortError(
                f"HELMET {name}: {budget} tokens cannot hold the prompt without its context "
                f"({len(ids) - len(context)} tokens)"
            )
        fields = {**fields, "context": decode(context[:-excess])}
        cut += excess
        ids = encode(prompt_text(kind, fields, chat))
    return ids, cut
