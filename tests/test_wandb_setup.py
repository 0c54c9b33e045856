"""wandb_setup: the online/offline rule and the runs it refuses to start."""

import pytest

from longctx.config import load
from longctx.wandb_setup import make_wandb_logger, resolve_wandb_mode, start_run


def test_auto_is_online_only_with_a_key(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    assert resolve_wandb_mode("auto") == "offline"
    (tmp_path / ".netrc").write_text("machine api.wandb.ai\n  login user\n  password secret\n")
    (tmp_path / ".netrc").chmod(0o600)
    assert resolve_wandb_mode("auto") == "online"
    (tmp_path / ".netrc").unlink()
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    assert resolve_wandb_mode("auto") == "online"
    assert [resolve_wandb_mode(mode) for mode in ("online", "offline", "disabled")] == ["online", "offline", "disabled"]


def test_disabled_starts_no_logger_and_no_run(tmp_path):
    config = load([], ["log.wandb_mode=disabled", f"train.out_dir={tmp_path / 'run'}"])
    assert make_wandb_logger(config) is None
    assert start_run(config, job="niah", out_dir=tmp_path / "eval") is None
    assert not (tmp_path / "run").exists() and not (tmp_path / "eval").exists()


def test_disabled_evaluations_log_nothing_and_need_no_wandb(monkeypatch, tmp_path):
    """With log.wandb_mode=disabled the evaluations' W&B steps return before importing wandb:
    the GPU image has none (a None entry in sys.modules makes `import wandb` raise)."""
    import sys

    from longctx.eval.niah.evaluation import log_to_wandb
    from longctx.eval.niah.table import log_table
    from longctx.eval.suite_table import log_suite

    monkeypatch.setitem(sys.modules, "wandb", None)
    config = load([], ["log.wandb_mode=disabled"])
    log_to_wandb(None, config, tmp_path / "heatmap.png", "niah", tmp_path)  # type: ignore[arg-type]
    log_table(config, {}, [], ["rope"], tmp_path)
    log_suite(config, {}, [], tmp_path)
    assert not any(tmp_path.iterdir())
    monkeypatch.setattr("longctx.wandb_setup.resolve_wandb_mode", lambda mode: "offline")
    with pytest.raises(ImportError):  # enabled, it does import wandb (missing here)
        log_suite(config, {}, [], tmp_path)
