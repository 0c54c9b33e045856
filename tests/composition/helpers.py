"""The composition matrix: every shipped training configuration, in miniature, under each
strategy it can run with, with its probes firing (docs/composition.md).

A cell is (configuration, strategy). The miniature is one override set (`miniature`):

- model: 2 layers (a hybrid with a full layer every k-th: k layers, its k - 1 linear and
  one full layer), d_model 64, 4 heads (2 key/value heads), d_ff 128; the vocabulary, the
  position design (NoPE, p-RoPE, sinks, gates, sliding/global and linear layers) and
  max_position as shipped;
- batch: one row per micro-batch, two rows per optimizer step (gradient accumulation 2 on
  one process, one row per rank on two); precision 32-true (a CPU run; bf16 autocast on
  CPU is slow and is not what the GPU runs);
- steps: 4 (pretraining and extension), SFT 8 samples for one epoch; a checkpoint every 2;
- probes every 2 steps: f(i) and the NIAH effective-length search (1 test per length,
  16 new tokens) on every cell, the answer loss where the data has retrieval sources
  (2 documents), `sft.niah_after` on every SFT cell (lengths 128 and 256, 1 test each);
  sliding layers add their own f(i);
- data: a corpus a fresh clone lacks (`data/...`, `.device/...`) is the embedded corpus
  prepared with the configuration's tokenizer (a tokenizer file a fresh clone lacks is
  `bpe-<model vocabulary>`, a vocabulary over 32K is bpe-8192); retrieval sources keep
  their settings with 200 documents;
- `init`: SFT and extension cells start from the one-process `pretrain/tiny_512` cell's
  checkpoint (stage 2 of LongRecipe too).

Every cell asserts exit 0 and each probe's metric in metrics.jsonl and in the W&B offline
run's history, read back with wandb's own reader (`wandb leet inspect --json`).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
STRATEGIES = {"single": ("auto", 1), "ddp": ("ddp", 2), "fsdp": ("fsdp", 2)}
"""Cell strategy -> (train.strategy, processes); two processes are gloo ranks under torchrun."""
STEPS = 4
PROBE_METRICS = {
    "fi": "fi/tokens_seen",
    "fi_sliding": "fi/sliding_f@W-1",
    "fi_full": "fi/full_f@L-1",
    "niah": "niah/effective_length",
    "answer": "answers/loss",
    "niah_after": "niah_after/effective_length",
}
"""The metric each probe logs (one is enough to prove it fired)."""
MAX_VOCAB = 32768
"""A larger vocabulary (llama3's 128,256) becomes bpe-8192 in the miniature: its logits, 0.5 GB
per 1K-token row in fp32, made a 4-step CPU cell take minutes."""
NOISE = ("💡 Tip", "litlogger", "anonymous setting", "LeafSpec", "Create an account")
"""Third-party tips and deprecation warnings a run must not print."""


@dataclass(frozen=True)
class Config:
    """A shipped configuration as a cell runs it."""

    name: str
    files: tuple[str, ...]
    command: str = "pretrain"
    probes: tuple[str, ...] = ("fi", "niah")
    init: bool = False
    """Starts from the pretrain/tiny_512 cell's checkpoint."""
    strategies: tuple[str, ...] = tuple(STRATEGIES)
    """The strategies it can run with: context parallelism (`train.context_parallel: 2`)
    runs under fsdp on 2 ranks only."""

    @property
    def slug(self) -> str:
        return self.name.replace("/", "-")


def _pretrain(name: str, probes=("fi", "niah"), init=False) -> Config:
    return Config(name, (f"experiments/{name}.yaml",), probes=probes, init=init)


def _design(name: str, probes=("fi", "niah")) -> Config:
    files = ("experiments/designs/base.yaml",) + (() if name == "base" else (f"experiments/designs/{name}.yaml",))
    return Config(f"designs/{name}", files, probes=(*probes, "answer"))


def _sft(name: str) -> Config:
    return Config(name, (f"experiments/{name}.yaml",), "sft", ("fi", "niah", "niah_after"), init=True)


CONFIGS = [
    *(_pretrain(f"pretrain/{n}") for n in ("tiny_512", "tiny_1k", "tiny_2k")),
    *(_pretrain(f"pretrain/{n}") for n in ("tinyllama_1b_2k", "tinyllama_1b_2k_mixture", "tinyllama_1b_4k")),
    *(_design(n) for n in ("base", "rope", "nope_every4", "prope_025", "sinks", "gated")),
    *(
        _design(n, probes=("fi", "fi_full", "niah"))
        for n in ("hybrid_olmo_rope", "hybrid_olmo_nope", "hybrid_qwen3next")
    ),
    _design("sliding_5to1", probes=("fi", "fi_sliding", "niah")),
    *(
        _pretrain(f"longrecipe/{n}", init=True)
        for n in ("extend", "drope", "full_length", "longrecipe", "pose", "randpos", "prolong_mix", "stage1")
    ),
    _pretrain("longrecipe/stage2_replay", init=True),
    Config(
        "longrecipe/prolong_cp_miniature", ("experiments/longrecipe/prolong_cp_miniature.yaml",), strategies=("fsdp",)
    ),
    *(_sft(f"sft/{n}") for n in ("tiny_normal", "tiny_packed", "tiny_skipalign")),
    Config("replicate/cpu_base", ("experiments/replicate/cpu_base.yaml",), probes=("fi", "niah", "answer")),
    Config("replicate/gpu_base", ("experiments/replicate/gpu_base.yaml",), probes=("fi", "niah", "answer")),
    Config("replicate/gpu_drill", ("experiments/replicate/gpu_drill.yaml",), probes=("fi", "niah", "answer")),
    _sft("replicate/cpu_sft"),
    _sft("replicate/gpu_sft"),
]
"""Every configuration under experiments/ that trains. Not here: replicate/*_table1.yaml and
real/ (evaluation only: `longctx niah-table`), designs/<name>.yaml alone (each is an overlay
on designs/base.yaml), and longrecipe/prolong_{64k,512k}_* (rows of 64K-512K tokens over 8 or
more context-parallel GPUs; their CPU form is prolong_cp_miniature)."""
BY_NAME = {config.name: config for config in CONFIGS}
NOT_CELLS = (
    "base.yaml",
    "designs/*.yaml",
    "replicate/*_table1.yaml",
    "real/*.yaml",
    "longrecipe/prolong_64k_*.yaml",
    "longrecipe/prolong_512k_*.yaml",
)
"""The files under experiments/ that are no cell of their own (CONFIGS' docstring): what
every config inherits, the design overlays, evaluation only, GPU-sized context parallelism."""


def load(config: Config, overrides: list[str] = ()):
    from longctx import config as config_module

    return config_module.load([ROOT / f for f in config.files], list(overrides))


def _embedded(tokenizer_spec: str) -> Path:
    """The embedded corpus prepared with `tokenizer_spec` (once per machine, as a run does)."""
    from longctx.data.dataset_sources import embedded_dataset_dir
    from longctx.data.prepare import prepare
    from longctx.data.tokenizer import load_tokenizer

    directory = embedded_dataset_dir(load_tokenizer(tokenizer_spec))
    prepare("embedded", directory, tokenizer_spec, verbose=False)
    return directory


def _missing(path: str) -> bool:
    """A relative file path (a corpus, a tokenizer file) that a fresh clone lacks; not a
    tokenizer spec such as bpe-8192 or llama3, not an object-store URL."""
    is_path = "/" in path or path.endswith(".json")
    return is_path and not (ROOT / path).exists() and not Path(path).is_absolute() and "://" not in path


def miniature(config: Config, strategy: str, out_dir: Path, init: Path | None = None) -> list[str]:
    """The miniature's overrides for `config` under `strategy` (module docstring)."""
    loaded = load(config)
    values: dict[str, object] = {}
    tokenizer = loaded.data.tokenizer
    if _missing(tokenizer):
        tokenizer = f"bpe-{loaded.model.vocab_size}"
        values["data.tokenizer"] = tokenizer
    if loaded.model.vocab_size > MAX_VOCAB:
        tokenizer = "bpe-8192"
        values |= {"data.tokenizer": tokenizer, "model.vocab_size": 8192}
    if _missing(loaded.data.path):
        values["data.path"] = "''"  # the embedded corpus
    for index, source in enumerate(loaded.data.mixture):
        if source.kind == "retrieval":
            values[f"data.mixture.{index}.retrieval.documents"] = 200
        elif _missing(source.path):
            values[f"data.mixture.{index}.path"] = _embedded(tokenizer)
    window = loaded.data.window
    values |= {
        "train.strategy": STRATEGIES[strategy][0],
        "train.precision": "32-true",
        "train.micro_batch_size": 1,
        "train.global_batch_tokens": 2 * window,
        "train.warmup_steps": 1,
        "train.checkpoint_every_steps": 2,
        "train.out_dir": out_dir,
        "log.every_steps": 1,
        "log.wandb_mode": "offline",
        "probe.fi_every_steps": 2,
        "probe.niah_every_steps": 2,
        "probe.niah_tests_per_length": 1,
        "eval.niah.max_new_tokens": 16,
        "eval.niah.batch_tokens": 8192,  # the memory check sizes a batch of the longest length
        "eval.niah.step": 128,
    }
    if config.command == "sft":
        values |= {
            "sft.embedded_samples": 8,
            "sft.epochs": 1,
            "sft.niah_after": "true",
            "sft.niah_max_length": 256,
            "eval.niah.tests_per_length": 1,
            "train.warmup_ratio": 0.0,
        }
    else:
        values["train.max_steps"] = STEPS
    if config.command != "sft":  # SFT's model is its init checkpoint's; an extension's must match it
        layers = loaded.model.linear_attention.full_every or 2  # a hybrid keeps one full layer
        values |= {"model.n_layers": layers, "model.d_model": 64, "model.n_heads": 4, "model.n_kv_heads": 2}
        values |= {"model.d_ff": 128}
    if config.init:
        assert init is not None, f"{config.name} starts from a pretrain cell's checkpoint"
        values["init"] = init
    if "answer" in config.probes:
        values |= {"probe.answer_every_steps": 2, "probe.answer_documents": 2}
    return [f"{key}={value}" for key, value in values.items()]


def environment() -> dict:
    env = dict(os.environ, WANDB_SILENT="true", PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    env.pop("WANDB_API_KEY", None)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"), str(ROOT), env.get("PYTHONPATH")]))
    return env


def command(config: Config, strategy: str, args: list[str]) -> list[str]:
    processes = STRATEGIES[strategy][1]
    launcher = [sys.executable]
    if processes > 1:
        launcher += ["-m", "torch.distributed.run", f"--nproc-per-node={processes}", "--standalone"]
    return [*launcher, "-m", "longctx", config.command, *(str(ROOT / f) for f in config.files), *args]


def launch(config: Config, strategy: str, args: list[str], log: Path) -> subprocess.Popen:
    """The cell's command in a process group of its own (so a kill reaches every rank), its
    output in `log`, run from the repository root (configs name files relative to it)."""
    return subprocess.Popen(
        command(config, strategy, args),
        cwd=ROOT,
        env=environment(),
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def run(
    config: Config, strategy: str, out_dir: Path, init: Path | None = None, extra: list[str] = (), timeout: float = 600
) -> str:
    """Run the cell to its end (`extra` overrides after the miniature's); its console output,
    asserting exit 0."""
    out_dir.mkdir(parents=True, exist_ok=True)
    log = out_dir.parent / f"{out_dir.name}.log"
    process = launch(config, strategy, [*miniature(config, strategy, out_dir, init), *extra], log)
    try:
        process.wait(timeout=timeout)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    output = log.read_text()
    assert process.returncode == 0, f"{config.name} under {strategy}: exit {process.returncode}\n{output[-5000:]}"
    return output


def kill_after_checkpoint(config: Config, strategy: str, out_dir: Path, step: int, timeout: float = 600) -> None:
    """Start the cell and SIGKILL every process of it once the checkpoint of `step` exists."""
    out_dir.mkdir(parents=True, exist_ok=True)
    log = out_dir.parent / f"{out_dir.name}.log"
    process = launch(config, strategy, miniature(config, strategy, out_dir), log)
    deadline = time.monotonic() + timeout
    try:
        while not list((out_dir / "checkpoints").glob(f"*step={step}*.ckpt")) and process.poll() is None:
            assert time.monotonic() < deadline, f"no checkpoint of step {step} in {out_dir}"
            time.sleep(0.2)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def metrics(out_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]


def wandb_history(out_dir: Path) -> list[dict]:
    """Every history row of the run's offline W&B runs, as wandb itself reads them."""
    rows = []
    for run in sorted((out_dir / "wandb").glob("offline-run-*")):
        done = subprocess.run(
            [str(Path(sys.executable).parent / "wandb"), "leet", "inspect", "--json", str(run)],
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        for line in done.stdout.splitlines():
            record = json.loads(line)
            if record.get("type") == "history":
                rows.append(record["history"]["item"])
    return rows


def probes_fired(config: Config, out_dir: Path) -> dict[str, tuple[int, int]]:
    """probe -> (rows with its metric in metrics.jsonl, in the W&B history)."""
    local, remote = metrics(out_dir), wandb_history(out_dir)
    return {
        probe: (
            sum(PROBE_METRICS[probe] in row for row in local),
            sum(PROBE_METRICS[probe] in row for row in remote),
        )
        for probe in config.probes
    }


def final_fi(out_dir: Path) -> np.ndarray:
    """The f(i) counts of the run's last f(i) file."""
    files = sorted((out_dir / "fi").glob("fi-step-*.npz"))
    assert files, f"no f(i) file in {out_dir / 'fi'}"
    with np.load(files[-1]) as data:
        return {name: data[name] for name in data.files}


def niah_records(out_dir: Path, step: int) -> dict[str, list[dict]]:
    """The in-training NIAH cells of `step`: cell path -> its sample records, without timings."""
    root = out_dir / "niah" / f"step-{step:07d}" / "cells"
    return _records(root)


def _records(root: Path) -> dict[str, list[dict]]:
    cells = {}
    for path in sorted(root.rglob("samples.jsonl")):
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        cells[str(path.parent.relative_to(root))] = [{k: v for k, v in row.items() if k != "seconds"} for row in rows]
    return cells


def noise(output: str) -> list[str]:
    """The lines of a run's console that are third-party tips or deprecation warnings."""
    return [line for line in output.splitlines() if any(marker in line for marker in NOISE)]


def check_probes(config: Config, strategy: str, out_dir: Path, output: str) -> dict[str, tuple[int, int]]:
    """Each probe of the cell fired, in metrics.jsonl and in W&B; the console is quiet."""
    fired = probes_fired(config, out_dir)
    silent = {probe: counts for probe, counts in fired.items() if min(counts) < 1}
    assert not silent, f"{config.name} under {strategy}: probes without metrics (jsonl, wandb): {silent}"
    assert not noise(output), f"{config.name} under {strategy} printed: {noise(output)}"
    return fired


def last_niah_step(out_dir: Path) -> int:
    steps = sorted(int(path.name.split("-")[1]) for path in (out_dir / "niah").glob("step-*"))
    assert steps, f"no in-training NIAH in {out_dir}"
    return steps[-1]


def sharded_niah(config: Config, strategy: str, out_dir: Path, init: Path | None, work: Path, processes: int) -> Path:
    """tests/composition/sharded_niah.py on the cell's last checkpoint, over `processes` ranks."""
    work.mkdir(parents=True, exist_ok=True)
    script = Path(__file__).with_name("sharded_niah.py")
    args = [str(out_dir / "checkpoints" / "last.ckpt"), str(work), *(str(ROOT / f) for f in config.files)]
    args += miniature(config, strategy, out_dir, init)
    if processes == 1:  # in this process: one launch fewer
        from tests.composition.sharded_niah import main

        main(args)
        return work
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            f"--nproc-per-node={processes}",
            "--standalone",
            str(script),
            *args,
        ],
        cwd=ROOT,
        env=environment(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return work


LOGITS_TOLERANCE = 1e-5
"""fp32: FSDP2 gathers the exact weights, so a sharded forward computes what one process
does; the bound allows a different summation order in a kernel, nothing more."""


def check_sharded_niah(config: Config, strategy: str, out_dir: Path, init: Path | None, work: Path) -> float:
    """The training run's last in-training NIAH cells (sharded over its ranks) equal one
    process's search on the same weights, record by record; logits of the search's prompts
    under 2-rank FSDP2 equal one process's within LOGITS_TOLERANCE. Returns the largest
    logit difference."""
    one = sharded_niah(config, strategy, out_dir, init, work / "one", 1)
    two = sharded_niah(config, strategy, out_dir, init, work / "two", 2)
    return compare_niah(config, out_dir, one, two)


def compare_niah(config: Config, out_dir: Path, one: Path, two: Path) -> float:
    """`check_sharded_niah`'s comparison of the outputs of one process and two ranks."""
    import torch

    in_training = niah_records(out_dir, last_niah_step(out_dir))
    assert in_training, f"no NIAH records in {out_dir}"
    assert in_training == _records(one / "cells") == _records(two / "cells")
    single, sharded = torch.load(one / "logits.pt"), torch.load(two / "logits.pt")
    assert len(single) == len(sharded) >= 1
    worst = max(float((a - b).abs().max()) for a, b in zip(single, sharded, strict=True))
    assert worst <= LOGITS_TOLERANCE, f"{config.name}: sharded logits differ by {worst}"
    return worst
