"""Modules and names that moved in the redesign fail with their new name."""

import importlib

import pytest


@pytest.mark.parametrize(
    "old,new",
    [
        ("longctx.data.niah", "longctx.niah.tasks"),
        ("longctx.probes.effective_length", "longctx.niah.search"),
        ("longctx.probes.niah_eval", "longctx.niah.evaluation"),
        ("longctx.model.attention_passes", "longctx.model.position_methods"),
    ],
)
def test_old_module_names_point_to_the_new_ones(old, new):
    with pytest.raises(ImportError, match=new.replace(".", r"\.")):
        importlib.import_module(old)
    importlib.import_module(new)


def test_the_replaced_round_robin_names_its_successor():
    import longctx.data.packing

    with pytest.raises(AttributeError, match=r"replaced by Mixture\(weights\)\.locate"):
        longctx.data.packing.weighted_round_robin  # noqa: B018
