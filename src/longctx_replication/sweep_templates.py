"""The replication's sweep files, generated from one template per step.

    python -m longctx_replication.sweep_templates            # write sweeps/replicate_<scale><step>.yaml
    python -m longctx_replication.sweep_templates --check    # exit 1, naming each file that differs

Each chain of the miniature (`make replicate`, `replicate-full`, `replicate-gpu`,
`replicate-smoke`) runs the same three steps: pretraining at three windows, STRING Table 1
on the largest window's model, SkipAlign vs Normal SFT (and plain Normal SFT). The chains
differ only in data: the scale's name, its verdict seeds, its windows and base configs, and
the smoke's short-run overrides. So the steps are Jinja templates
(sweeps/templates/replicate*.yaml.j2) and the scales one YAML file
(sweeps/templates/scales.yaml); the rendered files stay committed because `wandb agent`
and `longctx sweep` read a sweep file as it is, and a test renders them again and finds
no difference.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from pathlib import Path

import jinja2
import yaml

from longctx.errors import ConfigError

STEPS = ("", "_table1", "_sft", "_sft_plain")
"""Suffix of each step's template and file: replicate{step}.yaml.j2 -> replicate_<scale>{step}.yaml."""
SCALE_KEYS = {"about", "base", "model", "windows", "sft_length", "seeds", "overrides"}
OVERRIDE_STEPS = {"pretrain", "table1", "sft"}


def _scale(name: str, spec: object, source: Path) -> dict:
    if not isinstance(spec, Mapping):
        raise ConfigError(name, f"must be a mapping ({source})")
    unknown = set(spec) - SCALE_KEYS
    missing = SCALE_KEYS - {"overrides"} - set(spec)
    if unknown or missing:
        raise ConfigError(name, f"unknown keys {sorted(unknown)}, missing {sorted(missing)} ({source})")
    overrides = dict(spec.get("overrides") or {})
    if set(overrides) - OVERRIDE_STEPS:
        raise ConfigError(f"{name}.overrides", f"unknown steps {sorted(set(overrides) - OVERRIDE_STEPS)} ({source})")
    return {
        **spec,
        "scale": name,
        "eval_window": max(spec["windows"]),
        "overrides": {step: list(overrides.get(step, [])) for step in OVERRIDE_STEPS},
    }


def render_all(sweeps: Path) -> dict[Path, str]:
    """{sweeps/replicate_<scale><step>.yaml: its text} for every scale and step."""
    templates = sweeps / "templates"
    source = templates / "scales.yaml"
    scales = yaml.safe_load(source.read_text())
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(templates),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    files = {}
    for name, spec in scales.items():
        values = _scale(name, spec, source)
        for step in STEPS:
            template = f"replicate{step}.yaml.j2"
            files[sweeps / f"replicate_{name}{step}.yaml"] = env.get_template(template).render(
                template=template, **values
            )
    return files


def stale(sweeps: Path) -> list[Path]:
    """The generated files whose committed text differs from a fresh rendering."""
    return [path for path, text in render_all(sweeps).items() if not path.is_file() or path.read_text() != text]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[1] if __doc__ else None)
    parser.add_argument("--sweeps", type=Path, default=Path("sweeps"), help="the sweeps folder (default: sweeps)")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if a file differs")
    args = parser.parse_args(argv)
    if args.check:
        differ = stale(args.sweeps)
        for path in differ:
            print(f"{path}: differs from its template; run python -m longctx_replication.sweep_templates")
        return 1 if differ else 0
    for path, text in render_all(args.sweeps).items():
        path.write_text(text)
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
