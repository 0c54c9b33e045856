"""`longctx niah` on tiny hybrids (three Gated DeltaNet layers to one full): the search runs
as on any model, with plain positions and with StRing acting on the RoPE full layer; a
NoPE-only hybrid (OLMo Hybrid as released) refuses StRing in one line naming the method."""

import json

import pytest

from longctx.cli import main
from longctx.config.model import ModelConfig
from longctx.model.checkpoint import save_model
from longctx.model.llama import Llama
from tests.eval.niah.helpers import eval_args


def hybrid_checkpoint(path, **overrides):
    linear = {"variant": "olmo_hybrid", "full_every": 4, "n_key_heads": 2, "chunk_size": 32}
    config = ModelConfig.from_preset("debug", max_position=256, n_layers=4, linear_attention=linear, **overrides)
    return save_model(Llama(config), path)


@pytest.mark.parametrize("method", ["rope", "string"])
def test_niah_runs_on_a_hybrid(method, haystack_file, tmp_path):
    checkpoint = hybrid_checkpoint(tmp_path / "hybrid.safetensors")
    args = [
        *eval_args(haystack_file),
        f"eval.position_method.name={method}",
        "eval.position_method.string.local_window=16",
        "--lengths",
        "128,256",
    ]
    assert main(["niah", str(checkpoint), *args, "--out", str(tmp_path / "eval")]) == 0
    result = json.loads((tmp_path / "eval" / "niah.json").read_text())
    assert [row["tests"] for row in result["per_length"]] == [2, 2]
    assert result["effective_length"] == 0  # an untrained model finds no needle


def test_niah_refuses_a_method_on_a_nope_only_hybrid(haystack_file, tmp_path, capsys):
    checkpoint = hybrid_checkpoint(tmp_path / "nope.safetensors", nope_every=4)
    args = [
        *eval_args(haystack_file),
        "eval.position_method.name=string",
        "eval.position_method.string.local_window=16",
        "--lengths",
        "128",
    ]
    assert main(["niah", str(checkpoint), *args, "--out", str(tmp_path / "eval")]) != 0
    err = capsys.readouterr().err
    assert "position method 'string' has nothing to act on" in err
