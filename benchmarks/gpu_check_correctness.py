"""`make gpu-check`, part `correctness`: the GPU path against independent references.

    python benchmarks/gpu_check_correctness.py --out DIR [--smoke]

(the repository root and src/ on PYTHONPATH, as benchmarks/gpu_check.py sets them). Each
check is a function of the `gpu` tests, called here at the sizes of issue 31 (the tests
call the same functions at small sizes), in this order:

1. `flash 4K`: the flash varlen backend (bf16) forward and backward on 2 rows of 4,096
   tokens (four packed documents, one of a single token, and one whole document), GQA
   8/2 heads of 64, against fp32 dense-mask sdpa (tests/test_gpu_path.py);
2. `band <method> 8K`: StRing (paper and repo compat), ReRoPE, Self-Extend and DCA with
   the STRING §4.2 parameters of a 2,048-token training length, 2 rows of 8,192 tokens
   (packed and whole), the `tiny` preset's heads (8/4 of 32): output and q/k/v gradients
   through the merged passes (the exact lse-merge backward) on the flash path in bf16
   against the pure-torch path in fp64 (exact autograd; the CPU suite checks it against
   the dense Eq. 4 reference, tests/model/test_flash.py), run on the GPU: on CPU the 8K
   fp64 reference with gradients would take minutes (tests/model/test_gpu_numerics.py);
3. `rope bf16-true`: a bf16 model's cos/sin at positions up to 131,071 within
   m theta 2^-23 + 4e-6 of float64;
4. `no sync, 1.1B flash`: 2 optimizer steps of 2 micro-batches of 2 x 2,048 tokens of
   tinyllama-1.1b on the flash backend under `torch.cuda.set_sync_debug_mode("error")`,
   batch.document_segments' `nonzero` the one allowed synchronisation
   (tests/train/test_gpu_train.py);
5. `kill + resume`: `longctx pretrain` of the debug preset with fsdp, compile, bf16-mixed
   and flash, SIGKILLed once it has logged step 12, resumed from its step-10 checkpoint:
   the resumed losses of steps 11.. equal the killed run's within 2e-2 (flash backward
   and compiled kernels are not bitwise deterministic) (tests/test_gpu_path.py);
6. `hf attention bf16 8K`: every attention function of longctx.hf_attention (longctx_rope,
   _string paper and repo, _rerope, _self_extend, _dca at their defaults for a 2,048-token
   training length) in a bf16 transformers Llama on one 8,192-token row against longctx's
   own model on its flash path, logits within 3e-2 relative L2 error
   (tests/hf_attention/test_gpu.py). Its detail names the transformers version it ran
   with: the GPU image has its own; when it is not the `hf` extra's pin and the pinned
   wheels are staged (`make device-hf`, carried as .device-hf), the check installs them
   into a directory of its own and runs in a child process with them first on the path.

StRing's repo-compat decoding is not compared with its prefill here (no check decodes), so
the change of its single-token forwards on branch `engine` does not touch these checks.

DIR/correctness.json and .md (benchmarks/report.py) are rewritten after every check, so a
part stopped at its time limit keeps the checks that finished. Exit status 1 if any check
failed. `--smoke`: the same checks on CPU at tiny sizes, the flash backend running through
the CPU stand-in of torch's varlen kernel (tests/model/varlen_stand_in.py), without the
sync-debug mode (CUDA only) and with compile, fsdp and bf16 off in the kill + resume.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import pytest
import report
import torch
from position_methods import build

from tests.helpers import packed_document_ids, reset_position_ids
from tests.model import varlen_stand_in
from tests.model.helpers import all_methods, random_qkv
from tests.model.test_gpu_numerics import (
    assert_band_pass_gradients_match_fp64_path,
    assert_bf16_true_rope_matches_float64,
)
from tests.test_gpu_path import RESUME_TOLERANCE, assert_backend_matches_fp32_sdpa, kill_and_resume_losses
from tests.train.test_gpu_train import run_steps

BAND_METHODS = ("string", "string-repo", "rerope", "self_extend", "dca")
HF_PIN = "5.23.0"
"""The `hf` extra's transformers (pyproject.toml)."""
REPOSITORY = Path(__file__).resolve().parents[1]
STAGED_HF = REPOSITORY / ".device-hf" / "whl"
"""`make device-hf`: the pinned transformers wheel and the wheels of its version's needs."""
COLUMNS = ["check", "result", "detail", "seconds"]


