"""Moved: the effective-length search lives in `longctx.niah.search`."""

raise ImportError(
    "longctx.probes.effective_length moved to longctx.niah.search; "
    "EffectiveLengthConfig is now longctx.config.NiahConfig (the `eval.niah` settings)"
)
