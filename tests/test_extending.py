"""docs/extending.md's out-of-tree position method, run as written: it registers with no edit
to longctx and runs by name in the CLI (`longctx methods`, `longctx niah-table` on the tiny
model) and as `longctx_grouped_rope` inside a tiny transformers Llama."""

import itertools
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from longctx.config.model import ModelConfig
from longctx.data.corpus import embedded_documents
from longctx.model.checkpoint import save_model
from longctx.model.llama import Llama

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "extending.md"


def plugin_source() -> str:
    [block] = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.DOTALL)
    return block


@pytest.fixture(scope="module")
def plugin(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("plugin") / "grouped_rope.py"
    path.write_text(plugin_source())
    return path


def run(command: list[str], plugin: Path, cwd: Path) -> str:
    env = dict(os.environ, LONGCTX_PLUGINS=str(plugin), OMP_NUM_THREADS="1", WANDB_MODE="disabled")
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    return done.stdout


def test_the_example_is_at_most_30_lines():
    assert len(plugin_source().strip().splitlines()) <= 30


def test_the_plugin_is_listed_and_runs_in_a_method_table(plugin, tmp_path):
    listed = run([sys.executable, "-m", "longctx", "methods"], plugin, tmp_path)
    assert "grouped_rope  [passes, plugin from grouped_rope]  positions floor-divided by G" in listed
    assert "    group = 2  G: queries and keys sit at floor(position / G)." in listed
    model = tmp_path / "m.safetensors"
    save_model(Llama(ModelConfig.from_preset("debug", max_position=256)), model)
    haystack = tmp_path / "haystack.txt"
    haystack.write_text("\n".join(doc.text for doc in itertools.islice(embedded_documents(("prose",)), 30)))
    settings = [f"eval.niah.haystack={haystack}", "eval.niah.tests_per_length=2", "eval.niah.max_new_tokens=8"]
    settings += ["log.wandb_mode=disabled", "eval.position_method.grouped_rope.group=4"]
    out = tmp_path / "table.md"
    command = [sys.executable, "-m", "longctx", "niah-table", str(model), "--methods", "rope,grouped_rope"]
    run([*command, "--lengths", "128", "--out", str(out), "--quiet", *settings], plugin, tmp_path)
    rows = out.read_text().splitlines()
    assert rows[2].startswith("| rope | ") and rows[3].startswith("| grouped_rope | ") and "n=2" in rows[3]


HF_CHECK = textwrap.dedent(
    """
    import dataclasses, torch, transformers
    from pathlib import Path
    import grouped_rope  # the plugin registers on import
    import longctx.hf_attention as hfa
    from longctx.config.position_methods import PositionMethodConfig
    from longctx.errors import ConfigError
    from longctx.model.hf import import_hf
    from longctx.model.position_methods import build_position_method

    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, initializer_range=0.1)
    transformers.LlamaForCausalLM(config).save_pretrained("llama")
    ids = torch.randint(0, 256, (1, 96))
    hf = transformers.AutoModelForCausalLM.from_pretrained("llama", attn_implementation="longctx_grouped_rope").eval()
    plain = transformers.AutoModelForCausalLM.from_pretrained("llama").eval()
    hfa.apply(hf, "grouped_rope", group=4)
    own = import_hf("llama").eval()
    method = build_position_method(PositionMethodConfig(name="grouped_rope", grouped_rope={"group": 4}), own.config)
    with torch.no_grad():
        got, expected, rope = hf(ids).logits, own(ids, position_method=method), plain(ids).logits
    error = ((got.double() - expected.double()).norm() / expected.double().norm()).item()
    effect = ((rope.double() - expected.double()).norm() / expected.double().norm()).item()
    print(f"error {error:.2e} effect {effect:.2e}")
    assert error < 1e-4 and effect > 1e-3, (error, effect)
    try:
        PositionMethodConfig(name="grouped_rope", grouped_rope={"gruop": 4}).resolved(256)
    except ConfigError as bad:
        print(bad)
    # the lm-eval backend, by name, its parameter as lm-eval's model_args give it
    from longctx.eval.lm_eval import LongctxLM
    from tests.eval.helpers import write_tiny_llama
    lm = LongctxLM(pretrained=str(write_tiny_llama(Path("tiny"))), position_method="grouped_rope",
        **{"grouped_rope.group": "3"})
    print("lm-eval:", lm.position_method.name, lm.position_method.params)
    """
)


def test_a_misspelt_parameter_of_the_plugin_is_an_error_naming_it(plugin, tmp_path):
    command = [sys.executable, "-m", "longctx", "config", "eval.position_method.name=grouped_rope"]
    env = dict(os.environ, LONGCTX_PLUGINS=str(plugin), OMP_NUM_THREADS="1")
    done = subprocess.run(
        [*command, "eval.position_method.grouped_rope.gruop=4"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode != 0
    assert (
        "eval.position_method.grouped_rope.gruop: unknown key (at override 'eval.position_method.grouped_rope.gruop=4');"
        " did you mean eval.position_method.grouped_rope.group?" in done.stderr
    )
    assert "group: 4" in run([*command, "eval.position_method.grouped_rope.group=4"], plugin, tmp_path)


def test_the_plugin_runs_inside_a_transformers_llama_as_longctx_does(plugin, tmp_path):
    """fp32 logits of `longctx_grouped_rope` in transformers within 1e-4 relative L2 of
    longctx's own model with the method (the method itself moves them by > 1e-3); the
    lm-eval backend builds it by name."""
    script = tmp_path / "check.py"
    script.write_text(HF_CHECK)
    paths = [str(plugin.parent), str(ROOT)]
    command = f"import sys; sys.path[:0] = {paths!r}; exec(open({str(script)!r}).read())"
    output = run([sys.executable, "-c", command], plugin, tmp_path)
    assert "error" in output
    assert "eval.position_method.grouped_rope.gruop: unknown key: grouped_rope has parameters ['group']" in output
    assert "lm-eval: grouped_rope {'group': 3}" in output


def test_an_installed_package_registers_through_its_entry_point(plugin, tmp_path):
    """A distribution whose entry point in the `longctx.position_methods` group names the
    module: found with no LONGCTX_PLUGINS and no import by the user."""
    info = tmp_path / "site" / "grouped_rope_plugin-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Name: grouped-rope-plugin\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[longctx.position_methods]\ngrouped_rope = grouped_rope\n")
    (info.parent / "grouped_rope.py").write_text(plugin.read_text())
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(info.parent), os.environ.get("PYTHONPATH", "")]))
    env.pop("LONGCTX_PLUGINS", None)
    command = [sys.executable, "-m", "longctx", "methods"]
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "grouped_rope  [passes, plugin from grouped_rope]" in done.stdout


