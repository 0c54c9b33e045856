"""The benchmark registry: one `BenchmarkSpec` per benchmark, under the name
`longctx eval-suite --suite` takes.

A benchmark is one folder of longctx/eval/, always of the same shape:

    <name>/__init__.py      what it is: the paper, the reference code, the files below
    <name>/benchmark.py     SPEC = register_benchmark(BenchmarkSpec(...)): its tasks and
                            their categories, which run by default, the builder of its
                            engine tasks, its prediction-file scorer, its table's hooks
    <name>/generator.py     samples for (seed, task, length, index) in the model's tokenizer
    <name>/engine_task.py   the samples and the scorer as engine tasks (eval/task.py),
                            named `<name>-<task>`
    <name>/scoring.py       the reference metric

A folder's code imports its own folder and the generic modules of eval/ (the engine,
eval/prompt_frame.py, eval/prompt_pieces.py, eval/essays.py, eval/errors.py), never another
benchmark's folder, and no generic module imports a benchmark folder (tests/eval/test_registry.py
checks both): a benchmark comes and goes with its folder. benchmark.py imports no torch (its
builder imports engine_task.py when called), so `longctx eval-score`, `longctx benchmarks`
and the `--suite` choices read the registry without loading the model code.

Every list of benchmark and task names is read from here: `eval-suite --suite` and
`--tasks`, `eval-score --task`, the task that `longctx niah` and `niah-table` run for
`eval.niah.task=<name>-<task>` (ruler-niah_multikey_1), the table's mean and effective
length. In-tree folders are found by their package (each subpackage of longctx.eval with
a benchmark.py); a module of one's own registers with `register_benchmark` and is loaded
when named in LONGCTX_PLUGINS (the loader of the position-method plugins,
longctx.config.methods.registry).

Categories: a benchmark's tasks may be grouped (RULER's five families; a family of data
sets such as HELMET's recall, RAG, re-ranking and many-shot ICL), and `--tasks` takes a
category for all of its tasks.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from longctx.errors import ConfigError

if TYPE_CHECKING:
    from longctx.config import ExperimentConfig
    from longctx.eval.task import Task

TaskBuilder = Callable[[list[str], "ExperimentConfig", Any], list["Task"]]
"""(task names, checked and in the order asked, the config, the NIAH haystack the caller
loaded for eval.niah or None) -> the engine tasks, one per name."""
FileReader = Callable[[str], tuple[list[str], list[list]]]
"""(path) -> (predictions, references per prediction): a benchmark's own output format."""
FileScorer = Callable[[str, list[str], list[list], Mapping[str, str]], "float | dict[str, Any]"]
"""(task, predictions, references per prediction, options such as eval-score's `compat`,
`nli`, `judge`) -> the task's score, 0-100, or {"score": ..., other metrics beside it}."""
NAME = re.compile(r"[a-z0-9_]+")
"""A benchmark's name: engine task names are `<name>-<task>`, split at the first '-'."""


