"""RULER (Hsieh et al. 2024, "RULER: What's the Real Context Size of Your Long-Context
Language Models?"), generated and scored by NVIDIA/RULER's rules, for any tokenizer, chat
template and length.

    benchmark.py          the registry's spec: the tasks by family, defaults, scorer, table hooks
    constants.py          the 13 tasks, templates, answer prefixes, tokens to generate, metrics
    sources.py            the essay split by punkt, wonderwords' lists
    tokens.py             RULER's prompt layout in token space and the length rule
    context.py            per-tokenizer state and the (seed, task, length, index) streams
    niah.py / variable_tracking.py / words.py / qa.py   the generators per family
    generator.py          make_sample / make_samples
    engine_task.py        `RulerTask`: the samples and the scorer as engine tasks
    scoring.py            RULER's post-processing, metrics, effective length, suite name
"""

from longctx.eval.ruler.constants import QA_TASKS, SYNTHETIC_TASKS, TASKS, RulerOptions
from longctx.eval.ruler.context import RulerContext
from longctx.eval.ruler.generator import RulerSample, make_sample, make_samples
from longctx.eval.ruler.tokens import RulerError

__all__ = [
    "QA_TASKS",
    "SYNTHETIC_TASKS",
    "TASKS",
    "RulerContext",
    "RulerError",
    "RulerOptions",
    "RulerSample",
    "make_sample",
    "make_samples",
]
