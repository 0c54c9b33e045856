"""The GPU benchmark scripts (benchmarks/) and the real-model device drivers
(scripts/real_models/) run end to end on CPU at tiny sizes (`--smoke`, `smoke`), so a GPU session
only has to run them: each writes its tables as JSON and Markdown (benchmarks/report.py)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import gpu_image_environment

REPOSITORY = Path(__file__).resolve().parents[1]
SCRIPTS = {
    "train_gpu.py": ["train_step", "train_e2e"],
    "train_kernels_gpu.py": ["train_kernels"],
    "position_methods.py": ["positions_debug"],
    "niah.py": ["niah_search"],
    "designs.py": ["designs"],
    "decode_gpu.py": ["decode_gpu"],
    "niah_decode_gpu.py": ["niah_decode_gpu"],
    "profiles_gpu.py": ["profiles_gpu"],
    "context_parallel_gpu.py": ["cp_single"],
}


def check_niah_decode(out: Path) -> None:
    """Each length has the three arms; in fp32 on CPU the engine's RoPE decoding of the
    exported weights writes HF generate's tokens (greedy, the same prompts)."""
    rows = json.loads((out / "niah_decode_gpu.json").read_text())["rows"]
    arms = ["hf sdpa", "longctx rope", "longctx string"]
    assert [row[:2] for row in rows] == [[length, arm] for length in ("64", "128") for arm in arms]
    rope = [row for row in rows if row[1] == "longctx rope"]
    assert [row[-2:] for row in rope] == [["2/2", "8/8"]] * 2, rope


def check_profiles(out: Path) -> None:
    """Both profile summaries hold a key_averages table; the prefill one StRing's and RoPE's."""
    for name in ("profile_train_step", "profile_string_prefill"):
        text = (out / f"{name}.md").read_text()
        assert "Self CPU" in text and "aten::mm" in text, text[:2000]
    prefill = (out / "profile_string_prefill.md").read_text()
    assert "## string (shift=171" in prefill and "## rope" in prefill
    rows = json.loads((out / "profiles_gpu.json").read_text())["rows"]
    assert [row[0] for row in rows] == ["train step", "string prefill, 1 layer", "rope prefill, 1 layer"]


def check_train_kernels(out: Path) -> None:
    """Every CPU kernel at every shape, each timed; liger left out with its note."""
    record = json.loads((out / "train_kernels.json").read_text())
    arms = [row[1:3] for row in record["rows"]]
    shapes = ["2 x 1", "2 x 2", "4 x 1"]
    assert arms == [[kernel, shape] for kernel in ("chunked", "compiled") for shape in shapes], arms
    assert all(float(row[4]) > 0 for row in record["rows"])
    assert "liger: not measured" in (out / "train_kernels.md").read_text()


