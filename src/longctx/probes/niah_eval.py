"""Moved: NIAH evaluation of a model lives in `longctx.niah.evaluation`."""

raise ImportError("longctx.probes.niah_eval moved to longctx.niah.evaluation")
