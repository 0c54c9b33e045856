"""HELMET's prompt strings for long-document QA, summarization and generation with citations
(princeton-nlp/HELMET data.py: load_narrativeqa, load_infbench, load_multi_lexsum,
load_alce; InfiniteBench's prompts as HELMET modified them), the demonstration layouts and
the per-length sizes of its configs (longqa*.yaml, summ*.yaml, cite*.yaml). Strings are data
and reproduced verbatim.

HELMET's prompt_template is user_template + SEPARATOR + system_template: "\\n" for
NarrativeQA (and the RAG / re-ranking / ICL tasks), "\\n\\n" for InfiniteBench, Multi-LexSum
and ALCE.
"""

from __future__ import annotations

LONG_USER_TEMPLATES = {
    "narrativeqa": "You are given a story, which can be either a novel or a movie script, and a question. Answer "
    "the question as concisely as you can, using a single phrase if possible.\n\n{demo}{context}\n\nQuestion: "
    "{question}",
    "infbench_qa": "You are given a story and a question. Answer the question as concisely as you can, using a "
    "single phrase if possible.\n\n{demo}{context}\n\nQuestion: {question}",
    "infbench_choice": "You are given a story and a question with multiple choices. Choose the best answer from "
    "the options provided. Only one of the following options is correct, output the answer using one single letter "
    "(A, B, C, or D). Don't say anything else.\n\n{demo}{context}\n\nQuestion: {question}\nOptions:\n{options}",
    "infbench_sum": "You are given a book and you are tasked to summarize it. Write a summary of about 1000 to 1200 "
    "words. Only write about the plot and characters of the story. Do not discuss the themes or background of the "
    "book. Do not provide any analysis or commentary.\n\n{demo}{context}\n\nNow summarize the book.",
    "multi_lexsum": "You are given the legal documents in a civil rights lawsuit, and you are tasked to summarize "
    "the case. Write a concise summary of one paragraph (200 to 250 words). The summary should contain a short "
    "description of the background, the parties involved, and the outcomes of the case.\n\n{demo}Legal documents:\n"
    "{context}\n\nNow please summarize the case.",
    "alce": "{demo_text}{instruction}\n\nQuestion: {question}\n\n{context}",
}
LONG_SYSTEM_TEMPLATES = {
    "narrativeqa": "Answer:",
    "infbench_qa": "Answer:",
    "infbench_choice": "Answer:",
    "infbench_sum": "Summary:",
    "multi_lexsum": "Summary:",
    "alce": "Answer:",
}
SEPARATORS = {"narrativeqa": "\n", "infbench_qa": "\n\n", "infbench_choice": "\n\n"}
SEPARATORS |= {"infbench_sum": "\n\n", "multi_lexsum": "\n\n", "alce": "\n\n"}

TRUNCATION_POSTFIX = " ... [the rest of the text is omitted]"
"""truncate_llama2's postfix after a document cut to its dataset-name length."""

CONTEXT_RESERVE = {"narrativeqa": 300, "infbench_qa": 210, "infbench_choice": 210}
CONTEXT_RESERVE |= {"infbench_sum": 1400, "multi_lexsum": 700}
"""The document's token limit is length - reserve: the number in the config's dataset name
(narrativeqa_7892, infbench_qa_eng_7982, infbench_sum_eng_6792, multi_lexsum_7492 at 8K;
the same differences at 16K-128K)."""

ALCE_DOCS = (30, 75, 165, 345, 700)
"""alce_asqa_<n> / alce_qampari_<n>: retrieved passages at 8K-128K (cite*.yaml)."""

LONG_SHOTS = 2
"""shots: 2 in longqa*.yaml, summ*.yaml and cite*.yaml."""

NARRATIVEQA_DEMO = "Question: {question}\nAnswer: {answer}"
NARRATIVEQA_DEMOS = "For example:\n\n{demos}\n\nNow, use the following story to answer the question:\n\n"
INFBENCH_DEMO = {
    "infbench_qa": "[story text]\nQuestion: {question}\nAnswer: {answer}",
    "infbench_choice": "[story text]\nQuestion: {question}\nOptions:\n{options}\nAnswer: {answer}",
    "infbench_sum": "[story text]\nSummary: {answer}",
}
INFBENCH_DEMOS = "For example:\n\n{demos}\n\nNow, read the following story:\n\n"
LEXSUM_DEMOS = "Example summaries:\n\n{demos}\n\nNow, write a summary of the following legal documents.\n"
