"""longctx inside lm-evaluation-harness: three local tasks (generate_until, multiple choice,
loglikelihood_rolling) on one tiny random HF Llama, run through lm-eval's own `hf` model and
through `longctx` (src/longctx/eval/lm_eval.py). The peer library is the reference: same
generations, log-likelihoods within 1e-4 nats (float32), same metrics; StRing equals RoPE
where no query-key distance reaches its shift S and differs where one does."""

import json
import math

import pytest

from longctx.errors import ConfigError
from tests.eval.helpers import DOCUMENTS, GENERATION, TASKS, evaluate, write_tasks, write_tiny_llama

transformers = pytest.importorskip("transformers")
lm_eval = pytest.importorskip("lm_eval")
from lm_eval.tasks import TaskManager  # noqa: E402

from longctx.eval.lm_eval import LongctxLM  # noqa: E402

MAX_LENGTH = 32
"""Rolling windows of 32 tokens: each document of the tasks spans several."""


@pytest.fixture(scope="module")
def tasks(tmp_path_factory):
    return write_tasks(tmp_path_factory.mktemp("tasks"))


@pytest.fixture(scope="module")
def task_manager(tasks):
    return TaskManager(include_path=str(tasks), include_defaults=False)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return write_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="module")
def hf_results(model_dir, task_manager):
    args = {"pretrained": str(model_dir), "dtype": "float32", "max_length": MAX_LENGTH}
    return evaluate("hf", args, task_manager, batch_size=1)


@pytest.fixture(scope="module")
def rope_results(model_dir, task_manager):
    args = f"pretrained={model_dir},dtype=float32,max_length={MAX_LENGTH},position_method=rope"
    return evaluate("longctx", args, task_manager, batch_size=2)


def responses(results, task):
    """Per-sample model outputs in document order: generated text, (loglik, greedy), loglik."""
    samples = sorted(results["samples"][task], key=lambda sample: sample["doc_id"])
    return [[response[0] for response in sample["resps"]] for sample in samples]


def assert_logliks_close(got, expected, tolerance=1e-4):
    for got_sample, expected_sample in zip(got, expected, strict=True):
        for got_value, expected_value in zip(got_sample, expected_sample, strict=True):
            got_loglik = got_value[0] if isinstance(got_value, tuple | list) else got_value
            expected_loglik = expected_value[0] if isinstance(expected_value, tuple | list) else expected_value
            assert abs(float(got_loglik) - float(expected_loglik)) <= tolerance, (got_value, expected_value)


def test_rope_matches_lm_evals_hf_model_sample_for_sample(hf_results, rope_results):
    assert responses(rope_results, "tiny_gen") == responses(hf_results, "tiny_gen")
    assert any(text for sample in responses(hf_results, "tiny_gen") for text in sample), "all generations empty"
    assert_logliks_close(responses(rope_results, "tiny_mc"), responses(hf_results, "tiny_mc"))
    greedy = [[bool(value[1]) for value in sample] for sample in responses(rope_results, "tiny_mc")]
    assert greedy == [[bool(value[1]) for value in sample] for sample in responses(hf_results, "tiny_mc")]
    assert_logliks_close(responses(rope_results, "tiny_ppl"), responses(hf_results, "tiny_ppl"))
    for task in TASKS:
        for metric, value in hf_results["results"][task].items():
            if isinstance(value, float) and not math.isnan(value):
                assert rope_results["results"][task][metric] == pytest.approx(value, rel=1e-4), (task, metric)


def test_documents_span_several_rolling_windows(model_dir):
    lm = LongctxLM(pretrained=str(model_dir), max_length=MAX_LENGTH)
    assert all(len(lm.tok_encode(document["text"])) > 2 * MAX_LENGTH for document in DOCUMENTS)


def input_lengths(lm, results):
    """Tokens each multiple-choice request feeds the model: context + continuation - 1."""
    lengths = []
    for sample in sorted(results["samples"]["tiny_mc"], key=lambda sample: sample["doc_id"]):
        pairs = [lm._encode_pair(*argument[:2]) for argument in sample["arguments"]]
        lengths.append([len(context) + len(continuation) - 1 for context, continuation in pairs])
    return lengths


def test_string_equals_rope_below_its_shift_and_differs_beyond(model_dir, task_manager, rope_results):
    """Shift S = 40 > every distance of 32-token windows: RoPE's numbers. S = 12: requests
    whose inputs hold a distance >= 12 change, shorter ones do not."""
    far = LongctxLM(
        pretrained=str(model_dir),
        max_length=MAX_LENGTH,
        position_method="string",
        **{"string.shift": 40, "string.local_window": 4},
    )
    far_results = evaluate(far, None, task_manager)
    assert responses(far_results, "tiny_gen") == responses(rope_results, "tiny_gen")
    for task in ("tiny_mc", "tiny_ppl"):
        assert_logliks_close(responses(far_results, task), responses(rope_results, task))

    shift = 12
    near = LongctxLM(
        pretrained=str(model_dir),
        max_length=MAX_LENGTH,
        position_method="string",
        **{"string.shift": shift, "string.local_window": 4},
    )
    near_results = evaluate(near, None, task_manager)
    lengths = input_lengths(near, near_results)
    mc_near, mc_rope = responses(near_results, "tiny_mc"), responses(rope_results, "tiny_mc")
    seen = set()
    for sample_lengths, near_sample, rope_sample in zip(lengths, mc_near, mc_rope, strict=True):
        for length, near_value, rope_value in zip(sample_lengths, near_sample, rope_sample, strict=True):
            reaches = length - 1 >= shift
            seen.add(reaches)
            difference = abs(near_value[0] - rope_value[0])
            assert difference > 1e-3 if reaches else difference <= 1e-4, (length, near_value, rope_value)
    assert seen == {True, False}, "the multiple-choice requests must fall on both sides of S"
    for near_value, rope_value in zip(
        responses(near_results, "tiny_ppl"), responses(rope_results, "tiny_ppl"), strict=True
    ):
        assert abs(near_value[0] - rope_value[0]) > 1e-3


