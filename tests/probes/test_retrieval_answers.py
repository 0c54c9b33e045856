"""answer_metrics on models whose answers are known: an oracle and a uniform guesser."""

import math

import pytest
import torch

from longctx.config.data import RetrievalConfig
from longctx.data.tokenizer import load_tokenizer
from longctx.probes.retrieval_answers import answer_metrics

VOCAB = 512


class Oracle(torch.nn.Module):
    """Puts all mass on the true next token (it reads the input ids shifted): every answer exact."""

    def forward(self, input_ids):
        ids = input_ids[0].tolist()
        logits = torch.full((1, len(ids), VOCAB), -30.0)
        for t in range(len(ids) - 1):
            logits[0, t, ids[t + 1]] = 30.0
        return logits


class Uniform(torch.nn.Module):
    def forward(self, input_ids):
        return torch.zeros(1, input_ids.shape[1], VOCAB)


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("bpe-512")


def test_oracle_copies_every_value_and_uniform_is_at_log_vocab(tokenizer):
    config = RetrievalConfig(facts=2, queries=1, filler_max=3)
    oracle = answer_metrics(Oracle(), tokenizer, config, window=512, documents=5)
    # 5 documents x (1 query + 2 listed values)
    assert oracle["answers"] == 15 and oracle["value_exact"] == 1.0 and oracle["answer_loss"] < 1e-6
    uniform = answer_metrics(Uniform(), tokenizer, config, window=512, documents=5)
    assert uniform["answer_loss"] == pytest.approx(math.log(VOCAB))
    assert uniform["value_exact"] == 0.0
    assert sum(v for k, v in uniform.items() if k.startswith("answers_")) == 15


def test_no_document_fits(tokenizer):
    with pytest.raises(ValueError, match="window=8"):
        answer_metrics(Uniform(), tokenizer, RetrievalConfig(), window=8, documents=2)
