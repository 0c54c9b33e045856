"""What the engine asks of every registered benchmark's tasks (eval/task.py), checked on each
in-tree benchmark, one task per category of its defaults: a task is named `<benchmark>-<task>`,
its prompts fit the length, sample i does not depend on how many are drawn, its scorer gives
1 to an output holding the references and 0 to an empty one, and what it writes is JSON. A
new benchmark folder is checked here with no edit."""

import json

import pytest

from longctx.config import ExperimentConfig
from longctx.eval.niah.evaluation import load_haystack
from longctx.eval.registry import benchmark_spec, in_tree_names
from longctx.model.inference.generation import Generation

LENGTH = 1024


def representatives(name: str, config: ExperimentConfig) -> list[str]:
    """The first default task of each category (each task when it has none)."""
    spec = benchmark_spec(name)
    chosen: dict[str, str] = {}
    for task in spec.defaults(config) if spec.defaults else list(spec.tasks):
        chosen.setdefault(spec.tasks[task] or task, task)
    return list(chosen.values())


@pytest.fixture(scope="module")
def config(haystack_file):
    pytest.importorskip("wonderwords")
    pytest.importorskip("punkt")
    config = ExperimentConfig()
    config.eval.niah.haystack = str(haystack_file)
    return config


@pytest.mark.parametrize("name", in_tree_names())
def test_every_benchmark_keeps_the_task_contract(name, config, tokenizer):
    spec = benchmark_spec(name)
    tasks = spec.engine_tasks(representatives(name, config), config, load_haystack(config, tokenizer))
    for task, short in zip(tasks, representatives(name, config), strict=True):
        assert task.name == spec.engine_name(short)
        samples = task.samples(0, LENGTH, 3, tokenizer)
        assert [s.index for s in samples] == [0, 1, 2]
        assert task.samples(0, LENGTH, 1, tokenizer)[0].prompt_ids == samples[0].prompt_ids
        assert len({s.prompt_hash for s in samples}) == 3, f"{task.name}: samples repeat"
        for sample in samples:
            assert 0 < len(sample.prompt_ids) <= LENGTH and sample.max_new_tokens > 0, task.name
            answered = Generation([], " ".join(map(str, sample.references)), "eos")
            assert task.score(sample, answered) == 1.0, f"{task.name}: its own references do not score 1"
            assert task.score(sample, Generation([], "", "eos")) == 0.0, f"{task.name}: an empty output scores"
            json.dumps(task.details(sample, answered))
        json.dumps(task.settings())
