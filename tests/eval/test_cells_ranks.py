"""eval/cells.py under several ranks (eval/ranks.py): 2 and 3 gloo ranks write the records,
summaries and returned results of one process, a run killed on one rank resumes under
another world size decoding only what is missing, and bad input stops every rank with the
rank named; a model too large for one device is sharded over the node's ranks
(eval/layout.py) with the same logits and records."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from longctx.analysis.wandb_offline import offline_runs
from longctx.cli import main
from longctx.config.model import ModelConfig
from longctx.eval.cell_records import CellMismatchError, read_cell
from longctx.eval.cells import Decoding, run_grid
from longctx.eval.layout import choose_layout
from longctx.eval.memory_estimate import EvaluationMemoryError
from longctx.eval.ranks import RankError, Ranks, check_same_models, check_shared_directory, share, whole_cells
from longctx.model.checkpoint import save_model
from longctx.model.llama import Llama
from tests.eval.helpers import Tokens, copy_grid, copy_model, rank_main, sharded_rank_main, strip_seconds

REPOSITORY = Path(__file__).resolve().parents[2]
GRIDS = {
    "table": {"count": 5, "lengths": (24, 40)},  # 4 cells: whole on 2 ranks, 3 whole + 1 spread on 3
    "search": {"count": 7, "lengths": (24,), "methods": ("rope",)},  # 1 cell of 4 batches, spread
}


def spawn(world, jobs, tmp_path, name):
    out = tmp_path / name
    out.mkdir()
    mp.start_processes(rank_main, args=(world, str(out / "store"), jobs, str(out)), nprocs=world, start_method="spawn")
    outcomes, prompts = zip(*(torch.load(out / f"rank{rank}.pt") for rank in range(world)), strict=True)
    return outcomes, prompts


def cell_files(root):
    """Every file of every cell, parsed, without wall times; keyed by path under root."""
    files = {}
    for path in sorted(root.rglob("*")):
        if path.is_dir():
            continue
        if path.suffix == ".jsonl":
            content = [strip_seconds(json.loads(line)) for line in path.read_text().splitlines()]
        else:
            content = strip_seconds(json.loads(path.read_text()))
        files[str(path.relative_to(root))] = content
    return files


def outcome(results):
    return [(r.cell.name, strip_seconds(r.records), strip_seconds(r.summary), r.decoded) for r in results]


def test_two_and_three_ranks_write_what_one_process_writes_and_resume_each_other(tmp_path):
    model, decoding = copy_model(), Decoding(batch_tokens=48)
    one = {
        name: outcome(run_grid(copy_grid(model, **grid), Tokens(), tmp_path / "one" / name, decoding))
        for name, grid in GRIDS.items()
    }
    expected = {name: cell_files(tmp_path / "one" / name) for name in GRIDS}
    assert all("samples.jsonl" in path for path in expected["search"] if path.endswith("jsonl"))

    killed = {"root": str(tmp_path / "killed"), "grid": GRIDS["table"], "kill": {"rank": 1, "after": 1}}
    three, three_prompts = spawn(
        3, [*({"root": str(tmp_path / "three" / n), "grid": g} for n, g in GRIDS.items()), killed], tmp_path, "w3"
    )
    resumed = {"root": str(tmp_path / "killed"), "grid": GRIDS["table"]}
    blind = {"root": [str(tmp_path / "mounted"), str(tmp_path / "elsewhere")], "grid": GRIDS["search"]}
    other = {"root": str(tmp_path / "other"), "grid": GRIDS["search"], "other_weights": [1]}
    two, two_prompts = spawn(
        2,
        [*({"root": str(tmp_path / "two" / n), "grid": g} for n, g in GRIDS.items()), resumed, blind, other],
        tmp_path,
        "w2",
    )

    for world, ranks in (("three", three), ("two", two)):
        for position, name in enumerate(GRIDS):
            assert cell_files(tmp_path / world / name) == expected[name], (world, name)
            for rank_outcomes in ranks:  # every rank returns every cell, as one process does
                assert rank_outcomes[position] == one[name], (world, name)
    # No prompt is decoded twice, and each rank decodes its share of the spread cell.
    for prompts in (three_prompts, two_prompts):
        assert [sum(p[job] for p in prompts) for job in (0, 1)] == [20, 7]
        assert all(p[1] > 0 for p in prompts)
    # The kill on rank 1 stopped all three ranks, rank 1 with its own error, the others naming it.
    assert three[1][2] == "RuntimeError: killed"
    assert all(r[2].startswith("RankError: rank 1 of 3 failed: RuntimeError: killed") for r in (three[0], three[2]))
    # Resumed by 2 ranks: rank 1's record of the L=40 cell counts, its 4 others and the never
    # started last cell are decoded, nothing else; then the files are those of one process.
    assert sum(decoded for *_, decoded in two[0][2]) == 4 + 5
    assert cell_files(tmp_path / "killed") == expected["table"]
    # A rank that sees another directory, or holds other weights: every rank stops before any
    # cell, naming the rank; nothing is written.
    for rank_outcomes in two:
        assert (
            rank_outcomes[3].startswith("RankError: rank 1 (host ")
            and "cannot see the cells directory" in rank_outcomes[3]
        )
        assert rank_outcomes[4].startswith("RankError: rank 1 loaded other weights for model 'm'")
    assert not (tmp_path / "elsewhere").exists() and list((tmp_path / "mounted").iterdir()) == []
    assert list((tmp_path / "other").iterdir()) == []


def test_the_rule_deals_whole_cells_then_batches_by_rank():
    assert whole_cells(4, Ranks(0, 3)) == 3 and whole_cells(2, Ranks(0, 3)) == 0 and whole_cells(5, Ranks()) == 5
    assert [share(list(range(7)), Ranks(rank, 3)) for rank in range(3)] == [[0, 3, 6], [1, 4], [2, 5]]


class Gathered(Ranks):
    """A rank whose collectives return given values: the other ranks' answers, in-process."""

    def __init__(self, rank, world, answers):
        super().__init__(rank, world)
        object.__setattr__(self, "answers", answers)

    def gather(self, value):
        return self.answers.pop(0)(value)

    def barrier(self):
        pass


