"""Config loading: merge order, presets, and one test per class of error."""

import subprocess
import sys
import textwrap

import pytest

from longctx.config import load
from longctx.errors import ConfigError


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text).lstrip())
    return path


def test_merge_order_preset_then_files_then_overrides(tmp_path):
    first = write(
        tmp_path,
        "a.yaml",
        """
        model:
          preset: tiny
          n_layers: 6
        data:
          window: 1024
        train:
          micro_batch_size: 4
          global_batch_tokens: 8192
    """,
    )
    second = write(tmp_path, "b.yaml", "train:\n  lr: 1.0e-3\n")
    cfg = load([first, second], ["train.lr=2e-3", "model.rope_scaling.type=yarn", "model.rope_scaling.factor=2"])
    assert cfg.model.d_model == 256  # from the tiny preset
    assert cfg.model.n_layers == 6  # file beats preset
    assert cfg.train.lr == 2e-3  # override beats file
    assert cfg.model.rope_scaling.type == "yarn" and cfg.model.rope_scaling.factor == 2.0


def test_inherit_layers_a_file_on_its_parents(tmp_path):
    write(tmp_path, "base.yaml", "model:\n  preset: tiny\n  n_layers: 3\ndata:\n  window: 512\n")
    child = write(tmp_path, "child.yaml", "inherit: base.yaml\nmodel:\n  n_layers: 5\n")
    cfg = load([child], ["train.micro_batch_size=1", "train.global_batch_tokens=1024"])
    assert (cfg.model.d_model, cfg.model.n_layers, cfg.data.window) == (256, 5, 512)


def test_inherit_cycle_is_an_error(tmp_path):
    write(tmp_path, "a.yaml", "inherit: b.yaml\n")
    write(tmp_path, "b.yaml", "inherit: a.yaml\n")
    with pytest.raises(ConfigError, match="inherits itself"):
        load([tmp_path / "a.yaml"])


def test_unknown_key_names_file_line_and_suggests(tmp_path):
    path = write(
        tmp_path,
        "bad.yaml",
        """
        model:
          preset: debug
          n_head: 4
    """,
    )
    with pytest.raises(ConfigError, match=rf"model.n_head: unknown key \(at {path}:3\); did you mean model.n_heads\?"):
        load([path])


def test_unknown_section_in_override():
    with pytest.raises(ConfigError, match=r"optim: unknown key \(at override 'optim.lr=1'\)"):
        load([], ["optim.lr=1"])


def test_wrong_type_names_key_and_line(tmp_path):
    path = write(tmp_path, "bad.yaml", "data:\n  doc_mask: true\n  window: lots\n")
    with pytest.raises(ConfigError, match=rf"data.window: .*'lots'.* \(at {path}:3\)"):
        load([path])


@pytest.mark.parametrize(
    "overrides, key, message",
    [
        (["model.d_model=70"], "model.d_model", "not divisible by model.n_heads=4"),
        (["model.d_model=20", "model.n_heads=4"], "model.d_model", "must be even for RoPE"),
        (["model.n_kv_heads=3"], "model.n_kv_heads", "does not divide model.n_heads=4"),
        (["model.n_layers=0"], "model.n_layers", "positive integer"),
        (["data.window=-5"], "data.window", "positive integer"),
        (["data.window=1024"], "data.window", "exceeds model.max_position=512"),
        (
            ["train.micro_batch_size=3", "data.window=512"],
            "train.global_batch_tokens",
            "not a multiple of data.window x train.micro_batch_size",
        ),
        (["train.min_lr=1.0"], "train.min_lr", r"must be in \[0, train.lr"),
        (["train.strategy=deepspeed"], "train.strategy", "is not one of"),
        (["data.packing=greedy"], "data.packing", "is not one of"),
        (["train.loss_kernel=triton"], "train.loss_kernel", "is not one of"),
        (["train.loss_kernel=compiled"], "train.loss_kernel", "set train.loss_chunk_tokens > 0"),
        (["model.attention_backend=fastest"], "model.attention_backend", "is not one of"),
        (["model.rope_scaling.type=ntk", "model.rope_scaling.factor=0.5"], "model.rope_scaling.factor", "must be >= 1"),
        (["eval.niah.pass_threshold=0"], "eval.niah.pass_threshold", r"must be in \(0, 1\]"),
        (["eval.cuda_decoding=cuda-graph"], "eval.cuda_decoding", "is not one of"),
        (["eval.position_method.name=alibi"], "eval.position_method.name", "is not a registered position method"),
        (
            [
                "eval.position_method.name=string",
                "eval.position_method.string.shift=100",
                "eval.position_method.string.local_window=128",
            ],
            "eval.position_method.string.local_window",
            "must be",
        ),
        (["model.preset=gpt2"], "model.preset", "unknown preset 'gpt2'"),
    ],
)
def test_impossible_values_name_the_key_and_source(overrides, key, message):
    with pytest.raises(ConfigError, match=message) as info:
        load([], overrides)
    assert info.value.key == key
    assert "override '" in str(info.value)


