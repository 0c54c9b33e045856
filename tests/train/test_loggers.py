"""Pluggable loggers and callbacks, W&B fidelity, Lightning conventions, in one tiny run.

One pretraining run (6 steps, f(i) every 4, checkpoints every 3) writes through W&B
(offline), CSVLogger, TensorBoardLogger (tensorboardX) and MLFlowLogger (file store) at
once, with a LearningRateMonitor from `train.callbacks`; each logger's files are read back.
"""

import csv
import json
import struct
import subprocess
import sys
from pathlib import Path

import lightning as L
import numpy as np
import pytest
import torch

from longctx.analysis.wandb_offline import offline_runs, read_history, records
from longctx.config import load
from longctx.errors import ConfigError
from longctx.model.checkpoint import load_model
from longctx.train.loggers import build_callbacks, build_loggers
from longctx.train.module import LanguageModelModule
from longctx.train.progress_bar import RichStepProgressBar, TQDMStepProgressBar
from tests.train.helpers import STEPS, environment, overrides

LOGGERS = [
    "log.loggers=[wandb,csv,tensorboard,mlflow]",
    "train.callbacks=[{class_path: lightning.pytorch.callbacks.LearningRateMonitor, "
    "init_args: {logging_interval: step}}]",
]


@pytest.fixture(scope="module")
def run(workspace, tmp_path_factory):
    pytest.importorskip("tensorboardX")
    pytest.importorskip("mlflow")
    out = tmp_path_factory.mktemp("loggers")
    args = [*overrides(workspace, out, **{"probe.fi_every_steps": 4}), *LOGGERS]
    done = subprocess.run(
        [sys.executable, "-m", "longctx", "pretrain", *args],
        env=environment(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return out, done.stdout + done.stderr


def fi_npz(out: Path, step: int) -> dict:
    return dict(np.load(out / "fi" / f"fi-step-{step:07d}.npz"))


def test_fi_is_logged_at_its_interval_and_at_the_end(run):
    """f(i) every 4 steps in a 6-step run: after step 4 and, at the end, after step 6 (a run
    shorter than its interval, like `make demo`, still ends with a curve)."""
    out, _ = run
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in lines if "fi/f@L/4" in row] == [4, 6]
    history = read_history(offline_runs(out)[0])
    assert [row["trainer/global_step"] for row in history if "fi/curve_table.path" in row] == [3, 5]


def test_wandb_gets_the_config_once_and_one_fi_artifact_per_checkpoint(run):
    out, _ = run
    run_dir = offline_runs(out)[0]
    sections = []
    for record in records(run_dir):
        kind = record.WhichOneof("record_type")
        updates = record.run.config.update if kind == "run" else record.config.update if kind == "config" else []
        sections += [item.key for item in updates if item.key in ("model", "train", "experiment", "config")]
    assert sections == ["model", "train"]
    artifacts = [
        [entry.path for entry in record.artifact.manifest.contents]
        for record in records(run_dir)
        if record.WhichOneof("record_type") == "artifact" and record.artifact.type == "position-frequency"
    ]
    assert artifacts == [["fi-step-0000003.npz"], ["fi-step-0000006.npz"]]


def test_probe_points_share_lightnings_step_axis(run):
    out, _ = run
    history = read_history(offline_runs(out)[0])
    loss_steps = [row["trainer/global_step"] for row in history if "train/loss" in row]
    assert loss_steps == list(range(STEPS))  # Lightning: optimizer step k at k - 1
    tokens = {row["trainer/global_step"]: row["train/tokens_seen"] for row in history if "train/tokens_seen" in row}
    fi_rows = [row for row in history if "fi/tokens_seen" in row]
    assert [tokens[row["trainer/global_step"]] for row in fi_rows] == [row["fi/tokens_seen"] for row in fi_rows]


def test_csv_logger_gets_scalars_hparams_callbacks_and_the_fi_table(run):
    out, _ = run
    rows = list(csv.DictReader((out / "csv" / "metrics.csv").open()))
    losses = {int(r["step"]): float(r["train/loss"]) for r in rows if r.get("train/loss")}
    assert sorted(losses) == list(range(STEPS))
    fi = {int(r["step"]): float(r["fi/f@L/4"]) for r in rows if r.get("fi/f@L/4")}
    assert sorted(fi) == [3, 5]
    assert any(v for r in rows for k, v in r.items() if k.startswith("lr-AdamW"))  # train.callbacks' LR monitor
    assert "train:" in (out / "csv" / "hparams.yaml").read_text()
    table = list(csv.reader((out / "csv" / "fi" / "curve" / "step-0000005.csv").open()))
    assert table[0] == ["relative_position", "f"]
    assert [int(f) for _, f in table[1:]] == fi_npz(out, 6)["relative"].tolist()


def tensorboard_events(directory: Path) -> list:
    """Every Event of the TFRecord files in `directory` (length, crc, payload, crc)."""
    from tensorboardX.proto.event_pb2 import Event

    events = []
    for path in sorted(directory.glob("events.out.tfevents.*")):
        data, offset = path.read_bytes(), 0
        while offset < len(data):
            (length,) = struct.unpack_from("<Q", data, offset)
            event = Event()
            event.ParseFromString(data[offset + 12 : offset + 12 + length])
            events.append(event)
            offset += 12 + length + 4
    return events


def test_tensorboard_gets_scalars_and_the_fi_curve_as_a_figure(run):
    out, _ = run
    values = [(event.step, value) for event in tensorboard_events(out / "tensorboard") for value in event.summary.value]
    fi_steps = [step for step, value in values if value.tag == "fi/f_L/4"]  # tensorboardX writes '@' as '_'
    assert fi_steps == [3, 5]
    assert [step for step, value in values if value.tag == "fi/curve" and value.image.encoded_image_string] == [3, 5]
    assert sorted({step for step, value in values if value.tag == "train/loss"}) == list(range(STEPS))


def test_mlflow_gets_scalars_the_fi_table_and_the_artifacts(run, monkeypatch):
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    out, _ = run
    client = MlflowClient(tracking_uri=f"file:{out / 'mlruns'}")
    [experiment] = [e for e in client.search_experiments() if e.name == "longctx"]
    [mlflow_run] = client.search_runs([experiment.experiment_id])
    history = client.get_metric_history(mlflow_run.info.run_id, "fi/fL/4")  # MLflow drops the '@'
    assert [point.step for point in history] == [3, 5]
    artifacts = {a.path for a in client.list_artifacts(mlflow_run.info.run_id, "fi")}
    assert {"fi/fi-step-0000003.npz", "fi/fi-step-0000006.npz", "fi/curve"} <= artifacts
    curve = {a.path for a in client.list_artifacts(mlflow_run.info.run_id, "fi/curve")}
    assert curve == {
        "fi/curve/step-0000003.json",
        "fi/curve/step-0000003.png",
        "fi/curve/step-0000005.json",
        "fi/curve/step-0000005.png",
    }
    assert mlflow_run.data.params["train/max_steps"] == str(STEPS)


def test_progress_bar_counts_optimizer_steps(run):
    _, output = run
    assert f"{STEPS}/{STEPS}" in output and "Epoch" not in output and "24/" not in output  # 4 micro-batches a step


def test_load_from_checkpoint_rebuilds_the_trained_module(run):
    out, _ = run
    module = LanguageModelModule.load_from_checkpoint(out / "checkpoints" / "last.ckpt", map_location="cpu")
    reference = load_model(out / "checkpoints" / "last.ckpt")
    assert module.config.train.max_steps == STEPS and module.config.log.loggers == [
        "wandb",
        "csv",
        "tensorboard",
        "mlflow",
    ]
    for (name, expected), (other, actual) in zip(
        reference.state_dict().items(), module.model.state_dict().items(), strict=True
    ):
        assert name == other and torch.equal(expected, actual)


# --- without a run ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "override,key",
    [
        ("log.loggers=[wandb,neptune]", "log.loggers.1"),
        ("log.loggers=[{class_path: csv, init_arg: {}}]", "log.loggers.0.init_arg"),
        ("train.callbacks=[LearningRateMonitor]", "train.callbacks.0"),
    ],
)
def test_bad_entries_are_config_errors_naming_the_key(override, key):
    with pytest.raises(ConfigError) as error:
        load([], [override])
    assert error.value.key == key


