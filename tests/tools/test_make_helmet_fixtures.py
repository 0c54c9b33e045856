"""tools/fixtures/make_helmet_fixtures.py without a HELMET checkout (the maker itself runs
outside the suite, against HELMET at its pin; tools/README.md): it refuses a folder that is
not HELMET, naming the files; it writes the committed layout; it executes a summary-judge
script's prompt strings, parse_json and check_metrics' format statements from its syntax
tree without importing the file; and its stand-in for the hub's ICL sets reads the fixture
files with their label columns as ClassLabels."""

import json

import pytest

from tests.tools.helpers import TOOLS, tool

maker = tool(TOOLS / "fixtures", "make_helmet_fixtures")

JUDGE_SCRIPT = """
from model_utils import OpenAIModel  # an API client: the maker must not import the file
import re, json
fluency_prompt = "F {{x}}: {text}"
recall_prompt = "R: {keypoints} / {summary}"
precision_prompt = "P: {expert_summary} / {summary}"
fluency_prompt_book = "FB: {text}"
recall_prompt_book = "RB: {keypoints} / {summary}"
precision_prompt_book = "PB: {expert_summary} / {summary}"

def parse_json(text):
    found = re.findall(r"\\{.*?\\}", text)
    return json.loads(found[-1]) if found else None

def check_metrics(model, results_file, output_file):
    for d in []:
        if "infbench" in results_file:
            fp = fluency_prompt_book.format(text=d["output"].strip())
            rp = recall_prompt_book.format(keypoints=" ".join(d["keypoints"]), summary=d["output"].strip())
            pp = precision_prompt_book.format(expert_summary=d["answer"][0], summary=d["output"].strip())
        else:
            fp = fluency_prompt.format(text=d["output"].strip())
            rp = recall_prompt.format(keypoints=" ".join(d["keypoints"]), summary=d["output"].strip())
            pp = precision_prompt.format(expert_summary=d["summary/long"], summary=d["output"].strip())
"""


def test_a_folder_that_is_not_helmet_is_refused_naming_the_files(tmp_path):
    with pytest.raises(
        maker.FixtureError, match=r"not a HELMET checkout: no data.py, utils.py, scripts/eval_gpt4_summ.py"
    ):
        maker.check_inputs(tmp_path)


def test_the_committed_fixtures_are_in_the_maker_s_layout():
    paths = [maker.FIXTURES / "reference_prompts.json", maker.FIXTURES / "judge_summ.json"]
    paths += sorted((maker.FIXTURES / "outputs").glob("*.json"))
    assert len(paths) == 6
    for path in paths:
        assert maker.text(json.loads(path.read_text())) == path.read_text(), path.name
    assert json.loads(paths[0].read_text())["helmet_commit"] == maker.PIN


def test_the_judge_script_is_executed_from_its_syntax_tree(tmp_path):
    script = tmp_path / "eval_gpt4_summ.py"
    script.write_text(JUDGE_SCRIPT)
    committed = {
        "rows": [
            {"task": "multi_lexsum", "row": {"output": " out \n", "keypoints": ["a", "b"], "summary/long": "long"}},
            {"task": "infbench_sum", "row": {"output": "book", "keypoints": ["k"], "answer": ["expert"]}},
        ],
        "parse_json": [{"reply": 'x {"recall": 2} y', "parsed": None}, {"reply": "none", "parsed": 1}],
    }
    made = maker.judge_file(committed, script)
    first, second = made["rows"]
    assert (
        first["prompts"]["fluency"]["tail"] == "F {x}: out" and first["prompts"]["precision"]["tail"] == "P: long / out"
    )
    assert second["prompts"]["recall"]["tail"] == "RB: k / book" and second["prompts"]["fluency"]["chars"] == len(
        "FB: book"
    )
    assert [entry["parsed"] for entry in made["parse_json"]] == [{"recall": 2}, None]  # made anew, not copied


def test_the_hub_stand_in_reads_the_icl_fixtures_with_class_labels():
    datasets = pytest.importorskip("datasets")

    def refuse(*args, **kwargs):
        raise AssertionError("only the hub sets are stood in for")

    load = maker.hub_stand_in(refuse, maker.FIXTURES / "data")
    trec = load("CogComp/trec", trust_remote_code=True)
    assert sorted(trec) == ["test", "train"] and len(trec["train"]) == 40
    assert isinstance(trec["train"].features["fine_label"], datasets.ClassLabel)
    assert trec["train"].features["coarse_label"].num_classes == 6
    with pytest.raises(AssertionError, match="only the hub sets"):
        load("json", data_files="x.jsonl")
