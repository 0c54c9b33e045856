"""The GPU twin (issue 25, item 6): its configs, its size, and the driver's plan and
outputs (sweep/gpu_twin.py). Nothing here trains; tests/test_side_by_side.py covers the
stop/resume/skip logic on fake jobs."""

import json
from pathlib import Path

import pytest

from longctx import config as config_module
from longctx.config.model import shape_mismatches
from longctx.model.llama import Llama
from longctx.sweep import gpu_twin
from longctx.sweep.side_by_side import DONE_FILE

REPOSITORY = Path(__file__).resolve().parents[1]
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
    pretrain, _ = gpu_twin.twin_jobs()
    windows = sorted({int(gpu_twin._option(j.argv, "data.window")) for j in pretrain})
    seeds = sorted({int(gpu_twin._option(j.argv, "train.seed")) for j in pretrain})
    assert (windows, seeds) == ([1024, 2048, 4096], [10, 11, 12])
    for window in windows:  # every window's batch divides into micro-batches
        _load("gpu_base.yaml", [f"data.window={window}"])


def test_table1_and_sft_load_the_pretrained_body_with_its_tokenizer():
    base = _load("gpu_base.yaml")
    for name in ("gpu_table1.yaml", "gpu_sft.yaml"):
        other = _load(name)
        assert shape_mismatches(base.model, other.model) == [], name
        assert other.data.tokenizer == base.data.tokenizer, name


def test_the_plan_runs_every_sweep_point_with_resume_and_waits_for_the_base_model():
    pretrain, evaluations = gpu_twin.twin_jobs()
    assert sorted(str(j.out_dir) for j in pretrain) == sorted(
        f"runs/replicate_gpu/pretrain/w{w}_s{s}" for w in (1024, 2048, 4096) for s in (10, 11, 12)
    )
    assert len(evaluations) == 5 * 3 + 3 * 3  # Table 1 methods x seeds, SFT arms x seeds
    assert len({j.out_dir for j in pretrain + evaluations}) == len(pretrain) + len(evaluations)
    for job in pretrain + evaluations:
        assert "log.wandb_mode=disabled" in job.argv
        training = job.argv[job.argv.index("longctx") + 1] in ("pretrain", "sft")
        assert ("train.resume=auto" in job.argv) == training, job.name
    for job in evaluations:
        (need,) = job.needs
        checkpoint = next(w.removeprefix("init=") for w in job.argv if w.endswith("checkpoints/last.ckpt"))
        seed = gpu_twin._option(job.argv, "train.seed")
        assert checkpoint.replace("${train.seed}", seed) == str(need.parent / "checkpoints" / "last.ckpt")
        assert need.name == DONE_FILE and need.parent.name == f"w4096_s{seed}"


def test_overrides_reach_only_the_pretraining_runs():
    pretrain, evaluations = gpu_twin.twin_jobs(overrides=("train.max_steps=800",))
    assert all("train.max_steps=800" in j.argv for j in pretrain)
    assert not any("train.max_steps=800" in j.argv for j in evaluations)


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


def test_a_call_without_time_to_start_anything_reports_every_job_pending(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu_twin, "ROOT", tmp_path / "runs")
    monkeypatch.setenv("LONGCTX_COMMIT", "abc123")
    out = tmp_path / "out"
    assert gpu_twin.main(["--budget-s", "100", "--out", str(out)]) == 0  # 40 s after the report reserve < 90 s
    body = json.loads((out / "twin_status.json").read_text())
    assert (body["state"], body["commit"]) == ("running", "abc123")
    assert len(body["jobs"]) == 33 and {row["state"] for row in body["jobs"]} == {"pending"}
    assert sorted(p.name for p in out.iterdir()) == ["twin_status.json", "twin_status.md"]
    assert not (tmp_path / "runs" / "logs").exists() or not any((tmp_path / "runs" / "logs").iterdir())
