"""Shared helpers of the data tests: small prepared datasets written from ready token arrays."""

import numpy as np
from litdata import StreamingDataset, optimize

from longctx.data.packing import LENGTHS_FILE

EOS = 0


class _Identity:
    def __call__(self, item):
        return item


def write_token_dataset(directory, documents: list[np.ndarray], chunk_bytes="1KB"):
    """A prepared dataset as `longctx prepare` lays it out, from ready token arrays."""
    optimize(
        fn=_Identity(),
        inputs=documents,
        output_dir=str(directory),
        chunk_bytes=chunk_bytes,
        num_workers=1,
        verbose=False,
        start_method="fork",
    )
    lengths = [len(item) for item in StreamingDataset(str(directory), shuffle=False)]
    np.save(directory / LENGTHS_FILE, np.asarray(lengths))


def random_documents(count, seed, low=1, high=90):
    """Documents of distinct non-EOS token ids ending in EOS; ids encode (doc, offset)."""
    rng = np.random.default_rng(seed)
    docs = []
    for d in range(count):
        n = int(rng.integers(low, high))
        docs.append(np.asarray([*(1000 * (d + 1) + np.arange(n)), EOS], dtype=np.int32))
    return docs
