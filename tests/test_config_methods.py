"""One spelling for every position method's parameters, `eval.position_method.<name>.<field>`
(and `eval.arms.<arm>.<name>.<field>`), in-tree and registered later alike, with the fields,
defaults and checks of the method's spec; the `params.<name>.<field>` spelling loads to the
same settings; the transformers rope equivalents come from the specs."""

import dataclasses
import pickle
import warnings
from dataclasses import dataclass

import pytest

from longctx.config import as_dict, from_dict, load, to_yaml
from longctx.config.methods import registry
from longctx.config.position_methods import PositionMethodConfig
from longctx.errors import ConfigError
from longctx.hf_attention.methods import rope_methods


@dataclass
class ProbeConfig:
    alpha: int = 2
    """A parameter of a method registered from outside longctx."""
    beta: float = 0.5
    """Another."""


@pytest.fixture
def probe():
    """A method registered after longctx's own (as a plugin is), removed afterwards."""
    spec = registry.MethodSpec("probe", ProbeConfig, "passes", "a test method", plugin="tests")
    registry.register_method(spec)
    yield spec
    del registry._METHODS[spec.name]


def quiet_load(overrides: list[str], paths: tuple = ()):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the new spelling gives no notice
        return load(list(paths), overrides)


def test_an_in_tree_method_is_set_read_and_written_under_its_name():
    cfg = quiet_load(["eval.position_method.name=string", "eval.position_method.string.local_window=32"])
    assert cfg.eval.position_method.params_of("string").local_window == 32
    assert as_dict(cfg)["eval"]["position_method"]["string"]["local_window"] == 32
    assert "params" not in as_dict(cfg)["eval"]["position_method"]
    assert cfg.eval.position_method.resolved(1024) == {"shift": 341, "local_window": 32, "compat": "paper"}


def test_a_method_registered_later_has_the_same_spelling(probe):
    cfg = quiet_load(
        [
            "eval.position_method.name=probe",
            "eval.position_method.probe.alpha=7",
            "eval.arms.p.name=probe",
            "eval.arms.p.probe.beta=1.5",
            "eval.out_dir=runs/A${eval.position_method.probe.alpha}",
        ]
    )
    assert cfg.eval.position_method.params_of("probe") == ProbeConfig(alpha=7)
    assert cfg.eval.arms["p"].params_of("probe") == ProbeConfig(beta=1.5)
    assert as_dict(cfg)["eval"]["position_method"]["probe"] == {"alpha": 7, "beta": 0.5}
    assert "  probe:\n      alpha: 7" in to_yaml(cfg) and cfg.eval.out_dir == "runs/A7"
    assert cfg.eval.position_method.resolved(1024) == {"alpha": 7, "beta": 0.5}
    assert from_dict(as_dict(cfg)) == cfg


def test_the_params_spelling_loads_to_the_same_settings_with_a_notice(probe, tmp_path):
    new = quiet_load(["eval.position_method.name=probe", "eval.position_method.probe.alpha=7", "eval.arms.p.name=dca"])
    overrides = ["eval.position_method.name=probe", "eval.position_method.params.probe.alpha=7", "eval.arms.p.name=dca"]
    with pytest.warns(
        FutureWarning, match=r"eval.position_method.params.probe.<field> .* read as eval.position_method"
    ):
        assert load([], overrides) == new
    old_yaml = tmp_path / "old.yaml"
    old_yaml.write_text("eval:\n  arms:\n    a:\n      name: probe\n      params:\n        probe: {alpha: 3}\n")
    with pytest.warns(FutureWarning, match=rf"eval.arms.a.params.probe.<field> \(at {old_yaml}:6\)"):
        assert load([old_yaml]).eval.arms["a"] == PositionMethodConfig(name="probe", probe=ProbeConfig(alpha=3))
    old_yaml.write_text("eval:\n  position_method:\n    params:\n      probe: {alpah: 3}\n")
    with pytest.warns(FutureWarning), pytest.raises(ConfigError) as error:
        load([old_yaml])
    assert str(error.value).startswith(f"eval.position_method.probe.alpah: unknown key (at {old_yaml}:")


