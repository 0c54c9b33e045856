"""The position-method registry: the torch-free specs (longctx.config.methods) and the
builders (longctx.model.position_methods.methods) name the same methods, and every list the
suite keeps of methods is read from them."""

import dataclasses

import pytest

from longctx.config.methods import registry
from longctx.config.position_methods import POSITION_METHODS, PositionMethodConfig, arm_config
from longctx.errors import ConfigError
from longctx.gpu_checks import hf_arms
from longctx.hf_attention.methods import attention_methods, rope_methods
from longctx.model.position_methods.registry import builder_names


def test_every_spec_has_a_builder_and_every_builder_a_spec():
    assert sorted(builder_names()) == sorted(registry.method_names())
    assert registry.in_tree_names() == ("rope", "ntk", "yarn", "rerope", "self_extend", "dca", "string", "dpe")
    assert registry.in_tree_names() == POSITION_METHODS


@pytest.mark.parametrize("name", registry.in_tree_names())
def test_every_parameter_has_a_default_and_a_docstring(name):
    spec = registry.method_spec(name)
    docs = registry.field_docs(spec.params)
    for field in dataclasses.fields(spec.params):
        assert field.default is not dataclasses.MISSING, f"{name}.{field.name}"
        assert len(docs[field.name]) > 10, f"{name}.{field.name} has no docstring"
    spec.params()  # constructible from its defaults


def test_the_derived_lists_are_the_ones_the_suite_kept_by_hand():
    """What gpu_checks.HF_ARMS, hf_attention's attention and rope methods and
    gpu_check_correctness.BAND_METHODS listed before the registry."""
    assert set(attention_methods()) == {"rope", "string", "rerope", "self_extend", "dca", "dpe"}
    assert set(registry.method_names("rope")) == set(rope_methods()) == {"ntk", "yarn"}
    assert set(hf_arms()) == {"rope", "string", "string-repo", "rerope", "self_extend", "dca", "dpe"}
    assert registry.arm_names() == ("string-repo",)


def test_an_arm_presets_its_method_over_the_given_settings():
    config = arm_config(
        "string-repo",
        PositionMethodConfig(name="rope", string=dataclasses.replace(PositionMethodConfig().string, local_window=16)),
    )
    assert config.name == "string" and config.string.compat == "repo" and config.string.local_window == 16
    assert arm_config("rerope") == PositionMethodConfig(name="rerope")
    with pytest.raises(ConfigError, match=r"--methods: 'strnig' is neither a registered position method"):
        arm_config("strnig", key="--methods")


def test_a_taken_name_cannot_be_registered_again():
    spec = registry.method_spec("string")
    with pytest.raises(ValueError, match="'string' is registered already"):
        registry.register_method(dataclasses.replace(spec, summary="another"))
    with pytest.raises(ValueError, match="has no parameters"):
        registry.register_arm("string-x", "string", compat_mode="repo")
    with pytest.raises(ValueError, match="kind 'bands' is not one of"):
        registry.register_method(dataclasses.replace(spec, name="other", kind="bands"))
