"""ALCE's metrics as HELMET computes them (princeton-nlp/HELMET eval_alce.py, after Gao et al.
2023, "Enabling Large Language Models to Generate Text with Citations", §3 and §4).

The output is first cleaned: newlines to one space, "<|im_end|>" removed; every metric but
the citation ones then reads it with citations removed (`remove_citations`).

    str_em (ASQA)       per row: the share of qa_pairs with a normalised short answer inside
                        the normalised output (exact_presence); 100 x the mean
    qampari_rec_top5    answers = the output split at ","; per row: min(5, gold answer sets hit)
                        / min(5, gold sets); 100 x the mean (also prec, rec, f1 as eval_alce)
    citation_rec        per sentence (punkt; ASQA sentences under 5 characters dropped; QAMPARI:
                        question + " " + each comma item), 1 when the cited documents ([k],
                        k from 1; at most 3) jointly entail it (NLI), 0 when it cites none or
                        a document out of range; per row the mean; 100 x the mean over rows with
                        a sentence
    citation_prec       a citation of a supported multi-citation sentence counts unless it is
                        alone not entailing and the others without it entail (over-citation);
                        a single citation counts when the sentence is entailed; per row the
                        count / the citations; 100 x the mean over rows with a sentence

NLI is HELMET's AutoAIS (google/t5_xxl_true_nli_mixture, "premise: P hypothesis: H" -> "1"),
taken by path (`load_nli`); without one the citation metrics are refused.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from longctx.eval.helmet.generator import HelmetError
from longctx.eval.helmet.scoring import clean_output, remove_citations

NLI = Callable[[str, str], bool | int]
"""nli(premise, hypothesis): whether the premise entails the hypothesis."""

AT_MOST_CITATIONS = 3
"""eval_alce.py's --at_most_citations default."""


def _document(doc: dict[str, Any]) -> str:
    return "Title: {}\n{}".format(doc["title"], doc["sent"] if "sent" in doc else doc["text"])


def sentences(output: str, question: str, qampari: bool, split: Callable[[str], list[str]]) -> list[str]:
    """compute_autoais's claims: QAMPARI's comma items after the question; ASQA's punkt
    sentences of at least 5 characters."""
    if qampari:
        return [question + " " + x.strip() for x in output.rstrip().rstrip(".").rstrip(",").split(",")]
    return [s for s in split(output) if len(s.strip()) >= 5]


def row_citations(
    output: str,
    question: str,
    docs: Sequence[dict[str, Any]],
    nli: NLI,
    qampari: bool,
    split: Callable[[str], list[str]],
) -> tuple[float, float] | None:
    """(recall, precision) of one row in [0, 1] (module docstring); None without a sentence."""
    claims = sentences(clean_output(output), question, qampari, split)
    if not claims:
        return None
    entail = entail_prec = total = 0
    for claim in claims:
        target = remove_citations(claim).strip()
        cited = [int(r[1:]) - 1 for r in re.findall(r"\[\d+", claim)]
        if not cited or any(r >= len(docs) for r in cited):
            supported = 0
        else:
            cited = cited[:AT_MOST_CITATIONS]
            total += len(cited)
            supported = int(bool(nli("\n".join(_document(docs[r]) for r in cited), target)))
        entail += supported
        if supported and len(cited) > 1:
            for r in cited:
                if nli(_document(docs[r]), target):
                    entail_prec += 1
                    continue
                rest = list(cited)
                rest.remove(r)
                if not nli("\n".join(_document(docs[k]) for k in rest), target):
                    entail_prec += 1
        else:
            entail_prec += supported
    return entail / len(claims), (entail_prec / total if total > 0 else 0.0)


def citation_scores(rows: Sequence[dict[str, Any]], nli: NLI | None, qampari: bool) -> dict[str, float]:
    """citation_rec and citation_prec (0-100) over rows {output, question, docs}."""
    if nli is None:
        raise HelmetError(NLI_REFUSAL)
    from longctx.eval.sentences import punkt_english

    split = punkt_english().tokenize
    scored = [row_citations(r["output"], r["question"], r["docs"], nli, qampari, split) for r in rows]
    kept = [s for s in scored if s is not None]
    if not kept:
        return {"citation_rec": 0.0, "citation_prec": 0.0}
    return {
        "citation_rec": 100 * sum(s[0] for s in kept) / len(kept),
        "citation_prec": 100 * sum(s[1] for s in kept) / len(kept),
    }


NLI_REFUSAL = (
    "HELMET's citation recall and precision need an NLI model: eval-score --nli PATH (a local copy of "
    "google/t5_xxl_true_nli_mixture, HELMET's AutoAIS model); none given"
)


def load_nli(path: str) -> NLI:
    """HELMET's _run_nli_autoais on a local seq2seq model: "premise: P hypothesis: H",
    greedy up to 10 tokens, entailed when the text is "1"."""
    if not path:
        raise HelmetError(NLI_REFUSAL)
    if not Path(path).is_dir():
        raise HelmetError(f"--nli {path}: not a model directory (HELMET: google/t5_xxl_true_nli_mixture)")
    import torch
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForSeq2SeqLM.from_pretrained(path).eval()

    def nli(premise: str, hypothesis: str) -> bool:
        ids = tokenizer(f"premise: {premise} hypothesis: {hypothesis}", return_tensors="pt").input_ids
        with torch.inference_mode():
            out = model.generate(ids, max_new_tokens=10)
        return tokenizer.decode(out[0], skip_special_tokens=True) == "1"

    return nli