def test_a_checkpoint_with_the_params_spelling_loads_to_the_same_config(probe):
    cfg = quiet_load(["eval.position_method.name=probe", "eval.position_method.probe.alpha=7"])
    stored = as_dict(cfg)
    section = stored["eval"]["position_method"]
    section["params"] = {"probe": section.pop("probe")}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a checkpoint is not the user's to rewrite: no notice
        assert from_dict(stored) == cfg
    assert "probe" not in stored["eval"]["position_method"], "from_dict must not edit its argument"


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("eval.position_method.string.local_widnow=3", "eval.position_method.string.local_widnow"),
        ("eval.position_method.probe.alpah=3", "eval.position_method.probe.alpah"),
        ("eval.arms.x.probe.alpah=3", "eval.arms.x.probe.alpah"),
        ("eval.position_method.strnig.shift=3", "eval.position_method.strnig"),
    ],
)
def test_an_unknown_field_is_an_error_naming_its_key_and_where_it_was_set(probe, override, key):
    with pytest.raises(ConfigError) as error:
        load([], [override])
    assert error.value.key == key and f"unknown key (at override '{override}')" in str(error.value)


def test_sections_set_from_python_are_checked_and_compare_by_value(probe):
    assert PositionMethodConfig(name="probe", probe={"alpha": 4}).params_of("probe") == ProbeConfig(alpha=4)
    with pytest.raises(ConfigError, match=r"eval.position_method.probe.gamma: unknown key: probe has parameters"):
        PositionMethodConfig(name="probe", probe={"gamma": 4})
    with pytest.raises(ConfigError, match=r"eval.position_method.probe.gamma: unknown key"):
        PositionMethodConfig().with_params("probe", {"gamma": 4})
    config = PositionMethodConfig().with_params("probe", {"alpha": 9})
    assert pickle.loads(pickle.dumps(config)) == config and config != PositionMethodConfig(name="probe")


def test_a_config_made_before_a_method_registered_reads_its_defaults():
    before = PositionMethodConfig(name="dca")
    spec = registry.register_method(registry.MethodSpec("late_probe", ProbeConfig, "passes", "late"))
    try:
        assert before.params_of("late_probe") == ProbeConfig()
        assert before == PositionMethodConfig(name="dca")
        assert before.with_params("late_probe", {"alpha": 5}).params_of("late_probe").alpha == 5
    finally:
        del registry._METHODS[spec.name]


def test_a_method_name_that_is_a_key_of_the_section_is_refused():
    spec = registry.register_method(registry.MethodSpec("settings", ProbeConfig, "passes", "clashes"))
    try:
        with pytest.raises(ValueError, match=r"\['settings'\]: the names are taken"):
            PositionMethodConfig()
    finally:
        del registry._METHODS[spec.name]


def test_the_transformers_rope_methods_are_the_specs_with_an_equivalent():
    assert rope_methods() == ("ntk", "yarn")
    rope = {"rope_type": "default", "rope_theta": 10000.0}
    assert registry.method_spec("ntk").hf_rope(rope, {"factor": 2.0}, 64) == {
        "rope_type": "default",
        "rope_theta": 10000.0 * 2.0 ** (64 / 62),
    }
    resolved = {"factor": 1.5, "original_max_position": 2731, "beta_fast": 32.0, "beta_slow": 1.0}
    yarn = registry.method_spec("yarn").hf_rope({**rope, "partial_rotary_factor": 0.5}, resolved, 32)
    assert yarn["rope_type"] == "yarn" and yarn["original_max_position_embeddings"] == 2731
    assert yarn["partial_rotary_factor"] == 0.5
    spec = registry.MethodSpec("rope_probe", ProbeConfig, "rope", "no transformers equivalent")
    registry.register_method(spec)
    try:
        assert "rope_probe" not in rope_methods()
        registry._METHODS[spec.name] = dataclasses.replace(spec, hf_rope=lambda parameters, resolved, d: parameters)
        assert rope_methods() == ("ntk", "yarn", "rope_probe")
    finally:
        del registry._METHODS[spec.name]
