"""Per-device memory of a training run, estimated before step 1, and the refusal of a run
that cannot fit.

    estimate = estimate_memory(config, world_size=8, precision="bf16-mixed")
    print(estimate.table())
    check_fits(estimate, limit_bytes)          # ConfigError naming the knobs to turn

Terms, bytes on the busiest device:

- parameters, gradients, optimizer state: exact. The parameter shapes come from the
  model built on the `meta` device; each tensor holds `numel x element size` bytes, under
  `train.strategy=fsdp` its dim-0 shard of ceil(dim0 / world) rows (FSDP2 pads dim 0 to a
  multiple of the world size). Parameters and gradients are fp32, bf16 under `bf16-true`;
  AdamW keeps exp_avg and exp_avg_sq in the parameter's dtype plus a float32 0-dim `step`
  per tensor (fused AdamW). A CPU test checks all three against the instantiated model and
  its AdamW state after one step.
- activations: the tensors autograd saves per token and layer (`activation_bytes_per_token_layer`,
  its docstring has both formulas), times n_layers, or, with activation checkpointing,
  s d per layer (each block's input) plus one layer's full set (the block being
  recomputed); plus one layer's set again for the backward's temporaries (the gradients
  of the block being differentiated have the shapes of what it saved); plus per token the
  fp32 cos/sin (8 head_dim bytes), the final norm (its input, normalised value and
  output: 3 s d, and its fp32 rsqrt) and the batch (4 int64 tensors). s is the residual
  stream's element size (4, or 2 under `bf16-true`), c the compute dtype's (2 under bf16,
  else 4). The per-layer terms are measured on CPU by tests/train/test_memory.py: the
  bytes one eager and one compiled block save, counted with saved-tensor hooks.
- context parallelism (`train.context_parallel` N): a device holds T / N tokens of each
  row, so every per-token term above counts micro-batch x window / N tokens; each layer's
  kernel also saves the all-gathered keys and values of the other N - 1 ranks, c 2 d_kv
  (N - 1) bytes per local token and layer (the gathered [B, T] k and v in the compute
  dtype; train/context_parallel.py), held for every layer or, with activation
  checkpointing, for the one recomputed.
- logits: tokens x vocab x 16 bytes without `train.loss_chunk_tokens` (the bf16 logits,
  their fp32 copy, log-softmax's saved fp32 output, and in backward its fp32 and bf16
  gradients); with chunks, the same for one chunk (model/loss.py recomputes each chunk).
- buffers: copies made by the precision or strategy. bf16-mixed without FSDP: the bf16
  copy of every matmul weight (2 bytes each: autocast's cache, or what a compiled block
  saves). FSDP with bf16 parameters: the all-gathered bf16 parameters of the root module
  (embeddings, head) and two blocks (prefetch), and the unsharded bf16 and fp32 gradients
  of the root and one block. On CUDA, 1 GiB for the CUDA context and allocator slack.

The peak: parameters + optimizer + buffers + max(activations + logits + gradients at the
peak, all gradients) (the second: the optimizer step). Which gradients coexist with the
activations (`gradients_at_peak`):

- all of them when they outlive the forward: with gradient accumulation (earlier
  micro-batches' gradients), and in a loop that keeps the previous step's gradients until
  after the next forward (Lightning's automatic optimisation calls `zero_grad` inside the
  closure, after `training_step`; `gradients_freed_before_forward=False`);
- where the loop frees them before the forward (`longctx pretrain`, whose module calls
  `zero_grad(set_to_none=True)` right after each optimizer step, and
  benchmarks/train_gpu.py's step), only those the backward has made so far: the
  root's (head, final norm, embedding) plus the blocks' beyond what the backward has
  released by then. The loss (its chunk's logits) is differentiated first; after k of L
  blocks' backward, k blocks' gradients and L - k blocks' activations are held, a sum
  linear in k, so the peak is at k = 0 (all activations, the logits, the root's
  gradients) or at k = L (all gradients, neither the blocks' activations nor the logits).

Margin: the estimate is meant to lie within 20% above the measured peak
(`torch.cuda.max_memory_allocated`; estimate / peak in [1.0, 1.2]) and never below it,
since `check_fits` refuses runs by it; docs/benchmarks.md compares it with the peaks
measured on an H100 (benchmarks/train_gpu.py's table has both).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

import torch

from longctx.config import ExperimentConfig
from longctx.config.model import ModelConfig
from longctx.errors import ConfigError

GIB = 2**30
CUDA_CONTEXT_BYTES = GIB
LOGIT_BYTES_PER_ELEMENT = 16
MARGIN = 0.20


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes per device of each term (module docstring); `total` is what must fit.
    `gradients` is all of them (the optimizer step holds them), `gradients_at_peak` those
    that coexist with the activations."""

    parameters: int
    gradients: int
    optimizer: int
    activations: int
    logits: int
    buffers: int
    gradients_at_peak: int
    setting: str

    @property
    def total(self) -> int:
        """parameters + optimizer + buffers + max(activations + logits + gradients at the
        peak, all gradients): the larger of the backward's start and the optimizer step."""
        backward = self.activations + self.logits + self.gradients_at_peak
        return self.parameters + self.optimizer + self.buffers + max(backward, self.gradients)

    def table(self) -> str:
        """A text table of the terms in GiB, with the setting it was computed for."""
        lines = [f"memory estimate per device ({self.setting}):"]
        for item in fields(self):
            if item.name != "setting":
                lines.append(f"  {item.name:<17} {getattr(self, item.name) / GIB:8.2f} GiB")
        lines.append(f"  {'total':<17} {self.total / GIB:8.2f} GiB (upper bound; design margin {MARGIN:.0%})")
        return "\n".join(lines)


