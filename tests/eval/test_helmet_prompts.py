"""HELMET's prompts (eval/helmet/generator.py, data.py) equal, string for string, what HELMET's
own data.py builds for the same rows: tests/fixtures/helmet/reference_prompts.json was made
once by running HELMET's load_qa, load_msmarco_rerank and load_icl (the commit it names) on
the fixture files under tests/fixtures/helmet/data (tools/fixtures/make_helmet_fixtures.py
remakes it)."""

import json
from pathlib import Path

import pytest

from longctx.config import ExperimentConfig
from longctx.errors import ConfigError
from longctx.eval.helmet import TASKS, HelmetError, HelmetPromptTooShortError
from longctx.eval.helmet.data import HelmetData
from longctx.eval.helmet.generator import (
    fit_context,
    hf_train_test_split,
    icl_fields,
    icl_shots,
    icl_test_rows,
    prompt_text,
)

FIXTURES = Path(__file__).parents[1] / "fixtures" / "helmet"
REFERENCE = json.loads((FIXTURES / "reference_prompts.json").read_text())


def test_the_reference_names_its_helmet_commit():
    assert REFERENCE["helmet_commit"] == "4526dfbdc512bd9ff721da336bff4e3e75ecfd27"


@pytest.mark.parametrize("task", ["nq", "popqa", "msmarco"])
def test_rag_and_rerank_prompts_are_helmets(task):
    data = HelmetData(str(FIXTURES / "data"))
    expected = REFERENCE["prompts"][task]
    for index, reference in enumerate(expected):
        fields, references = data.sample_fields(task, 8192, index)
        assert prompt_text(TASKS[task].kind, fields, chat=False) == reference["prompt"]
        if task == "msmarco":
            assert references == reference["qrel"]
        else:
            assert references == reference["answer"]
    with pytest.raises(HelmetError, match=f"sample {len(expected)} asked"):
        data.sample_fields(task, 8192, len(expected))


def test_the_chat_prompt_is_the_user_template():
    fields, _ = HelmetData(str(FIXTURES / "data")).sample_fields("nq", 8192, 0)
    assert prompt_text("rag", fields, chat=True) + "\nAnswer:" == REFERENCE["prompts"]["nq"][0]["prompt"]


def _icl_rows(folder: str, split: str) -> list[dict]:
    lines = (FIXTURES / "data" / "icl" / folder / f"{split}.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


@pytest.mark.parametrize(
    ("task", "folder"), [("trec_coarse", "trec"), ("trec_fine", "trec"), ("banking77", "banking77")]
)
def test_icl_prompts_and_label_mapping_are_helmets(task, folder):
    info = TASKS[task]
    train, test = _icl_rows(folder, "train"), icl_test_rows(_icl_rows(folder, "test"), info)
    expected = REFERENCE["prompts"][task]
    assert len(test) == len(expected)
    for row, reference in zip(test, expected, strict=True):
        fields = icl_fields(row, train, info, reference["shots"])
        assert prompt_text("icl", fields, chat=False) == reference["prompt"]
        assert fields["answer"] == reference["answer"]


def test_nlu_is_split_and_its_test_rows_balanced_as_helmet_does():
    info = TASKS["nlu"]
    train, test = hf_train_test_split(_icl_rows("nlu", "train"), 0.1, 42)
    expected = REFERENCE["prompts"]["nlu"]
    test = icl_test_rows(test, info, count=3)
    for row, reference in zip(test, expected, strict=True):
        assert prompt_text("icl", icl_fields(row, train, info, reference["shots"]), chat=False) == reference["prompt"]


def test_icl_shots_follow_the_configs_and_scale_between():
    assert icl_shots(TASKS["trec_coarse"], 16384) == 800
    assert icl_shots(TASKS["nlu"], 131072) == 8296
    assert icl_shots(TASKS["banking77"], 4096) == 180


def test_a_missing_file_names_itself_and_the_task(tmp_path):
    with pytest.raises(HelmetError, match=r"HELMET task hotpotqa needs .*kilt/hotpotqa-dev-multikilt_1000_k105_dep3"):
        HelmetData(str(tmp_path)).sample_fields("hotpotqa", 16384, 0)
    with pytest.raises(ConfigError, match="eval.benchmarks.helmet_dir"):
        HelmetData("")


def test_lengths_pick_helmets_files():
    data = HelmetData("x")
    assert data.files("nq", 4096)[0] == "kilt/nq-dev-multikilt_1000_k50_dep6.jsonl"
    assert data.files("triviaqa", 65536)[0] == "kilt/triviaqa-dev-multikilt_1000_k440_dep6.jsonl"
    assert data.files("msmarco", 32768) == [
        "msmarco/test_reranking_data_k285_dep3.jsonl",
        "msmarco/test_reranking_data_k10_dep3.jsonl",
    ]
    assert data.files("popqa", 200000)[0] == "kilt/popqa_test_1000_k1000_dep6.jsonl"


def test_truncation_cuts_the_context_end_and_refuses_when_only_the_rest_fits():
    def encode(text):
        return text.split(" ")

    def decode(ids):
        return " ".join(ids)

    fields = {"demos": "", "context": " ".join(f"w{i}" for i in range(100)), "question": "q"}
    whole = encode(prompt_text("rag", fields, False))
    ids, cut = fit_context("rag", fields, False, len(whole) - 10, encode, decode, "helmet-nq")
    assert cut == 10 and len(ids) == len(whole) - 10
    assert "w89" in " ".join(ids) and "w90" not in " ".join(ids)
    with pytest.raises(HelmetPromptTooShortError, match="cannot hold the prompt without its context"):
        fit_context("rag", fields, False, 20, encode, decode, "helmet-nq")


def test_the_config_key_is_known_and_defaults_to_recall():
    from longctx.eval.helmet.benchmark import default_tasks

    config = ExperimentConfig()
    assert default_tasks(config) == ["json_kv", "ruler_niah_mk_2", "ruler_niah_mk_3", "ruler_niah_mv"]
    config.eval.benchmarks.helmet_dir = str(FIXTURES / "data")
    assert default_tasks(config) == list(TASKS)