@dataclass(frozen=True)
class BenchmarkSpec:
    name: str
    """`--suite <name>`; its folder's name, for an in-tree benchmark."""
    summary: str
    """One line for `longctx benchmarks`: what it measures, and its paper."""
    tasks: Mapping[str, str]
    """Every task name (what `--tasks` and `eval-score --task` take), to its category
    ('' = none), in the order tables list them."""
    build: TaskBuilder
    """Its engine tasks (`TaskBuilder`)."""
    defaults: Callable[[ExperimentConfig], list[str]] | None = None
    """The tasks that run without `--tasks` (RULER's qa_1/qa_2 only with their data files,
    NIAH's eval.niah.task); None = every task. Not checked against `tasks`: the builder
    refuses a configured name with its own config key."""
    score_file: FileScorer | None = None
    """How `longctx eval-score --task` scores a prediction file of its tasks; None = it
    scores none."""
    read_file: FileReader | None = None
    """How `eval-score` reads a prediction file of its tasks (HELMET: its eval.py's JSON);
    None = RULER's prediction lines (eval/predictions.py)."""
    category_means: bool = False
    """eval-suite's table adds the mean of each category that ran (HELMET reports category
    averages)."""
    mean_name: Callable[[list[str]], str] | None = None
    """The name of the mean over the tasks that ran (RULER: "RULER" only for all 13);
    None = "<name> mean (k tasks)"."""
    effective_length: Callable[[dict[int, float]], int | None] | None = None
    """A method's effective length from its mean by length (RULER: the largest length above
    85.6); None = the table has no such column."""
    table_keeps_prefix: bool = False
    """eval-suite's columns name a task without `<name>-` (`vt`), or whole (NIAH: `niah-paper`)."""
    order: int = 100
    """Place in listings (in-tree: the order of STRING's tables)."""

    @property
    def origin(self) -> str:
        """The module its builder is defined in: `longctx.eval.<name>.benchmark` in-tree, a
        plugin's own module otherwise."""
        return getattr(self.build, "__module__", None) or ""

    @property
    def in_tree(self) -> bool:
        return self.origin.startswith(f"{__package__}.")

    def categories(self) -> dict[str, list[str]]:
        """{category: its tasks}, for the categories that have a name."""
        grouped: dict[str, list[str]] = {}
        for task, category in self.tasks.items():
            if category:
                grouped.setdefault(category, []).append(task)
        return grouped

    def engine_name(self, task: str) -> str:
        """The engine task's name of `task`: its cells' directory, `eval.niah.task`'s value."""
        return f"{self.name}-{task}"

    def owner_task(self, engine_name: str) -> str:
        """The task of the engine task `engine_name` (`<name>-<task>`)."""
        return engine_name.removeprefix(f"{self.name}-")

    def column(self, engine_name: str) -> str:
        """How eval-suite's table names the engine task `engine_name`."""
        return engine_name if self.table_keeps_prefix else engine_name.removeprefix(f"{self.name}-")

    def select(self, names: Sequence[str], key: str = "--tasks") -> list[str]:
        """Task names from task and category names (a category: its tasks), in the order
        given, each once; ConfigError naming `key`, the tasks and the categories for an
        unknown one."""
        grouped = self.categories()
        chosen: list[str] = []
        for name in names:
            if name not in self.tasks and name not in grouped:
                also = f"; its categories: {sorted(grouped)}" if grouped else ""
                raise ConfigError(key, f"{name!r} is not a task of {self.name}; its tasks: {list(self.tasks)}{also}")
            chosen += [task for task in grouped.get(name, [name]) if task not in chosen]
        return chosen

    def engine_tasks(
        self, names: Sequence[str] | None, config: ExperimentConfig, haystack: Any = None, key: str = "--tasks"
    ) -> list[Task]:
        """The engine tasks of `names` (tasks or categories, checked: `select`), or of its
        defaults when None."""
        if names is None:
            chosen = self.defaults(config) if self.defaults else list(self.tasks)
        else:
            chosen = self.select(names, key)
        return self.build(chosen, config, haystack)


_BENCHMARKS: dict[str, BenchmarkSpec] = {}
_LOADED = {"in_tree": False, "plugins": False}


