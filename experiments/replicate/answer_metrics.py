"""Answer loss of a checkpoint on held-out retrieval documents (the recipe search's probe).

python experiments/replicate/answer_metrics.py CKPT experiments/replicate/cpu_base.yaml [key=value ...]
"""

import json
import sys

from longctx.config import load
from longctx.data.tokenizer import load_tokenizer
from longctx.model.checkpoint import load_model
from longctx.probes.retrieval_answers import answer_metrics

checkpoint, *items = sys.argv[1:]
config = load([i for i in items if "=" not in i], [i for i in items if "=" in i])
source = next(s for s in config.data.mixture if s.kind == "retrieval")
metrics = answer_metrics(
    load_model(checkpoint), load_tokenizer(config.data.tokenizer), source.retrieval, config.data.window, documents=32
)
print(json.dumps(metrics))
