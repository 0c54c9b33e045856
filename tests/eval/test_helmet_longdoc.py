"""HELMET's long-document QA, summarization and ALCE prompts on fixtures in its files'
formats (tests/fixtures/helmet/data: InfiniteBench's jsonl, the Hugging Face narrativeqa and
multi_lexsum rows, ALCE's JSON with HELMET's prompts/*_revised.json, demonstrations shortened
to two passages of 80 characters). Each expected prompt is written out here from HELMET's
data.py (load_infbench, load_narrativeqa, load_multi_lexsum, load_alce) by hand; the seeded
draws are recomputed with numpy / random directly."""

import json
import random
from pathlib import Path

import numpy as np
import pytest

from longctx.config import ExperimentConfig
from longctx.eval.helmet import HelmetError
from longctx.eval.helmet.data import HelmetData
from longctx.eval.helmet.generator import prompt_text
from longctx.eval.helmet.longdoc import truncate_document
from longctx.eval.suite_table import suite_tasks
from longctx.model.inference.generation import Generation

DATA = Path(__file__).parents[1] / "fixtures" / "helmet" / "data"


def _rows(relative):
    return [json.loads(line) for line in (DATA / relative).read_text().splitlines() if line.strip()]


def test_infbench_qa_prompt_is_helmets():
    rows = _rows("infbench/longbook_qa_eng.jsonl")
    first = rows[int(np.random.default_rng(42).permutation(len(rows))[0])]  # shuffle(seed=42), sample 0
    others = [r for r in rows if r["id"] != first["id"]]
    demos = [others[int(i)] for i in np.random.default_rng(42).permutation(len(others))[:2]]
    demo = "For example:\n\n" + "\n\n".join(
        f"[story text]\nQuestion: {d['input']}\nAnswer: {d['answer'][0]}" for d in demos
    )
    expected = (
        "You are given a story and a question. Answer the question as concisely as you can, using a single "
        f"phrase if possible.\n\n{demo}\n\nNow, read the following story:\n\n{first['context']}\n\n"
        f"Question: {first['input']}\n\nAnswer:"
    )
    fields, answers = HelmetData(str(DATA)).sample_fields("infbench_qa", 8192, 0)
    assert prompt_text("infbench_qa", fields, chat=False) == expected and answers == first["answer"]


def test_infbench_choice_options_and_answer_letter():
    fields, answers = HelmetData(str(DATA)).sample_fields("infbench_choice", 8192, 0)
    row = next(r for r in _rows("infbench/longbook_choice_eng.jsonl") if r["context"] == fields["context"])
    letter = "ABCD"[row["options"].index("Blue")]
    assert answers == [letter, f"{letter}. Blue"]
    assert fields["options"] == "A. {}\nB. {}\nC. {}\nD. {}".format(*row["options"])
    text = prompt_text("infbench_choice", fields, chat=True)
    assert text.endswith(f"Question: {row['input']}\nOptions:\n{fields['options']}")
    assert "Options:\nA. " in fields["demo"] and fields["demo"].startswith("For example:\n\n[story text]\n")


def test_narrativeqa_and_multi_lexsum_prompts():
    data = HelmetData(str(DATA))
    fields, answers = data.sample_fields("narrativeqa", 8192, 1)
    assert answers == ["At the lighthouse", "lighthouse"]  # the file's row 1: HELMET's selection in order
    text = prompt_text("narrativeqa", fields, chat=False)
    assert text.startswith(
        "You are given a story, which can be either a novel or a movie script, and a question. Answer the "
        "question as concisely as you can, using a single phrase if possible.\n\nFor example:\n\nQuestion: Train "
    )
    assert "\n\nNow, use the following story to answer the question:\n\nSentence 0 of story 1" in text
    assert text.endswith("\n\nQuestion: Where does keeper 1 live?\nAnswer:")  # "\n" before "Answer:"
    fields, summary = data.sample_fields("multi_lexsum", 8192, 0)
    rows = [r for r in _rows("multi_lexsum/validation.jsonl") if r["summary/short"] is not None]
    assert summary in [r["summary/short"] for r in rows] and "case-1" not in fields["id"]  # no-summary row dropped
    text = prompt_text("multi_lexsum", fields, chat=False)
    assert text.startswith("You are given the legal documents in a civil rights lawsuit")
    assert "\n\nExample summaries:\n\nSummary: Training summary " in text
    assert "\n\nNow, write a summary of the following legal documents.\nLegal documents:\nSentence 0" in text
    assert text.endswith("\n\nDocket {}.\n\nNow please summarize the case.\n\nSummary:".format(fields["id"][-1]))


