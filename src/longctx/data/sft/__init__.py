"""Chat data for SFT and the rows of its variants (SkipAlign §3-§4, docs/design.md §9 and §11).

    samples, report = load_sft_samples("embedded", tokenizer)        # or a Tulu-v2 JSONL path
    rows = SFTRows(samples, variant="skipalign", window=512, pad_id=tokenizer.pad_id)

One module per concern: `jsonl` (reading and checking Tulu-v2 files), `template` (the
chat template, tokenised samples and their labels), `rows` (Normal-SFT, PackedSFT-k and
SkipAlign rows of the batch contract), `synthetic` (the embedded conversations). The f(i)
of such rows (SkipAlign Figure 2) is a probe: `longctx.probes.dataset_fi.relative_distance_histogram`.
"""

from longctx.data.sft.jsonl import (
    CHAT_ROLES,
    EMBEDDED,
    ON_BAD_SAMPLE,
    SFTDataError,
    SFTReport,
    conversation_problem,
    read_conversations,
)
from longctx.data.sft.rows import VARIANTS, SFTRows
from longctx.data.sft.synthetic import EMBEDDED_SAMPLES, embedded_conversations
from longctx.data.sft.template import (
    ASSISTANT_HEADER,
    ChatSample,
    load_sft_samples,
    render_blocks,
    tokenize_conversations,
)

__all__ = [
    "ASSISTANT_HEADER",
    "CHAT_ROLES",
    "EMBEDDED",
    "EMBEDDED_SAMPLES",
    "ON_BAD_SAMPLE",
    "VARIANTS",
    "ChatSample",
    "SFTDataError",
    "SFTReport",
    "SFTRows",
    "conversation_problem",
    "embedded_conversations",
    "load_sft_samples",
    "read_conversations",
    "render_blocks",
    "tokenize_conversations",
]
