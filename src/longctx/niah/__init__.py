"""The needle-in-a-haystack test of effective context length (STRING §3, docs/design.md §7.2).

    longctx niah runs/tiny_1k/checkpoints/last.ckpt eval.niah.tests_per_length=50
    longctx niah CKPT --lengths 4096,8192 eval.position_method.name=string

- `tasks`: the prompts (4 needles in Paul Graham essays, RULER and HELMET variants), built
  to an exact token length, and their scoring; `haystack` (the essays' text) and `words`
  (RULER's keys and word values) are its inputs.
- `search`: the effective-length search (pass rate per length with Wilson intervals, stop
  at the first failing length) and the depth x length heatmap; any `generate()` works.
- `evaluation`: a `Llama` checkpoint under a position method, as the CLI, the in-training
  probe and NIAH after SFT run it; STRING Table 1 across methods.

Settings: `longctx.config.NiahConfig`, the `eval.niah` config section.
"""
