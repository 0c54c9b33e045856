"""HELMET's metrics (princeton-nlp/HELMET utils.py, after DensePhrases' eval_utils and
SQuAD's normalisation; data.py's post-processing; scripts/collect_results.py's choice of
the reported metric per data set).

    normalise(s)         lower case, punctuation removed, articles a|an|the removed,
                         whitespace collapsed (SQuAD v1.1's normalize_answer)
    exact_match          normalise(pred) == normalise(gold), max over the golds
    substring_exact_match normalise(gold) in normalise(pred), max over the golds
    f1                   token F1 of the normalised strings (0 when one side alone is
                         yes | no | noanswer), max over the golds
    ndcg_at_10           trec_eval's ndcg_cut_10 (linear gain = the qrel label, log2
                         discount, ideal ranking from the qrels), rounded to 5 digits as
                         HELMET's calculate_retrieval_metrics rounds its per-query mean

HELMET scores a generation after prepending the prompt's last line (the "system template":
"Answer:", "Ranking:", "label:", "Corresponding value:") when the chat template is off, so
that its parser finds the prefix; the sample's metric is the max of the metric on the whole
output and on the parsed answer (`parse_output`: the text after the prefix up to the line's
end). The reported metric (collect_results.py): substring exact match for JSON KV and RAG,
RULER's recall for the RULER needles (the share of golds found, case-insensitive), nDCG@10
for MS MARCO re-ranking, exact match of the parsed label for ICL. Task score: 100 x the mean.

Long-document QA and summarization (data.py's default_post_process): every metric (exact
match, F1, substring EM, ROUGE-L and ROUGE-Lsum F1 and recall: rouge-score's RougeScorer
with the Porter stemmer, max over the golds) on the output and on its parsed answer (prefix
"Answer:"), the max of the two. InfiniteBench MC (choice_post_process): exact match of the
output or its parse against [letter, "letter. option"], or "letter. option" inside the
output (case-insensitive). Reported: ROUGE-L F1 for InfiniteBench QA (collect_results.py);
for NarrativeQA and the summaries HELMET reports GPT-4o's judgement, which longctx replaces
by ROUGE-L F1 (docs/helmet.md: deviations); exact match for InfiniteBench MC. ALCE:
eval/helmet/citations.py (str_em for ASQA, qampari_rec_top5 for QAMPARI).
"""

from __future__ import annotations

import math
import re
import string
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from longctx.eval.helmet.generator import SYSTEM_TEMPLATES, TASKS, HelmetError

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = set(string.punctuation)
_NO_OVERLAP = {"yes", "no", "noanswer"}


def normalise(text: str) -> str:
    """SQuAD's normalize_answer: lower, punctuation out, articles out, whitespace collapsed."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def f1_score(prediction: str, gold: str) -> float:
    """Token F1 of the normalised strings; 0 when either is yes/no/noanswer and they differ."""
    pred, ref = normalise(prediction), normalise(gold)
    if (pred in _NO_OVERLAP or ref in _NO_OVERLAP) and pred != ref:
        return 0.0
    pred_tokens, ref_tokens = pred.split(), ref.split()
    same = sum((Counter(pred_tokens) & Counter(ref_tokens)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred_tokens), same / len(ref_tokens)
    return 2 * precision * recall / (precision + recall)


_ROUGE: list[Any] = []


def rouge(prediction: str, gold: str) -> dict[str, float]:
    """rouge-score 0.1.2's rougeL and rougeLsum (use_stemmer=True): F1 and recall."""
    if not _ROUGE:
        try:
            from rouge_score import rouge_scorer
        except ImportError as error:
            raise HelmetError("HELMET's ROUGE-L needs rouge-score: pip install rouge-score==0.1.2") from error
        _ROUGE.append(rouge_scorer.RougeScorer(["rougeL", "rougeLsum"], use_stemmer=True))
    scores = _ROUGE[0].score(target=gold, prediction=prediction)
    return {f"{k}_{part}": getattr(scores[k], m) for k in ("rougeL", "rougeLsum") for part, m in _PARTS}


_PARTS = (("f1", "fmeasure"), ("recall", "recall"))


def _golds(answers: str | Sequence) -> list[str]:
    """A gold, a list of golds or a list of lists of golds, flattened (HELMET's rule)."""
    if isinstance(answers, str):
        return [answers]
    flat: list[str] = []
    for answer in answers:
        flat += list(answer) if isinstance(answer, list | tuple) else [answer]
    return [str(a) for a in flat]


