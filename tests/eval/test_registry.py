"""The benchmark registry (longctx.eval.registry): it lists every benchmark folder, every
name the CLI takes comes from it, unknown names are errors that list the registered ones,
and the folders stay apart (no generic module of eval/ imports a benchmark's, no benchmark
imports another's)."""

import argparse
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from longctx.cli import build_parser, main
from longctx.config import ExperimentConfig
from longctx.errors import ConfigError
from longctx.eval import registry
from longctx.eval.suite_table import suite_tasks
from tests.test_layers import SOURCE, import_graph

EVAL = SOURCE / "eval"
SHAPE = ("__init__.py", "benchmark.py", "generator.py", "engine_task.py", "scoring.py")
"""The files of every benchmark folder (registry.py's docstring)."""


def benchmark_folders(root: Path = EVAL) -> set[str]:
    return {path.parent.name for path in root.glob("*/benchmark.py")}


@pytest.fixture
def scratch_registry():
    """Benchmarks registered inside a test are gone after it."""
    registry.load_benchmarks()
    saved = dict(registry._BENCHMARKS)
    yield registry
    registry._BENCHMARKS.clear()
    registry._BENCHMARKS.update(saved)


def toy_spec(name="toy", **fields):
    def build(names, config, haystack):
        return []

    values = {"tasks": {"alpha": "greek", "beta": "greek", "one": "number"}, "build": build, **fields}
    return registry.BenchmarkSpec(name, "a toy", **values)


def test_the_registry_lists_every_benchmark_folder():
    assert registry.in_tree_names() == ("ruler", "infinitebench", "niah", "helmet")
    assert set(registry.in_tree_names()) == benchmark_folders()
    assert registry.benchmark_names()[:4] == registry.in_tree_names()
    for name in registry.in_tree_names():
        missing = [file for file in SHAPE if not (EVAL / name / file).is_file()]
        assert not missing, f"eval/{name}/ lacks {missing}"
        assert registry.benchmark_spec(name).origin == f"longctx.eval.{name}.benchmark"


def test_the_tasks_and_categories_are_the_benchmarks_own():
    from longctx.eval import helmet, infinitebench
    from longctx.eval.niah.needles import TASKS as NEEDLE_TASKS
    from longctx.eval.ruler.constants import FAMILIES, TASKS

    assert list(registry.benchmark_spec("ruler").tasks) == list(TASKS)
    assert set(registry.benchmark_spec("ruler").categories()) == set(FAMILIES)
    assert list(registry.benchmark_spec("infinitebench").tasks) == list(infinitebench.TASKS)
    assert list(registry.benchmark_spec("niah").tasks) == list(NEEDLE_TASKS)
    assert list(registry.benchmark_spec("helmet").tasks) == list(helmet.TASKS)
    assert set(registry.benchmark_spec("helmet").categories()) == {
        "recall",
        "rag",
        "rerank",
        "icl",
        "longqa",
        "summ",
        "cite",
    }
    assert registry.scored_tasks() == {
        "ruler": list(TASKS),
        "infinitebench": list(infinitebench.TASKS),
        "helmet": list(helmet.TASKS),
    }


def test_every_engine_task_is_named_benchmark_dash_task():
    config = ExperimentConfig()
    for name in registry.in_tree_names():
        spec = registry.benchmark_spec(name)
        tasks = spec.engine_tasks(list(spec.tasks), config)
        assert [task.name for task in tasks] == [spec.engine_name(task) for task in spec.tasks]
        assert registry.owner_of(tasks[0].name) == (spec, next(iter(spec.tasks)))


def test_each_suite_runs_its_default_tasks():
    """RULER's 11 synthetic tasks (qa_1 with its file), every InfiniteBench task, the configured NIAH."""
    from longctx.eval.ruler import SYNTHETIC_TASKS

    config = ExperimentConfig()
    assert [t.name for t in suite_tasks("ruler", None, config)] == [f"ruler-{t}" for t in SYNTHETIC_TASKS]
    names = ["passkey", "number_string", "kv_retrieval", "math_find"]
    assert [t.name for t in suite_tasks("infinitebench", None, config)] == [f"infinitebench-{t}" for t in names]
    assert [t.name for t in suite_tasks("niah", None, config)] == ["niah-paper"]
    config.eval.benchmarks.squad_path = "squad.json"
    assert [t.name for t in suite_tasks("ruler", None, config)][-1] == "ruler-qa_1"