def test_decoding_is_eager_unless_a_gpu_path_is_opted_into():
    """graph and kernel stay opt-in until the GPU checklist records a pass of them (config/eval.py)."""
    assert load([], []).eval.cuda_decoding == "eager"
    assert load([], ["eval.cuda_decoding=graph+kernel"]).eval.cuda_decoding == "graph+kernel"


def test_window_defaults_to_the_model_context():
    assert load([], ["model.preset=tiny"]).data.window == 1024


def test_cross_field_error_points_at_the_file_that_set_it(tmp_path):
    path = write(tmp_path, "heads.yaml", "model:\n  preset: debug\n  n_kv_heads: 3\n")
    with pytest.raises(ConfigError, match=rf"\(set at {path}:3\)"):
        load([path])


def test_malformed_yaml_and_missing_file(tmp_path):
    path = write(tmp_path, "broken.yaml", "model: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load([path])
    with pytest.raises(FileNotFoundError, match="nope.yaml not found"):
        load([tmp_path / "nope.yaml"])
    with pytest.raises(ConfigError, match="not of the form key=value"):
        load([], ["train.lr"])


def test_shipped_experiment_files_load():
    from pathlib import Path

    files = sorted(Path("experiments").rglob("*.yaml"))
    assert files, "no experiment YAMLs found"
    for path in files:
        load([path])


def test_override_indexes_a_list_entry(tmp_path):
    path = tmp_path / "mix.yaml"
    path.write_text(
        "data:\n  mixture:\n    - kind: retrieval\n      retrieval:\n        filler_max: 16\n    - path: somewhere\n"
    )
    config = load([path], ["data.mixture.0.retrieval.filler_max=4", "data.mixture.1.weight=2.5"])
    assert config.data.mixture[0].retrieval.filler_max == 4
    assert config.data.mixture[1].weight == 2.5
    assert config.data.mixture[1].path == "somewhere"
    with pytest.raises(ConfigError, match=r"data\.mixture\.2\.weight.*has 2 entries"):
        load([path], ["data.mixture.2.weight=1"])
    with pytest.raises(ConfigError, match=r"nokey"):
        load([path], ["data.mixture.0.nokey=1"])
    with pytest.raises(ConfigError, match=r"data\.window.*not a list"):
        load([path], ["data.window.0=1"])


def test_the_config_command_imports_no_torch():
    """`longctx config` validates a run from the config package alone (no model, no torch)."""
    script = (
        "import sys\n"
        "from longctx.cli import main\n"
        "assert main(['config', 'experiments/pretrain/tiny_1k.yaml', 'train.max_steps=3']) == 0\n"
        "loaded = sorted(name for name in sys.modules if name == 'torch' or name.startswith('longctx.'))\n"
        "print(','.join(loaded), file=sys.stderr)\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert "max_steps: 3" in result.stdout
    loaded = result.stderr.strip().splitlines()[-1].split(",")
    assert "torch" not in loaded
    assert {name.split(".")[1] for name in loaded} <= {"cli", "config", "errors", "runtime"}


def test_every_section_validates_itself_when_built():
    """A bad field fails where the section is constructed, whoever constructs it."""
    from longctx.config import DataConfig, EvalConfig, LogConfig, NiahConfig, ProbeConfig, SftConfig, TrainConfig
    from longctx.config.model import ModelConfig

    for build, key in (
        (lambda: ModelConfig(n_heads=3), "model.d_model"),
        (lambda: DataConfig(packing="rows"), "data.packing"),
        (lambda: TrainConfig(lr=0), "train.lr"),
        (lambda: SftConfig(p=2.0), "sft.p"),
        (lambda: NiahConfig(step=0), "eval.niah.step"),
        (lambda: EvalConfig(device="tpu"), "eval.device"),
        (lambda: ProbeConfig(fi_every_steps=0), "probe.fi_every_steps"),
        (lambda: LogConfig(loggers=["nope"]), "log.loggers.0"),
    ):
        with pytest.raises(ConfigError) as error:
            build()
        assert error.value.key == key
