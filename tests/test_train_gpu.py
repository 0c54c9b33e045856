"""benchmarks/train_gpu.py on CPU (its --smoke sizes): one model on the device at a time,
so that each row's allocator peak holds its own model only."""

import functools
import gc
import sys
import weakref
from pathlib import Path

import torch

REPOSITORY = Path(__file__).resolve().parents[1]
SAVED_PATH = list(sys.path)
sys.path.insert(0, str(REPOSITORY / "benchmarks"))
import train_gpu  # noqa: E402  (a script directory, not a package)

sys.path[:] = SAVED_PATH


def test_each_model_is_dead_before_the_next_one_is_built(monkeypatch):
    """Weak references to every parameter of each model a step was built on: when a step is
    built on another model, every earlier model's parameters must be gone. Two compiled models of ours in a row (their
    blocks sit in the reference cycle `nn.Module.compile` makes) with the cycle collector
    off, so only the benchmark's own collection frees them; the compile backend is
    dynamo's `eager` (no code generation: the cycle is the same)."""
    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="eager"))
    argv = ["train_gpu.py", "--smoke", "--no-litgpt", "--skip-e2e", "--compile", "--loss-chunk-tokens", "64"]
    monkeypatch.setattr(sys, "argv", argv)
    args = train_gpu.parse_args()
    args.backends = ["varlen", "sdpa"]
    built: list[tuple[weakref.ref, list[weakref.ref]]] = []  # each model and its parameters
    real_init = train_gpu.DeviceStep.__init__

    def init_and_check(step, *arguments, **options):
        real_init(step, *arguments, **options)
        earlier = [parameters for model, parameters in built if model() is not step.model]
        alive = sum(ref() is not None for parameters in earlier for ref in parameters)
        assert not alive, f"{alive} parameters of earlier models alive when {step.implementation.name}'s was built"
        if len(earlier) == len(built):
            built.append((weakref.ref(step.model), [weakref.ref(p) for p in step.model.parameters()]))

    monkeypatch.setattr(train_gpu.DeviceStep, "__init__", init_and_check)
    gc.disable()
    try:
        rows = train_gpu.step_rows(64, args)
    finally:
        gc.enable()
    assert len(built) == 3  # HF's, ours on varlen, ours on sdpa: one model per library
    assert [row[1] for row in rows][:3] == ["HF sdpa", "longctx varlen", "longctx sdpa"]
