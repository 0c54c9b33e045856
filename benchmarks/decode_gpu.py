"""Decoding step time on a GPU: eager against a replayed CUDA graph, RoPE against StRing.

    python3 benchmarks/decode_gpu.py --out DIR [--cache 32768] [--batch 1] [--profile]
    PYTHONPATH=src python benchmarks/decode_gpu.py --smoke --out /tmp/decode   # CPU, tiny, eager only

tinyllama-1.1b's shapes (22 layers, 32/4 heads, d 2,048) with seeded random weights in
bf16 (the weights themselves, not autocast), `Llama.fuse_projections_` applied, a KV cache
of `--cache` positions filled by a chunked prefill of random ids, then per row:

- `eager`: the model's cached forward of one token per row, `--steps` times, attention in
  the Triton decoding kernel (model/inference/kernel.py);
- `graph`: the same steps through `DecodeGraph` (model/inference/graph.py): one eager step
  (the warm-up, on the capture's stream), one recorded, the rest replayed;
- `graph, no kernel`: the same on a cache without the kernel, the attention on its eager
  path (`_attend_math`): what the kernel gains;

The engine decodes eagerly unless `eval.cuda_decoding` opts in; this benchmark opts in to
what each row measures (`DecodeGraph` itself, the cache's `decode_kernel=True`).

for plain RoPE (`position_method=None`) and StRing (`arm_config("string")`, S = L/3 of the
model's 2,048 training length, W = 128), each on its own cache. Times are CUDA events
around each step (the median of `--steps`), in ms per step. The memory limit column is
the bytes a step must read (the bf16 weights and the whole [cache] key/value buffer every
full layer reads) over the device's bandwidth (`--bandwidth`, 3.35 TB/s = an H100 SXM).
Targets (docs/benchmarks.md): graph RoPE <= 3 ms at a 32K cache, StRing / RoPE <= 1.15x.
`--profile`: a `torch.profiler` summary of one eager and one replayed step (top 25 ops by
device time) beside the table. Writes decode_gpu.md and .json (and decode_gpu_profile.md) to --out.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import report
import torch

from longctx.config.model import ModelConfig
from longctx.config.position_methods import arm_config
from longctx.model.inference.graph import DecodeGraph
from longctx.model.llama import Llama
from longctx.model.position_methods import build_position_method

SEED = 0


def build(smoke: bool, device: torch.device) -> Llama:
    overrides = {"n_layers": 2, "d_model": 128, "n_heads": 8, "n_kv_heads": 2, "d_ff": 256, "vocab_size": 512}
    config = ModelConfig.from_preset("tinyllama-1.1b", **(overrides if smoke else {}))
    torch.manual_seed(SEED)
    with torch.device(device):
        model = Llama(config)
    return model.to(torch.bfloat16).eval().fuse_projections_()


def filled_cache(model: Llama, method, batch: int, length: int, steps: int, chunk: int, kernel: bool = True):
    device = model.tok_embeddings.weight.device
    generator = torch.Generator(device="cpu").manual_seed(SEED)
    ids = torch.randint(0, model.config.vocab_size, (batch, length), generator=generator).to(device)
    cache = model.new_kv_cache(batch, length + 2 * steps + 2, decode_kernel=kernel)
    for start in range(0, length, chunk):
        model(ids[:, start : start + chunk], kv_cache=cache, position_method=method, last_logits_only=True)
    return cache, ids[:, -1:]


def clock(device: torch.device):
    """A step timer: CUDA events on a GPU, wall time elsewhere (ms)."""
    if device.type != "cuda":

        def wall(step):
            start = time.perf_counter()
            step()
            return (time.perf_counter() - start) * 1e3

        return wall

    def events(step):
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        step()
        end.record()
        end.synchronize()
        return begin.elapsed_time(end)

    return events


def time_steps(model: Llama, method, args, device, recorded: bool, kernel: bool = True) -> list[float]:
    """Step times (ms); `kernel`: the attention in the Triton decoding kernel, else on its
    eager path (`decode._attend_math`), for the comparison column."""
    cache, token = filled_cache(model, method, args.batch, args.cache, args.steps, args.chunk, kernel)
    timer = clock(device)
    if recorded:
        graph = DecodeGraph(model, cache, method)
        graph.step(token)  # eager, the warm-up
        graph.step(token)  # recorded (and replayed)
        return [timer(lambda: graph.step(token)) for _ in range(args.steps)]
    model(token, kv_cache=cache, position_method=method)
    return [timer(lambda: model(token, kv_cache=cache, position_method=method)) for _ in range(args.steps)]


def step_bytes(model: Llama, cache: int, batch: int) -> int:
    """Bytes one decoding step reads: the weights and every full layer's whole K/V buffer."""
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    config = model.config
    full_layers = sum(1 for spec in model.layer_specs if not spec.window)
    return weights + 2 * full_layers * batch * cache * config.n_kv_heads * config.head_size * 2


