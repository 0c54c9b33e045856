"""Instruct models: the NIAH prompt inside the tokenizer's chat template (`eval.niah.chat_template`).

    none  the bare prompt (STRING's base-model protocol; the default), after BOS when the
          tokenizer's `add_bos_token` asks for one;
    auto  the prompt as the user turn of the tokenizer's chat template with the generation
          prompt, the answer prefix ("The numbers are") opening the assistant's turn, as
          HELMET evaluates instruct models. A tokenizer without a template is an error
          naming its tokenizer_config.json.

The template is rendered as transformers' `apply_chat_template` renders it: a sandboxed
Jinja environment with trim_blocks, lstrip_blocks and the loopcontrols extension, given
`messages`, `add_generation_prompt`, the special tokens' spellings and `raise_exception`.
NIAH prompts are assembled in token space (eval/niah/generator.py), so the rendering is split at
the user's content into the `PromptFrame`'s head and tail, each tokenised with special
tokens recognised ("<|im_start|>" is one id), as transformers tokenises the rendered text.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from longctx.data.tokenizer import Tokenizer
from longctx.errors import ConfigError

CHAT_TEMPLATE_MODES = ("none", "auto")
BENCHMARKS_TEMPLATE_KEY = "eval.benchmarks.chat_template"
"""The key that sets the prompt frame of the benchmarks on `eval.benchmarks` (RULER,
InfiniteBench), named in their errors; NIAH's is eval.niah.chat_template."""
_CONTENT = "\x00LONGCTX-NIAH-PROMPT\x00"


class TextTokenizer(Protocol):
    """What prompt builders (NIAH, RULER, InfiniteBench) and the engine need of
    `longctx.data.tokenizer.Tokenizer`; tests pass doubles."""

    name: str

    def encode(self, text: str) -> list[int]: ...

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]: ...

    def decode(self, ids: Sequence[int]) -> str: ...


@dataclass(frozen=True)
class PromptFrame:
    """Token ids around a NIAH prompt: `head` before its prefix; `tail` between its
    question and its answer prefix."""

    head: tuple[int, ...] = ()
    tail: tuple[int, ...] = ()


BARE = PromptFrame()
"""No BOS, no chat turn: the prompt alone."""


def render_chat(template: str, messages: list[dict], tokenizer: Tokenizer, add_generation_prompt: bool = True) -> str:
    """The text transformers' apply_chat_template(messages, tokenize=False) renders."""
    from jinja2.exceptions import TemplateError
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise TemplateError(message)

    environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    environment.globals["raise_exception"] = raise_exception

    def spelling(token_id: int | None) -> str:
        return "" if token_id is None else tokenizer.token(token_id)

    return environment.from_string(template).render(
        messages=messages,
        add_generation_prompt=add_generation_prompt,
        bos_token=spelling(tokenizer.bos_id),
        eos_token=spelling(tokenizer.eos_id),
        pad_token=spelling(tokenizer.pad_id),
    )


def prompt_frame(tokenizer: object, mode: str, key: str = "eval.niah.chat_template") -> PromptFrame:
    """The frame of `mode` (the module docstring) for prompts written in `tokenizer` (a
    longctx Tokenizer; test doubles without BOS or template get the bare prompt); `key` is
    the config key that set `mode`, named in errors."""
    if mode not in CHAT_TEMPLATE_MODES:
        raise ConfigError(key, f"{mode!r} is not one of {CHAT_TEMPLATE_MODES}")
    if mode == "none":
        bos = getattr(tokenizer, "bos_id", None)
        return PromptFrame(head=(bos,)) if getattr(tokenizer, "add_bos", False) and bos is not None else BARE
    template = getattr(tokenizer, "chat_template", None)
    if not isinstance(tokenizer, Tokenizer) or not template:
        where = getattr(tokenizer, "config_file", None) or f"tokenizer {getattr(tokenizer, 'name', tokenizer)}"
        raise ConfigError(key, f"is auto, but {where} has no chat_template (set {key}=none)")
    text = render_chat(template, [{"role": "user", "content": _CONTENT}], tokenizer)
    if text.count(_CONTENT) != 1:
        raise ConfigError(key, f"the chat template of {tokenizer.name} does not place the prompt")
    head, tail = text.split(_CONTENT)
    return PromptFrame(tuple(tokenizer.encode_template(head)), tuple(tokenizer.encode_template(tail)))
