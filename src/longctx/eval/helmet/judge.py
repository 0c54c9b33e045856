"""HELMET's model-judged NarrativeQA score (scripts/eval_gpt4_longqa.py) with a local judge
model in place of GPT-4o (a deviation, reported as such beside the n-gram metrics).

Per row the judge reads HELMET's prompt (its rubric: fluency 0-1, correctness 0-3; the
question, the correct answers as a Python list, the parsed answer: the output with newlines
as spaces, the text after "Answer:") and its last {...} is read as JSON; the row scores
fluency x correctness; rows whose reply has no such JSON are left out. Reported as
collect_results.py does: 100/3 x the mean (0-100).

The summaries' judge (eval_gpt4_summ.py: fluency, key-point recall, sentence precision) is
eval/helmet/summ_judge.py, on the same local judge (`load_judge`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from longctx.eval.helmet.generator import HelmetError
from longctx.eval.helmet.scoring import parse_output

Judge = Callable[[str], str]
"""judge(prompt) -> the judge model's reply."""

JUDGE_PROMPT = """Please act as an impartial judge and evaluate the quality of the provided answer which attempts to answer the provided question based on a provided context.
Although you are not given the context, you will be given a set of correct answers that achieves full scores on all metrics, and you need to assess the provided answers using the correct answers.

Below is your grading rubric:

Fluency:
- Score 0 (incoherent, repetitive, or incomplete): Incoherent sentences, repetitive sentences (even if not by exact words), incomplete answers, or gibberish. Note that even if the answer is coherent, if it is repetitive or incomplete, it should be given a score of 0.
- Score 1 (coherent, non-repetitive answer): Coherent, non-repetitive, fluent, grammatically correct answers.

Correctness:
- Score 0 (Incorrect): The answer does not agree with the provided correct answers at all.
- Score 1 (partly correct): Partly agree with one of the provided correct answers (for example, the question asks for a date and a person; the answer gets the date right but the person wrong).
- Score 2 (correct but not fully relevant): Fully agrees with one of the provided correct answers but mentions other completely irrelevant information. Note that extra details provided in the answer, even if not mentioned in the correct answers, should NOT be seen as irrelevant as long as they are relevant to the question to a reasonable extend.
- Score 3 (correct and relevant): Fully agrees with one of the provided correct answers and only provides information relevant to the question. Note that if the answer is longer than the correct answer, as long as everything in the answer is relevant to the question, it should still be given score 3. For example, if the correct answer is "the North Pole" and the answer is "They are headed for the North Pole", it should still be given a score of 3.

Now, read the following question, answer, and correct answers. First think step-by-step and provide your reasoning and assessment on the answer. Then output your score in the following json format: {{"fluency": 0, "correctness": 1}}.

Question: {question}
Correct answers: {correct_answers}
Answer: {parsed_output}
"""


def judge_prompt(question: str, answers: Sequence[str], output: str) -> str:
    """HELMET's prompt for one row; the answers printed as a Python list, as its format() does."""
    parsed = parse_output(output.replace("\n", " "))
    return JUDGE_PROMPT.format(question=question, correct_answers=list(answers), parsed_output=parsed)


def parse_reply(reply: str) -> dict[str, Any] | None:
    """parse_json: the last {...} of the reply as JSON, None when absent or not JSON."""
    matches = re.findall(r"\{.*?\}", reply, re.DOTALL)
    if not matches:
        return None
    try:
        value = json.loads(matches[-1])
    except json.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None


def judged_score(rows: Sequence[tuple[str, Sequence[str], str]], judge: Judge) -> dict[str, Any]:
    """{"judge_score": 100/3 x mean(fluency x correctness), "judged": rows scored} over
    (question, answers, output) rows."""
    total, count = 0.0, 0
    for question, answers, output in rows:
        scores = parse_reply(judge(judge_prompt(question, answers, output)))
        if scores is not None and "fluency" in scores and "correctness" in scores:
            total += float(scores["fluency"]) * float(scores["correctness"])
            count += 1
    if count == 0:
        raise HelmetError("the judge's replies held no {'fluency', 'correctness'} JSON: no judged score")
    return {"judge_score": round(100 / 3 * total / count, 4), "judged": count}


def load_judge(path: str, max_new_tokens: int = 1024) -> Judge:
    """A local chat model as the judge: the prompt as the user turn of its chat template,
    greedy decoding (HELMET: GPT-4o at temperature 0.1)."""
    if not Path(path).is_dir():
        raise HelmetError(f"--judge {path}: not a model directory (a local chat model judging in GPT-4o's place)")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path).eval()

    def judge(prompt: str) -> str:
        chat = [{"role": "user", "content": prompt}]
        encoded: Any = tokenizer.apply_chat_template(
            chat, add_generation_prompt=True, return_tensors="pt", return_dict=True
        )
        ids = encoded["input_ids"]
        with torch.inference_mode():
            out = model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False)
        return str(tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True))

    return judge


def judge_scores(task: str, rows: Sequence[tuple[str, Sequence[str], str]], path: str) -> dict[str, Any]:
    """The judged score of a NarrativeQA prediction file with the judge model at `path`
    (the summaries: summ_judge.judge_summary_file)."""
    if task != "narrativeqa":
        raise HelmetError(f"HELMET {task}: judge_scores judges NarrativeQA's answers; the summaries: summ_judge")
    return {**judged_score(rows, load_judge(path)), "judge_model": path}