EXTRA_CHECKS = {
    "train_kernels_gpu.py": check_train_kernels,
    "niah_decode_gpu.py": check_niah_decode,
    "profiles_gpu.py": check_profiles,
}


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_smoke_mode_writes_json_and_markdown_tables(script, tmp_path):
    out = tmp_path / "bench"
    command = [sys.executable, f"benchmarks/{script}", "--smoke", "--out", str(out)]
    if script == "position_methods.py":
        command += ["--methods", "string", "dca"]
    result = subprocess.run(command, cwd=REPOSITORY, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    for name in SCRIPTS[script]:
        record = json.loads((out / f"{name}.json").read_text())
        assert record["name"] == name and record["rows"], record
        assert all(len(row) == len(record["columns"]) for row in record["rows"])
        markdown = (out / f"{name}.md").read_text()
        assert "| " + " | ".join(record["columns"]) + " |" in markdown
        assert record["settings"]["device"] == "CPU"
    if script in EXTRA_CHECKS:
        EXTRA_CHECKS[script](out)


def test_llama31_8b_case_has_the_published_parameter_count():
    """Llama-3.1-8B: 8,030,261,248 parameters (its model card / safetensors index)."""
    sys.path.insert(0, str(REPOSITORY / "benchmarks"))
    try:
        from position_methods import model_config
    finally:
        sys.path.remove(str(REPOSITORY / "benchmarks"))
    config = model_config("llama3.1-8b", 131072)
    assert config.num_parameters() == 8_030_261_248
    assert config.head_size == 128


def run_device_smoke(script: str, out: Path, scratch: Path) -> subprocess.CompletedProcess:
    """`scripts/real_models/<script> smoke --out out` as the GPU image would run it (no wandb); it must succeed."""
    command = [sys.executable, f"scripts/real_models/{script}", "smoke", "--out", str(out)]
    env = gpu_image_environment(scratch)
    result = subprocess.run(command, cwd=REPOSITORY, capture_output=True, text=True, timeout=1200, env=env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


@pytest.mark.slow
def test_the_real_model_table1_device_script_runs_its_three_modes_on_cpu(tmp_path):
    """scripts/real_models/real_table1.py smoke (the real-model Table 1 driver) on a tiny random Llama in
    the HF layout: the table's cells packed and resumed from the archive on a fresh work
    directory, the paired rules, the CPU agreement and the side-by-side with HF generate
    (~5 min on the loaded 2-core machine)."""
    out = tmp_path / "real"
    run_device_smoke("real_table1.py", out, tmp_path)
    rules = json.loads((out / "table" / "rules-L512.json").read_text())
    assert [row[0] for row in rules["rows"]] == ["string-repo - rope", "string-repo - rope-repo-temperature"]
    agreement = json.loads((out / "agreement" / "agreement-L512.json").read_text())
    assert len(agreement["rows"]) == 10 and all(row[1] == "2" for row in agreement["rows"])
    side = json.loads((out / "side" / "side_by_side-L512.json").read_text())
    # fp32 on CPU, greedy on the same weights: HF generate and longctx write the same text
    assert "the same output text on 2/2" in " ".join(side["notes"])


@pytest.mark.slow
def test_the_dpe_probe_device_script_probes_compares_and_resumes(tmp_path):
    """scripts/real_models/dpe_probe.py smoke: the authors' probing (8 groups x factors 1, 2 at
    2,048 tokens on a tiny random Llama of L = 1,024), the choice, the comparison, and a
    second call from the first's archive alone that decodes nothing again (~1 min)."""
    out = tmp_path / "dpe"
    run_device_smoke("dpe_probe.py", out, tmp_path)
    first, second = (json.loads((out / call / "dpe_probe-L2048.json").read_text()) for call in ("first", "second"))
    assert len(first["scores"]) == 16 and first["unprobed_groups"] == [] and first["hold"] == 4
    assert first["scores"] == second["scores"] and first["scale_factors"] == second["scale_factors"]
    assert "| dpe |" in (out / "second" / "dpe_compare-L2048.md").read_text()


@pytest.mark.slow
def test_the_real_model_ruler_device_script_resumes_from_its_archive(tmp_path):
    """scripts/real_models/real_ruler.py smoke (the real-model RULER driver): RULER-11 on a tiny
    random Llama, a first call at 1,024 tokens, then a fresh work directory resumed from that
    call's archive at 1,024 and 2,048 (~1.5 min on one quiet core)."""
    out = tmp_path / "ruler"
    result = run_device_smoke("real_ruler.py", out, tmp_path)
    first = json.loads((out / "first" / "ruler.json").read_text())
    second = json.loads((out / "second" / "ruler.json").read_text())
    assert len(first["tasks"]) == 11 and first["mean_name"].startswith("RULER-11")
    assert sorted(first["lengths"]) == ["1024"] and sorted(second["lengths"]) == ["1024", "2048"]
    assert second["lengths"]["1024"] == first["lengths"]["1024"]  # the archived cells, read back
    assert "RULER samples on disk: 88 (44 this call" in result.stdout  # 11 tasks x 2 arms x 2 samples


@pytest.mark.slow
def test_hf_attention_benchmark_runs_its_three_arms_and_the_tiny_table(tmp_path):
    """benchmarks/hf_attention.py on a tiny saved Llama (L = 512, StRing S = 171) at 256
    tokens: both tables written, the two StRing arms generate the same tokens. Slow (about
    2 minutes: each arm is a fresh process); a CPU benchmark, not a GPU step."""
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        vocab_size=50000,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        max_position_embeddings=512,
    )
    transformers.LlamaForCausalLM(config).save_pretrained(tmp_path / "model")
    out = tmp_path / "bench"
    command = [sys.executable, "benchmarks/hf_attention.py", "--model", str(tmp_path / "model"), "--lengths", "256"]
    command += ["--new-tokens", "2", "--tiny-length", "512", "--threads", "1", "--out", str(out)]
    env = gpu_image_environment(tmp_path)
    result = subprocess.run(command, cwd=REPOSITORY, capture_output=True, text=True, timeout=600, env=env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    rows = json.loads((out / "hf_attention.json").read_text())["rows"]
    assert [row[1] for row in rows] == ["hf sdpa", "hf longctx_string", "longctx string"]
    assert [row[-1] for row in rows[1:]] == ["yes", "yes"]
    tiny = json.loads((out / "hf_attention_tiny.json").read_text())["rows"]
    assert [row[1] for row in tiny] == ["sdpa", "longctx_string", "longctx_rope"]


@pytest.mark.slow
def test_the_evaluation_ranks_benchmark_compares_one_rank_with_two_on_the_same_grids(tmp_path):
    """benchmarks/eval_ranks.py --smoke: each grid timed on 1 process and on 2 torchrun gloo
    ranks, every sample decoded in both (~2 min on the loaded 2-core machine: 4 launches)."""
    out = tmp_path / "bench"
    command = [sys.executable, "benchmarks/eval_ranks.py", "--smoke", "--out", str(out)]
    result = subprocess.run(command, cwd=REPOSITORY, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    rows = json.loads((out / "eval_ranks.json").read_text())["rows"]
    assert [row[:3] for row in rows] == [
        ["whole cells", "1", "16"],  # rope and string at 128 and 256, 4 tests each
        ["whole cells", "2", "16"],
        ["one cell, spread", "1", "4"],
        ["one cell, spread", "2", "4"],
    ]
    assert rows[0][-1] == rows[2][-1] == "1.00x" and all(float(row[4]) > 0 for row in rows)
