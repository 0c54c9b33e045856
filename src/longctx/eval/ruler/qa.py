"""RULER's QA tasks (NVIDIA/RULER scripts/data/synthetic/qa.py): qa_1 on SQuAD v2 dev, qa_2 on
HotpotQA dev (distractor setting), read from the files given by path (`eval.ruler.squad_path`,
`eval.ruler.hotpotqa_path`: no hub here).

Sample i asks question i (RULER's order: SQuAD's answerable questions in file order; every
HotpotQA question). Its golden documents come first, then (SQuAD) the other paragraphs of
its article, then documents drawn from the rest, n in all; they are shuffled, numbered
"Document {i}:\\n{text}" and joined by blank lines. n is the largest count that fits.
Outputs: the question's answers; scored by string_match_part (any answer found); 32 tokens.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from longctx.eval.prompt_pieces import Piece
from longctx.eval.ruler.constants import FAMILIES, Task
from longctx.eval.ruler.context import RulerContext
from longctx.eval.ruler.tokens import Prompt, RulerError, fit_prompt, frame_prompt

_ENCODE_CHUNK = 256


def read_squad(path: str | Path) -> tuple[list[dict], list[str]]:
    """Answerable questions and the sorted distinct paragraphs of a SQuAD v2 JSON file."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    docs = sorted({p["context"] for d in data["data"] for p in d["paragraphs"]})
    doc_index = {c: i for i, c in enumerate(docs)}
    questions = []
    for article in data["data"]:
        article_docs = [doc_index[p["context"]] for p in article["paragraphs"]]
        for paragraph in article["paragraphs"]:
            golden = doc_index[paragraph["context"]]
            for qa in paragraph["qas"]:
                if not qa["is_impossible"]:
                    questions.append(
                        {
                            "query": qa["question"],
                            "outputs": [a["text"] for a in qa["answers"]],
                            "context": [golden],
                            "more_context": [i for i in article_docs if i != golden],
                        }
                    )
    return questions, docs


def read_hotpotqa(path: str | Path) -> tuple[list[dict], list[str]]:
    """Questions and the sorted distinct "title\\nparagraph" documents of a HotpotQA JSON file."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    docs = sorted({f"{title}\n{''.join(sentences)}" for d in data for title, sentences in d["context"]})
    doc_index = {c: i for i, c in enumerate(docs)}
    questions = [
        {
            "query": d["question"],
            "outputs": [d["answer"]],
            "context": [doc_index[f"{title}\n{''.join(sentences)}"] for title, sentences in d["context"]],
        }
        for d in data
    ]
    return questions, docs


def _dataset(ctx: RulerContext, task: Task) -> tuple[list[dict], list[str], dict[int, np.ndarray]]:
    name = task.args["dataset"]
    key = ("qa", name)
    if key not in ctx.memo:
        path = ctx.options.squad_path if name == "squad" else ctx.options.hotpotqa_path
        option = "eval.ruler.squad_path" if name == "squad" else "eval.ruler.hotpotqa_path"
        if not path:
            raise RulerError(f"task {task.name!r} needs the {name} dev file: set {option}")
        if not Path(path).is_file():
            raise RulerError(f"{option}: {path} does not exist")
        try:
            questions, docs = (read_squad if name == "squad" else read_hotpotqa)(path)
        except (KeyError, TypeError, ValueError) as error:
            raise RulerError(f"{option}: {path} is not a {name} file ({type(error).__name__}: {error})") from error
        ctx.memo[key] = (questions, docs, {})
    return ctx.memo[key]  # type: ignore[return-value]


def qa_sample(ctx: RulerContext, task: Task, length: int, index: int) -> tuple[Prompt, list[str], dict]:
    questions, docs, doc_ids = _dataset(ctx, task)
    if index >= len(questions):
        raise RulerError(f"task {task.name!r}: sample {index} asks question {index}, the file has {len(questions)}")
    rng = ctx.rng(task.name, length, index)
    question = questions[index]
    golden, more = question["context"], question.get("more_context", [])
    taken = set(golden) | set(more)
    rest = [int(i) for i in rng.permutation(len(docs)) if int(i) not in taken]
    more_drawn = [more[int(i)] for i in rng.permutation(len(more))]

    def chosen(count: int) -> list[int]:
        if count >= len(docs):
            return (list(range(len(docs))) * (-(-count // len(docs))))[:count]
        if count - len(golden) > len(more):
            return golden + more + rest[: count - len(golden) - len(more)]
        return golden + more_drawn[: max(count - len(golden), 0)]

    def ids_of(doc: int) -> np.ndarray:
        if doc not in doc_ids:
            missing = [d for d in dict.fromkeys([doc, *rest[:_ENCODE_CHUNK]]) if d not in doc_ids]
            for d, ids in zip(missing, ctx.tokenizer.encode_batch([docs[d] + "\n\n" for d in missing]), strict=True):
                doc_ids[d] = np.asarray(ids, dtype=np.int64)
        return doc_ids[doc]

    family = FAMILIES["qa"]
    head, tail = family.template.split("{context}")
    tail = tail.removeprefix("\n\n").format(query=question["query"])

    def build_from(order: list[int]) -> Prompt:
        order = [order[i] for i in ctx.fixed_permutation(len(order))]
        segments: list[str | Piece] = [head]
        for number, doc in enumerate(order, start=1):
            segments += [f"Document {number}:\n", Piece(ids_of(doc), docs[doc] + "\n\n")]
        return frame_prompt(ctx.encoder, ctx.frame, [*segments, tail], family.answer_prefix)

    # n: documents beyond the golden ones (RULER cannot draw fewer than those)
    base = len(build_from([]).input_ids)

    def tokens_of(extra: int) -> int:
        count = len(golden) + extra
        headers = sum(len(ctx.encoder.ids(f"Document {n}:\n")) for n in range(1, count + 1))
        return base + headers + sum(len(ids_of(d)) for d in chosen(count))

    upper = 1
    while tokens_of(upper) <= length and upper < 64 * len(docs):
        upper *= 2
    extra, prompt = fit_prompt(
        lambda n: build_from(chosen(len(golden) + n)), tokens_of, length, family.tokens_to_generate, upper, task.name
    )
    size = len(golden) + extra
    return prompt, list(question["outputs"]), {"haystack_size": size}
