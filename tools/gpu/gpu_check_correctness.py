"""`make gpu-check`, part `correctness`: the GPU path against independent references.

    python tools/gpu/gpu_check_correctness.py --out DIR [--smoke]

(src/ on PYTHONPATH, as tools/gpu/gpu_check.py sets it). Each check is a function of
longctx.gpu_checks, which the `gpu` tests call at small sizes; here at the sizes that make
the proof of one device session, in this order:

1. `flash 4K`: the flash varlen backend (bf16) forward and backward on 2 rows of 4,096
   tokens (four packed documents, one of a single token, and one whole document), GQA
   8/2 heads of 64, against fp32 dense-mask sdpa;
2. `band <method> 8K`: StRing (paper and repo compat), ReRoPE, Self-Extend and DCA with
   the STRING §4.2 parameters of a 2,048-token training length, 2 rows of 8,192 tokens
   (packed and whole), the `tiny` preset's heads (8/4 of 32): output and q/k/v gradients
   through the merged passes (the exact lse-merge backward) on the flash path in bf16
   against the pure-torch path in fp64 (exact autograd; the CPU suite checks it against
   the dense Eq. 4 reference, tests/model/test_flash.py), run on the GPU: on CPU the 8K
   fp64 reference with gradients would take minutes;
3. `design <name> 8K` (longctx.gpu_design_checks): each attention design (sliding layers
   of window 1K with their own RoPE base, a NoPE layer, qk-norm per head and over the
   projection, p-RoPE 0.25, partial `first` 0.5, sinks on sliding and full layers, SSMax
   temperature) as a whole 2-layer model with heads of 64
   on one row of four packed documents, bf16 autocast on the flash path against the same
   weights in float64 on dense sdpa: logits and every parameter gradient within 3e-2
   relative L2 error;
4. `rope bf16-true`: a bf16 model's cos/sin at positions up to 131,071 within
   m theta 2^-23 + 4e-6 of float64;
5. `no sync, 1.1B flash`: 2 optimizer steps of 2 micro-batches of 2 x 2,048 tokens of
   tinyllama-1.1b on the flash backend under `torch.cuda.set_sync_debug_mode("error")`,
   batch.document_segments' `nonzero` the one allowed synchronisation;
6. `hf attention bf16 8K`: every attention function of longctx.hf_attention (longctx_rope,
   _string paper and repo, _rerope, _self_extend, _dca at their defaults for a 2,048-token
   training length) in a bf16 transformers Llama on one 8,192-token row against longctx's
   own model on its flash path, logits within 3e-2 relative L2 error. Its detail names the
   transformers version it ran with: the GPU image has its own; when it is not the `hf`
   extra's pin and the pinned wheels are staged (`make device-hf`, carried as .device-hf),
   the check installs them into a directory of its own and runs in a child process with
   them first on the path (`--hf-only`);
7. `kill + resume`: `longctx pretrain` of the debug preset with fsdp, compile, bf16-mixed
   and flash, SIGKILLed once it has logged step 12, resumed from its step-10 checkpoint:
   the resumed losses of steps 11.. equal the killed run's within 2e-2 (flash backward
   and compiled kernels are not bitwise deterministic).

`checks()` maps each check's name to its function, so a new check is one more entry.
DIR/correctness.json and .md (benchmarks/report.py) are rewritten after every check, so a
part stopped at its time limit keeps the checks that finished. Exit status 1 if any check
failed.

`--smoke`: the same checks on CPU at tiny sizes (the debug preset's heads, a 32-token
training length's method parameters), with the backend that CPU has in place of flash:
`varlen` (pure torch), so the smoke proves every check's code and the part's reporting
but not the flash kernel; without the sync-debug mode (CUDA only) and with compile, fsdp
and bf16 off in the kill + resume. tests/tools/test_gpu_check.py also calls `checks(...,
backend="flash")` in its own process with the CPU stand-in of torch's varlen kernel
installed, which runs the flash path of every check but the kill + resume (a pretrain in
processes of its own, where no stand-in reaches; it runs on varlen either way on CPU).
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

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))  # report, position_methods
import report
from position_methods import build

from longctx.config.model import ModelConfig
from longctx.config.position_methods import PositionMethodConfig, StringConfig, arm_config
from longctx.gpu_checks import (
    RESUME_TOLERANCE,
    assert_backend_matches_fp32_sdpa,
    assert_band_pass_gradients_match_fp64_path,
    assert_bf16_true_rope_matches_float64,
    assert_hf_functions_match_longctx,
    hf_arms,
    kill_and_resume_losses,
    packed_rows,
    random_qkv,
    run_steps,
)
from longctx.gpu_design_checks import BF16_BOUND, DESIGNS, FP32_BOUND, assert_design_matches_float64
from longctx.model.position_methods import PositionMethod, build_position_method

BAND_METHODS = tuple(arm for arm in hf_arms() if arm != "rope")
"""The attention methods of more than one pass (and their arms: string-repo), each checked
through the log-sum-exp merge."""
COLUMNS = ["check", "result", "detail", "seconds"]
HF_PIN = "5.23.0"
"""The `hf` extra's transformers (pyproject.toml)."""
STAGED_HF = Path(__file__).resolve().parents[2] / ".device-hf" / "whl"
"""`make device-hf`: the pinned transformers wheel and the wheels of its version's needs."""
SMOKE_TRAINING_LENGTH = 32
"""The smoke's methods are built for this training length (STRING S = 11, W = 3; the
baselines' protocol parameters), so 48-token rows reach past S and every pass runs."""