IN_TREE_SPEC = '''"""Grouped RoPE: every position floor-divided by G."""

from dataclasses import dataclass

from longctx.config.methods.registry import MethodSpec, register_method


@dataclass
class GroupedConfig:
    group: int = 2
    """G: queries and keys sit at floor(position / G)."""


SPEC = register_method(MethodSpec("grouped", GroupedConfig, "passes", "positions floor-divided by G"))
'''
IN_TREE_BUILDER = '''"""Grouped RoPE: every position floor-divided by G."""

import torch

from longctx.model.position_methods import PositionMethod, band_pass, register_builder


@register_builder("grouped")
def build(rotary, group: int) -> PositionMethod:
    def grouped(positions: torch.Tensor) -> torch.Tensor:
        return torch.div(positions, group, rounding_mode="floor")

    return PositionMethod("grouped", rotary, [band_pass("grouped", 0, None, grouped, grouped)], params={"group": group})
'''
IN_TREE_CHECK = textwrap.dedent(
    """
    import torch
    import longctx
    from longctx.config import load
    from longctx.config.methods.registry import in_tree_names, method_spec
    from longctx.model.llama import Llama
    from longctx.model.position_methods import build_position_method

    assert longctx.__file__.startswith(sys.argv[1]), longctx.__file__
    assert "grouped" in in_tree_names() and method_spec("grouped").plugin == ""
    cfg = load([], ["model.preset=debug", "eval.position_method.name=grouped", "eval.position_method.grouped.group=4",
        "eval.arms.g.name=grouped", "eval.arms.g.grouped.group=3"])
    assert cfg.eval.arms["g"].params_of("grouped").group == 3
    model = Llama(cfg.model).eval()
    method = build_position_method(cfg.eval.position_method, cfg.model)
    ids = torch.randint(0, cfg.model.vocab_size, (1, 64))
    with torch.no_grad():
        effect = (model(ids, position_method=method) - model(ids)).abs().max().item()
    print("grouped", method.params, effect > 1e-4)
    """
)


def test_an_in_tree_method_is_its_spec_and_its_builder(tmp_path):
    """A copy of longctx with two files added, the new method's spec and its builder, and no
    other edit: the method is in-tree, its parameters are `eval.position_method.<name>.<field>`
    (and under an arm), and it builds and moves the model's logits."""
    package = tmp_path / "src" / "longctx"
    shutil.copytree(ROOT / "src" / "longctx", package, ignore=shutil.ignore_patterns("__pycache__"))
    (package / "config" / "methods" / "grouped.py").write_text(IN_TREE_SPEC)
    (package / "model" / "position_methods" / "methods" / "grouped.py").write_text(IN_TREE_BUILDER)
    script = tmp_path / "check.py"
    script.write_text("import sys\n" + IN_TREE_CHECK)
    env = dict(os.environ, PYTHONPATH=str(package.parent), OMP_NUM_THREADS="1")
    env.pop("LONGCTX_PLUGINS", None)
    command = [sys.executable, str(script), str(package)]
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "grouped {'group': 4} True" in done.stdout