def test_a_rank_with_other_weights_or_without_the_cells_directory_is_named(tmp_path):
    ranks = Gathered(0, 2, [lambda mine: [mine, {"m": "f00"}]])
    with pytest.raises(RankError, match=r"rank 1 loaded other weights for model 'm'.*same checkpoint"):
        check_same_models({"m": "abc"}, tmp_path, ranks)
    blind = Gathered(
        0,
        3,
        [
            lambda token: [token] * 3,
            lambda error: [error] * 3,
            lambda saw: [saw, True, False],
            lambda h: ["a", "b", "c"],
        ],
    )
    with pytest.raises(RankError, match=rf"rank 2 \(host c\) cannot see the cells directory {tmp_path}"):
        check_shared_directory(tmp_path, blind)
    assert list(tmp_path.iterdir()) == []  # the marker is gone; nothing else written


def test_rank_files_that_disagree_or_other_batches_are_refused(tmp_path):
    model = copy_model()
    run_grid(copy_grid(model, count=2, lengths=[24], methods=("rope",)), Tokens(), tmp_path, Decoding())
    [cell] = [path.parent for path in tmp_path.rglob("summary.json")]
    (cell / "summary.json").unlink()
    record = json.loads((cell / "samples.jsonl").read_text().splitlines()[0])
    (cell / "samples.rank1.jsonl").write_text(json.dumps({**record, "text": "other"}) + "\n")
    with pytest.raises(
        CellMismatchError, match=r"samples.rank1.jsonl and .*samples.jsonl hold different records of sample 0"
    ):
        read_cell(cell)
    (cell / "samples.rank1.jsonl").unlink()
    with pytest.raises(CellMismatchError, match=r"batches.json: .* batches of 64 rows and this run would batch 1"):
        run_grid(copy_grid(model, count=2, lengths=[24], methods=("rope",)), Tokens(), tmp_path, Decoding(batch_size=1))
    assert len((cell / "samples.jsonl").read_text().splitlines()) == 2  # nothing overwritten


def sharded_run(tmp_path, world, local_world, grids):
    """`grids` (name -> copy_grid's arguments) on `world` ranks sharding the model over each
    node's `local_world` ranks; one process's results and files of the same grids beside."""
    model, decoding = copy_model(), Decoding(batch_tokens=48)
    one = {
        name: outcome(run_grid(copy_grid(model, **grid), Tokens(), tmp_path / "one" / name, decoding))
        for name, grid in grids.items()
    }
    out = tmp_path / "ranks"
    out.mkdir()
    jobs = {str(tmp_path / "sharded" / name): grid for name, grid in grids.items()}
    mp.start_processes(
        sharded_rank_main,
        args=(world, str(out / "store"), jobs, str(out), local_world),
        nprocs=world,
        start_method="spawn",
    )
    return one, [torch.load(out / f"rank{rank}.pt") for rank in range(world)]


