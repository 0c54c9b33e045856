"""FSDP2 with a bf16 MixedPrecisionPolicy hands the blocks the same fp32 RoPE cos/sin as a
single-device bf16-true run (bitwise): one process, gloo, fully_shard on CPU."""

import socket

import pytest
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from longctx.config import load
from longctx.model.llama import Llama
from longctx.train.module import shard_model


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def one_process_group():
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        yield init_device_mesh("cpu", (1,), mesh_dim_names=("data_parallel",))
    finally:
        dist.destroy_process_group()


def positions_reaching_blocks(model: Llama, position_ids: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """cos/sin as each block's attention receives them (after every FSDP hook has run)."""
    seen = []

    def record(module, args):
        seen.append((args[1].cos, args[1].sin))

    for block in model.blocks:
        block.attn.register_forward_pre_hook(record)
    ids = torch.randint(0, model.config.vocab_size, position_ids.shape)
    with torch.no_grad():
        model(ids, position_ids)
    return seen


def test_fsdp_bf16_blocks_receive_the_single_device_fp32_cos_sin(one_process_group):
    config = load([], ["train.precision=bf16-true", "model.max_position=65536"])
    position_ids = torch.tensor([[0, 1, 2047, 4095, 32767, 65535]])

    single = Llama(config.model).to(torch.bfloat16)
    expected = positions_reaching_blocks(single, position_ids)

    sharded = Llama(config.model)
    shard_model(sharded, one_process_group["data_parallel"], config.train.precision)
    got = positions_reaching_blocks(sharded, position_ids)

    assert len(got) == len(expected) == config.model.n_layers
    for (cos, sin), (cos_ref, sin_ref) in zip(got, expected, strict=True):
        assert cos.dtype == sin.dtype == torch.float32
        assert torch.equal(cos, cos_ref) and torch.equal(sin, sin_ref)