def test_alce_prompt_docs_and_seeded_demos():
    prompts = json.loads((DATA / "prompts/asqa_revised.json").read_text())
    rows = json.loads((DATA / "alce/asqa_eval_gtr_top2000.json").read_text())
    fields, reference = HelmetData(str(DATA)).sample_fields("alce_asqa", 8192, 0)
    j = int(np.random.default_rng(42).permutation(len(rows))[0])  # the file row of sample 0
    state = random.Random(42)
    draws = [state.sample(prompts["demos"], 2) for _ in range(len(rows))]
    doc = "Document [{ID}](Title: {title}): {text}"
    demo_text = "\n\n\n".join(
        prompts["demo_prompt"].format(
            **{
                **d,
                "instruction": prompts["instruction"],
                "context": "\n\n".join(doc.format(**p, ID=i + 1) for i, p in enumerate(d["docs"])),
            }
        )
        for d in draws[j]
    )
    context = "\n\n".join(doc.format(**p, ID=i + 1) for i, p in enumerate(rows[j]["docs"][:30]))  # alce_asqa_30
    expected = f"{demo_text}\n\n\n{prompts['instruction']}\n\nQuestion: {rows[j]['question']}\n\n{context}\n\nAnswer:"
    assert prompt_text("alce", fields, chat=False) == expected
    assert len(reference["docs"]) == 30 and reference["qa_pairs"] == rows[j]["qa_pairs"]
    _, at_16k = HelmetData(str(DATA)).sample_fields("alce_qampari", 16384, 0)
    assert len(at_16k["docs"]) == 40 and at_16k["answers"] == [["Book A", "A"], ["Book B"]]  # 75 asked, 40 there


def test_truncation_keeps_the_limit_with_helmets_postfix(tokenizer):
    document = " ".join(f"word{i}" for i in range(400))
    text, cut = truncate_document(document, 100, tokenizer.encode, tokenizer.decode)
    postfix = " ... [the rest of the text is omitted]"
    kept = tokenizer.encode(document)[: 100 - len(tokenizer.encode(postfix)) - 1]
    assert cut and text == tokenizer.decode(kept) + postfix
    assert truncate_document("short text", 100, tokenizer.encode, tokenizer.decode) == ("short text", False)


def test_engine_samples_fit_and_missing_files_name_the_task(tokenizer, tmp_path):
    config = ExperimentConfig()
    config.eval.benchmarks.helmet_dir = str(DATA)
    (engine,) = suite_tasks("helmet", ["infbench_sum"], config)
    (sample,) = engine.samples(0, 1600, 1, tokenizer)
    assert len(sample.prompt_ids) + 1200 <= 1600 and sample.metadata["document_cut"]  # 1600 - 1400 tokens of story
    assert sample.stop.stop_strings == () and sample.max_new_tokens == 1200
    details = engine.details(sample, Generation([], " The keeper tends the light.", "eos"))
    assert details["pred"].startswith("Summary: The keeper") and details["question"] == ""
    names = [t.name for t in suite_tasks("helmet", ["longqa", "summ", "cite"], config)]
    assert names == [
        "helmet-narrativeqa",
        "helmet-infbench_qa",
        "helmet-infbench_choice",
        "helmet-infbench_sum",
        "helmet-multi_lexsum",
        "helmet-alce_asqa",
        "helmet-alce_qampari",
    ]
    config.eval.benchmarks.helmet_dir = str(tmp_path)
    (engine,) = suite_tasks("helmet", ["infbench_qa"], config)
    with pytest.raises(HelmetError, match=r"HELMET task infbench_qa needs .*infbench/longbook_qa_eng.jsonl"):
        engine.samples(0, 8192, 1, tokenizer)


def test_a_row_without_a_field_names_the_file_and_the_task(tmp_path):
    (tmp_path / "alce").mkdir()
    (tmp_path / "alce" / "qampari_eval_gtr_top2000.json").write_text(json.dumps([{"question": "q", "docs": []}]))
    with pytest.raises(
        HelmetError, match=r"alce_qampari: a row of alce/qampari_eval_gtr_top2000.json has no 'answers'"
    ):
        HelmetData(str(tmp_path)).sample_fields("alce_qampari", 8192, 0)


@pytest.mark.slow  # decoding on CPU: 2 tasks x 2 samples at 2048 tokens
def test_eval_suite_long_document_cells_score_as_eval_score_does(tmp_path, capsys):
    from longctx.cli import main
    from longctx.config.model import ModelConfig
    from longctx.model.checkpoint import save_model
    from longctx.model.llama import Llama

    checkpoint = tmp_path / "m.safetensors"
    save_model(Llama(ModelConfig.from_preset("debug", max_position=2048)), checkpoint)
    out = tmp_path / "out" / "helmet.md"
    sets = ["eval.benchmarks.samples_per_length=2", "log.wandb_mode=disabled", f"eval.benchmarks.helmet_dir={DATA}"]
    args = ["eval-suite", str(checkpoint), "--suite", "helmet", "--tasks", "infbench_choice,alce_qampari"]
    assert main([*args, "--lengths", "2048", *sets, "--out", str(out), "--quiet"]) == 0
    table = json.loads(out.with_suffix(".json").read_text())
    assert table["categories"] == {"longqa": ["infbench_choice"], "cite": ["alce_qampari"]}
    cell = tmp_path / "out" / "cells" / "m.safetensors" / "rope" / "helmet-infbench_choice" / "L2048"
    capsys.readouterr()
    assert main(["eval-score", "--task", "helmet_infbench_choice", str(cell / "samples.jsonl")]) == 0
    summary = json.loads((cell / "summary.json").read_text())
    assert json.loads(capsys.readouterr().out)["score"] == pytest.approx(100 * summary["score"])
