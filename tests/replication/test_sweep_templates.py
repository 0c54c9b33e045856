"""The replicate_* sweeps are generated from one template per step (longctx_replication/sweep_templates.py)."""

import shutil
from pathlib import Path

import pytest
import yaml

from longctx.errors import ConfigError
from longctx_replication.sweep_templates import main, render_all, stale

SWEEPS = Path(__file__).resolve().parents[2] / "sweeps"


def test_the_committed_sweeps_are_what_the_templates_render():
    assert stale(SWEEPS) == [], "run python -m longctx_replication.sweep_templates"


def test_every_scale_and_step_is_rendered():
    names = {path.name for path in render_all(SWEEPS)}
    assert names == {
        f"replicate_{s}{step}.yaml"
        for s in ("cpu", "full", "gpu", "smoke")
        for step in ("", "_table1", "_sft", "_sft_plain")
    }


def test_a_rendered_sweep_reads_as_written_by_hand():
    """One file, its every field checked against the chain it must run (the CPU table step)."""
    spec = yaml.safe_load(render_all(SWEEPS)[SWEEPS / "replicate_full_table1.yaml"])
    assert spec["name"] == "replicate_full_table1"
    assert spec["parameters"]["train.seed"] == {"values": [10, 11, 12, 13, 14]}
    assert spec["command"][4:9] == [
        "niah",
        "runs/replicate_full/pretrain/w512_s${train.seed}/checkpoints/last.ckpt",
        "experiments/replicate/cpu_table1.yaml",
        "eval.out_dir=runs/replicate_full/table1/s${train.seed}/name=${eval.position_method.name}",
        "log.run_name=replicate_full_table1_${eval.position_method.name}_s${train.seed}",
    ]
    assert spec["command"][-1] == "${args_no_hyphens}"


def test_check_names_a_drifted_file_and_writing_repairs_it(tmp_path, capsys):
    sweeps = tmp_path / "sweeps"
    shutil.copytree(SWEEPS / "templates", sweeps / "templates")
    main(["--sweeps", str(sweeps)])
    assert main(["--sweeps", str(sweeps), "--check"]) == 0
    target = sweeps / "replicate_gpu_sft.yaml"
    target.write_text(target.read_text().replace("w4096", "w2048"))
    assert main(["--sweeps", str(sweeps), "--check"]) == 1
    assert "replicate_gpu_sft.yaml: differs" in capsys.readouterr().out
    main(["--sweeps", str(sweeps)])
    assert stale(sweeps) == []


def test_an_unknown_scale_key_is_refused_with_the_file(tmp_path):
    sweeps = tmp_path / "sweeps"
    shutil.copytree(SWEEPS / "templates", sweeps / "templates")
    scales = sweeps / "templates" / "scales.yaml"
    scales.write_text(scales.read_text().replace("  seeds: [10, 11, 12, 13, 14]", "  seed: [10, 11, 12, 13, 14]"))
    with pytest.raises(
        ConfigError, match=r"^full: unknown keys \['seed'\], missing \['seeds'\] \(.*templates/scales.yaml\)"
    ):
        render_all(sweeps)
