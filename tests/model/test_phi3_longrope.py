"""Phi-3's `longrope` (model/rope.py, model/families/phi3.py) against transformers' own Phi-3
on the same weights, float64: a tiny random model from Phi3Config with Phi-4-mini's partial
RoPE (6 rotated pairs), L_orig = original_max_position_embeddings = 32 and distinct short and
long factors (tests/model/test_hf_families.CASES["phi3-longrope"]).

- import equals transformers (eager and sdpa) below the switch (24 tokens, short factors)
  and past it (48, long), within transformers' float32 RoPE angles (1e-5); the long
  factors and the attention factor sqrt(1 + ln 8 / ln 32) each move the logits by > 1e-2;
- a cached forward that crosses L_orig keeps the earlier keys' short rotation as
  transformers' forward with a DynamicCache does (step by step, 1e-5), far from a full
  forward; `generate` re-runs the sequence at L_orig + 1 tokens as transformers' Phi-3
  `generate` does: its tokens and scores equal transformers' (dynamic and static caches),
  with the prompt prefilled whole or in chunks;
- export writes a Phi3ForCausalLM transformers reloads with equal logits on both sides
  of the switch, and import reads it back into the same ModelConfig;
- what is not reproduced is refused in one line.
"""

import json

import pytest
import torch

from longctx.config.model import ModelConfig
from longctx.config.position_methods import PositionMethodConfig
from longctx.errors import CheckpointError, ConfigError
from longctx.model.hf import export_hf, import_hf
from longctx.model.inference.generation import generate
from longctx.model.position_methods import build_position_method
from longctx.model.rope import RopeScaling
from tests.model.helpers import stepwise_logits
from tests.model.test_hf_families import build, ids

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

TOLERANCE = 1e-5
"""transformers computes the RoPE angles in float32 even in a float64 model."""
ORIGINAL = 32


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """(transformers' model in float64, its directory, longctx's import in float64)."""
    directory = tmp_path_factory.mktemp("phi3-longrope")
    hf = build("phi3-longrope", eos_token_id=None).double()
    hf.save_pretrained(directory)
    return hf, directory, import_hf(directory, dtype=torch.float64).eval()


def test_import_reads_the_factors_the_length_and_the_attention_factor(pair):
    _, _, ours = pair
    scaling = ours.config.rope_scaling
    assert (scaling.type, scaling.original_max_position, scaling.factor) == ("longrope", ORIGINAL, 8.0)
    assert scaling.short_factor == [1.0, 1.25, 1.5, 2.0, 3.0, 4.0] and scaling.long_factor[-1] == 48.0
    assert scaling.attention_factor == pytest.approx(
        (1 + torch.log(torch.tensor(8.0)) / torch.log(torch.tensor(32.0))).sqrt().item()
    )
    assert (ours.config.rotary_fraction, ours.rope.rotary_dim) == (0.75, 12)


