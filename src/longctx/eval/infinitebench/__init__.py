"""InfiniteBench's synthetic retrieval tasks (Zhang et al. 2024, OpenBMB/InfiniteBench
data/construct_synthetic_dataset.py, src/eval_utils.py, src/compute_scores.py), generated
at any length and scored as the STRING repository runs them for Llama (HKUNLP/STRING
inifinite_bench/src: the "yarn-mistral" templates its Llama 3.1 entries map to).

    passkey        noise * j + "The pass key is K. Remember it. K is the pass key.\\n" +
                   noise * (N - j); K: 5 random digits; 6 tokens to generate.
    number_string  the same with "The sequence of digits is K. ..."; K: 5 random digits,
                   then 5 times a digit duplicated in place (10 digits); 12 tokens.
    kv_retrieval   'JSON data:\\n{"k": "v", ...}' of P random UUID pairs; the queried pair is
                   number int(i * P / 500) of sample i; 50 tokens.
    math_find      a list of M integers in [0, 99] (bounds drawn per task as InfiniteBench
                   does); sample i asks, by i // 50 mod 7, for the largest, second largest,
                   third largest, smallest, second smallest, third smallest or median; 3 tokens.

Sizes scale InfiniteBench's 128K data with the length L: N = round(5220 L / 131072) noise
sentences (its own table: 326 at 8K ... 10440 at 256K), the depth j steps over N in
InfiniteBench's steps (90 at 128K, round(N / 58) elsewhere), 5 (passkey) or 10 (number
string) samples per depth; P = round(2500 L / 131072); M = round(60000 L / 131072). The
prompt is cut to L tokens by STRING's middle truncation (the first L // 2 and the last
L // 2 ids; STRING truncates to 131072 at 128K and does not reserve the generated tokens).

Scoring (the STRING repo's compute_scores.py, after " ".join(pred.split())): passkey and
number_string: the first run of digits equals the answer; kv_retrieval: the value is one of
the words after \\n : " ' . , ? ! { } become spaces; math_find: the first number
(\\d+\\.\\d+|\\d+) equals the answer (as int(float(x)) for an integer answer; InfiniteBench's
own int(x) is `compat="infinitebench"`). Task score: 100 x the mean.

The kv_retrieval pairs of a sample are drawn without replacement from a pool of random
UUID pairs tokenised once per generator (tokenising 125K tokens of fresh UUIDs per sample
costs seconds); InfiniteBench draws 3000 fresh pairs per sample.

    benchmark.py    the registry's spec: the four tasks in InfiniteBench's categories
    generator.py    the samples (`InfiniteBenchGenerator`), templates and sizes
    engine_task.py  `InfiniteBenchTask`: the samples and the scorer as engine tasks
    scoring.py      STRING's compute_scores
"""

from longctx.eval.infinitebench.generator import (
    MATH_TASKS,
    NOISE,
    TASKS,
    InfiniteBenchError,
    InfiniteBenchGenerator,
    InfiniteBenchSample,
    truncate_middle,
)
from longctx.eval.infinitebench.scoring import first_int, sample_score, task_score

__all__ = [
    "MATH_TASKS",
    "NOISE",
    "TASKS",
    "InfiniteBenchError",
    "InfiniteBenchGenerator",
    "InfiniteBenchSample",
    "first_int",
    "sample_score",
    "task_score",
    "truncate_middle",
]
