"""Serverless local sweep runner: a W&B sweep YAML's grid or random search, no W&B server.

    longctx sweep sweeps/probe_window_cpu.yaml --dry-run          # the numbered commands only
    longctx sweep sweeps/probe_window_cpu.yaml                    # run the 4 grid points in turn
    longctx sweep sweeps/skipalign.yaml --count 6 --keep-going    # first 6 points, past failures
    longctx sweep SWEEP.yaml --count 20 --seed 1                  # method: random, 20 draws
    longctx sweep sweeps/replicate_cpu.yaml --jobs 2              # two points at a time

    from longctx.sweep import load_sweep, plan, run
    sweep = load_sweep("sweeps/probe_window_cpu.yaml")
    exit_code = run(sweep, plan(sweep), sweep.default_summary())

This module owns reading the sweep YAML (every error names the file and the key at
fault), turning its `parameters` into points, expanding `command` into one argv per
point, and running the points, one or `--jobs N` at a time. It mirrors what `wandb sweep` +
`wandb agent` do with the same file:

- `method: grid` is the cartesian product of the parameters in W&B's order: parameter
  names sorted (as W&B's engine sorts them), the last name varying fastest, and each
  distinct point once (values that hash alike in W&B, like 7 and 7.0, are one).
  `value`/`values`, `int_uniform` (every integer in [min, max]) and `q_uniform` (W&B's
  `numpy.arange(min, max, q)`: from min in steps of q, max excluded) are enumerable. `--count N` keeps the first N, `run_cap` caps the points as it caps
  W&B's runs, and the arguments of each point are in the same sorted order.
- `method: random` draws `--count` points (the agent's `--count`; W&B's own random search
  never ends) from `random.Random(--seed)`, parameter by parameter in sorted order, so a
  seed gives the same points on every machine. Specs as W&B defines them: `value`,
  `values` (uniform choice, or weighted by `probabilities`), and `distribution:`
  constant | categorical | uniform | int_uniform (max inclusive) | log_uniform_values
  (uniform in log space) | q_uniform (round(X / q) * q), with `min`/`max`/`q`. A spec
  with only `min`/`max` is int_uniform when both are integers, else uniform, as W&B infers.
- `command` macros expand as the agent expands them: `${args}` -> `--key=value`,
  `${args_no_hyphens}` -> `key=value`, `${args_json}` -> one JSON argument,
  `${args_no_equals}`, `${args_no_boolean_flags}`, `${args_append_hydra}`,
  `${args_override_hydra}`, `${program}` -> the `program` key, `${envvar:NAME}` -> $NAME,
  and no `command` means `${env} ${interpreter} ${program} ${args}`. Each run gets
  WANDB_RUN_GROUP=<sweep name> (the YAML's `name`, else the file stem) so W&B groups its
  runs, and LONGCTX_SWEEP_POINT=<index>.

Deliberate differences: `${interpreter}` is the running interpreter (`sys.executable`,
the venv's python) rather than W&B's literal `python`, so the venv need not be active;
`${env}` (W&B: /usr/bin/env, which only runs the next word) is dropped; values are written
as OmegaConf reads them back (booleans `true`/`false`, None `null`, lists and dicts as
JSON) where the agent writes Python's str() (`True`, `['a']`); q_uniform draws are kept
inside [min, max] (W&B's rounding can step one q outside when min or max is not a
multiple of q); a whole-word macro W&B does not define (`${typo}`) is an error, where the
agent silently drops it. Every top-level key of W&B's sweep schema is accepted; those
that only a W&B server or Launch acts on (SERVER_KEYS: `controller`, `early_terminate`,
`scheduler`, `job`, ...) are ignored with a note, so every point runs to its end. Each
run gets WANDB_PROJECT / WANDB_ENTITY from `project` / `entity`, as under the agent. Not
done: `bayes` and `custom` (their models live on the W&B server: use `wandb sweep` +
`wandb agent`), nested `parameters`, the distributions of other
families (normal, beta, log_uniform in exponent space, ...) and `${args_json_file}`.
Points run as fresh subprocesses, one at a time or `--jobs N` at a time (N local agents on
one machine). A fresh process costs the child's start-up per point (importing torch and
Lightning: seconds), small next to a training run, and buys isolation (CUDA state,
Lightning globals and memory are released between points). With `--jobs N` each child
gets 1/N of the CPUs as OMP_NUM_THREADS unless the caller set it: on the 2-core CPU
machine two one-thread replication runs side by side each keep the speed of one alone
(4.2 steps/s, docs/replication.md, "Runtime"), so `--jobs 2` halves a sweep's time.

Each point's output streams to the console (with `--jobs N` > 1, to
`<summary dir>/point-<index>.log`). The runner launches no further point after the first
failing one unless `--keep-going` is given, and appends one JSON line per point as it
ends (index, arguments, command, returncode, seconds, signal, and the log with `--jobs`)
to `runs/sweeps/<name>/summary.jsonl` (or `--summary`). Ctrl-C / SIGTERM is forwarded to
every running child's process group (each child runs in its own group, as under the
agent, so a terminal Ctrl-C reaches it once), the children are waited for and recorded,
and the sweep stops. Exit status: 0 when every run
succeeded, 1 when a run failed, 128 + signal number when interrupted (the CLI adds 2 for
an invalid sweep file).
"""

from longctx.sweep.runner import expand_command, plan, run
from longctx.sweep.spec import Parameter, Point, Sweep, SweepError, format_value, load_sweep

__all__ = ["Parameter", "Point", "Sweep", "SweepError", "expand_command", "format_value", "load_sweep", "plan", "run"]
