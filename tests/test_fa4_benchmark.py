"""benchmarks/fa4_gpu.py without a GPU: flash-attn-4's arguments from the flash path's, the
checks run on CPU against torch's varlen stand-ins (tests/model/varlen_stand_in.py) with a
dense stand-in of flash-attn-4's varlen function, each check failing on the kernel fault it
is there for, the timing loop, the verdict rule, and the exit when fa4 is not importable."""

import json
import math
import sys
from pathlib import Path

import pytest
import torch

from longctx.model import flash
from tests.model import varlen_stand_in

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import fa4_gpu  # noqa: E402

SHAPES = (4, 2, 16)
PIECES = [9, 1, 30, 24]
"""Documents of the checks' packed row (one of a single token, one longer than the window)."""


def fa4_stand_in(faults=(), calls=None):
    """flash-attn-4's `flash_attn_varlen_func` as its docstring describes it: q [Nq, H, D],
    k/v [Nk, Hkv, D] with Hkv dividing H, window (left, right) with None unbounded, `causal`
    setting right = 0, the diagonal aligned bottom-right; returns (out, lse [H, Nq], natural
    log). `faults` breaks it on purpose: 'window' ignores the window, 'lse' returns log2,
    'top-left' aligns the diagonal top-left, 'gqa' pairs query head h with key head h % Hkv."""

    def function(q, k, v, *, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal, **rest):
        window_size = rest.pop("window_size")
        assert isinstance(rest.pop("return_lse"), bool)  # (out, lse) come back either way
        assert not rest and type(max_seqlen_q) is int and type(max_seqlen_k) is int
        assert cu_seqlens_q.dtype == cu_seqlens_k.dtype == torch.int32
        if calls is not None:
            calls.append({"kv_heads": k.shape[1], "causal": causal, "window_size": window_size})
        left, right = (None, None) if "window" in faults else window_size
        right = 0 if causal else right
        heads, kv_heads = q.shape[1], k.shape[1]
        outs, lses = [], []
        for i in range(len(cu_seqlens_q) - 1):
            qs = q[cu_seqlens_q[i] : cu_seqlens_q[i + 1]]
            ks, vs = (t[cu_seqlens_k[i] : cu_seqlens_k[i + 1]] for t in (k, v))
            sq, sk = qs.shape[0], ks.shape[0]
            assert sq <= max_seqlen_q and sk <= max_seqlen_k
            if "gqa" in faults:
                ks, vs = ks.repeat(1, heads // kv_heads, 1), vs.repeat(1, heads // kv_heads, 1)
            else:
                ks, vs = ks.repeat_interleave(heads // kv_heads, 1), vs.repeat_interleave(heads // kv_heads, 1)
            diagonal = torch.arange(sq)[:, None] + (0 if "top-left" in faults else sk - sq)
            index = torch.arange(sk)[None, :]
            seen = torch.ones(sq, sk, dtype=torch.bool)
            if right is not None:
                seen &= index <= diagonal + right
            if left is not None:
                seen &= index >= diagonal - left
            scores = torch.einsum("qhd,khd->hqk", qs.float(), ks.float()) * softmax_scale
            scores = scores.masked_fill(~seen, -math.inf)
            lse = scores.logsumexp(-1)
            weights = torch.exp(scores - lse[..., None]).nan_to_num(0.0)
            outs.append(torch.einsum("hqk,khd->qhd", weights, vs.float()).to(q.dtype))
            lses.append(lse / math.log(2) if "lse" in faults else lse)
        return torch.cat(outs), torch.cat(lses, dim=1)

    return function


def current(version="torch-2.11"):
    stand_in = varlen_stand_in.STAND_INS[version]
    return fa4_gpu.current_call(flash.VarlenKernel(stand_in, flash_attn=False, enable_gqa=version == "torch-2.14"))


def run_checks(faults=(), version="torch-2.11", calls=None):
    fa4 = fa4_gpu.fa4_call(fa4_stand_in(faults, calls))
    checks = fa4_gpu.run_checks(fa4, current(version), PIECES, SHAPES, torch.device("cpu"), torch.float32, chunk=3)
    return {record["check"]: record for record in checks}


def test_the_flash_paths_windows_become_fa4s_arguments():
    where = fa4_gpu.layout([5, 7], [2, 7], torch.device("cpu"))
    assert where.cu_q.tolist() == [0, 2, 9] and where.cu_k.tolist() == [0, 5, 12]
    assert (where.max_q, where.max_k) == (7, 7) and where.cu_q.dtype == torch.int32
    arguments = fa4_gpu.fa4_arguments(where, scale=0.25, window=flash.CAUSAL, lse=True)
    assert arguments["cu_seqlens_q"] is where.cu_q and arguments["cu_seqlens_k"] is where.cu_k
    assert (arguments["max_seqlen_q"], arguments["max_seqlen_k"], arguments["softmax_scale"]) == (7, 7, 0.25)
    assert (arguments["causal"], arguments["window_size"], arguments["return_lse"]) == (True, (None, None), True)
    window = fa4_gpu.fa4_arguments(where, scale=1.0, window=(255, 0), lse=False)
    assert (window["causal"], window["window_size"], window["return_lse"]) == (False, (255, 0), False)
    full = fa4_gpu.fa4_arguments(where, scale=1.0, window=flash.FULL, lse=False)
    assert (full["causal"], full["window_size"]) == (False, (None, None))


@pytest.mark.parametrize("version", ["torch-2.11", "torch-2.14"])
def test_a_kernel_with_fa4s_documented_semantics_passes_every_check_with_gqa_unexpanded(version, monkeypatch):
    monkeypatch.setattr(fa4_gpu, "WINDOW", (7, 0))  # shorter than the 30- and 24-token documents
    calls = []
    checks = run_checks(version=version, calls=calls)
    assert list(checks) == list(fa4_gpu.CHECKS)
    assert all(record["passed"] for record in checks.values()), checks
    assert max(max(record["gaps"].values()) for record in checks.values()) < 1e-5
    assert [call["kv_heads"] for call in calls] == [4, 2, 2, 2, 2]  # varlen has Hkv = H; the rest unexpanded
    assert calls[2] == {"kv_heads": 2, "causal": False, "window_size": (7, 0)}
    assert "lse_abs" in checks["lse"]["gaps"] and checks["gqa"]["note"].endswith("dk (64, 2, 16)")


@pytest.mark.parametrize(
    ("fault", "failing"),
    [("window", {"window"}), ("lse", {"lse"}), ("top-left", {"chunked"}), ("gqa", {"gqa", "window", "lse", "chunked"})],
)
def test_each_check_fails_on_the_fault_it_is_there_for(fault, failing, monkeypatch):
    monkeypatch.setattr(fa4_gpu, "WINDOW", (7, 0))
    checks = run_checks((fault,))
    assert {name for name, record in checks.items() if not record["passed"]} == failing


def test_a_kernel_that_raises_fails_its_check_with_the_error():
    def refusing(*args, **kwargs):
        raise RuntimeError("head dim 64 unsupported")

    fa4 = fa4_gpu.fa4_call(refusing)
    record = fa4_gpu.check("varlen", fa4, current(), PIECES, SHAPES, torch.device("cpu"), torch.float32, 3)
    assert not record["passed"] and record["note"] == "fa4: RuntimeError: head dim 64 unsupported"


def test_the_timing_loop_times_both_kernels_and_reports_one_that_fails():
    args = fa4_gpu.parse_args(["--out", "unused", "--heads", "4", "--kv-heads", "2", "--head-dim", "16"])
    calls = {"fa4": fa4_gpu.fa4_call(fa4_stand_in()), "current": current()}
    rows = fa4_gpu.time_length(64, [20, 44], calls, args, torch.device("cpu"), torch.float32)
    assert [row["kernel"] for row in rows] == ["fa4", "current"]
    assert all(row["fwd_bwd_ms"] > 0 and row["first_call_s"] > 0 for row in rows)
    assert rows[0]["fwd_bwd_tflops"] == pytest.approx(
        14 * (20 * 21 + 44 * 45) / 2 * 16 * 4 / rows[0]["fwd_bwd_ms"] / 1e9
    )

    def failing(*args, **kwargs):
        raise RuntimeError("no sm90 kernel")

    calls["fa4"] = fa4_gpu.fa4_call(failing)
    failed = fa4_gpu.time_length(64, [64], calls, args, torch.device("cpu"), torch.float32)
    assert failed[0]["failed"] == "RuntimeError: no sm90 kernel" and "fwd_bwd_ms" in failed[1]
    text = fa4_gpu.markdown("header", rows + failed, ["verdict: keep"])
    assert "| 64 | 2 | fa4 |" in text and "failed: RuntimeError: no sm90 kernel" in text and "- keep" in text


def passed_checks():
    return [{"check": name, "passed": True, "gaps": {"out": 1e-3}, "note": ""} for name in fa4_gpu.CHECKS]


LENGTHS = [4096, 16384, 65536]


def timed(fa4_ms, current_ms, lengths=LENGTHS):
    rows = []
    for seq_len, a, b in zip(lengths, fa4_ms, current_ms, strict=True):
        rows += [{"T": seq_len, "kernel": "fa4", "fwd_bwd_ms": a}, {"T": seq_len, "kernel": "current", "fwd_bwd_ms": b}]
    return rows


def test_adopt_only_if_installed_correct_everywhere_and_faster_at_every_length():
    faster = timed([1.0, 5.0, 40.0], [1.5, 6.0, 41.0])
    lines = fa4_gpu.decide(True, passed_checks(), faster, LENGTHS)
    assert lines[-1] == "verdict: adopt"
    assert "verdict: faster at T=65536: yes (fwd+bwd 40.000 ms vs 41.000 ms, 1.02x)" in lines
    assert len(lines) == 1 + len(fa4_gpu.CHECKS) + 3 + 1
    slower_once = fa4_gpu.decide(True, passed_checks(), timed([1.0, 6.5, 40.0], [1.5, 6.0, 41.0]), LENGTHS)
    assert slower_once[-1] == "verdict: keep the current kernel (slower at T=16384)"
    wrong = passed_checks()
    wrong[2] = {"check": "window", "passed": False, "gaps": {"out": 0.4}, "note": ""}
    assert fa4_gpu.decide(True, wrong, faster, LENGTHS)[-1] == "verdict: keep the current kernel (window check failed)"
    assert fa4_gpu.decide(True, passed_checks()[:-1], faster, LENGTHS)[-1].endswith("(chunked not checked)")
    assert (
        fa4_gpu.decide(False, passed_checks(), faster, LENGTHS)[-1]
        == "verdict: keep the current kernel (not installed)"
    )
    untimed = [*faster[:4], {"T": 65536, "kernel": "fa4", "failed": "OOM"}, faster[5]]
    assert fa4_gpu.decide(True, passed_checks(), untimed, LENGTHS)[-1].endswith("(not timed at T=65536)")
    assert fa4_gpu.decide(True, passed_checks(), [], [])[-1].endswith("(no length timed)")
    partial = fa4_gpu.decide(True, passed_checks(), faster[:2], LENGTHS)  # stopped after 4K: no adoption
    assert partial[-1].endswith("(not timed at T=16384; not timed at T=65536)")
    assert "verdict: faster at T=65536: no (not timed yet)" in partial


def test_without_fa4_importable_it_says_so_and_exits_nonzero(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "flash_attn.cute", None)  # import raises ImportError
    assert fa4_gpu.main(["--out", str(tmp_path)]) == 1
    assert "flash-attn-4 is not importable (ModuleNotFoundError" in capsys.readouterr().out
    monkeypatch.setattr(fa4_gpu, "load_fa4", lambda: (fa4_stand_in(), "flash-attn-4 4.0.0b36"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert fa4_gpu.main(["--out", str(tmp_path)]) == 1
    assert "no CUDA device" in capsys.readouterr().out
    assert not list(tmp_path.iterdir())


def test_a_whole_run_on_cpu_stand_ins_writes_the_table_and_the_verdicts(tmp_path, monkeypatch, capsys):
    """main end to end at tiny sizes: both kernels are the CPU stand-ins, so the verdict
    (whichever it is: the two are timed against each other) ends the files and the console."""
    monkeypatch.setattr(fa4_gpu, "load_fa4", lambda: (fa4_stand_in(), "flash-attn-4 (stand-in)"))
    monkeypatch.setattr(
        flash, "resolve_kernel", lambda: flash.VarlenKernel(varlen_stand_in.STAND_INS["torch-2.11"], False, False)
    )
    monkeypatch.setattr(fa4_gpu, "WINDOW", (7, 0))
    small = ["--heads", "4", "--kv-heads", "2", "--head-dim", "16", "--check-length", "96", "--chunk", "3"]
    assert fa4_gpu.main(["--out", str(tmp_path), "--device", "cpu", "--lengths", "64", "128", *small]) == 0
    result = json.loads((tmp_path / "fa4.json").read_text())
    assert [check["check"] for check in result["checks"] if check["passed"]] == list(fa4_gpu.CHECKS)
    assert [(row["T"], row["kernel"]) for row in result["rows"]] == [
        (64, "fa4"),
        (64, "current"),
        (128, "fa4"),
        (128, "current"),
    ]
    assert "current kernel: torch varlen_attn, GQA expanded" in result["header"]
    last = result["verdicts"][-1]
    assert last == "verdict: adopt" or last.startswith("verdict: keep the current kernel (slower at T=")
    markdown = (tmp_path / "fa4.md").read_text()
    assert markdown.startswith(result["header"]) and markdown.rstrip().endswith(last.removeprefix("verdict: "))
    console = capsys.readouterr().out.splitlines()
    assert console[-len(result["verdicts"]) :] == result["verdicts"]
