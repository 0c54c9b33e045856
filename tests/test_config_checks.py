"""The shared field checks (config/checks.py), each through a section that uses it: the
error names the key, the bound (and what 0 means, where it means something) and the value."""

import pytest

from longctx.config.checks import above, at_least, boolean
from longctx.config.eval import EvalConfig, NiahConfig
from longctx.config.linear_attention import LinearAttention
from longctx.config.loader import load
from longctx.config.model import ModelConfig
from longctx.errors import ConfigError


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: EvalConfig(threads=-1), "eval.threads: must be >= 0, got -1"),
        (
            lambda: NiahConfig(prefill_chunk_tokens=-2),
            "eval.niah.prefill_chunk_tokens: must be >= 0 (0 = unchunked), got -2",
        ),
        (lambda: ModelConfig.from_preset("debug", norm_offset=1), "model.norm_offset: must be true or false, got 1"),
        (
            lambda: LinearAttention(allow_neg_eigval="yes").validate(),
            "model.linear_attention.allow_neg_eigval: must be true or false, got 'yes'",
        ),
        (
            lambda: load(overrides=["data.mixture=[{path: x, weight: 0}]"]),
            "data.mixture.0.weight: must be > 0, got 0.0",
        ),
    ],
)
def test_a_section_refuses_with_the_key_bound_and_value(build, message):
    with pytest.raises(ConfigError) as error:
        build()
    assert str(error.value).startswith(message)


def test_the_bounds_are_inclusive_or_strict_as_named():
    at_least("k", 0, 0)  # the bound itself passes
    above("k", 1, 0)
    boolean("k", False)
    with pytest.raises(ConfigError, match=r"^k: must be >= 1, got 0$"):
        at_least("k", 0, 1)
    with pytest.raises(ConfigError, match=r"^k: must be > 0, got 0$"):
        above("k", 0, 0)
    with pytest.raises(ConfigError, match=r"^k: must be true or false, got 0$"):
        boolean("k", 0)
