"""The block's parts that do not attend: RMSNorm, the gated MLP, and fused projections.

Fused projections are an inference layout (`Llama.fuse_projections_`): the q/k/v weights of
each attention and the gate/up weights of each MLP are re-laid as consecutive row blocks of
one buffer, every Parameter becoming a view of it. Names, state_dict, optimizers and
checkpoints see the same Parameters as before; a forward without gradients then reads each
group with one matmul instead of two or three. Why: a decoding step of a small model is
bound by the number of dispatched operations (docs/benchmarks.md, "Decode step operations"),
and one [d, (H + 2 Hkv) D] matmul reads the same bytes as three.

The layout holds while the Parameters stay views of the buffer. Anything that replaces their
storage (`.to()` to another dtype or device, FSDP's sharding, `load_state_dict(assign=True)`)
silently ends it: `FusedWeights.joint` checks the layout by data pointers (host integers, no
device work) at every forward and returns None when it no longer holds, and the forward
falls back to one matmul per projection. With gradients the separate matmuls run too: the
buffer is not a leaf of autograd, the Parameters are.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from longctx.config.model import ModelConfig
from longctx.model.rope import rotation_dtype


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * weight, computed in fp32 (Zhang & Sennrich, 2019); in
    fp64 for fp64 inputs (the float64 references of the tests compare exactly). With
    `offset` (Gemma): times 1 + weight, in fp32 before the cast back, as transformers' Gemma.

    Without offset the normalisation is torch's `rms_norm` (no weight), then times the
    weight in the input's dtype, as transformers' Llama (the normalised value is rounded to
    the input's dtype before the weight): on CPU torch decomposes it into the same fp32
    operations as the offset form; on CUDA it is one fused kernel instead of seven."""

    def __init__(self, dim: int, eps: float, offset: bool = False):
        super().__init__()
        self.eps, self.offset = eps, offset
        self.weight = nn.Parameter(torch.zeros(dim) if offset else torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.offset:
            return self.weight * F.rms_norm(x, (x.shape[-1],), None, self.eps)
        x32 = x.to(rotation_dtype(x.dtype))
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (normed * (1.0 + self.weight.to(normed.dtype))).to(x.dtype)


@dataclass
class FusedWeights:
    """One buffer whose consecutive row blocks are the weights (and biases) of several
    nn.Linear layers of one input (module docstring)."""

    weight: torch.Tensor
    """[sum of out_features, in_features]."""
    bias: torch.Tensor | None

    @classmethod
    def fuse_(cls, linears: Sequence[nn.Linear]) -> FusedWeights | None:
        """Re-lay the linears' Parameters as views of one new buffer (their values and
        identities unchanged); None, changing nothing, when they cannot share one: on
        different devices or dtypes, not plain tensors (FSDP's DTensors), with and without
        bias, or on the meta device."""
        weights = [linear.weight for linear in linears]
        biases = [linear.bias for linear in linears]
        if not _plain(weights) or (any(b is not None for b in biases) and not _plain(biases)):
            return None
        return cls(_relay(weights), _relay(biases) if biases[0] is not None else None)

    def joint(self, linears: Sequence[nn.Linear]) -> tuple[torch.Tensor, torch.Tensor | None] | None:
        """(weight, bias) of the buffer while every linear still reads its rows of it,
        else None."""
        if not _laid_out(self.weight, [linear.weight for linear in linears]):
            return None
        if self.bias is not None and not _laid_out(self.bias, [linear.bias for linear in linears]):
            return None
        return self.weight, self.bias


def _plain(tensors: Sequence[torch.Tensor | None]) -> bool:
    first = tensors[0]
    return first is not None and all(
        t is not None
        and type(t.data) is torch.Tensor
        and t.device == first.device
        and t.dtype == first.dtype
        and t.device.type != "meta"
        for t in tensors
    )


def _relay(parameters: Sequence[torch.Tensor]) -> torch.Tensor:
    buffer = torch.cat([p.detach() for p in parameters])
    row = 0
    for p in parameters:
        p.data = buffer[row : row + p.shape[0]]
        row += p.shape[0]
    return buffer


def _laid_out(buffer: torch.Tensor, parameters: Sequence[torch.Tensor | None]) -> bool:
    """Each parameter a contiguous block of `buffer` at its row, by data pointer."""
    row_bytes = buffer.stride(0) * buffer.element_size()  # contiguous: a row of weights, or one bias value
    row, start = 0, buffer.data_ptr()
    for p in parameters:
        if (
            p is None
            or p.device != buffer.device
            or p.dtype != buffer.dtype
            or not p.is_contiguous()
            or p.data_ptr() != start + row * row_bytes
        ):
            return False
        row += p.shape[0]
    return row == buffer.shape[0]


def joint_weights(
    fused: FusedWeights | None, linears: Sequence[nn.Linear]
) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """The fused (weight, bias) for an inference forward (no gradients), else None."""
    if fused is None or torch.is_grad_enabled():
        return None
    return fused.joint(linears)


def linear_into(residual: torch.Tensor, x: torch.Tensor, layer: nn.Linear) -> torch.Tensor:
    """residual + layer(x) for 2-D x and residual, as one addmm (no bias)."""
    return torch.addmm(residual, x, layer.weight.t())


class FeedForward(nn.Module):
    """SwiGLU (Shazeer, 2020): down(silu(gate(x)) * up(x)); GeGLU with `gelu_tanh` (Gemma).
    `residual` (inference, see `Block`): returns residual + the output, the add inside the
    down projection's matmul."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.gate = nn.Linear(config.d_model, config.d_ff, bias=False)
        self.up = nn.Linear(config.d_model, config.d_ff, bias=False)
        self.down = nn.Linear(config.d_ff, config.d_model, bias=False)
        self.gelu = config.mlp_activation == "gelu_tanh"
        self.fused: FusedWeights | None = None
        """gate and up in one buffer (module docstring); None until fused."""

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])  # 2-D matmuls, as in Attention
        joint = joint_weights(self.fused, (self.gate, self.up))
        if joint is not None:
            gate, up = F.linear(flat, *joint).split(self.gate.out_features, dim=-1)
        else:
            gate, up = self.gate(flat), self.up(flat)
        hidden = (F.gelu(gate, approximate="tanh") if self.gelu else F.silu(gate)) * up
        if residual is not None:
            return linear_into(residual.reshape(flat.shape[0], -1), hidden, self.down).view(*x.shape[:-1], -1)
        return self.down(hidden).view(*x.shape[:-1], -1)

    def fuse_(self) -> None:
        self.fused = FusedWeights.fuse_((self.gate, self.up))
