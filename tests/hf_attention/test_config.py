"""apply(): longctx's parameter names and defaults, the parameters stored in the config
(save_pretrained / from_pretrained round trip), attn_implementation names that work on
any checkpoint, and each refusal as one line naming its reason."""

import pytest
import torch
import transformers

import longctx.hf_attention as hfa
from longctx.config.position_methods import baseline_protocol
from longctx.errors import HFAttentionError
from longctx.hf_attention.methods import method_for
from tests.hf_attention.helpers import PARAMS, build, tokens

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


SAME_METHOD_ATOL = 1e-12
"""float64 logits of one model and method computed twice, after a save/load or through
another route to the same method: equal up to the summation order the CPU's matrix
kernels choose for the memory they are given (a few ulps, ~1e-16; plain sdpa logits move
as much). A method changes them by more than 1e-3, which `assert_same_method` also asserts."""


def logits(model, ids):
    with torch.no_grad():
        return model(ids).logits


def assert_same_method(got: torch.Tensor, expected: torch.Tensor, plain: torch.Tensor) -> None:
    """`got` is the method's `expected` logits, not the plain model's (`plain`)."""
    torch.testing.assert_close(got, expected, rtol=0, atol=SAME_METHOD_ATOL)
    assert not torch.allclose(plain, expected, atol=1e-3)


def test_string_defaults_are_longctxs_and_training_length_overrides_them():
    model = build("llama-tied", max_position_embeddings=1024)
    hfa.apply(model, "string")
    assert model.config.longctx_position_method == {
        "name": "string",
        "training_length": 1024,
        "params": {"shift": 341, "local_window": 128, "compat": "paper"},
    }
    hfa.apply(model, "string", training_length=240, local_window=16, compat="repo")
    assert model.config.longctx_position_method["params"] == {"shift": 80, "local_window": 16, "compat": "repo"}


@pytest.mark.parametrize("method", ["rerope", "self_extend", "dca", "ntk", "yarn"])
def test_baselines_default_to_the_string_protocol(method):
    model = hfa.apply(build("qwen2"), method)
    assert model.config.longctx_position_method["params"] == baseline_protocol(method, 256)


@pytest.mark.parametrize("arm", ["string", "dca", "yarn"])
def test_save_pretrained_and_from_pretrained_keep_the_method(tmp_path, arm):
    model = hfa.apply(build("qwen2-tied"), arm, **({"shift": 40, "local_window": 8} if arm == "string" else {}))
    ids = tokens(1, 250)  # DCA's default chunks (107 tokens at L = 256) change nothing below ~130
    expected = logits(model, ids)
    model.save_pretrained(tmp_path)
    implementation = {} if arm == "yarn" else {"attn_implementation": f"longctx_{arm}"}
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float64, **implementation)
    assert loaded.config.longctx_position_method == model.config.longctx_position_method
    assert_same_method(logits(loaded, ids), expected, plain=logits(build("qwen2-tied"), ids))


def test_any_checkpoint_runs_a_name_with_the_methods_defaults(tmp_path):
    """from_pretrained(attn_implementation=...) on a plain checkpoint, and
    set_attn_implementation, run the method's defaults against L."""
    build("mistral").save_pretrained(tmp_path)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path, dtype=torch.float64, attn_implementation="longctx_self_extend"
    )
    assert method_for(loaded.config, "self_extend").params == baseline_protocol("self_extend", 256)
    ids = tokens(1, 250)  # DCA's default chunks (107 tokens at L = 256) change nothing below ~130
    plain = logits(build("mistral"), ids)
    assert_same_method(logits(loaded, ids), logits(hfa.apply(build("mistral"), "self_extend"), ids), plain)
    loaded.set_attn_implementation("longctx_dca")
    assert_same_method(logits(loaded, ids), logits(hfa.apply(build("mistral"), "dca"), ids), plain)