def test_both_frequency_sets_and_the_factor_are_transformers(pair):
    """theta_i / short_factor and theta_i / long_factor (float32, within one rounding of
    transformers' float32 arithmetic) and the cos/sin factor; a bf16 cast keeps both sets."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    hf, directory, ours = pair
    short, factor = ROPE_INIT_FUNCTIONS["longrope"](hf.config, None)
    long, _ = ROPE_INIT_FUNCTIONS["longrope"](hf.config, None, seq_len=ORIGINAL + 1)
    assert torch.allclose(ours.rope.inv_freq, short, rtol=2e-7, atol=0)
    assert torch.allclose(ours.rope.long_inv_freq, long, rtol=2e-7, atol=0)
    assert (long - short).abs().max() > 1e-2 and ours.rope.attention_factor == pytest.approx(factor, rel=1e-12)
    cast = import_hf(directory).to(torch.bfloat16)
    assert torch.equal(cast.rope.long_inv_freq, ours.rope.long_inv_freq.float())
    assert cast.rope.long_inv_freq.dtype == torch.float32


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
@pytest.mark.parametrize("length", [24, ORIGINAL, ORIGINAL + 1, 48])
def test_import_equals_transformers_on_both_sides_of_the_switch(pair, implementation, length):
    hf, _, ours = pair
    hf.set_attn_implementation(implementation)
    prompt = ids(length)
    with torch.no_grad():
        theirs, mine = hf(prompt).logits, ours(prompt)
    hf.set_attn_implementation("sdpa")
    assert theirs.abs().max() > 1.0
    assert (mine - theirs).abs().max() <= TOLERANCE


def test_the_long_factors_and_the_attention_factor_matter(pair):
    """Negative controls past the switch: the short factors, or no attention factor."""
    hf, directory, _ = pair
    prompt = ids(48)
    with torch.no_grad():
        theirs = hf(prompt).logits
    for change in (
        {"long_factor": [1.0, 1.25, 1.5, 2.0, 3.0, 4.0]},  # the short set past L_orig
        {"attention_factor": 1.0},
    ):
        ours = import_hf(directory, dtype=torch.float64).eval()
        for key, value in change.items():
            setattr(ours.config.rope_scaling, key, value)
        ours.rope = type(ours.rope)(
            ours.rope.head_dim, ours.rope.base, ours.config.rope_scaling, ours.rope.max_position, **ours.rope.partial
        ).double()
        with torch.no_grad():
            assert (ours(prompt) - theirs).abs().max() > 1e-2, change


def test_a_cached_forward_across_the_switch_keeps_the_short_keys_as_transformers(pair):
    """20 tokens cached, then one a step to 48: the step at position 32 switches to the long
    factors while the cached keys keep the short rotation, in both models."""
    hf, _, ours = pair
    sequence = ids(48)
    cache = transformers.DynamicCache(config=hf.config)
    with torch.no_grad():
        steps = [hf(sequence[:, :20], past_key_values=cache, use_cache=True).logits]
        steps += [hf(sequence[:, t : t + 1], past_key_values=cache, use_cache=True).logits for t in range(20, 48)]
        full = hf(sequence).logits
    theirs = torch.cat(steps, dim=1)
    assert (stepwise_logits(ours, sequence, 20) - theirs).abs().max() <= TOLERANCE
    assert (theirs - full)[:, ORIGINAL:].abs().max() > 1e-1  # mixed rotations: not a full forward


@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_generate_across_the_switch_equals_transformers_generate(pair, cache):
    """Prompts of 20 tokens, 24 new: transformers' Phi-3 re-runs the sequence at 33 tokens;
    longctx's generate does the same, so its tokens are transformers' and every step's
    logits a full forward's."""
    hf, _, ours = pair
    prompt = ids(20)
    out = hf.generate(
        prompt,
        max_new_tokens=24,
        do_sample=False,
        pad_token_id=0,
        output_scores=True,
        return_dict_in_generate=True,
        cache_implementation=cache,
    )
    generations = generate(ours, prompt.tolist(), max_new_tokens=24, batch_size=2)
    assert torch.equal(torch.tensor([g.token_ids for g in generations]), out.sequences[:, 20:])
    with torch.no_grad():  # step s: a full forward of the 20 + s tokens so far (short up to 32, then long)
        full = torch.stack([ours(out.sequences[:, : 20 + s])[:, -1] for s in range(24)], dim=1)
    assert (torch.stack(out.scores, dim=1).double() - full).abs().max() <= TOLERANCE


@pytest.mark.parametrize("length", [24, 40])
def test_a_chunked_prefill_equals_one_forward_on_either_side_of_the_switch(pair, length):
    """Chunks of 8: below L_orig all short; past it all long (as the whole prompt), also in
    the re-run at 33 tokens; the tokens equal transformers' generate."""
    hf, _, ours = pair
    prompt = ids(length)
    chunked = generate(ours, prompt.tolist(), max_new_tokens=16, prefill_chunk_tokens=8)
    expected = hf.generate(prompt, max_new_tokens=16, do_sample=False, pad_token_id=0)
    assert torch.equal(torch.tensor([g.token_ids for g in chunked]), expected[:, length:])


