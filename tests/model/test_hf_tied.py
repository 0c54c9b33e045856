"""Tied input/output embeddings: one Parameter, whose gradient is the sum of the embedding's
and the head's (checked against an untied copy), kept one under FSDP2's fully_shard (a
1-process gloo group on CPU), and saved once."""

import dataclasses
import socket
import subprocess
import sys

import torch

from longctx.config.model import ModelConfig
from longctx.model.checkpoint import load_model, save_model
from longctx.model.llama import Llama

FSDP = """
import sys, torch, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from longctx.config import load
from longctx.model.llama import Llama
from longctx.train.module import LanguageModelModule, shard_model

dist.init_process_group("gloo", rank=0, world_size=1, init_method=f"tcp://127.0.0.1:{sys.argv[1]}")
config = load([], ["model.tie_embeddings=true", "model.vocab_size=300", "train.precision=32-true"])
torch.manual_seed(0)
reference = Llama(config.model)
module = LanguageModelModule(config, initial_state=reference.state_dict())
module.configure_model()  # the init weights, as a run starts; then the trainer's sharding:
model = module.model
shard_model(model, init_device_mesh("cpu", (1,)), config.train.precision)  # fully_shard per block, then the root
assert type(model.output.weight).__name__ == "DTensor", type(model.output.weight)
assert model.output.weight is model.tok_embeddings.weight
assert len(list(model.parameters())) == len(list(reference.parameters()))
ids = torch.randint(0, 300, (2, 32))
model(ids).square().mean().backward()
reference(ids).square().mean().backward()
gradient = model.tok_embeddings.weight.grad.full_tensor()
assert (gradient - reference.tok_embeddings.weight.grad).abs().max() <= 1e-6
torch.optim.SGD(model.parameters(), lr=1.0).step()
assert torch.equal(model.output.weight.full_tensor(), model.tok_embeddings.weight.full_tensor())
dist.destroy_process_group()
print("ok")
"""


def test_tied_gradient_is_the_sum_of_both_uses():
    torch.manual_seed(0)
    tied = Llama(ModelConfig.from_preset("debug", vocab_size=300, tie_embeddings=True))
    untied = Llama(ModelConfig.from_preset("debug", vocab_size=300))
    untied.load_state_dict({**tied.state_dict(), "output.weight": tied.tok_embeddings.weight.detach().clone()})
    assert tied.output.weight is tied.tok_embeddings.weight
    assert tied.config.num_parameters() == sum(p.numel() for p in tied.parameters())
    ids = torch.randint(0, 300, (2, 40))
    tied(ids).square().mean().backward()
    untied(ids).square().mean().backward()
    expected = untied.tok_embeddings.weight.grad + untied.output.weight.grad
    torch.testing.assert_close(tied.tok_embeddings.weight.grad, expected)
    assert untied.output.weight.grad.abs().max() > 1e-3  # the head's share is not negligible


def test_biases_are_counted_and_zero_initialised():
    for bias, count in (("qkv", 3), ("qkvo", 4)):
        model = Llama(ModelConfig.from_preset("debug", attention_bias=bias))
        biases = [p for name, p in model.named_parameters() if name.endswith(".bias")]
        assert len(biases) == count * model.config.n_layers and all(not b.any() for b in biases)
        assert model.config.num_parameters() == sum(p.numel() for p in model.parameters())


def test_tied_model_is_saved_once_and_reloads_tied(tmp_path):
    model = Llama(ModelConfig.from_preset("debug", vocab_size=300, tie_embeddings=True))
    path = save_model(model, tmp_path / "m.safetensors")
    loaded = load_model(path)
    assert loaded.output.weight is loaded.tok_embeddings.weight
    assert torch.equal(loaded.output.weight, model.output.weight)
    torch.save(
        {
            "state_dict": {f"model.{k}": v for k, v in model.state_dict().items()},
            "hyper_parameters": {"model": dataclasses.asdict(model.config)},
        },
        tmp_path / "last.ckpt",
    )
    from_checkpoint = load_model(tmp_path / "last.ckpt")  # a state dict naming the one tensor twice
    assert from_checkpoint.output.weight is from_checkpoint.tok_embeddings.weight
    assert torch.equal(from_checkpoint.output.weight, model.output.weight)


def test_fsdp2_keeps_the_embedding_and_head_one_parameter():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    result = subprocess.run(
        [sys.executable, "-c", FSDP, str(port)], capture_output=True, text=True, env={"PYTHONPATH": ":".join(sys.path)}
    )
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stderr[-3000:]
