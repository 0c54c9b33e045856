"""Shared by the lm-eval adapter's tests (tests/eval/test_lm_eval.py, tests/test_cli_harness.py,
tests/hf_attention/test_lm_eval.py): three local lm-eval tasks, a tiny random HF Llama with its
tokenizer, and lm-eval run on them; and the engine's cell tests (tests/eval/test_cells.py,
test_cells_ranks.py): a copy task, its tokenizer double, model and grid."""

import json

import numpy as np
import torch
from tokenizers import Tokenizer, processors

from longctx.config.model import ModelConfig
from longctx.config.position_methods import PositionMethodConfig, StringConfig
from longctx.eval.cells import Grid
from longctx.eval.task import Sample, Task
from longctx.model.inference.generation import StopRule
from longctx.model.llama import Llama
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


class Tokens:
    """A tokenizer double: ids spelled as space-separated numbers."""

    name = "numbers"

    def decode(self, ids):
        return " ".join(map(str, ids))


class CopyTask(Task):
    """Prompts of random ids (a function of seed, length, index); score 1 when the output
    repeats the prompt's last id."""

    name = "copy"

    def __init__(self, salt: int = 0):
        self.salt = salt

    def samples(self, seed, length, count, tokenizer):
        out = []
        for index in range(count):
            ids = np.random.default_rng([seed, length, index, self.salt]).integers(0, 256, length - index % 3)
            out.append(Sample(index, tuple(int(i) for i in ids), 4, StopRule(), (str(ids[-1]),)))
        return out

    def score(self, sample, generation):
        return float(sample.references[0] in (generation.text or "").split())

    def details(self, sample, generation):
        return {"first_token": generation.token_ids[0]}


def copy_model(seed: int = 0) -> Llama:
    """The `debug` model the cell tests decode with (seeded: every process builds the same)."""
    torch.manual_seed(seed)
    return Llama(ModelConfig.from_preset("debug", vocab_size=256, max_position=32, init_std=0.2)).eval()


def copy_grid(model, count=5, task=None, lengths=(24, 40), methods=("rope", "string")) -> Grid:
    """RoPE and StRing (or those of `methods`) on `model` for CopyTask at `lengths`."""
    settings = {
        "rope": PositionMethodConfig(name="rope"),
        "string": PositionMethodConfig(name="string", string=StringConfig(local_window=4)),
    }
    arms = {name: settings[name] for name in methods}
    return Grid({"m": model}, arms, [task or CopyTask()], list(lengths), seed=3, count=count)


def strip_seconds(value):
    """A record, summary or list of them without the wall times (the one field that differs
    between two runs of the same samples)."""
    if isinstance(value, list):
        return [strip_seconds(item) for item in value]
    return {key: item for key, item in value.items() if key != "seconds"}


class KillAfter:
    """A progress that raises (a kill) after `batches` batches of decoding on this rank."""

    def __init__(self, batches: int):
        self.batches = batches

    def cell_started(self, cell, total, done):
        pass

    def advance(self, samples):
        self.batches -= 1
        if self.batches == 0:
            raise RuntimeError("killed")

    def cell_done(self, result, reused):
        pass


def rank_main(rank: int, world: int, store: str, jobs: list[dict], out: str) -> None:
    """One gloo rank (torch.multiprocessing, a FileStore): each job runs `copy_grid(**grid)`
    into `root` (a list: one per rank; `kill`: the rank that raises after `after` batches;
    `other_weights`: ranks whose model has other weights), and the rank's results,
    or the error it stopped with, and the prompts it decoded itself go to `<out>/rank<rank>.pt`."""
    import torch.distributed as dist

    from longctx.eval import cell_decoding
    from longctx.eval.cells import Decoding, run_grid
    from longctx.eval.ranks import Ranks

    prompts = []
    generate = cell_decoding.generate

    def counting(model, batch, **options):
        prompts[-1] += len(batch)
        return generate(model, batch, **options)

    cell_decoding.generate = counting
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store, world), rank=rank, world_size=world)
    model = copy_model()
    outcomes = []
    for job in jobs:
        prompts.append(0)
        kill = job.get("kill")
        progress = KillAfter(kill["after"]) if kill and kill["rank"] == rank else None
        try:
            grid = copy_grid(model if rank not in job.get("other_weights", ()) else copy_model(seed=1), **job["grid"])
            root = job["root"] if isinstance(job["root"], str) else job["root"][rank]
            results = run_grid(grid, Tokens(), root, Decoding(batch_tokens=48), progress, ranks=Ranks.current())
            outcomes.append(
                [(r.cell.name, strip_seconds(r.records), strip_seconds(r.summary), r.decoded) for r in results]
            )
        except Exception as error:
            outcomes.append(f"{type(error).__name__}: {error}")
    torch.save((outcomes, prompts), f"{out}/rank{rank}.pt")
    dist.destroy_process_group()


def sharded_rank_main(rank: int, world: int, store: str, jobs: dict, out: str, local_world: int) -> None:
    """One of `world` gloo ranks, `local_world` per node, holding the copy model sharded over
    its node (eval/layout.py, an eval.memory_limit_gib between the sharded and the whole
    estimate): the layout chosen, the largest logit difference to the unsharded model, and
    each job's results (`jobs`: root -> copy_grid's arguments) go to `<out>/rank<rank>.pt`."""
    import copy
    import os

    import torch.distributed as dist

    from longctx.eval.cells import Decoding, run_grid
    from longctx.eval.layout import choose_layout, place_models, sharded
    from longctx.eval.memory_estimate import GIB, estimate_evaluation_memory
    from longctx.eval.ranks import Ranks

    os.environ.update(LOCAL_RANK=str(rank % local_world), LOCAL_WORLD_SIZE=str(local_world))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store, world), rank=rank, world_size=world)
    model = copy_model()
    reference = copy.deepcopy(model)
    shape = {"length": 40, "rows": 1, "tests": 5, "new_tokens": 4, "prefill_chunk_tokens": 0}
    whole = estimate_evaluation_memory(model.config, **shape)
    limit = (whole.total + sharded(whole, local_world).total) / 2 / GIB
    device = torch.device("cpu")
    layout = choose_layout(model.config, Ranks.current(), device, **shape, limit_gib=limit)
    ranks = place_models({"m": model}, layout, Ranks.current(), device)
    ids = torch.randint(0, 256, (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        difference = (model(ids) - reference(ids)).abs().max().item()
    decoding = Decoding(batch_tokens=48, memory_limit_gib=limit)
    outcomes = {}
    for root, grid in jobs.items():
        results = run_grid(copy_grid(model, **grid), Tokens(), root, decoding, ranks=ranks)
        outcomes[root] = [(r.cell.name, strip_seconds(r.records), strip_seconds(r.summary), r.decoded) for r in results]
    torch.save((layout.shard, ranks.workers, difference, outcomes), f"{out}/rank{rank}.pt")
    dist.destroy_process_group()