@pytest.mark.parametrize("length", [24, 48])
def test_export_reloads_in_transformers_with_equal_logits(pair, tmp_path, length):
    hf, _, ours = pair
    exported = export_hf(ours, tmp_path / "out")
    values = json.loads((exported / "config.json").read_text())
    assert (values["model_type"], values["original_max_position_embeddings"]) == ("phi3", ORIGINAL)
    assert values["rope_scaling"]["rope_type"] == "longrope" and values["partial_rotary_factor"] == 0.75
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(exported, dtype=torch.float64).eval()
    assert type(reloaded).__name__ == "Phi3ForCausalLM"
    prompt = ids(length)
    with torch.no_grad():
        assert (reloaded(prompt).logits - hf(prompt).logits).abs().max() <= 1e-10
    assert import_hf(exported).config == ours.config


@pytest.mark.parametrize(
    "fields, message",
    [
        (
            {"rope_parameters": {"rope_type": "longrope", "short_factor": [1.0] * 6, "long_factor": [2.0] * 5}},
            "rope_type='longrope': long_factor must be 6 factors > 0 (one per rotated pair)",
        ),
        (
            {"rope_scaling": {"type": "su", "short_factor": [1.0] * 6, "long_factor": [2.0, -1.0, 2.0, 2.0, 2.0, 2.0]}},
            "rope_type='su': long_factor must be 6 factors > 0 (one per rotated pair)",
        ),
    ],
)
def test_refusals_name_the_field_in_one_line(pair, tmp_path, fields, message):
    _, directory, _ = pair
    values = {**json.loads((directory / "config.json").read_text()), **fields}
    (tmp_path / "config.json").write_text(json.dumps(values))
    with pytest.raises(CheckpointError, match="rope_type") as error:
        import_hf(tmp_path)
    assert message in str(error.value) and "\n" not in str(error.value)


@pytest.mark.parametrize("kind", ["yarn", "su"])
def test_su_and_yarn_are_read_as_longrope_as_transformers_reads_them(pair, tmp_path, kind):
    """transformers' older names in 4.x's `rope_scaling`: both take the top-level
    original_max_position_embeddings (32), not the rope dict's (40 here), in both models."""
    _, directory, _ = pair
    values = json.loads((directory / "config.json").read_text())
    rope = {key: value for key, value in values.pop("rope_parameters").items() if key != "rope_type"}
    rope = {**rope, "type": kind, "original_max_position_embeddings": 40}
    (tmp_path / "config.json").write_text(json.dumps({**values, "rope_scaling": rope}))
    (tmp_path / "model.safetensors").symlink_to(directory / "model.safetensors")
    ours = import_hf(tmp_path, dtype=torch.float64).eval()
    theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float64).eval()
    assert ours.config.rope_scaling.original_max_position == ORIGINAL
    for length in (36, 48):
        with torch.no_grad():
            assert (ours(ids(length)) - theirs(ids(length)).logits).abs().max() <= TOLERANCE


def test_position_methods_on_longrope_are_refused_in_one_line(pair):
    _, _, ours = pair
    with pytest.raises(ValueError, match="'string' is not supported on longrope RoPE") as error:
        build_position_method(PositionMethodConfig(name="string"), ours.config)
    assert "\n" not in str(error.value)


def test_model_config_checks_the_factors_per_rotated_pair():
    scaling = RopeScaling(
        "longrope", factor=2.0, original_max_position=64, short_factor=[1.0] * 3, long_factor=[2.0] * 4
    )
    with pytest.raises(ConfigError, match="short_factor.*longrope needs 4 factors"):
        ModelConfig.from_preset("debug", rope_scaling=scaling, head_dim=8, n_heads=8)
    with pytest.raises(ConfigError, match="is longrope's, not yarn's"):
        ModelConfig.from_preset("debug", rope_scaling=RopeScaling("yarn", factor=2.0, long_factor=[1.0]))
