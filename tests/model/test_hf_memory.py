"""Loading straight into the evaluation dtype, one tensor at a time: the peak memory of
`import_hf` is bounded by the model in that dtype plus the largest stored tensor."""

import json
import subprocess
import sys

import torch

from longctx.config.model import ModelConfig
from longctx.model.hf import export_hf, import_hf
from longctx.model.llama import Llama

MEASURE = """
import json, sys, torch
from longctx.model.hf import import_hf

def status(field):
    for line in open("/proc/self/status"):
        if line.startswith(field):
            return int(line.split()[1]) * 1024

warm = import_hf(sys.argv[1], dtype=torch.bfloat16)  # first-call allocations; kept, so the next load
open("/proc/self/clear_refs", "w").write("5")  # cannot reuse its memory; reset the peak (VmHWM) to the RSS
before = status("VmRSS")
model = import_hf(sys.argv[1], dtype=torch.bfloat16)
print(json.dumps({"peak": status("VmHWM") - before, "params": sum(p.numel() for p in model.parameters())}))
"""


def test_bf16_load_peak_is_the_bf16_model_plus_one_tensor(tmp_path):
    """Measured as the rise of the process's peak RSS (VmHWM, reset just before) in a fresh
    process: torch storage is invisible to tracemalloc. The bound: the bf16 model + the
    largest fp32 tensor + 24 MiB slack (allocator and interpreter). Building an fp32 model
    and reading all tensors first, as the loader did, needs over twice the fp32 model."""
    config = ModelConfig.from_preset(
        "debug", vocab_size=8192, d_model=512, n_layers=8, n_heads=8, n_kv_heads=8, d_ff=1536
    )
    model = Llama(config)
    export_hf(model, tmp_path)
    del model
    params = config.num_parameters()
    largest = 8192 * 512 * 4
    env_path = ":".join(sys.path)
    result = subprocess.run(
        [sys.executable, "-c", MEASURE, str(tmp_path)],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONPATH": env_path, "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"},
    )
    measured = json.loads(result.stdout.strip().splitlines()[-1])
    assert measured["params"] == params
    bound = 2 * params + largest + 24 * 2**20
    assert measured["peak"] <= bound, f"peak {measured['peak'] / 2**20:.0f} MiB > {bound / 2**20:.0f} MiB"
    assert measured["peak"] >= params  # the measurement sees the model (2 x params bytes) being allocated


def test_loaded_dtype_is_the_stored_tensor_rounded_once(tmp_path):
    """bf16 parameters are the fp32 file's values rounded to bf16, each exactly once."""
    model = Llama(ModelConfig.from_preset("debug", vocab_size=300, tie_embeddings=True, attention_bias="qkv"))
    export_hf(model, tmp_path)
    loaded = import_hf(tmp_path, dtype=torch.bfloat16)
    assert loaded.output.weight is loaded.tok_embeddings.weight
    for (name, ours), (_, reference) in zip(loaded.state_dict().items(), model.state_dict().items(), strict=True):
        assert ours.dtype == torch.bfloat16, name
        assert torch.equal(ours, reference.to(torch.bfloat16)), name
    assert loaded.rope.inv_freq.dtype == model.rope.inv_freq.dtype
    assert torch.equal(loaded.rope.inv_freq, model.rope.inv_freq)
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] == "qwen2"
