"""STRING Table 1 on SmolLM2-135M-Instruct at 500 tests per cell on the GPU, in calls that
fit one device command each (a device driver: the tables it writes are the real-model
results of docs/real_models.md, not timings).

    python3 scripts/real_models/real_table1.py table MODEL_DIR --out $OUT [--resume-from CELLS.tar.xz]
    python3 scripts/real_models/real_table1.py agreement MODEL_DIR --out $OUT [--resume-from ...]
    python3 scripts/real_models/real_table1.py side-by-side MODEL_DIR --out $OUT
    python3 scripts/real_models/real_table1.py smoke --out DIR            # all three on CPU, tiny model

- `table`: the nine arms of experiments/real/smollm2_table1.yaml at `--length` (8,192, the
  training length, first; then 6K, 4K, 2K in later calls), `--tests` (500) per cell, bf16 on
  CUDA, `--batch-tokens` (65,536: 8 rows of 8K per forward, GPU_BATCH_TOKENS), by
  `longctx niah-table` on the engine's cells (eval/cells.py), run as a child
  stopped `--budget-s` after the start: the cells resume after a kill, and are packed into
  $OUT/cells.tar.xz every call (prompts' outputs and scores, ~0.1-0.3 MiB), so the next call,
  on this machine or a fresh one (`--resume-from` that archive, committed under
  docs/real_models/), continues them. Once every arm has its tests: $OUT/table1-L<L>.md and,
  with the per-prompt outcomes, the two committed rules (analysis/paired.py,
  docs/real_models.md "Rules"): $OUT/rules-L<L>.json / .md.
- `agreement`: the first `--tests` (10) prompts at `--length` in float32 on the CPU
  (eval.device=cpu, cells of their own, resumable likewise), each arm's records compared with
  the CUDA bf16 cells of `table`: the same pass/fail, the same output text ($OUT/agreement-L<L>.*).
- `side-by-side`: RoPE only, the first `--tests` (<= 50) prompts at `--length`: seconds per
  test of longctx's batched evaluation (model.inference.generation.generate with `--batch-tokens`' rows,
  bf16 autocast on CUDA) and of Hugging Face `generate` at batch size 1 on the same
  token ids (bf16 weights, sdpa: how the STRING repository runs its NIAH; the GPU image has
  no flash-attn), after one warm-up prompt each, and whether they pass the same prompts
  ($OUT/side_by_side-L<L>.*).
- `smoke`: a tiny random Llama in the HF layout with the default vocabulary, at 512
  tokens, 2-3 tests per cell, all three modes on CPU (tests/test_benchmarks_smoke.py).

The device call sequence (the model sent in parts first): docs/real_models.md, "On the GPU".
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))  # report.py
import report

from longctx.analysis.paired import table1_rules
from longctx.eval.cell_records import read_records
from longctx.eval.cells import Cell, Decoding

TABLE = "experiments/real/smollm2_table1.yaml"
TASK = "niah-paper"
RESERVE_S = 20.0
"""Seconds of the budget kept for packing the cells and writing the tables."""
GPU_BATCH_TOKENS = 65_536
"""Prompt tokens per forward on the GPU: 8 rows at 8K (the YAML's 8,192 is one row, which
leaves an H100 idle between a 135M model's decode steps). Kept at 8 rows because a method
that scores attention densely would hold rows x 9 heads x chunk x 8,192 fp32 scores per
layer: 4.8 GB with the table's 2,048-token prefill chunks, 19 GB with RULER's whole-prompt
prefill (arithmetic, not measured). Decoding batch sizes are not part of a cell's identity,
so cells resume across a change."""


def run_child(argv: list[str], budget_s: float) -> int:
    """`argv` as a child process stopped at the budget (the engine's cells resume after it);
    its exit code, -9 when stopped."""
    try:
        return subprocess.run(argv, timeout=max(budget_s, 1.0)).returncode
    except subprocess.TimeoutExpired:
        return -9


def _niah_table(model: Path, length: int, tests: int, cells: Path, out_md: Path, budget_s: float, *extra: str) -> int:
    """`longctx niah-table` as a child, stopped at the budget (run_child)."""
    argv = [sys.executable, "-m", "longctx", "niah-table", str(model), "--lengths", str(length), TABLE]
    argv += [f"eval.niah.tests_per_length={tests}", *extra]
    argv += ["--cells", str(cells), "--out", str(out_md), "--quiet"]
    return run_child(argv, budget_s)


def arms() -> list[str]:
    import yaml

    return list(yaml.safe_load(Path(TABLE).read_text())["eval"]["arms"])


def outcomes(cells: Path, model: str, length: int) -> dict[str, dict[int, dict]]:
    """{arm: {index: record}} of the cells on disk."""
    found = {}
    for arm in arms():
        records = read_records(Cell(model, arm, TASK, length).directory(cells) / "samples.jsonl")
        found[arm] = {int(r["index"]): r for r in records}
    return found


def unpack_cells(archive: Path | None, into: Path) -> None:
    if archive is not None and archive.is_file():
        with tarfile.open(archive, "r:xz") as tar:
            tar.extractall(into, filter="data")


def pack_cells(cells: Path, archive: Path) -> None:
    if not cells.is_dir():
        raise SystemExit(f"no cells under {cells}: niah-table stopped before its first cell (see its output above)")
    archive.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive, "w:xz") as tar:
        tar.add(cells, arcname=cells.name)


def run_table(args: argparse.Namespace) -> int:
    start = time.monotonic()
    work = Path(args.work)
    unpack_cells(args.resume_from, work)
    cells, name = work / "cells", Path(args.model).name
    table_md = work / f"table1-L{args.length}.md"
    batch = f"eval.niah.batch_tokens={args.batch_tokens}"
    code = _niah_table(
        Path(args.model), args.length, args.tests, cells, table_md, args.budget_s - RESERVE_S, batch, *args.set
    )
    pack_cells(cells, Path(args.out) / "cells.tar.xz")
    found = outcomes(cells, name, args.length)
    done = {arm: len(records) for arm, records in found.items()}
    print(f"tests per arm at L={args.length}: {done}")
    if code != 0 or min(done.values()) < args.tests:
        print(f"table not finished (niah-table exit {code}): call again with --resume-from the cells.tar.xz")
        return 3 if code in (0, -9) else 1
    (Path(args.out) / table_md.name).write_text(table_md.read_text())
    passes = {arm: [found[arm][i]["score"] >= 1.0 for i in range(args.tests)] for arm in found}
    rules = table1_rules(passes)
    body = {key: value.__dict__ if hasattr(value, "__dict__") else value for key, value in rules.items()}
    rows = [
        [
            "string-repo - rope",
            rules["string_repo_minus_rope"].text(),
            "above 0" if rules["string_beats_rope"] else "not above 0",
        ],
        [
            "string-repo - rope-repo-temperature",
            rules["string_repo_minus_temperature"].text(),
            "contains 0" if rules["temperature_explains_gain"] else "excludes 0",
        ],
    ]
    notes = [
        f"StRing as released beats RoPE: {'yes' if rules['string_beats_rope'] else 'no'}; "
        f"the temperature explains the gain: {'yes' if rules['temperature_explains_gain'] else 'no'} "
        "(rules: docs/real_models.md)."
    ]
    settings = {"length": args.length, "tests": args.tests, "seconds": round(time.monotonic() - start, 1)}
    report.write(args.out, f"rules-L{args.length}", ["difference", "Newcombe 95%", "reading"], rows, settings, notes)
    (Path(args.out) / f"rules-L{args.length}-counts.json").write_text(json.dumps(body, indent=1) + "\n")
    return 0


def run_agreement(args: argparse.Namespace) -> int:
    work = Path(args.work)
    unpack_cells(args.resume_from, work)
    name = Path(args.model).name
    cpu_cells = work / "cells_cpu"
    code = _niah_table(
        Path(args.model),
        args.length,
        args.tests,
        cpu_cells,
        work / "cpu.md",
        args.budget_s - RESERVE_S,
        "eval.device=cpu",
        *args.set,
    )
    pack_cells(cpu_cells, Path(args.out) / "cells_cpu.tar.xz")
    cpu, cuda = outcomes(cpu_cells, name, args.length), outcomes(work / "cells", name, args.length)
    rows = []
    for arm in arms():
        shared = [i for i in range(args.tests) if i in cpu[arm] and i in cuda[arm]]
        same_pass = sum((cpu[arm][i]["score"] >= 1.0) == (cuda[arm][i]["score"] >= 1.0) for i in shared)
        same_text = sum(cpu[arm][i].get("text") == cuda[arm][i].get("text") for i in shared)
        rows.append([arm, str(len(shared)), f"{same_pass}/{len(shared)}", f"{same_text}/{len(shared)}"])
    columns = ["arm", "prompts in both", "same pass/fail", "same output text"]
    notes = ["float32 on CPU against the bf16-autocast CUDA cells of the same prompts (test i = the same prompt)."]
    report.write(args.out, f"agreement-L{args.length}", columns, rows, {"length": args.length, "cpu_exit": code}, notes)
    return 0 if code == 0 else 3


def _timed(function) -> tuple[float, object]:
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    start = time.perf_counter()
    value = function()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter() - start, value


def run_side_by_side(args: argparse.Namespace) -> int:
    from transformers import AutoModelForCausalLM

    from longctx.cli.common import evaluation_setup
    from longctx.eval.niah.engine_task import NiahTask
    from longctx.eval.niah.evaluation import evaluation_device
    from longctx.model.checkpoint import load_model
    from longctx.model.inference.generation import Generation, generate

    if args.tests > 50:
        raise SystemExit(f"--tests {args.tests}: the side-by-side is capped at 50 prompts")
    batch = f"eval.niah.batch_tokens={args.batch_tokens}"
    cfg, tokenizer, haystack, (path,) = evaluation_setup([TABLE, batch, *args.set], [args.model])
    device = evaluation_device(cfg)
    task = NiahTask(cfg.eval.niah, haystack)
    samples = task.samples(cfg.eval.niah.seed, args.length, args.tests, tokenizer)
    prompts = [list(s.prompt_ids) for s in samples]
    stop, settings = samples[0].stop, cfg.eval.niah
    decoding = Decoding(batch_tokens=settings.batch_tokens, prefill_chunk_tokens=settings.prefill_chunk_tokens)

    model = load_model(path).to(device).eval()

    def ours(batch: list[list[int]]) -> list[Generation]:
        with torch.no_grad(), torch.autocast(device.type, torch.bfloat16, enabled=device.type == "cuda"):
            return generate(
                model,
                batch,
                max_new_tokens=settings.max_new_tokens,
                stop=stop,
                decode=tokenizer.decode,
                batch_size=decoding.rows(max(map(len, batch))),
                prefill_chunk_tokens=settings.prefill_chunk_tokens,
                cuda_decoding=cfg.eval.cuda_decoding,
            )

    ours(prompts[:1])  # warm-up
    ours_s, ours_out = _timed(lambda: ours(prompts))
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation="sdpa").to(device).eval()
    eos = sorted(stop.eos_ids) or None

    def theirs(prompt: list[int]) -> Generation:
        ids = torch.tensor([prompt], device=device)
        with torch.no_grad():
            out = hf.generate(
                ids, attention_mask=torch.ones_like(ids), max_new_tokens=settings.max_new_tokens, do_sample=False,
                eos_token_id=eos, pad_token_id=eos[0] if eos else 0,
            )  # fmt: skip
        tokens = out[0, ids.shape[1] :].tolist()
        tokens = tokens[: next((i for i, t in enumerate(tokens) if t in stop.eos_ids), len(tokens))]
        return Generation(tokens, tokenizer.decode(tokens), "hf")

    theirs(prompts[0])  # warm-up
    hf_s, hf_out = _timed(lambda: [theirs(p) for p in prompts])
    ours_pass = [task.score(s, g) >= 1.0 for s, g in zip(samples, ours_out, strict=True)]
    hf_pass = [task.score(s, g) >= 1.0 for s, g in zip(samples, hf_out, strict=True)]
    agree = sum(a == b for a, b in zip(ours_pass, hf_pass, strict=True))
    same_text = sum(a.text == b.text for a, b in zip(ours_out, hf_out, strict=True))
    ours_label, hf_label = ("bf16 autocast", "bf16 weights") if device.type == "cuda" else ("fp32", "fp32")
    rows = [
        [
            f"longctx batched (generate, {ours_label})",
            f"{ours_s / len(prompts):.3f}",
            f"{sum(ours_pass)}/{len(prompts)}",
        ],
        [f"HF generate, batch 1 ({hf_label}, sdpa)", f"{hf_s / len(prompts):.3f}", f"{sum(hf_pass)}/{len(prompts)}"],
    ]
    notes = [
        f"RoPE, the same {len(prompts)} prompts at L={args.length}: the same pass/fail on {agree}/{len(prompts)}, "
        f"the same output text on {same_text}/{len(prompts)}."
    ]
    report.write(
        args.out,
        f"side_by_side-L{args.length}",
        ["evaluation", "seconds per test", "passed"],
        rows,
        {"length": args.length, "tests": len(prompts), "speedup": round(hf_s / ours_s, 2)},
        notes,
    )
    return 0


def tiny_model(directory: Path, max_position: int) -> Path:
    """A random Llama in the HF layout with longctx's bpe-8192 tokenizer beside it."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from longctx.data.tokenizer import load_tokenizer

    tokenizer = load_tokenizer("bpe-8192")
    torch.manual_seed(0)
    shape = dict(vocab_size=8192, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4)
    config = LlamaConfig(
        **shape, num_key_value_heads=2, max_position_embeddings=max_position, eos_token_id=tokenizer.eos_id
    )
    LlamaForCausalLM(config).save_pretrained(directory)
    tokenizer.hf_tokenizer.save(str(directory / "tokenizer.json"))
    eos = tokenizer.token(tokenizer.eos_id) if tokenizer.eos_id is not None else None
    settings = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": eos, "model_max_length": max_position}
    (directory / "tokenizer_config.json").write_text(json.dumps(settings) + "\n")
    return directory


def run_smoke(args: argparse.Namespace) -> int:
    out = Path(args.out)
    with tempfile.TemporaryDirectory(prefix="real_table1_smoke_") as scratch:
        model = tiny_model(Path(scratch) / "tiny", 512)
        small = ["eval.niah.prefill_chunk_tokens=256", "eval.niah.max_new_tokens=8"]
        common = dict(model=str(model), length=512, budget_s=600.0, batch_tokens=2048, set=small)
        table = argparse.Namespace(
            **common, tests=3, out=str(out / "table"), work=str(Path(scratch) / "w1"), resume_from=None
        )
        if run_table(table) != 0:
            return 1
        resumed = Path(scratch) / "w2"  # a fresh machine: only the archive of the first call
        agreement = argparse.Namespace(
            **common, tests=2, out=str(out / "agreement"), work=str(resumed), resume_from=out / "table" / "cells.tar.xz"
        )
        if run_agreement(agreement) != 0:
            return 1
        side = argparse.Namespace(**common, tests=2, out=str(out / "side"))
        return run_side_by_side(side)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    modes = parser.add_subparsers(dest="mode", required=True)
    for name, tests in (("table", 500), ("agreement", 10), ("side-by-side", 50)):
        mode = modes.add_parser(name)
        mode.add_argument("model", help="the converted HF directory (longctx convert-gguf)")
        mode.add_argument("--length", type=int, default=8192, help="test length (the training length first)")
        mode.add_argument("--tests", type=int, default=tests, help="prompts per cell")
        mode.add_argument("--out", required=True, help="what comes back ($OUT)")
        mode.add_argument("--work", default="runs/real/table1_gpu", help="cells on this machine")
        mode.add_argument("--resume-from", type=Path, help="cells.tar.xz of an earlier call")
        mode.add_argument("--budget-s", type=float, default=540.0, help="seconds this call may run")
        if name != "agreement":  # agreement decodes on the CPU with the table's own batches
            mode.add_argument("--batch-tokens", type=int, default=GPU_BATCH_TOKENS, help="eval.niah.batch_tokens")
        mode.add_argument("--set", action="append", default=[], help="more eval.* overrides")
    smoke = modes.add_parser("smoke", help="all three modes on CPU with a tiny random model")
    smoke.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    run = {"table": run_table, "agreement": run_agreement, "side-by-side": run_side_by_side, "smoke": run_smoke}
    return run[args.mode](args)


if __name__ == "__main__":
    raise SystemExit(main())