def profile(model: Llama, method, args, device) -> str:
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as run_profile

    cache, token = filled_cache(model, method, args.batch, args.cache, 4, args.chunk)
    graph = DecodeGraph(model, cache, method)
    graph.step(token)
    graph.step(token)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    lines = []
    for name, step in (("eager step", lambda: model(token, kv_cache=cache, position_method=method)),):
        with run_profile(activities=activities) as prof:
            step()
            if device.type == "cuda":
                torch.cuda.synchronize()
        sort = "cuda_time_total" if device.type == "cuda" else "cpu_time_total"
        lines += [f"## {name}", "```", prof.key_averages().table(sort_by=sort, row_limit=25), "```"]
    with run_profile(activities=activities) as prof:
        graph.step(token)
        if device.type == "cuda":
            torch.cuda.synchronize()
    lines += ["## replayed step", "```", prof.key_averages().table(row_limit=10), "```"]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--cache", type=int, default=32768)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--chunk", type=int, default=8192, help="prefill chunk (tokens)")
    parser.add_argument("--bandwidth", type=float, default=3.35e12, help="bytes/s for the memory-limit column")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--smoke", action="store_true", help="tiny model and cache, on CPU if no GPU")
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if args.smoke:
        args.cache, args.steps, args.chunk = min(args.cache, 256), min(args.steps, 4), min(args.chunk, 128)
    model = build(args.smoke, device)
    methods = {"rope": None, "string": build_position_method(arm_config("string"), model.config).to(device)}
    limit_ms = step_bytes(model, args.cache, args.batch) / args.bandwidth * 1e3
    rows = []
    with torch.no_grad():
        for name, method in methods.items():
            for recorded in (False, True):
                times = time_steps(model, method, args, device, recorded)
                rows.append({"method": name, "step": "graph" if recorded else "eager", "ms": statistics.median(times)})
            times = time_steps(model, method, args, device, True, kernel=False)
            rows.append({"method": name, "step": "graph, no kernel", "ms": statistics.median(times)})
        summary = profile(model, methods["string"], args, device) if args.profile else ""
    by = {(r["method"], r["step"]): r["ms"] for r in rows}
    columns = [
        "method",
        "eager ms",
        "graph ms",
        "graph / eager",
        "vs rope (graph)",
        "graph, no kernel ms",
        "memory limit ms",
    ]
    table = [
        [
            name,
            f"{by[(name, 'eager')]:.3f}",
            f"{by[(name, 'graph')]:.3f}",
            f"{by[(name, 'graph')] / by[(name, 'eager')]:.2f}x",
            f"{by[(name, 'graph')] / by[('rope', 'graph')]:.2f}x",
            f"{by[(name, 'graph, no kernel')]:.3f}",
            f"{limit_ms:.3f}",
        ]
        for name in methods
    ]
    settings = {"batch": args.batch, "cache": args.cache, "steps": args.steps, "dtype": "bf16", "smoke": args.smoke}
    notes = [] if device.type == "cuda" else ["no CUDA: the graph column runs eagerly"]
    report.write(args.out, "decode_gpu", columns, table, settings=settings, notes=notes)
    if summary:
        (Path(args.out) / "decode_gpu_profile.md").write_text(summary + "\n")


if __name__ == "__main__":
    main()