def smoke_method(name: str) -> PositionMethod:
    """`name` built from longctx's own config for the debug preset (heads of 16) at
    SMOKE_TRAINING_LENGTH, StRing with a local window of 3 (its default 128 needs S > 128)."""
    # the per-method sections are keyword arguments made from the registry at run time
    config = arm_config(name, PositionMethodConfig(string=StringConfig(local_window=3)))  # type: ignore[call-arg]
    return build_position_method(config, ModelConfig.from_preset("debug", max_position=SMOKE_TRAINING_LENGTH))


def band_rows(total: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(position_ids, document_ids) [2, total]: four packed documents, then one whole."""
    return packed_rows([3 * total // 8, 1, total // 2, total - 3 * total // 8 - 1 - total // 2], total)


def band_check(name: str, total: int, device: torch.device, backend: str) -> Callable[[], str]:
    """On CUDA: `total` tokens, the STRING §4.2 parameters of a 2,048-token training length,
    bf16. On CPU: smoke_method's parameters, fp32."""

    def check() -> str:
        positions, documents = band_rows(total)
        torch.manual_seed(0)
        factory: Callable[[], PositionMethod]
        if device.type == "cuda":
            heads, dtype = (8, 4, 32), torch.bfloat16
            factory = lambda: build(name, 2048, "tiny")  # noqa: E731
        else:
            heads, dtype = (4, 2, 16), torch.float32
            factory = lambda: smoke_method(name)  # noqa: E731
        q, k, v = random_qkv(2, total, total, *heads)
        error = assert_band_pass_gradients_match_fp64_path(
            factory, positions, documents, q, k, v, device, device, dtype, backend
        )
        return f"relative L2 error {error:.1e} (bound {3e-2 if dtype == torch.bfloat16 else 1e-5:g})"

    return check


def hf_errors(tokens: int, device: torch.device, scratch: Path) -> dict[str, float]:
    """longctx.gpu_checks' hf attention check (bf16 on CUDA, fp32 on CPU): {arm: error}."""
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


def hf_in_child(tokens: int, device: torch.device, site: Path, version: str, scratch: Path) -> tuple[dict, str]:
    """The check in a child process with the staged transformers first on the path; the
    image's own when the staged wheels do not import there."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    command = [sys.executable, __file__, "--hf-only", str(tokens), "--device", device.type]
    child = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if child.returncode == 1:  # the check itself failed: its one-line reason
        raise AssertionError(child.stdout.strip().splitlines()[-1])
    if child.returncode:
        reason = (child.stderr.strip().splitlines() or ["no output"])[-1][:120]
        return hf_errors(tokens, device, scratch), f"{version} (the image's; the staged {HF_PIN} failed: {reason})"
    result = json.loads(child.stdout.strip().splitlines()[-1])
    return result["errors"], f"{result['transformers']} (staged pin; the image has {version})"


def hf_check(tokens: int, device: torch.device, scratch: Path) -> Callable[[], str]:
    def check() -> str:
        version = importlib.metadata.version("transformers")
        print(f"hf attention: transformers {version} here, {HF_PIN} pinned", flush=True)
        site = stage_pinned_transformers(scratch) if version != HF_PIN else None
        if site is None:
            errors = hf_errors(tokens, device, scratch)
            ran = version if version == HF_PIN else f"{version} (the image's; pinned {HF_PIN}, none staged)"
        else:
            errors, ran = hf_in_child(tokens, device, site, version, scratch)
        worst = max(errors, key=lambda name: errors[name])
        bound = 3e-2 if device.type == "cuda" else 1e-4
        return f"transformers {ran}: largest relative L2 error {errors[worst]:.1e} ({worst}; bound {bound:g})"

    return check


def design_check(name: str, total: int, device: torch.device, backend: str) -> Callable[[], str]:
    """A design's whole 2-layer model on `backend` against float64 sdpa (longctx.gpu_design_checks)."""

    def check() -> str:
        error = assert_design_matches_float64(name, total, device, backend)
        bound = BF16_BOUND if device.type == "cuda" else FP32_BOUND
        return f"relative L2 error {error:.1e} (logits and gradients; bound {bound:g})"

    return check


def checks(smoke: bool, device: torch.device, scratch: Path, backend: str = "flash") -> dict[str, Callable[[], str]]:
    """Name -> a function that raises on failure and returns what it measured. `backend`:
    the packed-varlen backend the attention checks run on (flash; varlen in the CPU smoke)."""
    flash_tokens, band_tokens = (64, 48) if smoke else (4096, 8192)
    preset, window = ("debug", 64) if smoke else ("tinyllama-1.1b", 2048)
    kill = {"kill_after": 7, "max_steps": 12} if smoke else {"kill_after": 12, "max_steps": 100}

    def flash() -> str:
        worst = assert_backend_matches_fp32_sdpa(backend, flash_tokens, device)
        return f"largest error {worst:.2f} of its bound (output 2e-2, gradients 5% of max)"

    def rope() -> str:
        assert_bf16_true_rope_matches_float64(device)
        return "cos/sin within m theta 2^-23 + 4e-6"

    def no_sync() -> str:
        losses = run_steps(backend, preset, window, rows=2, micro_batches=2, steps=2, device=device)
        assert all(torch.isfinite(torch.tensor(losses))), losses
        mode = '"error" mode' if device.type == "cuda" else "CPU: no sync-debug mode"
        return f"{preset}, losses {', '.join(f'{loss:.3f}' for loss in losses)} ({mode})"

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
        f"{backend} {tokens}, fwd+bwd vs fp32": flash,
        **{f"band {name} {band}": band_check(name, band_tokens, device, backend) for name in BAND_METHODS},
        **{f"design {name} {band}": design_check(name, band_tokens, device, backend) for name in DESIGNS},
        "rope bf16-true": rope,
        f"no sync, {preset} {backend} step": no_sync,
        # The slowest check last: a part stopped at its limit loses only it.
        f"hf attention {'bf16 ' if not smoke else ''}{band}": hf_check(band_tokens, device, scratch),
        "kill + resume (fsdp, compile)" if not smoke else "kill + resume": kill_resume,
    }


