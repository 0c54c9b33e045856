"""HELMET (Yen et al., "HELMET: How to Evaluate Long-Context Language Models Effectively and
Thoroughly", ICLR 2025; princeton-nlp/HELMET) on the evaluation engine: its seven categories,
prompts built from its released files by its rules, at its controlled lengths.

    recall   json_kv, ruler_niah_mk_2, ruler_niah_mk_3, ruler_niah_mv: longctx's generators of
             these tasks (no data file), HELMET's generation lengths and metrics
    rag      nq, triviaqa, hotpotqa, popqa: KILT questions over HELMET's retrieved passages
             (k = 50, 105, 220, 440, 1000 at 8K-128K), two demonstrations; substring EM
    rerank   msmarco: rank k = 50 ... 1000 passages, two demonstrations; nDCG@10
    icl      trec_coarse, trec_fine, banking77, clinc150, nlu: many-shot classification with
             labels mapped to shuffled integers; exact match
    longqa   narrativeqa, infbench_qa, infbench_choice: the document cut to HELMET's length,
             two demonstrations; ROUGE-L F1 (QA), exact match (MC)
    summ     infbench_sum, multi_lexsum; ROUGE-L F1 (HELMET's GPT-4o judge: summ_judge.py)
    cite     alce_asqa, alce_qampari: 30-700 retrieved passages; str_em / QAMPARI recall,
             citation recall and precision with an NLI model by path (citations.py)

The faithful parts and the deviations: docs/helmet.md.

    benchmark.py    the registry's spec (categories, defaults, category means, file reader)
    generator.py    templates, task table, HELMET's demonstration draws and truncation
    templates.py    the long-document, summarization and ALCE prompt strings and sizes
    data.py         HELMET's files under eval.benchmarks.helmet_dir, a sample's fields
    longdoc.py      the long-document, summarization and ALCE rows, demonstrations, truncation
    engine_task.py  `HelmetTask`, `RecallTask`: the engine tasks
    scoring.py      HELMET's metrics
    citations.py    ALCE's citation recall / precision (NLI by path)
    judge.py        HELMET's NarrativeQA judge on a local model (GPT-4o's place)
    summ_judge.py   HELMET's summary judge (key-point F1 x fluency) on the same local model
    summ_prompts.py its six summary judge prompts, verbatim
"""

from longctx.eval.helmet.generator import TASKS, HelmetError, HelmetPromptTooShortError
from longctx.eval.helmet.scoring import ndcg_at_k, normalise, parse_output, parse_rankings, sample_score, task_score

__all__ = [
    "TASKS",
    "HelmetError",
    "HelmetPromptTooShortError",
    "ndcg_at_k",
    "normalise",
    "parse_output",
    "parse_rankings",
    "sample_score",
    "task_score",
]
