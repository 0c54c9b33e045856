"""Per-device memory of a training run, estimated before step 1, and the refusal of a run
that cannot fit.

    estimate = estimate_memory(config, world_size=8, precision="bf16-mixed")
    print(estimate.table())
    check_fits(estimate, limit_bytes)          # ConfigError naming the knobs to turn

Five terms, bytes on the busiest device:

- parameters, gradients, optimizer state: exact. The parameter shapes come from the
  model built on the `meta` device; each tensor holds `numel x element size` bytes, under
  `train.strategy=fsdp` its dim-0 shard of ceil(dim0 / world) rows (FSDP2 pads dim 0 to a
  multiple of the world size). Parameters and gradients are fp32, bf16 under `bf16-true`;
  AdamW keeps exp_avg and exp_avg_sq in the parameter's dtype plus a float32 0-dim `step`
  per tensor (fused AdamW). A CPU test checks all three against the instantiated model and
  its AdamW state after one step.
- activations, by formula: the tensors autograd saves per token and layer in the eager
  block (model/llama.py), with s the residual stream's element size (4, or 2 under
  `bf16-true`), c the compute dtype's (2 under bf16, else 4), H heads:

      4 s d                        two RMSNorms: input and normalised value
      + c (7 d + 2 d_kv + 4 d_ff)  linear inputs cast by autocast (3 d for q/k/v, 2 d for
                                   gate/up), rotated q and k, v, attention output, and the
                                   SwiGLU gate, up, silu(gate) and product
      + 4 H                        the attention kernel's fp32 log-sum-exp

  times n_layers, or, with activation checkpointing, s d per layer (each block's input)
  plus one layer's full set (the block being recomputed). Plus per token: the fp32 cos/sin
  (8 head_dim bytes), the final norm (2 s d) and the batch (4 int64 tensors).
- logits: tokens x vocab x 16 bytes without `train.loss_chunk_tokens` (the bf16 logits,
  their fp32 copy, log-softmax's saved fp32 output, and in backward its fp32 and bf16
  gradients); with chunks, the same for one chunk (model/loss.py recomputes each chunk).
- buffers: copies made by the precision or strategy. bf16-mixed without FSDP: autocast's
  bf16 copy of every matmul weight (2 bytes each). FSDP with bf16 parameters: the
  all-gathered bf16 parameters of the root module (embeddings, head) and two blocks
  (prefetch), and the unsharded bf16 and fp32 gradients of the root and one block.
  On CUDA, 1 GiB for the CUDA context and allocator slack.

Margin: the activation and logits terms are upper bounds of what eager PyTorch keeps
(torch.compile's partitioner recomputes pointwise ops and saves less); the total is meant
to lie within 25% above the measured peak (`torch.cuda.max_memory_allocated`). That margin
is a design target, not yet checked on a GPU (`make bench-gpu-train` records the peak).
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
MARGIN = 0.25


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes per device of each term (module docstring); `total` is what must fit."""

    parameters: int
    gradients: int
    optimizer: int
    activations: int
    logits: int
    buffers: int
    setting: str

    @property
    def total(self) -> int:
        return self.parameters + self.gradients + self.optimizer + self.activations + self.logits + self.buffers

    def table(self) -> str:
        """A text table of the terms in GiB, with the setting it was computed for."""
        lines = [f"memory estimate per device ({self.setting}):"]
        for item in fields(self):
            if item.name != "setting":
                lines.append(f"  {item.name:<12} {getattr(self, item.name) / GIB:8.2f} GiB")
        lines.append(f"  {'total':<12} {self.total / GIB:8.2f} GiB (upper bound; design margin {MARGIN:.0%})")
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


def activation_bytes_per_token_layer(model: ModelConfig, stream: int, compute: int) -> int:
    """Bytes autograd keeps per token in one eager block (module docstring)."""
    d, d_kv = model.d_model, model.n_kv_heads * model.head_dim
    return 4 * stream * d + compute * (7 * d + 2 * d_kv + 4 * model.d_ff) + 4 * model.n_heads


def estimate_memory(config: ExperimentConfig, world_size: int, precision: str, cuda: bool = True) -> MemoryEstimate:
    """The per-device estimate of `config` at `world_size` ranks under Lightning's
    `precision` (32-true | bf16-mixed | bf16-true; resolve "auto" first)."""
    model, train = config.model, config.train
    fsdp = train.strategy == "fsdp"
    shards = world_size if fsdp else 1
    param_size = 2 if precision == "bf16-true" else 4
    shapes = parameter_shapes(model)
    local = sum(shard_numel(shape, shards) for shape in shapes.values())
    parameters = local * param_size
    optimizer = 2 * local * param_size + 4 * len(shapes)

    stream = 2 if precision == "bf16-true" else 4
    compute = 4 if precision == "32-true" else 2
    tokens = train.micro_batch_size * config.data.window
    per_layer = activation_bytes_per_token_layer(model, stream, compute)
    if train.activation_checkpointing:
        blocks = model.n_layers * stream * model.d_model + per_layer
    else:
        blocks = model.n_layers * per_layer
    activations = tokens * (blocks + 8 * model.head_dim + 2 * stream * model.d_model + 4 * 8)
    logit_tokens = min(train.loss_chunk_tokens, tokens) if train.loss_chunk_tokens else tokens
    logits = logit_tokens * model.vocab_size * LOGIT_BYTES_PER_ELEMENT

    buffers = CUDA_CONTEXT_BYTES if cuda else 0
    block_numel = sum(math.prod(shape) for name, shape in shapes.items() if name.startswith("blocks.0."))
    root_numel = sum(math.prod(shape) for name, shape in shapes.items() if not name.startswith("blocks."))
    if fsdp and precision != "32-true":
        buffers += 2 * (root_numel + 2 * block_numel) + (2 + 4) * (root_numel + block_numel)
    elif precision == "bf16-mixed":
        matmul_numel = sum(math.prod(shape) for name, shape in shapes.items() if len(shape) == 2)
        buffers += 2 * (matmul_numel - model.vocab_size * model.d_model)  # the embedding is a lookup
    setting = (
        f"{model.n_layers} layers x d {model.d_model}, vocab {model.vocab_size}; {train.micro_batch_size} x "
        f"{config.data.window} tokens per micro-batch; {precision}; strategy {train.strategy} over {world_size}; "
        f"activation checkpointing {'on' if train.activation_checkpointing else 'off'}; "
        f"loss_chunk_tokens {train.loss_chunk_tokens}"
    )
    return MemoryEstimate(parameters, parameters, optimizer, activations, logits, buffers, setting)


def check_fits(estimate: MemoryEstimate, limit_bytes: int, config: ExperimentConfig) -> None:
    """Raise ConfigError naming the knobs when `estimate.total` exceeds `limit_bytes`."""
    if estimate.total <= limit_bytes:
        return
    train = config.train
    knobs = [f"lower train.micro_batch_size (now {train.micro_batch_size}; global batch kept by accumulation)"]
    if estimate.logits > estimate.activations / 4:
        knobs.insert(0, f"set train.loss_chunk_tokens (now {train.loss_chunk_tokens}; e.g. 2048)")
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
