"""Moved: multi-pass attention lives in the `longctx.model.position_methods` package."""

raise ImportError(
    "longctx.model.attention_passes moved into the longctx.model.position_methods package "
    "(plan: the passes and their layout; cpu and gpu: the kernels)"
)