def hf_only(tokens: int, device: torch.device) -> None:
    """The hf attention check alone, as the child of `hf_in_child`: a JSON line, or exit 1
    with the failure's one-line reason."""
    import transformers

    with tempfile.TemporaryDirectory(prefix="gpu-check-hf-") as scratch:
        try:
            errors = hf_errors(tokens, device, Path(scratch))
        except AssertionError as error:
            print(str(error).splitlines()[0])
            raise SystemExit(1) from None
    print(json.dumps({"transformers": transformers.__version__, "errors": errors}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="directory for correctness.json and .md")
    parser.add_argument("--smoke", action="store_true", help="CPU, tiny sizes, backend varlen in place of flash")
    parser.add_argument("--hf-only", type=int, metavar="TOKENS", help="only the hf attention check, a JSON line")
    parser.add_argument("--device", default="cuda", help="with --hf-only")
    parser.add_argument("--only", metavar="PREFIX", help="run only the checks whose name starts with PREFIX")
    args = parser.parse_args()
    if args.hf_only:
        hf_only(args.hf_only, torch.device(args.device))
        return
    # Stopped at the part's limit (SIGTERM from gpu_check.py): leave through the `finally`
    # blocks, which kill a pretrain running in its own process group.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    device = torch.device("cpu" if args.smoke else "cuda")
    rows: list[list[str]] = []
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as scratch:
        named = checks(args.smoke, device, Path(scratch), "varlen" if args.smoke else "flash")
        named = {name: check for name, check in named.items() if name.startswith(args.only or "")}
        for name, check in named.items():
            start = time.perf_counter()
            try:
                result, detail = "passed", check()
            except Exception as error:  # a failed check is reported and the next one runs
                traceback.print_exc()
                result, detail = "FAILED", f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"
            rows.append([name, result, detail.replace("|", "/"), f"{time.perf_counter() - start:.1f}"])
            report.write(args.out, "correctness", COLUMNS, rows, {"smoke": args.smoke})
    raise SystemExit(1 if any(row[1] != "passed" for row in rows) else 0)


if __name__ == "__main__":
    main()