def _best(metric: Callable[[str, str], float], prediction: str, answers: str | Sequence) -> float:
    return max(metric(prediction, gold) for gold in _golds(answers))


def qa_metrics(prediction: str, answers: str | Sequence) -> dict[str, float]:
    """HELMET's calculate_metrics without ROUGE: exact_match, f1, substring_exact_match."""
    return {
        "exact_match": _best(lambda p, g: float(normalise(p) == normalise(g)), prediction, answers),
        "f1": _best(f1_score, prediction, answers),
        "substring_exact_match": _best(lambda p, g: float(normalise(g) in normalise(p)), prediction, answers),
    }


def all_metrics(prediction: str, answers: str | Sequence) -> dict[str, float]:
    """HELMET's calculate_metrics: qa_metrics and the ROUGE scores, each the max over the golds."""
    golds = _golds(answers)
    scores = [rouge(prediction, gold) for gold in golds]
    return {**qa_metrics(prediction, golds), **{k: max(s[k] for s in scores) for k in scores[0]}}


def parse_prefix(kind: str) -> str:
    """The prefix HELMET's post-processing parses after: Multi-LexSum's own post_process
    parses after "Summary:", default_post_process (every other task, InfiniteBench Sum too)
    after "Answer:"."""
    return "Summary:" if kind == "multi_lexsum" else "Answer:"


def post_processed(output: str, answers: str | Sequence, prefix: str = "Answer:") -> dict[str, float]:
    """default_post_process: each metric the max over the output and its parsed answer."""
    whole, parsed = all_metrics(output, answers), all_metrics(parse_output(output, prefix), answers)
    return {k: max(v, parsed[k]) for k, v in whole.items()}


def choice_correct(output: str, answers: Sequence[str]) -> float:
    """choice_post_process's exact_match: EM of the output or of its parse against [letter,
    "letter. option"], or the second inside the output (case-insensitive)."""
    exact = max(qa_metrics(output, answers)["exact_match"], qa_metrics(parse_output(output), answers)["exact_match"])
    return 1.0 if answers[1].lower() in output.lower() else exact


def parse_output(output: str, prefix: str = "Answer:") -> str:
    """HELMET's parse_output: the rest of the line after `prefix` (case-insensitive), else the
    first line; a repeated prefix stripped once more."""
    for pattern in (re.compile(f"(?:{prefix})(.*)(?:\n|$)", re.IGNORECASE), re.compile(r"(?:^)(.*)(?:\n|$)")):
        match = pattern.search(output)
        if match is not None:
            return re.sub(f"^{re.escape(prefix)}", "", match[1].strip(), flags=re.IGNORECASE).strip()
    return ""  # unreachable: the second pattern matches any string


def parse_rankings(output: str) -> dict[str, int]:
    """HELMET's parse_rankings: the longest run "3 > 1 > 2" of ids ("[", "]", ":" and "id"
    removed first), each id scored len - position (first kept); the whole text when none."""
    output = re.sub(r"[\[\]:]", "", output).lower().replace("id", "")
    longest = ""
    for match in re.finditer(r"(\d+)(?:\s*>\s*(\d+))*", output):
        if len(match.group(0)) > len(longest):
            longest = match.group(0)
    rankings = [n.strip() for n in longest.split(">") if n.strip().isdigit()] if longest else [output]
    scores: dict[str, int] = {}
    for position, doc in enumerate(rankings):
        scores.setdefault(doc, len(rankings) - position)
    return scores


def ndcg_at_k(scores: Mapping[str, float], qrels: Mapping[str, int], k: int = 10) -> float:
    """trec_eval's ndcg_cut_k for one query: documents by score (descending; ties by id,
    descending, as trec_eval breaks them), gain = the qrel label (0 when unjudged or
    negative), discount log2(rank + 1); divided by the ideal DCG of the qrels' labels."""
    ranked = sorted(scores.items(), key=lambda item: (item[1], item[0]), reverse=True)[:k]
    dcg = sum(max(qrels.get(doc, 0), 0) / math.log2(rank + 2) for rank, (doc, _) in enumerate(ranked))
    ideal = sorted((label for label in qrels.values() if label > 0), reverse=True)[:k]
    idcg = sum(label / math.log2(rank + 2) for rank, label in enumerate(ideal))
    return dcg / idcg if idcg > 0 else 0.0


