"""The memory estimate before step 1 (train/memory_budget.py): exact for parameters, gradients
and AdamW state, and the refusal of configs that cannot fit, naming the knob."""

import dataclasses
import inspect
import math

import pytest
import torch

from longctx.config import load
from longctx.config.model import ModelConfig
from longctx.errors import ConfigError
from longctx.model.attention import build_mask
from longctx.model.flash import VarlenKernel
from longctx.model.layer_attention import Dense
from longctx.model.llama import Block, Llama
from longctx.model.rope import RotaryEmbedding
from longctx.train.memory_budget import (
    GIB,
    activation_bytes_per_token_layer,
    check_fits,
    estimate_memory,
    precision_sizes,
    shard_numel,
)

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


# --- what a block saves for backward, measured on CPU ----------------------------------

BLOCK = ModelConfig(
    d_model=128,
    n_heads=8,
    n_kv_heads=1,
    d_ff=352,
    n_layers=1,
    vocab_size=64,
    max_position=128,
    attention_backend="flash",
)
"""tinyllama-1.1b's ratios at small shapes: d_ff = 2.75 d, 8 query heads per k/v head."""
SAVED_TOLERANCE = 0.02
"""The estimate may exceed the measured bytes by this fraction, never fall below them."""


def dense_varlen(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *args, scale=None, **kwargs):
    """A CPU kernel of torch's varlen FlashAttention op (torch_attn::_varlen_attn), causal,
    one sequence per cu_seqlens segment: (out [N, H, D], fp32 lse [H, N], rng state)."""
    with torch.autocast("cpu", enabled=False):
        heads = query.shape[1]
        key, value = (t.repeat_interleave(heads // t.shape[1], dim=1) for t in (key, value))
        outs, lses = [], []
        for start, end in zip(cu_seq_q[:-1].tolist(), cu_seq_q[1:].tolist(), strict=True):
            q, k, v = (t[start:end].transpose(0, 1).float() for t in (query, key, value))
            scores = (q @ k.transpose(1, 2)) * (scale or q.shape[-1] ** -0.5)
            scores = scores.masked_fill(torch.ones(end - start, end - start, dtype=torch.bool).triu(1), -math.inf)
            lse = scores.logsumexp(-1)
            outs.append(((scores - lse[..., None]).exp() @ v).transpose(0, 1))
            lses.append(lse)
        return torch.cat(outs).to(query.dtype), torch.cat(lses, dim=1), torch.zeros(2, dtype=torch.uint64)


@pytest.fixture
def varlen_on_cpu():
    """torch's own varlen op, whose autograd formula saves what the GPU kernel saves (q, k,
    v, out, lse), runnable on CPU for this test; the registration ends with the Library."""
    pytest.importorskip("torch.nn.attention.varlen")
    library = torch.library.Library("torch_attn", "IMPL")
    library.impl("_varlen_attn", dense_varlen, "CPU")
    yield
    del library


def _torch_varlen_gqa() -> bool:
    from torch.nn.attention import varlen

    return "enable_gqa" in inspect.signature(varlen.varlen_attn).parameters


TORCH_VARLEN_GQA = _torch_varlen_gqa()
"""torch's varlen_attn takes GQA itself (2.14), or k/v must be copied to the query heads (2.11)."""


def block_saved_bytes(
    block: Block, precision: str, enable_gqa: bool, rows: int, length: int, config: ModelConfig = BLOCK
) -> int:
    """Bytes of the distinct storages `block` saves for backward on rows x length tokens,
    other than its parameters and the shared cos/sin (counted once per model)."""
    from torch.nn.attention.varlen import varlen_attn

    dtype = torch.bfloat16 if precision == "bf16-true" else torch.float32
    compute = torch.float32 if precision == "32-true" else torch.bfloat16
    x = torch.randn(rows, length, config.d_model, dtype=dtype, requires_grad=True)
    position_ids = torch.arange(length).expand(rows, length)
    rope = RotaryEmbedding(config.head_size, config.rope_base, config.rope_scaling, config.max_position)
    cos, sin = rope(position_ids, compute)
    mask = build_mask(torch.zeros(rows, length, dtype=torch.long), length, "flash", dtype=compute, max_seqlen=length)
    kernel = VarlenKernel(varlen_attn, flash_attn=False, enable_gqa=enable_gqa)
    positions = Dense(dataclasses.replace(mask, extra=dataclasses.replace(mask.extra, kernel=kernel)), cos, sin)
    skip = {t.untyped_storage().data_ptr() for t in (*block.parameters(), cos, sin)}
    saved: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in skip:
            saved[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16-mixed"):
        block(x, positions)  # a compiled block compiles here, outside the hooks
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            block(x, positions)
    return sum(saved.values())


@pytest.mark.parametrize(
    ("precision", "compiled", "enable_gqa"),
    [
        ("bf16-mixed", False, True),
        ("bf16-mixed", True, True),
        ("bf16-mixed", False, False),
        ("bf16-mixed", True, False),
        ("bf16-true", False, True),
        ("bf16-true", True, True),
        ("32-true", False, True),
        ("32-true", True, True),
    ],
)
def test_per_layer_activation_term_is_what_one_block_saves(varlen_on_cpu, precision, compiled, enable_gqa):
    """Reference: the bytes one block saves for backward per token, counted with
    saved-tensor hooks (the slope between two lengths, so the bf16 weight copies, which do
    not grow with tokens, drop out), on the flash path through torch's varlen op. The
    compiled block runs the partitioner inductor uses (min-cut) with eager kernels, which
    saves the same tensors as inductor's C++ code (4,072 bytes per token both, bf16-mixed)
    without a C++ compile. `enable_gqa` False: k/v copied to the query heads (torch 2.11)."""
    if enable_gqa and not TORCH_VARLEN_GQA:
        pytest.skip(f"torch {torch.__version__}'s varlen_attn has no enable_gqa")
    torch.manual_seed(0)
    block = Block(BLOCK, 0).to(torch.bfloat16 if precision == "bf16-true" else torch.float32)
    if compiled:
        torch.compiler.reset()
        block.compile(backend="aot_eager_decomp_partition", dynamic=False)
    short, long = (block_saved_bytes(block, precision, enable_gqa, 2, length) for length in (32, 64))
    measured = (long - short) / (2 * 32)
    _, stream, compute = precision_sizes(precision)
    kv_heads = BLOCK.n_kv_heads if enable_gqa else BLOCK.n_heads
    estimated = activation_bytes_per_token_layer(BLOCK, stream, compute, compiled, kv_heads)
    assert measured <= estimated <= (1 + SAVED_TOLERANCE) * measured, (measured, estimated)


DESIGNS = {
    "head_dim": dataclasses.replace(BLOCK, head_dim=32),
    "qk_norm=head": dataclasses.replace(BLOCK, head_dim=32, qk_norm="head"),
    "qk_norm=projection": dataclasses.replace(BLOCK, qk_norm="projection"),
}
"""Designs that change what a block saves: q/o of n_heads x head_dim != d_model, qk-norm."""


@pytest.mark.parametrize("precision", ["bf16-mixed", "bf16-true", "32-true"])
@pytest.mark.parametrize("design", list(DESIGNS))
def test_per_layer_activation_term_follows_head_dim_and_qk_norm(varlen_on_cpu, precision, design):
    """As above, eager, for a head_dim decoupled from d_model and for both qk-norms."""
    torch.manual_seed(0)
    config = DESIGNS[design]
    block = Block(config, 0).to(torch.bfloat16 if precision == "bf16-true" else torch.float32)
    short, long = (block_saved_bytes(block, precision, TORCH_VARLEN_GQA, 2, length, config) for length in (32, 64))
    measured = (long - short) / (2 * 32)
    _, stream, compute = precision_sizes(precision)
    kv_heads = config.n_kv_heads if TORCH_VARLEN_GQA else config.n_heads
    estimated = activation_bytes_per_token_layer(config, stream, compute, kv_heads=kv_heads)
    assert measured <= estimated <= (1 + SAVED_TOLERANCE) * measured, (measured, estimated)


# --- the estimate's peak ----------------------------------------------------------------


def _debug(*overrides: str):
    return load([], ["data.window=64", "train.micro_batch_size=4", "train.global_batch_tokens=256", *overrides])


def test_gradients_coexist_with_activations_unless_freed_before_the_forward():
    """Hand-worked: freed before the forward at accumulation 1, the backward holds the
    root's gradients (head, final norm, embedding) and the blocks' activations, which here
    exceed the blocks' gradients; with accumulation, or kept until after the next forward
    (Lightning's own zero_grad), all gradients."""
    model = Llama(_debug().model)
    root = sum(p.numel() * 4 for name, p in model.named_parameters() if not name.startswith("blocks."))
    freed = estimate_memory(_debug(), 1, "32-true", cuda=False, gradients_freed_before_forward=True)
    kept = estimate_memory(_debug(), 1, "32-true", cuda=False, gradients_freed_before_forward=False)
    accumulating = estimate_memory(
        _debug("train.global_batch_tokens=512"), 1, "32-true", cuda=False, gradients_freed_before_forward=True
    )
    assert freed.gradients_at_peak == root < freed.gradients
    assert kept.gradients_at_peak == accumulating.gradients_at_peak == kept.gradients
    peak = freed.parameters + freed.optimizer + freed.buffers + freed.activations + freed.logits + root
    assert freed.total == peak == kept.total - (kept.gradients - root)


def test_blocks_gradients_beyond_checkpointed_activations_are_held():
    """With activation checkpointing a block holds only its input (s d per token): when the
    blocks' gradients exceed that and the logits, the backward's end holds them all, and
    neither the blocks' activations nor the logits (linear in the blocks done, so the
    larger end counts)."""
    config = _debug(
        "train.activation_checkpointing=true",
        "train.micro_batch_size=1",
        "train.global_batch_tokens=64",
        "train.loss_chunk_tokens=16",
        "model.vocab_size=256",  # the blocks' gradients outweigh the root's
    )
    estimate = estimate_memory(config, 1, "32-true", cuda=False, gradients_freed_before_forward=True)
    held = config.model.n_layers * 4 * config.model.d_model * 64
    assert estimate.logits == 16 * config.model.vocab_size * 16
    assert held + estimate.logits < estimate.gradients
    assert estimate.gradients_at_peak == estimate.gradients - held - estimate.logits


def test_compiled_blocks_use_the_compiled_per_layer_term():
    """activations = tokens x (n_layers + 1 (the backward's temporaries)) x per layer + the
    per-token root terms, with the compiled block's bytes when `train.compile`."""
    eager, compiled = (
        estimate_memory(_debug(f"train.compile={flag}"), 1, "bf16-mixed", cuda=False) for flag in ("false", "true")
    )
    model = _debug().model
    per_layer = {flag: activation_bytes_per_token_layer(model, 4, 2, flag) for flag in (False, True)}
    assert eager.activations - compiled.activations == 256 * (model.n_layers + 1) * (per_layer[False] - per_layer[True])
    assert per_layer[True] < 0.7 * per_layer[False]


def test_kernel_kv_heads_follow_the_flash_kernel(monkeypatch):
    """k/v reach torch 2.11's varlen kernel copied to every query head; 2.14's takes them as
    they are (model/flash.py)."""
    from longctx.model import flash
    from longctx.train.memory_budget import kernel_kv_heads

    model = ModelConfig.from_preset("tinyllama-1.1b", attention_backend="flash")
    for enable_gqa, heads in ((True, 4), (False, 32)):
        monkeypatch.setattr(flash, "resolve_kernel", lambda gqa=enable_gqa: VarlenKernel(print, False, gqa))
        assert kernel_kv_heads(model) == heads
        assert kernel_kv_heads(dataclasses.replace(model, attention_backend="auto")) == heads
        # under context parallelism `auto` runs flex, which takes the 4 k/v heads as they are
        assert kernel_kv_heads(dataclasses.replace(model, attention_backend="auto"), context_parallel=2) == 4
    assert kernel_kv_heads(dataclasses.replace(model, attention_backend="sdpa")) == 4


H100_PEAKS_GIB = [(True, 8, 39.4), (False, 8, 54.2), (True, 16, 63.7)]
"""(compiled, rows, peak): `max_memory_allocated` of benchmarks/train_gpu.py's step of ours,
plain and packed rows alike, on one H100 (torch 2.11, tinyllama-1.1b, vocab 32,000, T=2,048,
bf16-mixed, flash, loss chunk 2,048; docs/benchmarks.md)."""


@pytest.mark.parametrize(("compiled", "rows", "peak_gib"), H100_PEAKS_GIB)
def test_estimate_lies_within_the_margin_above_the_h100_peaks(monkeypatch, compiled, rows, peak_gib):
    """The benchmark's step (gradients freed first) with the kernel torch 2.11 ran (k/v
    copied to the 32 query heads): estimate / peak in [1.0, 1 + MARGIN]."""
    from longctx.train import memory_budget

    monkeypatch.setattr(memory_budget, "kernel_kv_heads", lambda model, context_parallel=1: model.n_heads)
    config = load(
        [],
        [
            "model.preset=tinyllama-1.1b",
            "model.attention_backend=flash",
            "data.window=2048",
            f"train.micro_batch_size={rows}",
            f"train.global_batch_tokens={rows * 2048}",
            "train.loss_chunk_tokens=2048",
            f"train.compile={str(compiled).lower()}",
        ],
    )
    estimate = estimate_memory(config, 1, "bf16-mixed", cuda=False, gradients_freed_before_forward=True)
    assert 1.0 <= estimate.total / GIB / peak_gib <= 1 + memory_budget.MARGIN, estimate.table()
