"""eval.niah.chat_template: the NIAH prompt inside an instruct model's chat template, rendered
as transformers' apply_chat_template renders it (a ChatML tokenizer directory)."""

import pytest

from longctx.config import NiahConfig
from longctx.data.tokenizer import load_tokenizer
from longctx.errors import ConfigError
from longctx.eval.niah.generator import make_sample
from longctx.eval.niah.haystack import Haystack
from longctx.eval.prompt_frame import PromptFrame, prompt_frame, render_chat
from longctx.model_tokenizer import tokenizer_for_model
from tests.chat_tokenizer import write_chat_tokenizer, write_hf_config

transformers = pytest.importorskip("transformers")

TEXT = "There is an important info hidden inside.\n\nWhat are the magic numbers?"


@pytest.fixture(scope="module")
def chat_dir(tmp_path_factory):
    return write_hf_config(write_chat_tokenizer(tmp_path_factory.mktemp("chat"), vocab_size=400), vocab_size=400)


@pytest.fixture(scope="module")
def reference(chat_dir):
    return transformers.AutoTokenizer.from_pretrained(chat_dir)


def test_rendered_prompt_equals_transformers_apply_chat_template(chat_dir, reference):
    tokenizer = tokenizer_for_model(chat_dir)
    messages = [{"role": "user", "content": TEXT}]
    expected = reference.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert render_chat(tokenizer.chat_template, messages, tokenizer) == expected
    frame = prompt_frame(tokenizer, "auto")
    ids = [*frame.head, *tokenizer.encode(TEXT), *frame.tail]
    expected_ids = reference.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
    assert ids == list(getattr(expected_ids, "input_ids", expected_ids))


def test_niah_sample_in_the_chat_frame_keeps_its_length_and_needle_spans(chat_dir):
    tokenizer = tokenizer_for_model(chat_dir)
    haystack = Haystack.from_text(tokenizer, "The sky was grey. " * 200 + "Boats came in. " * 200)
    frame = prompt_frame(tokenizer, "auto")
    sample = make_sample(tokenizer, haystack, 600, frame=frame)
    ids = sample.input_ids.tolist()
    assert len(ids) == 600
    assert ids[: len(frame.head)] == list(frame.head)
    answer_prefix = tokenizer.encode("\nThe numbers are")  # the paper task's answer prefix
    assert ids[-len(answer_prefix) - len(frame.tail) : -len(answer_prefix)] == list(frame.tail)
    for needle in sample.needles:
        start, stop = needle.value_span
        assert tokenizer.decode(ids[start:stop]) == needle.value
    bare = make_sample(tokenizer, haystack, 600)
    assert bare.answers == sample.answers  # same needles, other frame


def test_bos_when_the_tokenizer_asks_for_it_and_errors_naming_the_file(tmp_path):
    with_bos = tokenizer_for_model(
        write_hf_config(write_chat_tokenizer(tmp_path / "b", vocab_size=400, add_bos_token=True), 400)
    )
    assert prompt_frame(with_bos, "none") == PromptFrame(head=(with_bos.bos_id,))
    plain = load_tokenizer("bpe-8192")
    assert prompt_frame(plain, "none") == PromptFrame()
    with pytest.raises(
        ConfigError, match="eval.niah.chat_template: is auto, but tokenizer bpe-8192 has no chat_template"
    ):
        prompt_frame(plain, "auto")
    with pytest.raises(ConfigError, match="eval.niah.chat_template"):
        NiahConfig(chat_template="yes")


def test_bos_when_the_post_processor_adds_it_as_llama3s_tokenizer_does(tmp_path):
    """A directory shaped like Llama 3's: tokenizer.json's TemplateProcessing puts BOS before
    every text, tokenizer_config.json has no add_bos_token. The prompt starts with BOS, as
    transformers' (and so RULER's) encoding of the same text does."""
    import json

    from tokenizers import Tokenizer, processors

    directory = write_chat_tokenizer(tmp_path / "llama3", vocab_size=400)
    backend = Tokenizer.from_file(str(directory / "tokenizer.json"))
    bos = backend.token_to_id("<|im_start|>")
    backend.post_processor = processors.TemplateProcessing(
        single="<|im_start|> $A", pair="<|im_start|> $A <|im_start|> $B", special_tokens=[("<|im_start|>", bos)]
    )
    backend.save(str(directory / "tokenizer.json"))
    config = json.loads((directory / "tokenizer_config.json").read_text())
    del config["add_bos_token"]
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    tokenizer = tokenizer_for_model(write_hf_config(directory, 400))
    assert tokenizer.add_bos and tokenizer.bos_id == bos
    frame = prompt_frame(tokenizer, "none", "eval.benchmarks.chat_template")
    assert frame == PromptFrame(head=(bos,))
    reference = transformers.AutoTokenizer.from_pretrained(directory)
    assert reference(TEXT).input_ids == [*frame.head, *tokenizer.encode(TEXT)]
    # without the post-processor's BOS and without add_bos_token: the bare prompt
    plain = write_chat_tokenizer(tmp_path / "plain", vocab_size=400)
    assert prompt_frame(tokenizer_for_model(write_hf_config(plain, 400)), "none") == PromptFrame()
