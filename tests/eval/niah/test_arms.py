"""The arms of a method table (niah-table --arms), fixed in YAML before any result, and the
RoPE-with-the-repo's-score-temperature arm that separates StRing's shift from its temperature."""

import math

import pytest
import torch

from longctx.cli import main
from longctx.config import load
from longctx.config.model import ModelConfig
from longctx.config.position_methods import PositionMethodConfig, RopeConfig
from longctx.errors import ConfigError
from longctx.model.checkpoint import save_model
from longctx.model.llama import Llama
from longctx.model.position_methods import build_position_method
from tests.eval.niah.helpers import eval_args


def test_rope_with_the_repo_temperature_multiplies_scores_by_it():
    """softmax(factor^2 q.k / sqrt d): the same as plain RoPE with queries times factor^2,
    (1 + 0.1 ln 2)^2 = 1.0693^2 = 1.1434 by hand."""
    factor = (1 + 0.1 * math.log(2)) ** 2
    assert factor == pytest.approx(1.1434, abs=1e-4)
    config = ModelConfig.from_preset("debug", max_position=64)
    plain = build_position_method(PositionMethodConfig(name="rope"), config).double()
    tempered = build_position_method(PositionMethodConfig(name="rope", rope=RopeConfig(True)), config).double()
    q, k, v = (torch.randn(2, 30, h, 16, dtype=torch.float64) for h in (4, 2, 2))
    expected = plain.attend(q * factor, k, v)
    torch.testing.assert_close(tempered.attend(q, k, v), expected, atol=1e-12, rtol=0)
    assert not torch.allclose(plain.attend(q, k, v), expected)
    assert tempered.params == {"repo_score_scale": True}


def test_arms_are_named_position_method_sections_of_the_config(tmp_path):
    path = tmp_path / "arms.yaml"
    path.write_text(
        "eval:\n  arms:\n    rope: {name: rope}\n    string-repo: {name: string, string: {compat: repo}}\n"
        "    rope-temperature: {name: rope, rope: {repo_score_scale: true}}\n"
    )
    arms = load([path]).eval.arms
    assert list(arms) == ["rope", "string-repo", "rope-temperature"]
    assert (arms["string-repo"].name, arms["string-repo"].string.compat, arms["string-repo"].string.local_window) == (
        "string",
        "repo",
        128,
    )
    assert arms["rope-temperature"].rope.repo_score_scale is True
    path.write_text("eval:\n  arms:\n    bad: {name: string, string: {shfit: 3}}\n")
    with pytest.raises(ConfigError, match=r"eval\.arms\.bad\.string\.shfit: unknown key"):
        load([path])
    path.write_text("eval:\n  arms:\n    wide: {name: string, string: {local_window: 4000}}\n")
    with pytest.raises(ConfigError, match=r"eval\.arms\.wide\.string\.local_window: must be in \[0, shift S="):
        load([path])


def test_the_shipped_real_model_table_fixes_the_ten_arms():
    arms = load(["experiments/real/smollm2_table1.yaml"]).eval.arms
    assert list(arms) == [
        "rope",
        "string-paper",
        "string-repo",
        "rope-repo-temperature",
        "ntk",
        "yarn",
        "rerope",
        "self_extend",
        "dca",
        "dpe",
    ]
    assert arms["dpe"].resolved(8192) == {"local_window": 1024, "scale_factors": "2-2-2-2-2-2-2-2"}
    assert arms["string-paper"].resolved(8192) == {"shift": 2731, "local_window": 128, "compat": "paper"}


def test_niah_table_runs_the_arms_at_the_given_lengths(tmp_path, haystack_file, capsys):
    model = tmp_path / "m.safetensors"
    save_model(Llama(ModelConfig.from_preset("debug", max_position=256)), model)
    arms = tmp_path / "arms.yaml"
    arms.write_text("eval:\n  arms:\n    rope: {name: rope}\n    string: {name: string, string: {local_window: 16}}\n")
    out = tmp_path / "table.md"
    args = ["niah-table", str(model), str(arms), "--lengths", "192,256", "--out", str(out)]
    assert main([*args, *eval_args(haystack_file)]) == 0
    lines = out.read_text().splitlines()
    assert lines[0] == "| method | m.safetensors@192 | m.safetensors@256 |"
    assert lines[2].startswith("| rope | ") and lines[3].startswith("| string | ")
    assert lines[2].count("n=2") == 2
    assert (tmp_path / "table.json").is_file()
