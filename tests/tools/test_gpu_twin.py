"""The GPU twin: its configs, its size, its plan (sweeps/gpu_twin/plan.yaml), its lease
(tools/twin/lease.yaml) and the jobs the driver builds from them (tools/twin/gpu_twin.py).
Nothing here trains: tests/tools/test_twin_calls.py runs the driver's calls on fake jobs,
tests/replication/test_side_by_side.py the stop/resume/skip logic."""

import json
from pathlib import Path

import pytest

from longctx import config as config_module
from longctx.config.model import shape_mismatches
from longctx.model.llama import Llama
from longctx_replication.side_by_side import DONE_FILE
from longctx_replication.twin_plan import load_plan
from tests.tools.helpers import lender, twin

gpu_twin, lease = twin("gpu_twin"), twin("lease")
REPOSITORY = Path(__file__).resolve().parents[2]
TWIN = REPOSITORY / "experiments" / "replicate"


def _load(name, overrides=()):
    return config_module.load([TWIN / name], list(overrides))


def test_the_twin_model_has_20_978_176_parameters_counted_on_the_built_model():
    config = _load("gpu_base.yaml")
    model = Llama(config.model)
    counted = sum(p.numel() for p in model.parameters())
    # By hand: embeddings and head 2 x 2048 x 512; per layer q,o 2 x 512 x 512, k,v 2 x 512 x 256
    # (4 KV heads of 64), SwiGLU 3 x 512 x 1536, two RMSNorms 2 x 512; the final norm 512.
    per_layer = 2 * 512 * 512 + 2 * 512 * 256 + 3 * 512 * 1536 + 2 * 512
    assert counted == 2 * 2048 * 512 + 6 * per_layer + 512 == 20_978_176
    assert counted >= 20_000_000


def test_windows_seeds_sources_and_the_one_variable_rules():
    config = _load("gpu_base.yaml")
    assert (config.data.packing, config.data.mask_cut_answers, config.data.seed) == ("stream", True, 0)
    kinds = [(s.kind, s.path) for s in config.data.mixture]
    assert kinds == [("prepared", ".device/twin/prose"), ("retrieval", ""), ("retrieval", "")]
    weights = config.data.source_weights()
    assert weights[0] / sum(weights) == pytest.approx(0.25)
    assert config.data.tokenizer == ".device/twin/tokenizer.json"
    plan = load_plan(REPOSITORY / "sweeps" / "gpu_twin" / "plan.yaml")
    pretrain = [job for seed in plan.seeds for job in gpu_twin.seed_jobs(plan, seed, 1200)[0]]
    windows = sorted({int(gpu_twin._option(j.argv, "data.window")) for j in pretrain})
    assert windows == [1024, 2048, 4096] and len(pretrain) == 9
    for window in windows:  # every window's batch divides into micro-batches
        _load("gpu_base.yaml", [f"data.window={window}"])


def test_table1_and_sft_load_the_pretrained_body_with_its_tokenizer():
    base = _load("gpu_base.yaml")
    for name in ("gpu_table1.yaml", "gpu_sft.yaml"):
        other = _load(name)
        assert shape_mismatches(base.model, other.model) == [], name
        assert other.data.tokenizer == base.data.tokenizer, name


def test_a_seed_call_runs_that_seed_s_sweep_points_with_the_cut_and_waits_for_its_base_model():
    plan = load_plan(REPOSITORY / "sweeps" / "gpu_twin" / "plan.yaml")
    pretrain, evaluations = gpu_twin.seed_jobs(plan, 11, 900)
    assert sorted(str(j.out_dir) for j in pretrain) == [
        f"runs/replicate_gpu/pretrain/w{w}_s11" for w in (1024, 2048, 4096)
    ]
    assert len(evaluations) == 5 + 3  # Table 1 methods, SFT arms
    assert {str(j.out_dir.relative_to(plan.root)).split("/")[0] for j in evaluations} == {"sft", "table1"}
    for job in pretrain + evaluations:
        assert "log.wandb_mode=disabled" in job.argv
        assert gpu_twin._option(job.argv, "train.seed") in ("11", "${train.seed}")
        training = job.argv[job.argv.index("longctx") + 1] in ("pretrain", "sft")
        assert ("train.resume=auto" in job.argv) == training, job.name
    assert all(j.argv[-1] == "train.max_steps=900" for j in pretrain)  # the cut, after the sweep's own keys
    assert not any("train.max_steps=900" in j.argv for j in evaluations)
    for job in evaluations:
        (need,) = job.needs
        checkpoint = next(w.removeprefix("init=") for w in job.argv if w.endswith("checkpoints/last.ckpt"))
        assert checkpoint.replace("${train.seed}", "11") == str(need.parent / "checkpoints" / "last.ckpt")
        assert need.name == DONE_FILE and need.parent.name == "w4096_s11"


def test_the_plan_s_verdict_and_tuning_seeds_and_the_lease_s_cuts():
    plan = load_plan(REPOSITORY / "sweeps" / "gpu_twin" / "plan.yaml")
    assert plan.seeds == (10, 11, 12) and not set(plan.tuning.seeds) & {10, 11, 12}
    terms, budget = lender().load(), lease.load_lease()
    assert budget.max_steps_cuts[0] == _load("gpu_base.yaml").train.max_steps
    assert budget.budget_s < terms.command_s  # a call ends before the lender's command limit
    assert budget.archive_max_bytes * len(plan.seeds) < terms.carry_mib * 2**20 / 8  # archives ride along cheaply
    drill = _load("gpu_drill.yaml")
    assert drill.model.init_std == 0.06 and [s.retrieval.template for s in drill.data.mixture][-1] == "repeat"
    assert shape_mismatches(_load("gpu_base.yaml").model, drill.model) == []
    assert 300 % _load("gpu_base.yaml").probe.answer_every_steps == 0  # the rule's probe exists


def test_copy_out_keeps_within_the_device_limits(tmp_path):
    files = []
    for i in range(10):
        files.append(tmp_path / f"f{i}.json")
        files[-1].write_text("{}")
    big = tmp_path / "big.png"
    with big.open("wb") as handle:
        handle.truncate(gpu_twin.MAX_OUT_BYTES + 1)
    left_out = gpu_twin.copy_out([big, *files, tmp_path / "missing.md"], tmp_path / "out")
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [f"f{i}.json" for i in range(8)]
    assert [Path(entry.split(" ")[0]).name for entry in left_out] == ["big.png", "f8.json", "f9.json", "missing.md"]


def test_progress_reads_the_last_values_and_survives_a_cut_line(tmp_path):
    job = gpu_twin.Job("run", [], tmp_path)
    lines = [
        {"step": 60, "train/loss": 3.0, "perf/tokens_per_s": 100.0},
        {"step": 60, "answers/loss": 2.2},
        {"step": 120, "train/loss": 2.5, "perf/tokens_per_s": 300.0, "perf/mfu": 0.05},
        {"step": 180, "train/loss": 2.0, "perf/tokens_per_s": 200.0},
    ]
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in lines) + '\n{"step": 18')
    assert gpu_twin._progress(job) == {
        "step": 180,
        "train/loss": 2.0,
        "perf/mfu": 0.05,
        "answers/loss": 2.2,
        "tokens_per_s_median": 200.0,
    }
