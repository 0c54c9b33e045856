"""Assemble and run a training job: data, module, strategy, precision, logger, callbacks.

    longctx pretrain experiments/pretrain/tiny_1k.yaml train.max_steps=200
    torchrun --nproc-per-node 8 -m longctx pretrain experiments/pretrain/tinyllama_1b_2k.yaml
    torchrun --nnodes 4 --node-rank $R --nproc-per-node 8 --rdzv-backend c10d \\
        --rdzv-endpoint $HOST:29500 -m longctx pretrain experiments/pretrain/tinyllama_1b_4k.yaml

World size. Under torchrun, Lightning's TorchElasticEnvironment supplies ranks; devices per
node and nodes are read from LOCAL_WORLD_SIZE and WORLD_SIZE, and `train.devices` /
`train.num_nodes`, when set, must agree (a mismatch is an error, not a silent re-launch).

Batch. `train.global_batch_tokens` is fixed; accumulation = global / (window x micro-batch
x data-parallel size), the data-parallel size = world / `train.context_parallel` (the N
ranks of a context-parallel group share their rows: train/context_parallel.py). A 4K run therefore accumulates twice as many micro-batches as a 2K run and both
take the same tokens per optimizer step (STRING A.2: 4M tokens at both windows).

Resume. `train.resume=auto|PATH` first checks that the checkpoint's saved config agrees on
the keys that fix shapes, vocabulary, window and positions (train/resume_check.py), then
restores model, optimizer, schedule, step, RNG and callback states through Lightning; the data position is global row `step x rows_per_step`
(data/packing.py), so no loader state is needed and nothing is seen twice or skipped.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, cast

import lightning as L
import torch
from lightning.pytorch.strategies import DDPStrategy, ModelParallelStrategy

from longctx.config import ExperimentConfig
from longctx.data.batch_plan import tokens_per_step
from longctx.data.pipeline import packed_rows, position_transform
from longctx.data.transforms import PositionTransform
from longctx.errors import CheckpointError, ConfigError
from longctx.train.callbacks.frequency import HostBatchDataModule, PositionFrequencyCallback
from longctx.train.callbacks.training import METRICS_FILE, LastCheckpoint, MetricsFile, TrainingSpeed, step_checkpoints
from longctx.train.checkpoint_io import AtomicCheckpointIO, check_checkpoint_space
from longctx.train.loggers import ConfigLogger, build_callbacks, build_loggers
from longctx.train.memory_budget import check_run_memory, estimate_memory
from longctx.train.module import LanguageModelModule
from longctx.train.nonfinite import NonFiniteCheck
from longctx.train.progress_bar import step_progress_bar
from longctx.train.resume_check import check_resume_compatible
from longctx.wandb_setup import finish_loggers


@dataclass
class WorldSize:
    devices: int
    num_nodes: int

    @property
    def total(self) -> int:
        return self.devices * self.num_nodes

    def data_parallel(self, config: ExperimentConfig) -> int:
        """Ranks reading different rows: the world over the context-parallel size, which
        must divide it."""
        size = config.train.context_parallel
        if self.total % size:
            raise ConfigError(
                "train.context_parallel",
                f"{size} does not divide the world size {self.total} ({self.num_nodes} node(s) x {self.devices} devices)",
            )
        return self.total // size


def world_size_from_environment(config: ExperimentConfig) -> WorldSize:
    """Devices per node and nodes, from torchrun's environment or the config."""
    train = config.train
    if "LOCAL_WORLD_SIZE" in os.environ and "WORLD_SIZE" in os.environ:
        local, world = int(os.environ["LOCAL_WORLD_SIZE"]), int(os.environ["WORLD_SIZE"])
        if world % local:
            raise ConfigError(
                "train.devices", f"torchrun set WORLD_SIZE={world}, not a multiple of LOCAL_WORLD_SIZE={local}"
            )
        found = WorldSize(local, world // local)
        for key, expected in (("devices", found.devices), ("num_nodes", found.num_nodes)):
            value = getattr(train, key)
            if value and value != expected:
                raise ConfigError(
                    f"train.{key}",
                    f"{value} but torchrun launched {expected} "
                    f"({'--nproc-per-node' if key == 'devices' else '--nnodes'}); set train.{key}=0 to follow torchrun",
                )
        return found
    return WorldSize(train.devices or 1, train.num_nodes or 1)


Precision = Literal["32-true", "bf16-mixed", "bf16-true"]
"""The `train.precision` values besides "auto" (config/train.py checks them), as Lightning names them."""


def resolve_precision(config: ExperimentConfig) -> Precision:
    if config.train.precision != "auto":
        return cast(Precision, config.train.precision)
    return "bf16-mixed" if torch.cuda.is_available() else "32-true"


def make_strategy(config: ExperimentConfig, world: WorldSize):
    if config.train.context_parallel > 1:
        from longctx.train.context_parallel import ContextParallelStrategy

        return ContextParallelStrategy(world.data_parallel(config), config.train.context_parallel)
    if config.train.strategy == "fsdp":
        # Consolidated (not sharded) checkpoints: one file, resumable at any world size.
        return ModelParallelStrategy(
            data_parallel_size=world.total, tensor_parallel_size=1, save_distributed_checkpoint=False
        )
    if config.train.strategy == "ddp" or world.total > 1:
        return DDPStrategy()
    return "auto"


def document_granule(config: ExperimentConfig) -> int:
    """2 x CP under `train.load_balance=document` (each document padded to a multiple of
    it, data/row_padding.py), else 1."""
    train = config.train
    return 2 * train.context_parallel if train.context_parallel > 1 and train.load_balance == "document" else 1


def resolve_resume(config: ExperimentConfig) -> str | None:
    resume = config.train.resume
    if not resume:
        return None
    path = Path(config.train.out_dir) / "checkpoints" / "last.ckpt" if resume == "auto" else Path(resume)
    if not path.exists():
        if resume == "auto":
            return None  # first launch of a run that may be pre-empted later
        raise FileNotFoundError(f"train.resume: checkpoint {path} does not exist")
    verify_checkpoint(path, config)
    return str(path)


def verify_checkpoint(path: Path, config: ExperimentConfig) -> None:
    """Fail early, naming the file, on a truncated or corrupt checkpoint, or on one whose
    config differs from `config` in a key a resumed run must keep (train/resume_check.py)."""
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as error:  # the zip reader raises several types for damaged files
        raise CheckpointError(f"checkpoint {path} is truncated or corrupt and cannot be resumed: {error}") from None
    missing = [key for key in ("state_dict", "global_step", "optimizer_states") if key not in checkpoint]
    if missing:
        raise CheckpointError(f"checkpoint {path} lacks {missing}: not a longctx training checkpoint")
    check_resume_compatible(path, checkpoint, config)


class PackedDataModule(HostBatchDataModule):
    """Builds each rank's loader after a resume has restored the global step."""

    def __init__(
        self,
        config: ExperimentConfig,
        sources: list[tuple[str, float]],
        eos_id: int,
        rows_per_step: int,
        transform: PositionTransform | None = None,
    ):
        super().__init__()
        self.config = config
        self.sources = sources
        self.eos_id = eos_id
        self.rows_per_step = rows_per_step
        self.transform = transform

    def train_dataloader(self) -> torch.utils.data.DataLoader:
        trainer = self.trainer
        assert trainer is not None  # Lightning attaches the trainer before it asks for data
        context = self.config.train.context_parallel  # a group's ranks are adjacent and share rows
        rows = packed_rows(
            self.config.data,
            self.sources,
            self.eos_id,
            rank=trainer.global_rank // context,
            world_size=trainer.world_size // context,
            start_row=trainer.global_step * self.rows_per_step,
            transform=self.transform,
            micro_batch_size=self.config.train.micro_batch_size,
            document_granule=document_granule(self.config),
        )
        workers = self.config.train.loader_workers
        return torch.utils.data.DataLoader(
            rows,
            batch_size=self.config.train.micro_batch_size,
            num_workers=workers,
            pin_memory=torch.cuda.is_available(),  # pinned rows reach the GPU without a host sync
            persistent_workers=workers > 0,
            prefetch_factor=4 if workers else None,
        )


def pretrain(config: ExperimentConfig, sources: list[tuple[str, float]], tokenizer) -> L.Trainer:
    """Train on prepared `sources` [(path, weight)]; returns the finished Trainer. With
    `init=CKPT` the run continues from that checkpoint's weights under `model` (which may
    change max_position and RoPE, as context extension does, but not the shapes)."""
    world = world_size_from_environment(config)
    _, rows_per_step = batch_plan(config, world)
    transform = position_transform(config.data, tokenizer)
    datamodule = PackedDataModule(config, sources, tokenizer.eos_id, rows_per_step, transform)
    if int(os.environ.get("RANK", "0")) == 0:
        write_masking_report(config, sources, tokenizer.eos_id, config.train.max_steps * rows_per_step)
    initial_state = initial_weights(config) if config.init else None
    fi_window = config.data.window if transform is None else config.data.target_length
    loss_weights = None
    if config.train.loss_weighting == "inverse_frequency":
        from longctx.train.loss_weights import run_loss_weights

        rows = packed_rows(
            config.data, sources, tokenizer.eos_id, transform=transform, document_granule=document_granule(config)
        )
        count = config.train.max_steps * rows_per_step
        out_dir = Path(config.train.out_dir) if int(os.environ.get("RANK", "0")) == 0 else None
        loss_weights = run_loss_weights(rows, count, fi_window, config.train.loss_weight_cap, out_dir)
    return fit(
        config,
        datamodule,
        fi_window=fi_window,
        initial_state=initial_state,
        tokenizer=tokenizer,
        loss_weights=loss_weights,
    )


MASKING_FILE = "answer_masking.json"


def write_masking_report(config: ExperimentConfig, sources: list[tuple[str, float]], eos_id: int, rows: int) -> None:
    """<out_dir>/answer_masking.json: per source, the answers the run's `rows` rows supervise
    and how many of them a row edge cut from their fact (data/answer_spans.py), and whether
    those were masked (`data.mask_cut_answers`)."""
    report = packed_rows(config.data, sources, eos_id, document_granule=document_granule(config)).masking_report(rows)
    out_dir = Path(config.train.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    body = {
        "window": config.data.window,
        "packing": config.data.packing,
        "masked": config.data.mask_cut_answers,
        "rows": rows,
        "sources": [{"path": path, **(entry or {})} for (path, _), entry in zip(sources, report, strict=True)],
    }
    (out_dir / MASKING_FILE).write_text(json.dumps(body, indent=2) + "\n")


def initial_weights(config: ExperimentConfig) -> dict[str, torch.Tensor]:
    """The `init` checkpoint's weights (a .ckpt, a .safetensors or an HF directory), checked
    to fit `config.model`."""
    from longctx.config.model import shape_mismatches
    from longctx.model.checkpoint import load_model

    base = load_model(config.init)
    mismatches = shape_mismatches(base.config, config.model)
    if base.config.norm_eps != config.model.norm_eps:  # same shapes, other function (HF Llama: 1e-6)
        mismatches.append(f"norm_eps: {base.config.norm_eps} vs {config.model.norm_eps}")
    if mismatches:
        raise ConfigError(
            "init",
            f"{config.init} does not fit model.* ({'; '.join(mismatches)}: checkpoint vs config); "
            "set the model preset/fields to the checkpoint's architecture (max_position and RoPE may differ)",
        )
    return base.state_dict()


def batch_plan(config: ExperimentConfig, world: WorldSize) -> tuple[int, int]:
    """(gradient accumulation steps, rows per optimizer step) for this world size."""
    return tokens_per_step(
        config.data.window, config.train.micro_batch_size, world.data_parallel(config), config.train.global_batch_tokens
    )


def fit(
    config: ExperimentConfig,
    datamodule: L.LightningDataModule,
    *,
    fi_window: int,
    initial_state: dict[str, torch.Tensor] | None = None,
    tokenizer=None,
    loss_weights: torch.Tensor | None = None,
    after: Callable[[L.Trainer], None] | None = None,
) -> L.Trainer:
    """Run the Trainer on `datamodule`; f(i) is counted up to relative position `fi_window`.
    `tokenizer` is needed when `probe.niah_every_steps` runs NIAH during training;
    `loss_weights`: w(p) of train.loss_weighting (train/loss_weights.py); `after`: rank 0's
    work once training ends, while the loggers' runs are still open (what it logs joins
    the run's history)."""
    world = world_size_from_environment(config)
    accumulation, _ = batch_plan(config, world)
    out_dir = Path(config.train.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    resume = resolve_resume(config)
    check_run_memory(config, world.total, resolve_precision(config))
    whole = estimate_memory(config, 1, resolve_precision(config), cuda=False)  # the consolidated checkpoint
    check_checkpoint_space(out_dir / "checkpoints", whole.parameters + whole.optimizer)
    L.seed_everything(config.train.seed, workers=True, verbose=False)

    callbacks = [
        NonFiniteCheck(config.log.every_steps),  # before any callback that writes
        step_checkpoints(out_dir / "checkpoints", config.train.checkpoint_every_steps),
        LastCheckpoint(out_dir / "checkpoints" / "last.ckpt", config.train.checkpoint_every_steps),
        TrainingSpeed(config, world.total, accumulation),
        MetricsFile(out_dir / METRICS_FILE),
        ConfigLogger(config),
        step_progress_bar(),
    ]
    if config.probe.fi:
        callbacks.append(
            PositionFrequencyCallback(
                fi_window,
                out_dir,
                config.probe.fi_every_steps,
                config.probe.fi_count_only_labeled,
                config.model.sliding_window if "sliding" in config.model.layer_kinds() else 0,
                config.train.context_parallel,
                linear_layers="linear" in config.model.layer_kinds(),
            )
        )
    if config.probe.niah_every_steps:
        from longctx.eval.niah.evaluation import load_haystack
        from longctx.train.callbacks.niah import EffectiveLengthCallback

        if tokenizer is None:
            raise ConfigError("probe.niah_every_steps", "needs the tokenizer (data.tokenizer)")
        callbacks.append(EffectiveLengthCallback(config, tokenizer, load_haystack(config, tokenizer), out_dir))
    if config.probe.answer_every_steps:
        from longctx.train.callbacks.answer import AnswerLossCallback

        if tokenizer is None or not any(source.kind == "retrieval" for source in config.data.mixture):
            raise ConfigError("probe.answer_every_steps", "needs a kind: retrieval source in data.mixture")
        callbacks.append(AnswerLossCallback(config, tokenizer, out_dir))
    callbacks += build_callbacks(config)
    trainer = L.Trainer(
        accelerator="auto",
        devices=world.devices,
        num_nodes=world.num_nodes,
        strategy=make_strategy(config, world),
        precision=resolve_precision(config),
        max_steps=config.train.stop_at_step or config.train.max_steps,
        accumulate_grad_batches=accumulation,
        logger=build_loggers(config) or False,
        callbacks=callbacks,
        plugins=[AtomicCheckpointIO()],
        log_every_n_steps=config.log.every_steps,
        use_distributed_sampler=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        enable_model_summary=False,
        default_root_dir=str(out_dir),
    )
    module = LanguageModelModule(config, initial_state=None if resume else initial_state, loss_weights=loss_weights)
    trainer.fit(module, datamodule=datamodule, ckpt_path=resume, weights_only=True)  # never unpickle objects
    if trainer.is_global_zero:
        if after is not None:
            after(trainer)
        finish_loggers(trainer.loggers)
    return trainer