def test_a_category_stands_for_its_tasks():
    spec = registry.benchmark_spec("infinitebench")
    assert spec.select(["retrieve"]) == ["passkey", "number_string", "kv_retrieval"]
    assert spec.select(["math_find", "retrieve", "passkey"]) == [
        "math_find",
        "passkey",
        "number_string",
        "kv_retrieval",
    ]
    assert registry.benchmark_spec("ruler").select(["variable_tracking", "qa"]) == ["vt", "qa_1", "qa_2"]


def test_the_cli_choices_come_from_the_registry(scratch_registry):
    def suite_action():
        commands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
        return next(a for a in commands.choices["eval-suite"]._actions if "--suite" in a.option_strings)

    assert tuple(suite_action().choices) == registry.benchmark_names()
    registry.register_benchmark(toy_spec())
    assert tuple(suite_action().choices) == (*registry.in_tree_names(), "toy")
    args = build_parser().parse_args(["eval-suite", "CKPT", "--suite", "toy", "--lengths", "64"])
    assert args.suite == "toy"


def test_an_unknown_suite_is_an_error_naming_the_registered_ones(capsys):
    with pytest.raises(SystemExit) as exit_code:
        main(["eval-suite", "CKPT", "--suite", "rulers", "--lengths", "64"])
    assert exit_code.value.code == 2
    assert (
        "invalid choice: 'rulers' (choose from 'ruler', 'infinitebench', 'niah', 'helmet')" in capsys.readouterr().err
    )
    with pytest.raises(ConfigError, match=r"--suite: 'rulers' is not a registered benchmark; registered: \['ruler'"):
        registry.benchmark_spec("rulers")


def test_an_unknown_task_is_an_error_naming_the_tasks_and_categories(tmp_path, capsys):
    with pytest.raises(
        ConfigError, match=r"--tasks: 'pass_key' is not a task of infinitebench; its tasks: \['passkey'"
    ):
        suite_tasks("infinitebench", ["passkey", "pass_key"], ExperimentConfig())
    with pytest.raises(ConfigError, match=r"its categories: \['math', 'retrieve'\]"):
        suite_tasks("infinitebench", ["pass_key"], ExperimentConfig())
    with pytest.raises(ConfigError, match=r"'papers' is not a task of niah; its tasks: \['paper', 'string-repo'"):
        suite_tasks("niah", ["papers"], ExperimentConfig())
    predictions = tmp_path / "p.jsonl"
    predictions.write_text(json.dumps({"pred": "1", "outputs": ["1"]}) + "\n")
    assert main(["eval-score", "--task", "paper", str(predictions)]) == 2
    error = capsys.readouterr().err
    assert "--task: 'paper' is not a task of a benchmark that scores prediction files" in error
    assert "ruler: ['niah_single_1'" in error and "infinitebench: ['passkey'" in error


def test_taken_names_and_ambiguous_tasks_are_refused(scratch_registry):
    with pytest.raises(ValueError, match="'ruler' is registered already"):
        registry.register_benchmark(toy_spec("ruler"))
    with pytest.raises(ValueError, match="a name is lower-case"):
        registry.register_benchmark(toy_spec("my-bench"))
    with pytest.raises(ValueError, match=r"\['one'\] name both a category and a task"):
        registry.register_benchmark(toy_spec(tasks={"one": "one"}))
    scorer = registry.benchmark_spec("ruler").score_file
    with pytest.raises(ValueError, match=r"tasks \['vt'\] are ruler's"):
        registry.register_benchmark(toy_spec(tasks={"vt": ""}, score_file=scorer))
    registry.register_benchmark(toy_spec(tasks={"vt": ""}))  # no files scored: eval-score stays unambiguous
    assert registry.scored_task("vt")[0].name == "ruler"