def test_chat_template_renders_as_lm_evals_hf_model(model_dir):
    from lm_eval.models.huggingface import HFLM

    reference = HFLM(pretrained=str(model_dir), device="cpu")
    lm = LongctxLM(pretrained=str(model_dir))
    history = [{"role": "user", "content": "Which colour is the sky?"}, {"role": "assistant", "content": " Blue"}]
    assert lm.chat_template(True) == reference.chat_template(True)
    assert lm.apply_chat_template(history[:1]) == reference.apply_chat_template(history[:1])
    assert lm.apply_chat_template(history, add_generation_prompt=False) == reference.apply_chat_template(
        history, add_generation_prompt=False
    )
    rendered = lm.apply_chat_template(history[:1])
    assert lm.tok_encode(rendered) == reference.tok_encode(rendered)
    assert lm.tokenizer_name and lm.rank == 0 and lm.world_size == 1


@pytest.mark.parametrize(
    ("params", "key"),
    [
        ({"strin.shift": 4}, "eval.position_method.strin"),
        ({"shift": 4}, "model_args shift"),
        ({"string.shift": 8, "string.local_window": 8}, "eval.position_method.string.local_window"),
    ],
)
def test_bad_position_method_arguments_name_the_key(model_dir, params, key):
    with pytest.raises(ConfigError, match=key):
        LongctxLM(pretrained=str(model_dir), position_method="string", **params)


def test_the_decoding_setting_is_a_model_argument_checked_as_eval_cuda_decoding(model_dir):
    """Eager unless `cuda_decoding` opts in (docs/lm_eval.md); a bad value names the key."""
    assert LongctxLM(pretrained=str(model_dir)).cuda_decoding == "eager"
    assert LongctxLM(pretrained=str(model_dir), cuda_decoding="graph").cuda_decoding == "graph"
    with pytest.raises(ConfigError, match="eval.cuda_decoding"):
        LongctxLM(pretrained=str(model_dir), cuda_decoding="cudagraph")


def test_until_strings_stop_each_row_of_a_batch_as_lm_evals_hf_model(model_dir):
    """Rows of one batch cut at their own first stop string, and requests with different
    `until` (other batches) at theirs; the reference is lm-eval's hf model, one row at a time."""
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM

    reference = HFLM(pretrained=str(model_dir), device="cpu", dtype="float32", max_length=MAX_LENGTH, batch_size=1)
    lm = LongctxLM(pretrained=str(model_dir), max_length=MAX_LENGTH, batch_size=3)
    contexts = [sample["prompt"] for sample in GENERATION]

    def requests(until_of):
        return [
            Instance("generate_until", {}, (context, {"until": until_of(index), "max_gen_toks": 10}), index)
            for index, context in enumerate(contexts)
        ]

    uncut = reference.generate_until(requests(lambda index: []))
    assert lm.generate_until(requests(lambda index: [])) == uncut
    assert all(len(text) >= 4 for text in uncut), uncut
    shared = [uncut[0][2:4], uncut[1][3:5]]  # a string inside row 0's text and one inside row 1's
    cut = lm.generate_until(requests(lambda index: shared))
    assert cut == reference.generate_until(requests(lambda index: shared))
    assert len(cut[0]) <= 2 and len(cut[1]) <= 3
    own = lm.generate_until(requests(lambda index: [uncut[index][1:3]]))
    assert own == reference.generate_until(requests(lambda index: [uncut[index][1:3]]))
    assert all(len(text) <= 1 for text in own)


RANKS_SCRIPT = """
import json, sys
import lm_eval
from lm_eval.tasks import TaskManager
import longctx.eval.lm_eval

model_dir, tasks, out, max_length, names = sys.argv[1:]
results = lm_eval.simple_evaluate(
    model="longctx", model_args={"pretrained": model_dir, "max_length": int(max_length)}, tasks=names.split(","),
    task_manager=TaskManager(include_path=tasks, include_defaults=False), log_samples=True, device="cpu",
)
if results is not None:  # rank 0 holds the gathered results
    json.dump({task: [s["resps"] for s in sorted(results["samples"][task], key=lambda s: s["doc_id"])]
               for task in results["samples"]}, open(out, "w"))
"""


@pytest.mark.slow
def test_two_processes_give_the_single_process_results(model_dir, tasks, rope_results, tmp_path):
    """torchrun --nproc-per-node 2 (gloo on the CPU): lm-eval splits the requests by rank,
    gathers them with the model's gather_object / all_gather; rank 0 holds every sample."""
    import subprocess
    import sys

    script, out = tmp_path / "ranks.py", tmp_path / "samples.json"
    script.write_text(RANKS_SCRIPT)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(script)]
    subprocess.run(
        [*command, str(model_dir), str(tasks), str(out), str(MAX_LENGTH), ",".join(TASKS)], check=True, timeout=600
    )
    samples = json.loads(out.read_text())
    assert [[response[0] for response in sample] for sample in samples["tiny_gen"]] == responses(
        rope_results, "tiny_gen"
    )
    for task in ("tiny_mc", "tiny_ppl"):
        got = [[response[0] for response in sample] for sample in samples[task]]
        assert_logliks_close(got, responses(rope_results, task))