def band_rows(total: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(position_ids, document_ids) [2, total]: four packed documents, then one whole."""
    lengths = [3 * total // 8, 1, total // 2, total - 3 * total // 8 - 1 - total // 2]
    documents = torch.stack([packed_document_ids(lengths)[0], torch.zeros(total, dtype=torch.long)])
    positions = torch.stack([reset_position_ids(lengths)[0], torch.arange(total)])
    return positions, documents


def band_check(name: str, total: int, device: torch.device) -> Callable[[], str]:
    """On CUDA: `total` tokens, the STRING §4.2 parameters of a 2,048-token training length,
    bf16. On CPU (smoke): the parameters of the CPU tests (tests/model/helpers.all_methods:
    StRing S=10, W=3 ...), fp32 through the kernel's stand-in."""

    def check() -> str:
        positions, documents = band_rows(total)
        torch.manual_seed(0)
        if device.type == "cuda":
            heads, factory, dtype = (8, 4, 32), lambda: build(name, 2048, "tiny"), torch.bfloat16
        else:
            heads, factory, dtype = (4, 2, 16), lambda: all_methods()[name], torch.float32
        q, k, v = random_qkv(2, total, total, *heads)
        error = assert_band_pass_gradients_match_fp64_path(
            factory, positions, documents, q, k, v, device, device, dtype
        )
        return f"relative L2 error {error:.1e} (bound {3e-2 if dtype == torch.bfloat16 else 1e-5:g})"

    return check


def hf_errors(tokens: int, device: torch.device, scratch: Path) -> dict[str, float]:
    """The relative errors of tests/hf_attention/test_gpu.py's check (bf16 on CUDA, fp32 on CPU)."""
    from tests.hf_attention.test_gpu import assert_hf_functions_match_longctx

    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    return assert_hf_functions_match_longctx(scratch / "hf-llama", device, tokens, dtype)


def stage_pinned_transformers(scratch: Path) -> Path | None:
    """Install the staged wheels (.device-hf/whl) into a directory of their own; None when
    none are staged or pip cannot install them (the check then runs the image's version)."""
    wheels = sorted(STAGED_HF.glob("*.whl"))
    if not wheels:
        return None
    target = scratch / "hf-site"
    command = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile"]
    installed = subprocess.run([*command, "--no-cache-dir", "--target", str(target), *map(str, wheels)], check=False)
    return target if installed.returncode == 0 else None


def hf_check(tokens: int, device: torch.device, scratch: Path) -> Callable[[], str]:
    def check() -> str:
        version = importlib.metadata.version("transformers")
        print(f"hf attention: transformers {version} here, {HF_PIN} pinned", flush=True)
        site = stage_pinned_transformers(scratch) if version != HF_PIN else None
        if site is None:
            errors = hf_errors(tokens, device, scratch)
            ran = version if version == HF_PIN else f"{version} (the image's; pinned {HF_PIN}, none staged)"
        else:
            env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
            command = [sys.executable, __file__, "--hf-only", str(tokens), "--device", device.type]
            child = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
            if child.returncode == 1:  # the check itself failed: its one-line reason
                raise AssertionError(child.stdout.strip().splitlines()[-1])
            if child.returncode:  # the staged wheels do not import here: the image's transformers
                reason = (child.stderr.strip().splitlines() or ["no output"])[-1][:120]
                errors = hf_errors(tokens, device, scratch)
                ran = f"{version} (the image's; the staged {HF_PIN} failed: {reason})"
            else:
                result = json.loads(child.stdout.strip().splitlines()[-1])
                errors, ran = result["errors"], f"{result['transformers']} (staged pin; the image has {version})"
        worst = max(errors, key=errors.get)
        bound = 3e-2 if device.type == "cuda" else 1e-4
        return f"transformers {ran}: largest relative L2 error {errors[worst]:.1e} ({worst}; bound {bound:g})"

    return check


def checks(smoke: bool, device: torch.device, scratch: Path) -> dict[str, Callable[[], str]]:
    """Name -> a function that raises on failure and returns what it measured."""
    flash_tokens, band_tokens = (64, 48) if smoke else (4096, 8192)
    step_shape = {"preset": "debug", "window": 64} if smoke else {"preset": "tinyllama-1.1b", "window": 2048}
    kill = {"kill_after": 7, "max_steps": 12} if smoke else {"kill_after": 12, "max_steps": 100}

    def flash() -> str:
        worst = assert_backend_matches_fp32_sdpa("flash", flash_tokens, device)
        return f"largest error {worst:.2f} of its bound (output 2e-2, gradients 5% of max)"

    def rope() -> str:
        assert_bf16_true_rope_matches_float64(device)
        return "cos/sin within m theta 2^-23 + 4e-6"

    def no_sync() -> str:
        losses = run_steps("flash", rows=2, micro_batches=2, steps=2, device=device, **step_shape)
        assert all(torch.isfinite(torch.tensor(losses))), losses
        mode = '"error" mode' if device.type == "cuda" else "CPU: no sync-debug mode"
        return f"{step_shape['preset']}, losses {', '.join(f'{loss:.3f}' for loss in losses)} ({mode})"

    def kill_resume() -> str:
        pairs = kill_and_resume_losses(scratch / "kill", cuda=device.type == "cuda", **kill)
        assert pairs, "no step after the checkpoint in both runs"
        worst_step = max(pairs, key=lambda step: abs(pairs[step][0] - pairs[step][1]))
        worst = abs(pairs[worst_step][0] - pairs[worst_step][1])
        assert worst <= RESUME_TOLERANCE, f"step {worst_step}: {pairs[worst_step]} differ by {worst:.2e}"
        return f"steps {min(pairs)}-{max(pairs)}, largest difference {worst:.1e} (tolerance {RESUME_TOLERANCE:g})"

    tokens = f"{flash_tokens // 1024}K" if flash_tokens >= 1024 else str(flash_tokens)
    band = f"{band_tokens // 1024}K" if band_tokens >= 1024 else str(band_tokens)
    return {
        f"flash {tokens}, fwd+bwd vs fp32": flash,
        **{f"band {name} {band}": band_check(name, band_tokens, device) for name in BAND_METHODS},
        "rope bf16-true": rope,
        f"no sync, {step_shape['preset']} flash step": no_sync,
        "kill + resume (fsdp, compile)" if not smoke else "kill + resume": kill_resume,
        f"hf attention {'bf16 ' if not smoke else ''}{band}": hf_check(band_tokens, device, scratch),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="directory for correctness.json and .md")
    parser.add_argument("--smoke", action="store_true", help="CPU, tiny sizes, the flash kernel's CPU stand-in")
    parser.add_argument("--hf-only", type=int, metavar="TOKENS", help="only the hf attention check, a JSON line")
    parser.add_argument("--device", default="cuda", help="with --hf-only")
    args = parser.parse_args()
    if args.hf_only:
        import transformers

        with tempfile.TemporaryDirectory(prefix="gpu-check-hf-") as scratch:
            try:
                errors = hf_errors(args.hf_only, torch.device(args.device), Path(scratch))
            except AssertionError as error:
                print(str(error).splitlines()[0])
                raise SystemExit(1) from None
        print(json.dumps({"transformers": transformers.__version__, "errors": errors}))
        return
    # Stopped at the part's limit (SIGTERM from gpu_check.py): leave through the `finally`
    # blocks, which kill a pretrain running in its own process group.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    device = torch.device("cpu" if args.smoke else "cuda")
    patch = pytest.MonkeyPatch()
    if args.smoke:
        varlen_stand_in.install(patch, "torch-2.14")
    rows: list[list[str]] = []
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as scratch:
        for name, check in checks(args.smoke, device, Path(scratch)).items():
            start = time.perf_counter()
            try:
                result, detail = "passed", check()
            except Exception as error:  # a failed check is reported and the next one runs
                traceback.print_exc()
                result, detail = "FAILED", f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"
            rows.append([name, result, detail.replace("|", "/"), f"{time.perf_counter() - start:.1f}"])
            report.write(args.out, "correctness", COLUMNS, rows, {"smoke": args.smoke})
    patch.undo()
    raise SystemExit(1 if any(row[1] != "passed" for row in rows) else 0)


if __name__ == "__main__":
    main()
