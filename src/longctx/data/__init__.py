"""Data: corpora, tokenizers, packing into the batch contract (docs/design.md §3, §11)."""