def ruler_recall(prediction: str, answers: Sequence[str]) -> float:
    """HELMET's ruler_recall (RULER's string_match_all): the share of golds in the output."""
    return sum(a.lower() in prediction.lower() for a in answers) / len(answers)


def clean_output(output: str) -> str:
    """eval_alce's main(): newlines collapsed to one space, "<|im_end|>" removed."""
    return re.sub(r"\n+", " ", output).replace("<|im_end|>", "")


def remove_citations(sentence: str) -> str:
    """utils.remove_citations: " [k" and "[k" removed, then " |" and "]"."""
    return re.sub(r"\[\d+", "", re.sub(r" \[\d+", "", sentence)).replace(" |", "").replace("]", "")


def str_em(output: str, qa_pairs: Sequence[dict[str, Any]]) -> float:
    """compute_str_em for one row (0-1), on the cleaned output without citations."""
    text = normalise(remove_citations(clean_output(output)))
    hits = [any(normalise(a) in text for a in pair["short_answers"]) for pair in qa_pairs]
    return sum(hits) / len(hits)


def qampari_scores(output: str, answers: Sequence[Sequence[str]]) -> dict[str, float]:
    """compute_qampari_f1 (cot off) for one row: prec, rec, rec_top5, f1, f1_top5 (0-1)."""
    text = remove_citations(clean_output(output))
    predictions = [normalise(x.strip()) for x in text.rstrip().rstrip(".").rstrip(",").split(",")]
    predictions = [p for p in predictions if p]
    golds = [[normalise(x) for x in group] for group in answers]
    flat = [x for group in golds for x in group]
    hits = sum(any(x in predictions for x in group) for group in golds)
    prec = sum(p in flat for p in predictions) / len(predictions) if predictions else 0.0
    rec, rec_top5 = hits / len(golds), min(5, hits) / min(5, len(golds))

    def f1(p: float, r: float) -> float:
        return 0.0 if p + r == 0 else 2 * p * r / (p + r)

    return {"prec": prec, "rec": rec, "rec_top5": rec_top5, "f1": f1(prec, rec), "f1_top5": f1(prec, rec_top5)}


def sample_score(task: str, output: str, references: Any) -> float:
    """The reported metric of one sample in [0, 1]. `output` is HELMET's: the generation
    after the system template when the chat template is off. `references`: the golds, or
    for msmarco the qrels as [doc id, label] pairs."""
    if task not in TASKS:
        raise HelmetError(f"HELMET task {task!r} is not one of {list(TASKS)}")
    kind = TASKS[task].kind
    if kind == "ruler":
        return ruler_recall(output, [str(r) for r in references])
    if kind == "rerank":
        qrels = {str(doc): int(label) for doc, label in references}
        return round(ndcg_at_k(parse_rankings(output), qrels, 10), 5)
    if kind == "icl":
        return qa_metrics(parse_output(output, SYSTEM_TEMPLATES["icl"]), references)["exact_match"]
    if kind == "infbench_choice":
        return choice_correct(output, [str(r) for r in references])
    if kind in ("narrativeqa", "infbench_qa", "infbench_sum", "multi_lexsum"):
        return post_processed(output, references, parse_prefix(kind))["rougeL_f1"]
    if kind == "alce":
        item = references[0] if isinstance(references, list | tuple) else references
        if "qa_pairs" in item:
            return str_em(output, item["qa_pairs"])
        return qampari_scores(output, item["answers"])["rec_top5"]
    prefix = "corresponding value:" if kind == "json_kv" else "Answer:"
    whole = qa_metrics(output, references)["substring_exact_match"]
    return max(whole, qa_metrics(parse_output(output, prefix), references)["substring_exact_match"])


def task_score(task: str, outputs: Sequence[str], references: Sequence[Sequence]) -> float:
    """100 x the mean sample score (HELMET's averaged_metrics)."""
    if not outputs or len(outputs) != len(references):
        raise HelmetError(f"HELMET {task}: {len(outputs)} predictions for {len(references)} references")
    return 100 * sum(sample_score(task, o, r) for o, r in zip(outputs, references, strict=True)) / len(outputs)
