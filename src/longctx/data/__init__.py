"""Data: corpora, tokenizers, packing into the batch contract (DESIGN §3, §11)."""
