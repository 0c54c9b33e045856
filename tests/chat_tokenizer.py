"""A small ChatML tokenizer directory as Hugging Face writes one (tokenizer.json +
tokenizer_config.json), for tests of models that come with their own tokenizer."""

import json
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from longctx.data.corpus import embedded_documents

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
"""Ids 0, 1, 2, as in SmolLM2: BOS <|im_start|>, EOS <|im_end|>."""
CHATML_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def write_chat_tokenizer(directory: Path, vocab_size: int = 400, add_bos_token: bool = False) -> Path:
    """tokenizer.json (byte-level BPE, digits split) and tokenizer_config.json in `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    texts = [doc.text for _, doc in zip(range(20), embedded_documents(("prose",)), strict=False)]
    hf = Tokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    hf.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    hf.train_from_iterator(texts, trainer)
    hf.save(str(directory / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<|im_start|>",
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "add_bos_token": add_bos_token,
        "chat_template": CHATML_TEMPLATE,
        "model_max_length": 8192,
    }
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return directory


def write_hf_config(directory: Path, vocab_size: int) -> Path:
    """A config.json holding only what the tokenizer lookup reads (the embedding's rows)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps({"model_type": "llama", "vocab_size": vocab_size}))
    return directory