def test_a_model_too_large_for_one_device_is_sharded_over_the_node_with_the_same_results(tmp_path):
    one, ranks = sharded_run(tmp_path, 2, 2, {"table": GRIDS["table"]})
    for shard, workers, difference, outcomes in ranks:
        assert (shard, workers) == (2, 1)  # the limit admits half the weights, not all of them
        assert difference <= 1e-6  # the sharded forward's logits are the unsharded model's
        assert outcomes[str(tmp_path / "sharded" / "table")] == one["table"]
    assert cell_files(tmp_path / "sharded" / "table") == cell_files(tmp_path / "one" / "table")


@pytest.mark.slow
def test_two_nodes_of_two_ranks_each_shard_the_model_and_share_the_grid(tmp_path):
    """4 gloo ranks as 2 nodes x 2: each node one worker holding the model sharded; whole
    cells dealt to the nodes, a spread cell's batches too (~2 min on 2 loaded cores)."""
    one, ranks = sharded_run(tmp_path, 4, 2, GRIDS)
    for shard, workers, difference, outcomes in ranks:
        assert (shard, workers, difference <= 1e-6) == (2, 2, True)
        assert outcomes == {str(tmp_path / "sharded" / name): one[name] for name in GRIDS}
    for name in GRIDS:
        assert cell_files(tmp_path / "sharded" / name) == cell_files(tmp_path / "one" / name)


def test_a_model_that_fits_no_layout_is_refused_naming_why():
    model = copy_model()
    with pytest.raises(EvaluationMemoryError, match=r"one rank per node cannot shard it.*--nproc-per-node"):
        choose_layout(
            model.config,
            Ranks(),
            torch.device("cpu"),
            length=40,
            rows=1,
            tests=5,
            new_tokens=4,
            prefill_chunk_tokens=0,
            limit_gib=1e-6,
        )
    with pytest.raises(EvaluationMemoryError, match=r"sharded over the node's 2 ranks it still needs"):
        choose_layout(
            model.config,
            Ranks(0, 2, 0, 2),
            torch.device("cpu"),
            length=40,
            rows=1,
            tests=5,
            new_tokens=4,
            prefill_chunk_tokens=0,
            limit_gib=1e-6,
        )


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["checkpoint", "hf"])
def test_niah_table_under_torchrun_writes_the_one_process_table_once(tmp_path, haystack_file, kind):
    """`torchrun --nproc_per_node=2 -m longctx niah-table` (gloo ranks on CPU): the table, the
    cells and one W&B run, as `longctx niah-table` writes them (~1 min on 2 loaded cores);
    for one of our checkpoints and for a Hugging Face directory alike."""
    from longctx.data.tokenizer import load_tokenizer
    from longctx.model.hf import export_hf

    torch.manual_seed(0)
    model = Llama(ModelConfig.from_preset("debug", max_position=256, init_std=0.2))
    if kind == "hf":
        checkpoint = export_hf(model, tmp_path / "hf-model", tokenizer=load_tokenizer("bpe-8192"))
    else:
        checkpoint = tmp_path / "m.safetensors"
        save_model(model, checkpoint)
    sets = [
        f"eval.niah.haystack={haystack_file}",
        "eval.niah.tests_per_length=3",
        "eval.niah.max_new_tokens=8",
        "eval.niah.batch_tokens=512",
        "eval.position_method.string.local_window=16",
        "eval.threads=1",
        "log.wandb_mode=offline",
    ]
    args = ["niah-table", str(checkpoint), *sets, "--methods", "rope,string", "--lengths", "128,256"]
    assert main([*args, "--quiet", "--out", str(tmp_path / "one" / "table.md")]) == 0
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "-m", "longctx", *args]
    done = subprocess.run(
        [*command, "--out", str(tmp_path / "two" / "table.md")],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": str(REPOSITORY / "src")},
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("| method |") == 1  # rank 0 prints the table, rank 1 nothing
    assert "models whole on every rank" in done.stderr and "evaluating on 2 ranks" in done.stderr
    assert done.stderr.count(f"done  {checkpoint.name}") == 4  # rank 0's lines: its cells and rank 1's
    for name in ("table.md", "table.json"):
        assert (tmp_path / "two" / name).read_text() == (tmp_path / "one" / name).read_text()
    assert cell_files(tmp_path / "two" / "cells") == cell_files(tmp_path / "one" / "cells")
    assert len(offline_runs(tmp_path / "two")) == 1