def register_benchmark(spec: BenchmarkSpec) -> BenchmarkSpec:
    """Add a benchmark. Refused: a taken name (a plugin cannot shadow an in-tree benchmark
    silently), a name engine task names could not be split at, a category that is also a
    task's name, and a task name that another benchmark scores prediction files of
    (`eval-score --task` finds the benchmark by the task alone)."""
    if not NAME.fullmatch(spec.name):
        raise ValueError(f"benchmark {spec.name!r}: a name is lower-case letters, digits and '_' ({NAME.pattern})")
    taken = _BENCHMARKS.get(spec.name)
    if taken is not None and taken != spec:
        raise ValueError(f"benchmark {spec.name!r} is registered already")
    if not spec.tasks:
        raise ValueError(f"benchmark {spec.name!r} has no tasks")
    clash = sorted(set(spec.categories()) & set(spec.tasks))
    if clash:
        raise ValueError(f"benchmark {spec.name!r}: {clash} name both a category and a task")
    if spec.score_file is not None:
        for other in _BENCHMARKS.values():
            shared = sorted(set(other.tasks) & set(spec.tasks))
            if other.name != spec.name and other.score_file is not None and shared:
                raise ValueError(
                    f"benchmark {spec.name!r}: tasks {shared} are {other.name}'s, whose prediction files "
                    "eval-score --task scores by the task name alone"
                )
    _BENCHMARKS[spec.name] = spec
    return spec


def _load_in_tree() -> None:
    if _LOADED["in_tree"]:
        return
    _LOADED["in_tree"] = True
    here = Path(__file__).parent
    for module in pkgutil.iter_modules([str(here)]):
        if module.ispkg and (here / module.name / "benchmark.py").is_file():
            importlib.import_module(f"{__package__}.{module.name}.benchmark")


def load_benchmarks() -> None:
    """The in-tree benchmarks, then (once) the modules named in LONGCTX_PLUGINS."""
    _load_in_tree()
    if _LOADED["plugins"]:
        return
    _LOADED["plugins"] = True
    from longctx.config.methods.registry import load_plugins

    load_plugins()


def benchmark_names() -> tuple[str, ...]:
    """Registered benchmark names (in-tree first, in their order)."""
    load_benchmarks()
    return tuple(spec.name for spec in sorted(_BENCHMARKS.values(), key=lambda spec: spec.order))


def benchmark_spec(name: str, key: str = "--suite") -> BenchmarkSpec:
    """The spec of `name`; ConfigError naming `key` and the registered names if unknown."""
    load_benchmarks()
    if name not in _BENCHMARKS:
        raise ConfigError(key, f"{name!r} is not a registered benchmark; registered: {list(benchmark_names())}")
    return _BENCHMARKS[name]


def in_tree_names() -> tuple[str, ...]:
    _load_in_tree()
    return tuple(spec.name for spec in sorted(_BENCHMARKS.values(), key=lambda spec: spec.order) if spec.in_tree)


def scored_tasks() -> dict[str, list[str]]:
    """{benchmark: its tasks} of the benchmarks that score prediction files."""
    return {name: list(spec.tasks) for name in benchmark_names() if (spec := _BENCHMARKS[name]).score_file is not None}


def scored_task(task: str, key: str = "--task") -> tuple[BenchmarkSpec, str]:
    """(the benchmark that scores prediction files of `task`, the task's own name): `task`
    is a task's name, or `<benchmark>-<task>` / `<benchmark>_<task>` (helmet_nq); ConfigError
    naming `key` and every such task if none does."""
    for name in benchmark_names():
        spec = _BENCHMARKS[name]
        if spec.score_file is None:
            continue
        if task in spec.tasks:
            return spec, task
        for joint in ("-", "_"):
            short = task.removeprefix(f"{name}{joint}")
            if short != task and short in spec.tasks:
                return spec, short
    listing = "; ".join(f"{name}: {tasks}" for name, tasks in scored_tasks().items())
    raise ConfigError(key, f"{task!r} is not a task of a benchmark that scores prediction files ({listing})")


def owner_of(engine_name: str) -> tuple[BenchmarkSpec, str] | None:
    """(the benchmark, the task) an engine task name `<name>-<task>` belongs to (ruler-vt:
    RULER's vt), whether or not `<task>` is one of its tasks (`engine_tasks` refuses an
    unknown one); None when no registered benchmark is called `<name>`."""
    name, dash, task = engine_name.partition("-")
    load_benchmarks()
    if not dash or name not in _BENCHMARKS:
        return None
    return _BENCHMARKS[name], task
