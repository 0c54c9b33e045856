"""The memory estimate before step 1 (train/memory_budget.py): exact for parameters, gradients
and AdamW state, and the refusal of configs that cannot fit, naming the knob."""

import pytest
import torch

from longctx.config import load
from longctx.errors import ConfigError
from longctx.model.llama import Llama
from longctx.train.memory_budget import GIB, check_fits, estimate_memory, shard_numel

PAPER_CONFIGS = ["experiments/pretrain/tinyllama_1b_2k.yaml", "experiments/pretrain/tinyllama_1b_4k.yaml"]
H100_BYTES = 80 * GIB


def _bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


@pytest.mark.parametrize("dtype,precision", [(torch.float32, "32-true"), (torch.bfloat16, "bf16-true")])
def test_parameters_gradients_and_adamw_state_equal_the_real_tensors(dtype, precision):
    """Reference: the bytes of the instantiated model, its gradients and the fused AdamW
    state after one real step."""
    config = load([], ["data.window=32", "train.micro_batch_size=2", "train.global_batch_tokens=64"])
    torch.manual_seed(0)
    model = Llama(config.model).to(dtype)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    ids = torch.randint(0, config.model.vocab_size, (2, 32))
    model(ids).float().logsumexp(-1).mean().backward()
    optimizer.step()
    state = [t for s in optimizer.state.values() for t in s.values()]
    estimate = estimate_memory(config, world_size=1, precision=precision, cuda=False)
    assert estimate.parameters == _bytes(model.parameters())
    assert estimate.gradients == _bytes(p.grad for p in model.parameters())
    assert estimate.optimizer == _bytes(state)


def test_fsdp_shards_the_first_three_terms_over_the_world():
    """Hand-worked: FSDP2 keeps ceil(dim0 / world) rows of each tensor per rank."""
    assert shard_numel((10, 3), 4) == 3 * 3
    assert shard_numel((64,), 8) == 8
    config = load([], ["data.window=32", "train.strategy=fsdp", "train.micro_batch_size=2"])
    one, four = (estimate_memory(config, world, "32-true", cuda=False) for world in (1, 4))
    model = Llama(config.model)
    expected = sum(shard_numel(tuple(p.shape), 4) * 4 for p in model.parameters())
    assert four.parameters == four.gradients == expected < one.parameters
    assert one.activations == four.activations and one.logits == four.logits


def test_logits_term_follows_the_loss_chunking():
    """Hand-worked: 16 bytes per logit of (all tokens | one chunk)."""
    base = ["data.window=64", "train.micro_batch_size=4", "train.global_batch_tokens=256"]
    plain = estimate_memory(load([], base), 1, "bf16-mixed", cuda=False)
    chunked = estimate_memory(load([], [*base, "train.loss_chunk_tokens=32"]), 1, "bf16-mixed", cuda=False)
    vocab = load([], base).model.vocab_size
    assert plain.logits == 256 * vocab * 16
    assert chunked.logits == 32 * vocab * 16
    checkpointed = estimate_memory(
        load([], [*base, "train.activation_checkpointing=true"]), 1, "bf16-mixed", cuda=False
    )
    assert checkpointed.activations < plain.activations


@pytest.mark.parametrize("path", PAPER_CONFIGS)
def test_paper_configs_fit_one_80_gib_device_and_keep_the_paper_batch(path):
    config = load([path], [])
    assert config.train.global_batch_tokens == 4_194_304
    estimate = estimate_memory(config, world_size=1, precision=config.train.precision)
    check_fits(estimate, H100_BYTES, config)
    assert config.data.path == "data/slimpajama-llama3"  # a prepared SlimPajama (docs/data.md)
    tokens_between_probes = config.probe.niah_every_steps * config.train.global_batch_tokens
    assert abs(tokens_between_probes - 10e9) < 0.001 * 10e9  # NIAH every 10B tokens, as STRING probes


@pytest.mark.parametrize("path", PAPER_CONFIGS)
def test_the_old_paper_settings_are_refused_naming_the_knob(path):
    """The settings before issue 24: 16 rows (8 at 4K) and the whole fp32 logits at once."""
    rows = 16 if "2k" in path else 8
    config = load([path], [f"train.micro_batch_size={rows}", "train.loss_chunk_tokens=0"])
    estimate = estimate_memory(config, world_size=1, precision=config.train.precision)
    assert estimate.logits > 60e9  # ~65 GB of logits alone (issue 24)
    with pytest.raises(ConfigError) as error:
        check_fits(estimate, H100_BYTES, config)
    message = str(error.value)
    assert "train.micro_batch_size" in message and "train.loss_chunk_tokens" in message
    assert "train.activation_checkpointing" in message


def test_tinyllama_data_mixture_is_slimpajama_without_github_and_starcoderdata_7_to_3(capsys):
    """TinyLlama's pretraining data as a `data.mixture`, validated offline by `longctx config`."""
    from longctx.cli import main

    path = "experiments/pretrain/tinyllama_1b_2k_mixture.yaml"
    assert main(["config", path]) == 0 and "data/starcoderdata-llama3" in capsys.readouterr().out
    config = load([path], [])
    assert [source.path for source in config.data.mixture] == [
        "data/slimpajama-nogithub-llama3",
        "data/starcoderdata-llama3",
    ]
    assert config.data.source_weights() == pytest.approx([0.7, 0.3]) and config.data.path == ""
    assert config.probe.niah_every_steps == load([PAPER_CONFIGS[0]], []).probe.niah_every_steps
