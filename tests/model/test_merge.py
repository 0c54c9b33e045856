"""LongRecipe model merging (Eq. 7) against a tensor-by-tensor weighted sum, through the CLI too."""

import dataclasses

import pytest
import torch

from longctx.cli import main
from longctx.config.model import ModelConfig
from longctx.model.checkpoint import load_model, save_model
from longctx.model.llama import Llama
from longctx.model.merge import merge_checkpoints, merge_models
from longctx.model.rope import RopeScaling


def seeded(seed: int, **changes) -> Llama:
    torch.manual_seed(seed)
    return Llama(dataclasses.replace(ModelConfig.from_preset("debug"), **changes))


def test_merged_weights_are_the_weighted_sum_and_the_config_comes_from_the_chosen_model():
    original = seeded(0, max_position=256)
    extended = seeded(1, max_position=1024, rope_base=40000.0)
    third = seeded(2)
    result = merge_models({"o": original, "replay": extended, "x": third}, [0.5, 0.3, 0.2], config_from=1)
    merged = result.model.state_dict()
    for name, tensor in original.state_dict().items():
        expected = 0.5 * tensor + 0.3 * extended.state_dict()[name] + 0.2 * third.state_dict()[name]
        torch.testing.assert_close(merged[name], expected, rtol=1e-6, atol=1e-7)
    assert result.model.config == extended.config and result.config_source == "replay"
    assert result.differing_fields == {"max_position": [256, 1024, 512], "rope_base": [10000.0, 40000.0, 10000.0]}


def test_weights_one_and_zero_reproduce_a_model_exactly():
    a, b = seeded(0), seeded(1)
    ids = torch.randint(0, a.config.vocab_size, (2, 16))
    result = merge_models({"a": a, "b": b}, [1.0, 0.0], config_from=0)
    torch.testing.assert_close(result.model(ids), a(ids), rtol=0, atol=0)


@pytest.mark.parametrize(
    "changes,weights,message",
    [
        ({"d_ff": 128}, [0.5, 0.5], r"d_ff is 256 \(a\), 128 \(b\)"),
        ({}, [0.5, 0.6], r"sum to 1\.1, not 1"),
        ({}, [1.0], r"1 weights for 2 checkpoints"),
        ({}, [float("nan"), 1.0], "finite"),
    ],
)
def test_impossible_merges_are_clear_errors(changes, weights, message):
    with pytest.raises(ValueError, match=message):
        merge_models({"a": seeded(0), "b": seeded(1, **changes)}, weights)


def test_a_renamed_or_reshaped_tensor_is_named():
    a, b = seeded(0), seeded(1)
    state = b.state_dict()
    state["output.weight"] = state["output.weight"][:, :-1].clone()

    class Reshaped(torch.nn.Module):
        config = b.config

        def state_dict(self):
            return state

    with pytest.raises(ValueError, match=r"output.weight has shape \(8192, 63\) in b but \(8192, 64\) in a"):
        merge_models({"a": a, "b": Reshaped()}, [0.5, 0.5])


def test_merge_command_averages_checkpoints_by_default(tmp_path, capsys):
    paths = []
    for seed, scaling in ((0, RopeScaling()), (1, RopeScaling("ntk", factor=4.0))):
        paths.append(save_model(seeded(seed, rope_scaling=scaling), tmp_path / f"m{seed}.safetensors"))
    out = tmp_path / "merged.safetensors"
    assert main(["merge", *map(str, paths), "--out", str(out)]) == 0
    merged, first, second = load_model(out), load_model(paths[0]), load_model(paths[1])
    for name, tensor in merged.state_dict().items():
        torch.testing.assert_close(tensor, (first.state_dict()[name] + second.state_dict()[name]) / 2)
    assert merged.config.rope_scaling == RopeScaling("ntk", factor=4.0)  # the last checkpoint's config
    assert "rope_scaling differs" in capsys.readouterr().out
    assert main(["merge", str(paths[0]), "--out", str(out)]) == 2  # one checkpoint: a clear error
    assert merge_checkpoints(paths, [0.25, 0.75]).model.config == second.config