def parameter_shapes(model: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every parameter of `Llama(model)`, built on the meta device."""
    from longctx.model.llama import Llama

    with torch.device("meta"):
        llama = Llama(model)
    return {name: tuple(parameter.shape) for name, parameter in llama.named_parameters()}


def shard_numel(shape: tuple[int, ...], world_size: int) -> int:
    """Elements of the largest dim-0 shard over `world_size` ranks (FSDP2's padded shard)."""
    if not shape:
        return 1
    return math.ceil(shape[0] / world_size) * math.prod(shape[1:])


def kernel_kv_heads(model: ModelConfig, context_parallel: int = 1) -> int:
    """The key/value heads the attention kernel receives, and saves for backward: n_kv_heads,
    or n_heads where the flash path copies each k/v head to its query heads (torch's
    varlen_attn without `enable_gqa`, torch 2.11; model/flash.py's `kv_repeats`). Under
    context parallelism `auto` runs flex (train/module.py), which takes GQA itself."""
    flash_path = model.attention_backend == "flash" or (model.attention_backend == "auto" and context_parallel == 1)
    if not flash_path or model.n_heads == model.n_kv_heads:
        return model.n_kv_heads
    from longctx.model import flash

    try:
        kernel = flash.resolve_kernel()
    except RuntimeError:
        return model.n_kv_heads
    return model.n_kv_heads * flash.kv_repeats(kernel, model.n_heads, model.n_kv_heads)


def activation_bytes_per_token_layer(
    model: ModelConfig, stream: int, compute: int, compiled: bool = False, kv_heads: int | None = None
) -> int:
    """Bytes autograd keeps per token in one block (model/llama.py's `Block`), s = `stream`,
    c = `compute` element sizes, H heads, d_q = H x head_dim (d_model unless `model.head_dim`
    decouples them), d_kv = `kv_heads` (default n_kv_heads) x head_dim.

    Both count the attention kernel's saved q, output, k and v (c (2 d_q + 2 d_kv); the
    kernel saves what it was given) and its fp32 log-sum-exp (4 H), as FlashAttention's
    and FlexAttention's backward need them, and the two RMSNorms' fp32 rsqrt (8). qk-norm
    adds its norms' fp32 input and normalised value in the compute dtype, (4 + c)(d_q +
    d_kv), and their fp32 rsqrt, 4 per normalised row (H + n_kv_heads rows under `head`,
    2 under `projection`); measured eager (the compiled block recomputes some of it).

    Eager:   2 (4 d + s d) + c (n d + 4 d_ff) + attention + 8
        each RMSNorm keeps its fp32 input (the input itself when s = 4) and its normalised
        value in the stream dtype; the linears keep their inputs: under autocast (s != c)
        each its own c-dtype cast (q/k/v 3, gate/up 2: n = 5), else q/k/v share the first
        norm's output and gate/up the second's (n = 2); SwiGLU keeps gate, up, silu(gate)
        and their product (4 d_ff).
    Compiled (torch.compile, min-cut partitioner): s d + c (3 d + 3 d_ff) + attention + 8
        the block's input; the two norms' outputs as the matmuls take them and the
        attention projection's output (the residual and the norms are recomputed from
        these); gate, up and their product (silu is recomputed).
    tinyllama-1.1b, bf16-mixed: eager 107,656 bytes, compiled 63,624 (114,824 and 70,792
    with k/v copied to the 32 query heads).
    """
    d, d_ff = model.d_model, model.d_ff
    d_q = model.n_heads * model.head_size
    d_kv = (kv_heads or model.n_kv_heads) * model.head_size
    attention = compute * (2 * d_q + 2 * d_kv) + 4 * model.n_heads
    if model.qk_norm != "none":
        rows = model.n_heads + model.n_kv_heads if model.qk_norm == "head" else 2
        attention += (4 + compute) * (d_q + model.n_kv_heads * model.head_size) + 4 * rows
    if model.attention_gate != "none":  # the product keeps the ungated output and sigmoid(gate) (model/gate.py)
        attention += compute * (d_q + (d_q if model.attention_gate == "elementwise" else model.n_heads))
    if compiled:
        return stream * d + compute * (3 * d + 3 * d_ff) + attention + 8
    linear_inputs = 5 if stream != compute else 2
    return 2 * (4 * d + stream * d) + compute * (linear_inputs * d + 4 * d_ff) + attention + 8


def gradients_at_peak(gradients: int, root_gradients: int, released: int, freed_before_forward: bool) -> int:
    """Gradient bytes counted next to the activations and logits (module docstring): all of
    them unless the loop frees them before the forward; then the root's plus the blocks'
    beyond what the backward has `released` when they are all made (the blocks' held
    activations and the logits), so that activations + logits + this is the larger end."""
    if not freed_before_forward:
        return gradients
    return root_gradients + max(0, gradients - root_gradients - released)


def precision_sizes(precision: str) -> tuple[int, int, int]:
    """(parameter, residual stream, compute) element sizes under Lightning's `precision`."""
    param_size = 2 if precision == "bf16-true" else 4
    compute = 4 if precision == "32-true" else 2
    return param_size, param_size, compute


def estimate_memory(
    config: ExperimentConfig,
    world_size: int,
    precision: str,
    cuda: bool = True,
    gradients_freed_before_forward: bool = True,
) -> MemoryEstimate:
    """The per-device estimate of `config` at `world_size` ranks under Lightning's
    `precision` (32-true | bf16-mixed | bf16-true; resolve "auto" first), blocks compiled
    when `train.compile`. `gradients_freed_before_forward`: the loop frees the gradients
    (`zero_grad(set_to_none=True)`) between an optimizer step and the next forward, as
    `longctx pretrain` does (train/module.py); False: they live through that forward."""
    model, train = config.model, config.train
    fsdp = train.strategy == "fsdp"
    shards = world_size if fsdp else 1
    param_size, stream, compute = precision_sizes(precision)
    shapes = parameter_shapes(model)
    local = sum(shard_numel(shape, shards) for shape in shapes.values())
    root_local = sum(shard_numel(shape, shards) for name, shape in shapes.items() if not name.startswith("blocks."))
    parameters = local * param_size
    optimizer = 2 * local * param_size + 4 * len(shapes)

    tokens = train.micro_batch_size * config.data.window // train.context_parallel
    kv_heads = kernel_kv_heads(model, train.context_parallel)
    per_layer = activation_bytes_per_token_layer(model, stream, compute, train.compile, kv_heads)
    per_layer += compute * 2 * kv_heads * model.head_size * (train.context_parallel - 1)
    held = model.n_layers * (stream * model.d_model if train.activation_checkpointing else per_layer)
    recomputed = per_layer if train.activation_checkpointing else 0
    root = 8 * model.head_size + 3 * stream * model.d_model + 4 + 4 * 8
    activations = tokens * (held + recomputed + per_layer + root)
    logit_tokens = min(train.loss_chunk_tokens, tokens) if train.loss_chunk_tokens else tokens
    logits = logit_tokens * model.vocab_size * LOGIT_BYTES_PER_ELEMENT
    accumulating = train.global_batch_tokens > tokens * world_size
    at_peak = gradients_at_peak(
        parameters, root_local * param_size, tokens * held + logits, gradients_freed_before_forward and not accumulating
    )
    buffers = buffer_bytes(shapes, model, precision, fsdp, cuda)
    setting = (
        f"{model.n_layers} layers x d {model.d_model}, vocab {model.vocab_size}; {train.micro_batch_size} x "
        f"{config.data.window} tokens per micro-batch; {precision}; strategy {train.strategy} over {world_size}; "
        f"context parallel {train.context_parallel}; "
        f"blocks {'compiled' if train.compile else 'eager'}; "
        f"activation checkpointing {'on' if train.activation_checkpointing else 'off'}; "
        f"loss_chunk_tokens {train.loss_chunk_tokens}; gradients "
        f"{'freed before the forward' if gradients_freed_before_forward else 'kept through the forward'}"
    )
    return MemoryEstimate(parameters, parameters, optimizer, activations, logits, buffers, at_peak, setting)


def buffer_bytes(shapes: dict[str, tuple[int, ...]], model: ModelConfig, precision: str, fsdp: bool, cuda: bool) -> int:
    """Copies made by the precision or strategy, and the CUDA context (module docstring)."""
    buffers = CUDA_CONTEXT_BYTES if cuda else 0
    block_numel = sum(math.prod(shape) for name, shape in shapes.items() if name.startswith("blocks.0."))
    root_numel = sum(math.prod(shape) for name, shape in shapes.items() if not name.startswith("blocks."))
    if fsdp and precision != "32-true":
        buffers += 2 * (root_numel + 2 * block_numel) + (2 + 4) * (root_numel + block_numel)
    elif precision == "bf16-mixed":
        matmul_numel = sum(math.prod(shape) for name, shape in shapes.items() if len(shape) == 2)
        buffers += 2 * (matmul_numel - model.vocab_size * model.d_model)  # the embedding is a lookup
    return buffers


def check_fits(estimate: MemoryEstimate, limit_bytes: int, config: ExperimentConfig) -> None:
    """Raise ConfigError naming the knobs when `estimate.total` exceeds `limit_bytes`."""
    if estimate.total <= limit_bytes:
        return
    train = config.train
    knobs = [f"lower train.micro_batch_size (now {train.micro_batch_size}; global batch kept by accumulation)"]
    if estimate.logits > estimate.activations / 4:
        knobs.insert(0, f"set train.loss_chunk_tokens (now {train.loss_chunk_tokens}; e.g. 2048)")
    if not train.compile:
        knobs.append("set train.compile=true (a compiled block saves ~40% fewer activations)")
    if not train.activation_checkpointing:
        knobs.append("set train.activation_checkpointing=true")
    if train.strategy != "fsdp":
        knobs.append("use train.strategy=fsdp over more devices")
    raise ConfigError(
        "train.micro_batch_size",
        f"the run needs ~{estimate.total / GIB:.1f} GiB per device but {limit_bytes / GIB:.1f} GiB are available:\n"
        f"{estimate.table()}\nto fit: " + "; ".join(knobs) + " (or raise train.memory_limit_gib)",
        ("train.loss_chunk_tokens", "train.activation_checkpointing"),
    )


def device_limit_bytes(config: ExperimentConfig, device: torch.device) -> int | None:
    """The bytes a run may use: `train.memory_limit_gib` when set, else the CUDA device's
    total memory; None on CPU without a limit (no refusal there)."""
    if config.train.memory_limit_gib > 0:
        return int(config.train.memory_limit_gib * GIB)
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    return None


def check_run_memory(config: ExperimentConfig, world_size: int, precision: str) -> MemoryEstimate:
    """Print the estimate (global rank 0) and refuse a run that cannot fit; called before step 1."""
    import os

    cuda = torch.cuda.is_available()
    estimate = estimate_memory(config, world_size, precision, cuda=cuda)
    if int(os.environ.get("RANK", "0")) == 0:
        print(estimate.table(), flush=True)
    limit = device_limit_bytes(config, torch.device("cuda") if cuda else torch.device("cpu"))
    if limit is not None:
        check_fits(estimate, limit, config)
    return estimate
