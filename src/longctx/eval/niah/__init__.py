"""The needle-in-a-haystack test as a task of the evaluation engine (STRING §3, docs/design.md §7.2).

    longctx niah runs/tiny_1k/checkpoints/last.ckpt eval.niah.tests_per_length=50
    longctx niah CKPT --lengths 4096,8192 eval.position_method.name=string

- benchmark.py: the registry's spec (eval/registry.py): the variants as tasks, the default;
- needles.py: each task's wording, how its needles are drawn and when a test passes;
- haystack.py: the text the needles go into (Paul Graham essays by default), tokenised once;
- generator.py: prompts of an exact token length built from those two;
- scoring.py: which answers an output holds;
- engine_task.py: `NiahTask`, those samples and scores as an engine task (eval/task.py);
- evaluation.py: `longctx niah` on a checkpoint: the effective-length search
  (eval/effective_length.py) over the task's cells, its niah.json, heatmap and W&B run;
- table.py: STRING Table 1 / Table 4 (`longctx niah-table`), every position method on every
  checkpoint as a grid of cells.

Settings: `longctx.config.NiahConfig`, the `eval.niah` config section.
"""
