"""Shared by the lm-eval adapter's tests (tests/eval/test_lm_eval.py, tests/test_cli_harness.py,
tests/hf_attention/test_lm_eval.py): three local lm-eval tasks, a tiny random HF Llama with its
tokenizer, and lm-eval run on them."""

import json

import torch
from tokenizers import Tokenizer, processors

from tests.chat_tokenizer import write_chat_tokenizer
from tests.model.hf_models import SMALL

GENERATION = [
    {"prompt": "The cat sat on the", "answer": "mat"},
    {"prompt": "Once upon a time there was a little house by the river, and", "answer": "it"},
    {"prompt": "Numbers: 1 2 3 4 5 6 7", "answer": "8"},
]
CHOICE = [
    {"question": "Sky?", "choices": [" blue", " red"], "label": 0},
    {"question": "Grass?", "choices": [" green", " grey", " pink"], "label": 0},
    {
        "question": "A long question about the weather in the town by the river, which changes often in spring:",
        "choices": [" rain", " the sun shines all day long"],
        "label": 1,
    },
]
DOCUMENTS = [
    {"text": "It was a bright cold day in April, and the clocks were striking thirteen. " * 3},
    {"text": "The quick brown fox jumps over the lazy dog while the river runs by the old mill. " * 2},
]


def task_yaml(name: str, data: str, body: str) -> str:
    return (
        f"task: {name}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {data}\n"
        f"test_split: test\n{body}metadata:\n  version: 1.0\n"
    )


def write_tasks(directory):
    """Three task YAMLs and their JSONL data in `directory`, as a user's --include_path holds them."""
    directory.mkdir(parents=True, exist_ok=True)
    bodies = {
        "tiny_gen": (
            GENERATION,
            'output_type: generate_until\ndoc_to_text: "{{prompt}}"\ndoc_to_target: "{{answer}}"\n'
            'generation_kwargs:\n  until: ["\\n\\n", "."]\n  max_gen_toks: 10\n  do_sample: false\n'
            "metric_list:\n  - metric: exact_match\n",
        ),
        "tiny_mc": (
            CHOICE,
            'output_type: multiple_choice\ndoc_to_text: "{{question}}"\ndoc_to_choice: "{{choices}}"\n'
            'doc_to_target: "{{label}}"\nmetric_list:\n  - metric: acc\n  - metric: acc_norm\n',
        ),
        "tiny_ppl": (
            DOCUMENTS,
            'output_type: loglikelihood_rolling\ndoc_to_text: ""\ndoc_to_target: "{{text}}"\n'
            "metric_list:\n  - metric: word_perplexity\n  - metric: byte_perplexity\n  - metric: bits_per_byte\n",
        ),
    }
    for name, (rows, body) in bodies.items():
        data = directory / f"{name}.jsonl"
        data.write_text("".join(json.dumps(row) + "\n" for row in rows))
        (directory / f"{name}.yaml").write_text(task_yaml(name, str(data), body))
    return directory


def write_tiny_llama(directory):
    """A random LlamaForCausalLM saved by transformers beside a ChatML tokenizer that adds
    BOS as Llama 2's does (tokenizer.json's post-processor and add_bos_token)."""
    directory.mkdir(parents=True, exist_ok=True)
    write_chat_tokenizer(directory, vocab_size=SMALL["vocab_size"], add_bos_token=True)
    backend = Tokenizer.from_file(str(directory / "tokenizer.json"))
    backend.post_processor = processors.TemplateProcessing(
        single="<|im_start|> $A", pair="<|im_start|> $A $B", special_tokens=[("<|im_start|>", 1)]
    )
    backend.save(str(directory / "tokenizer.json"))
    import transformers

    torch.manual_seed(0)
    config = transformers.LlamaConfig(**SMALL, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    transformers.LlamaForCausalLM(config).eval().save_pretrained(directory)
    return directory


TASKS = ["tiny_gen", "tiny_mc", "tiny_ppl"]
"""The local tasks `write_tasks` writes."""


def evaluate(model, model_args, task_manager, **options):
    """lm-eval's own `simple_evaluate` on TASKS, on CPU, with each sample logged."""
    import lm_eval

    return lm_eval.simple_evaluate(
        model=model,
        model_args=model_args,
        tasks=TASKS,
        task_manager=task_manager,
        log_samples=True,
        device="cpu",
        **options,
    )