def test_the_search_finds_another_benchmarks_task_through_the_registry():
    from longctx.eval.niah.evaluation import load_haystack, search_task

    config = ExperimentConfig()
    config.eval.niah.task = "infinitebench-passkey"
    assert load_haystack(config, None) is None  # type: ignore[arg-type]  # no haystack for another benchmark
    assert search_task(config.eval.niah, config, None).name == "infinitebench-passkey"
    config.eval.niah.task = "ruler-vt"
    assert search_task(config.eval.niah, config, None).name == "ruler-vt"
    config.eval.niah.task = "ruler-vtt"
    with pytest.raises(ConfigError, match=r"eval.niah.task: 'vtt' is not a task of ruler"):
        search_task(config.eval.niah, config, None)
    config.eval.niah.task = "helmet-json-kv"  # NIAH's own variant, whatever benchmark `helmet` may come
    assert search_task(config.eval.niah, config, None).name == "niah-helmet-json-kv"


def benchmark_of(module: str, folders: set[str]) -> str | None:
    parts = module.split(".")
    return parts[2] if parts[:2] == ["longctx", "eval"] and len(parts) > 2 and parts[2] in folders else None


def crossings(graph: dict[str, set[str]], folders: set[str]) -> list[str]:
    """`module -> target` for each import, by a module of eval/, of a benchmark folder that is
    not the module's own: from a generic module (up) or from another benchmark (sideways)."""
    bad = []
    for module, targets in graph.items():
        if not module.startswith("longctx.eval."):
            continue
        home = benchmark_of(module, folders)
        bad += [f"{module} -> {t}" for t in targets if benchmark_of(t, folders) not in (None, home)]
    return sorted(bad)


def test_no_generic_module_and_no_other_benchmark_imports_a_benchmark_folder():
    bad = crossings(import_graph(), benchmark_folders())
    assert not bad, "imports of a benchmark folder from outside it:\n" + "\n".join(bad)


def test_the_import_checker_by_hand():
    graph = {
        "longctx.eval.effective_length": {"longctx.eval.niah.needles", "longctx.eval.task"},
        "longctx.eval.infinitebench.generator": {"longctx.eval.ruler.tokens", "longctx.eval.prompt_pieces"},
        "longctx.eval.ruler.niah": {"longctx.eval.ruler.tokens"},
        "longctx.cli.evaluation_commands": {"longctx.eval.niah.table"},
    }
    assert crossings(graph, {"niah", "ruler", "infinitebench"}) == [
        "longctx.eval.effective_length -> longctx.eval.niah.needles",
        "longctx.eval.infinitebench.generator -> longctx.eval.ruler.tokens",
    ]


def test_the_registry_and_every_spec_import_no_torch():
    """`eval-score`, `longctx benchmarks` and the `--suite` choices read the specs only."""
    script = (
        "import sys\n"
        "from longctx.eval.registry import benchmark_names\n"
        "assert benchmark_names()\n"
        "print('torch' in sys.modules)\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"


def test_a_plugin_registers_a_benchmark_with_categories(tmp_path):
    plugin = tmp_path / "toy_bench.py"
    plugin.write_text(
        textwrap.dedent(
            """
            from longctx.eval.registry import BenchmarkSpec, register_benchmark

            def build(names, config, haystack):
                return []

            register_benchmark(BenchmarkSpec("toy", "a toy family", {"a": "recall", "b": "rag"}, build))
            """
        )
    )
    env = {**os.environ, "LONGCTX_PLUGINS": str(plugin)}
    result = subprocess.run(
        [sys.executable, "-m", "longctx", "benchmarks"], capture_output=True, text=True, env=env, check=True
    )
    assert "toy  [2 tasks, plugin from toy_bench]  a toy family" in result.stdout
    assert "    recall: a" in result.stdout and "    rag: b" in result.stdout
    assert result.stdout.index("niah ") < result.stdout.index("toy ")