def test_a_mistral_window_that_covers_the_sequence_is_full_attention():
    model = build("mistral", sliding_window=300)
    sdpa = logits(model, tokens())
    hfa.apply(model, "rope")
    assert torch.allclose(logits(model, tokens()), sdpa, rtol=0, atol=1e-12)
    with pytest.raises(HFAttentionError, match="301 keys exceed the sliding window of 300"):
        logits(model, tokens(1, 301))


def refusal(call, match: str) -> None:
    with pytest.raises(HFAttentionError, match=match) as error:
        call()
    assert "\n" not in str(error.value) and str(error.value).startswith(("longctx_", "unknown", "training_length"))


def test_refusals_name_their_reason():
    refusal(lambda: hfa.apply(build("mistral", sliding_window=64), "string"), "sliding_window=64 is shorter")
    for rope_type in ("dynamic", "longrope"):
        parameters = {"rope_type": rope_type, "rope_theta": 10000.0, "factor": 2.0}
        if rope_type == "longrope":
            parameters.update(short_factor=[1.0] * 8, long_factor=[2.0] * 8, original_max_position_embeddings=64)
        model = build("llama-tied", rope_parameters=parameters)
        why = "runs under longctx_rope only" if rope_type == "longrope" else ".*change with the sequence"
        refusal(lambda model=model, why=why: hfa.apply(model, "dca"), f"rope_type '{rope_type}' {why}")
        model.set_attn_implementation("longctx_string")
        refusal(lambda model=model: logits(model, tokens()), f"rope_type '{rope_type}'")
    refusal(lambda: hfa.apply(build("llama-tied"), "string", shfit=40), "unknown parameter 'shfit'")
    refusal(lambda: hfa.apply(build("llama-tied"), "string", shift=10, local_window=20), "local_window: must be in")
    refusal(lambda: hfa.apply(build("llama-tied"), "dca", chunk_size=10, local_window=20), "local_window: 20 exceeds")
    refusal(lambda: hfa.apply(build("llama-tied"), "rerope", window=-3), "window: must be > 0")
    refusal(lambda: hfa.apply(build("llama-tied"), "string", shift="far"), "shift='far' is not a int")
    refusal(lambda: hfa.apply(build("llama-tied"), "string", training_length=0), "training_length")
    refusal(lambda: hfa.apply(build("llama-tied"), "alibi"), "unknown method 'alibi'")


def test_another_attention_family_is_refused():
    config = transformers.Gemma2Config(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        head_dim=16,
        max_position_embeddings=128,
        pad_token_id=0,
    )
    model = transformers.Gemma2ForCausalLM(config)
    refusal(lambda: hfa.apply(model, "string", shift=40, local_window=8), "model_type 'gemma2' is not supported")


def test_inputs_it_cannot_serve_are_refused():
    model = hfa.apply(build("llama-bias"), "string", **PARAMS["string"])
    ids = tokens(1, 20)
    holes = torch.ones_like(ids)
    holes[0, 5:8] = 0
    refusal(lambda: model(ids, attention_mask=holes), "padding between the tokens of a row")
    dense = torch.zeros(1, 1, 20, 20, dtype=torch.float64)
    refusal(lambda: model(ids, attention_mask=dense), "a Tensor mask, not longctx's")
    function = transformers.AttentionInterface()["longctx_string"]
    layer = model.model.layers[0].self_attn
    q, k = torch.zeros(1, 4, 1, 16), torch.zeros(1, 2, 1, 16)
    refusal(lambda: function(layer, q, k, k, None, cache=object()), "paged cache")
    refusal(lambda: function(layer, q, k, k, None, cu_seq_lens_q=torch.zeros(2)), "continuous batching")
    refusal(lambda: function(layer, q, k, k, None, dropout=0.1), "dropout")


def test_continuous_batching_is_refused():
    model = hfa.apply(build("llama-tied", dtype=torch.float32), "string", **PARAMS["string"])
    config = transformers.GenerationConfig(max_new_tokens=2, do_sample=False, eos_token_id=-1, pad_token_id=0)
    with pytest.raises(ValueError, match="not supported for continuous batching"):
        model.generate_batch(inputs=[[5, 6, 7, 8]], generation_config=config)