@pytest.mark.parametrize(
    "override,key,message",
    [
        ("log.loggers=[no.such.Logger]", "log.loggers.0", "cannot import"),
        ("log.loggers=[lightning.pytorch.callbacks.LearningRateMonitor]", "log.loggers.0", "is not a"),
        ("log.loggers=[{class_path: csv, init_args: {colour: red}}]", "log.loggers.0", "colour"),
        ("train.callbacks=[lightning.pytorch.loggers.CSVLogger]", "train.callbacks.0", "is not a"),
    ],
)
def test_classes_that_do_not_fit_are_config_errors(tmp_path, override, key, message):
    config = load([], [override, f"train.out_dir={tmp_path}"])
    with pytest.raises(ConfigError, match=message) as error:
        build_callbacks(config) if key.startswith("train") else build_loggers(config)
    assert error.value.key == key


def test_init_args_override_a_named_loggers_defaults(tmp_path):
    config = load([], [f"train.out_dir={tmp_path}", "log.loggers=[{class_path: csv, init_args: {name: mine}}]"])
    [logger] = build_loggers(config)
    assert Path(logger.log_dir) == tmp_path / "mine"


class _Tiny(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)

    def training_step(self, batch, batch_idx):
        return self.layer(batch).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


@pytest.mark.parametrize("bar_class", [RichStepProgressBar, TQDMStepProgressBar])
def test_bar_shows_optimizer_steps_out_of_max_steps(tmp_path, bar_class):
    """3 optimizer steps of 4 micro-batches each: the bar reads 3/3 (Lightning's: 12/3)."""
    bar = bar_class()
    loader = torch.utils.data.DataLoader(torch.randn(64, 2), batch_size=1)
    trainer = L.Trainer(
        max_steps=3,
        accumulate_grad_batches=4,
        callbacks=[bar],
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
    )
    trainer.fit(_Tiny(), loader)
    if bar_class is RichStepProgressBar:
        task = bar.progress.tasks[bar.train_progress_bar_id]
        assert (task.completed, task.total, task.description) == (3, 3, "step")
    else:
        assert (bar.train_progress_bar.n, bar.train_progress_bar.total) == (3, 3)
        assert bar.train_progress_bar.desc.startswith("step")
