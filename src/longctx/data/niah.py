"""Moved: the NIAH tasks and haystack live in `longctx.niah.tasks`."""

raise ImportError("longctx.data.niah moved to longctx.niah.tasks (the NIAH code is one package: longctx.niah)")
