"""Modules that moved in the NIAH package redesign fail on import with their new name."""

import importlib

import pytest


@pytest.mark.parametrize(
    "old,new",
    [
        ("longctx.data.niah", "longctx.niah.tasks"),
        ("longctx.probes.effective_length", "longctx.niah.search"),
        ("longctx.probes.niah_eval", "longctx.niah.evaluation"),
    ],
)
def test_old_module_names_point_to_the_new_ones(old, new):
    with pytest.raises(ImportError, match=new.replace(".", r"\.")):
        importlib.import_module(old)
    importlib.import_module(new)


def test_old_niah_config_keys_name_their_new_spelling():
    from longctx.config import ConfigError, load

    for old, new in (
        ("eval.niah_tests_per_length=5", "eval.niah.tests_per_length"),
        ("eval.pass_threshold=0.4", "eval.niah.pass_threshold"),
    ):
        with pytest.raises(ConfigError, match=f"renamed to {new}"):
            load([], [old])
