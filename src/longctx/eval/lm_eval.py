"""longctx models and position methods inside lm-evaluation-harness (lm-eval 0.4.13).

    longctx lm-eval --model longctx --tasks niah_single_1 \\
        --model_args pretrained=runs/a/checkpoints/last.ckpt position_method=string string.shift=1365

    import longctx.eval.lm_eval  # registers the model name "longctx"
    lm_eval.simple_evaluate(model="longctx", model_args="pretrained=hf/SmolLM2,position_method=dca", tasks=[...])

lm-eval 0.4.13 finds model backends only in its own registry (`lm_eval.models.MODEL_MAPPING`,
no entry points), so importing this module is what registers `longctx`; `longctx lm-eval
ARGS...` (cli/harness_commands.py) imports it and hands ARGS to lm-eval's own command line.

`LongctxLM` is a `TemplateLM`: lm-eval's own code splits each (context, continuation)
pair into tokens and cuts documents into rolling windows (`get_rolling_token_windows`, each
window at most `max_length` tokens, the model's training length L by default); this class
scores token lists and generates. Every forward runs under the position method named by
`position_method` with the parameters of `eval.position_method` given by their own keys
(`string.shift=...`, `dca.local_window=...`; 0-valued ones resolved by STRING §4.2's
protocol against L, as `longctx niah` does). The arguments and their defaults follow
lm-eval's `hf` model, so that the two agree token for token on the same weights
(tests/eval/test_lm_eval.py): BOS as the tokenizer's `add_bos_token` says (not added to a
string that already starts with it), special-token spellings in text are those tokens,
generated text decoded without special tokens and cut at the first of `until` (EOS among
them), contexts left-truncated to `max_length - max_gen_toks` for generation and to
`max_length` tokens for scoring.

Scoring runs each batch (right-padded: causal attention never lets a real token see the
padding after it) through the KV cache in chunks of `chunk_tokens`, so a rolling window of
L tokens holds [batch, chunk_tokens, vocab] logits at a time, never [batch, L, vocab]:
chunk c attends to the cached keys of chunks 0..c-1, which is the unchunked forward.

Multi-process runs (`torchrun --nproc-per-node N -m longctx lm-eval ...`): rank and world
size come from torchrun's RANK / WORLD_SIZE / LOCAL_RANK, each rank evaluates its share of
the requests on cuda:LOCAL_RANK (on the CPU, over gloo, without CUDA; lm-eval splits them
by `rank` and `world_size`), and `all_gather` / `gather_object` / `barrier` are
torch.distributed's.
"""

from __future__ import annotations

import os
from typing import Any

# lm-eval's own models go into its registry first: get_model imports them only while the
# registry is empty, and would no longer find "hf" once "longctx" is in it.
import lm_eval.models  # noqa: F401
import torch
import torch.nn.functional as F
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from lm_eval.models.utils import Collator, handle_stop_sequences, normalize_gen_kwargs
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window
from tqdm import tqdm

from longctx.config.loader import load
from longctx.data.tokenizer import Tokenizer, TokenizerError
from longctx.errors import ConfigError
from longctx.eval.prompt_frame import render_chat
from longctx.model.checkpoint import load_model
from longctx.model.inference.generation import StopRule, generate
from longctx.model.position_methods import build_position_method
from longctx.model_tokenizer import tokenizer_for_model

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
METHOD_KEY = "eval.position_method"


def position_method_overrides(name: str, params: dict[str, Any]) -> list[str]:
    """`position_method=string string.shift=100` -> eval.position_method.* overrides; a key
    that is not `<method>.<parameter>` is an error naming it."""
    overrides = [f"{METHOD_KEY}.name={name}"]
    for key, value in params.items():
        if "." not in key:
            raise ConfigError(
                f"model_args {key}",
                "is not an argument of the longctx model (pretrained, position_method, dtype, device, batch_size, "
                "max_length, max_gen_toks, chunk_tokens, tokenizer, cuda_decoding) nor a position method parameter "
                "(<method>.<parameter>, e.g. string.shift=1365)",
            )
        overrides.append(f"{METHOD_KEY}.{key}={value}")
    return overrides


@register_model("longctx")
class LongctxLM(TemplateLM):
    """A longctx model under one evaluation-time position method, as an lm-eval LM."""

    def __init__(
        self,
        pretrained: str,
        position_method: str = "rope",
        dtype: str = "float32",
        device: str | None = None,
        batch_size: int | str = 1,
        max_batch_size: int | None = None,
        max_length: int | None = None,
        max_gen_toks: int = 256,
        chunk_tokens: int = 4096,
        tokenizer: str | None = None,
        cuda_decoding: str = "eager",
        **method_params: Any,
    ) -> None:
        super().__init__()
        if dtype not in DTYPES:
            raise ConfigError("model_args dtype", f"{dtype!r} is not one of {tuple(DTYPES)}")
        if not str(batch_size).isdigit() or int(batch_size) < 1:
            raise ConfigError("batch_size", f"must be a positive integer (no 'auto' for longctx), got {batch_size!r}")
        self._world_size = int(os.environ.get("WORLD_SIZE", "1"))
        self._rank = int(os.environ.get("RANK", "0"))
        if self._world_size > 1:
            if torch.cuda.is_available():
                device = f"cuda:{os.environ.get('LOCAL_RANK', '0')}"
                torch.cuda.set_device(device)
            if not torch.distributed.is_initialized():
                torch.distributed.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
        overrides = [*position_method_overrides(position_method, method_params), f"eval.cuda_decoding={cuda_decoding}"]
        evaluation = load(overrides=overrides).eval
        settings, self.cuda_decoding = evaluation.position_method, evaluation.cuda_decoding
        self._device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.model = load_model(pretrained, dtype=DTYPES[dtype], device=self._device).eval().fuse_projections_()
        self.tokenizer: Tokenizer = tokenizer_for_model(pretrained, override=tokenizer)
        self.position_method = build_position_method(settings, self.model.config)
        self.batch_size = min(int(batch_size), max_batch_size or int(batch_size))
        self._max_length = max_length or self.model.config.max_position
        self.max_gen_toks = max_gen_toks
        self.chunk_tokens = chunk_tokens

    # ------------------------------------------------------------------ tokens

    @property
    def eot_token_id(self) -> int:
        return self.tokenizer.eos_id

    @property
    def prefix_token_id(self) -> int:
        """The token scored continuations of an empty context condition on: BOS, else EOS."""
        return self.tokenizer.eos_id if self.tokenizer.bos_id is None else self.tokenizer.bos_id

    @property
    def max_length(self) -> int:
        return self._max_length

    @property
    def tokenizer_name(self) -> str:
        return self.tokenizer.name.replace("/", "__")

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs: Any) -> list[int]:
        """Ids of `string` with special-token spellings as those tokens (as HF tokenizers
        encode), after BOS when `add_special_tokens` (None: the tokenizer's add_bos_token,
        unless the string already starts with BOS)."""
        bos_id = self.tokenizer.bos_id
        add_bos = self.tokenizer.add_bos if add_special_tokens is None else add_special_tokens
        if add_special_tokens is None and bos_id is not None and string.startswith(self.tokenizer.token(bos_id)):
            add_bos = False
        ids = self.tokenizer.encode_template(string)
        return [bos_id, *ids] if add_bos and bos_id is not None else ids

    def tok_decode(self, ids: list[int]) -> str:
        """Text of generated ids without special tokens (as lm-eval's hf model decodes)."""
        try:
            return self.tokenizer.hf_tokenizer.decode(ids, skip_special_tokens=True)
        except TokenizerError:  # tiktoken: its special ids are the ones the Tokenizer names
            specials = {self.tokenizer.eos_id, self.tokenizer.bos_id, self.tokenizer.pad_id}
            return self.tokenizer.decode([i for i in ids if i not in specials])

    def apply_chat_template(self, chat_history: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        """The tokenizer's chat template rendered as transformers renders it; without the
        generation prompt, the text ends at the last message's content (transformers'
        continue_final_message), so a scored answer continues the assistant's turn."""
        if self.tokenizer.chat_template is None:
            raise TokenizerError(f"{self.tokenizer.config_file or self.tokenizer.name}: no chat_template")
        text = render_chat(self.tokenizer.chat_template, chat_history, self.tokenizer, add_generation_prompt)
        if add_generation_prompt:
            return text
        final = chat_history[-1]["content"]
        end = text.rindex(final.strip())
        return text[: end + len(final.lstrip() if text[end:].startswith(final.lstrip()) else final.strip())]

    # ------------------------------------------------------------------ scoring

    @torch.no_grad()
    def _token_logprobs(self, rows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows of tokens -> (log p(row[t+1] | row[:t+1]), whether it is the argmax), each
        [batch, longest - 1], through the KV cache in chunks of `chunk_tokens`."""
        longest = max(len(row) for row in rows)
        tokens = torch.full((len(rows), longest), self.tokenizer.pad_id, dtype=torch.long)
        for index, row in enumerate(rows):
            tokens[index, : len(row)] = torch.tensor(row)
        tokens = tokens.to(self._device)
        inputs, targets = tokens[:, :-1], tokens[:, 1:]
        cache = self.model.new_kv_cache(len(rows), inputs.shape[1])
        logprobs, greedy = [], []
        for start in range(0, inputs.shape[1], self.chunk_tokens):
            part = slice(start, start + self.chunk_tokens)
            logits = self.model(inputs[:, part], kv_cache=cache, position_method=self.position_method)
            scores = F.log_softmax(logits.float(), dim=-1)
            logprobs.append(scores.gather(-1, targets[:, part, None])[..., 0])
            greedy.append(scores.argmax(-1) == targets[:, part])
        return torch.cat(logprobs, dim=1).cpu(), torch.cat(greedy, dim=1).cpu()

    def _loglikelihood_tokens(
        self, requests: list[tuple[Any, list[int], list[int]]], disable_tqdm: bool = False, **kwargs: Any
    ) -> list[tuple[float, bool]]:
        """(log p(continuation | context), continuation is the greedy one) per request; the
        context is left-truncated so that the scored input is at most `max_length` tokens."""
        order = Collator(requests, sort_fn=lambda request: (-len(request[1]) - len(request[2]), tuple(request[1])))
        results = []
        progress = tqdm(total=len(requests), disable=disable_tqdm or self.rank != 0, desc="loglikelihood (longctx)")
        for batch in order.get_batched(n=self.batch_size):
            rows = [(context + continuation)[-(self.max_length + 1) :] for _, context, continuation in batch]
            logprobs, greedy = self._token_logprobs(rows)
            for (request, _, continuation), row, row_logprobs, row_greedy in zip(
                batch, rows, logprobs, greedy, strict=True
            ):
                scored = slice(len(row) - 1 - len(continuation), len(row) - 1)
                answer = (float(row_logprobs[scored].sum()), bool(row_greedy[scored].all()))
                results.append(answer)
                if request is not None:  # rolling windows carry no request of their own
                    self.cache_hook.add_partial("loglikelihood", request, answer)
                progress.update(1)
        progress.close()
        return order.get_original(results)

    def loglikelihood_rolling(self, requests: list, disable_tqdm: bool = False) -> list[float]:
        """Log-likelihood of whole documents: lm-eval's rolling windows of `max_length`
        tokens (every token predicted once, each window with as much context as fits)."""
        windows, owners = [], []
        for index, (string,) in enumerate(request.args for request in requests):
            token_windows = get_rolling_token_windows(
                token_list=self.tok_encode(string),
                prefix_token=self.prefix_token_id,
                max_seq_len=self.max_length,
                context_len=1,
            )
            for context, continuation in map(make_disjoint_window, token_windows):
                windows.append((None, context, continuation))
                owners.append(index)
        totals = [0.0] * len(requests)
        for owner, (logprob, _) in zip(owners, self._loglikelihood_tokens(windows, disable_tqdm), strict=True):
            totals[owner] += logprob
        for request, total in zip(requests, totals, strict=True):
            self.cache_hook.add_partial("loglikelihood_rolling", request.args, total)
        return totals

    # ------------------------------------------------------------------ generation

    def generate_until(self, requests: list, disable_tqdm: bool = False) -> list[str]:
        """Greedy continuations, batched by `longctx.model.inference.generation.generate` (prompts of
        any lengths in one batch), each row stopped by EOS or the first of its `until`
        strings and cut before it, within `max_gen_toks` tokens (the request's, else the
        model's). Requests are grouped by their generation arguments, longest first."""
        eos = self.tokenizer.token(self.eot_token_id)
        order = Collator(
            [request.args for request in requests],
            sort_fn=lambda args: (-len(self.tok_encode(args[0])), args[0]),
            group_by="gen_kwargs",
            group_fn=lambda args: args[1],
        )
        results = []
        progress = tqdm(total=len(requests), disable=disable_tqdm or self.rank != 0, desc="generate_until (longctx)")
        for batch in order.get_batched(n=self.batch_size):
            contexts, all_gen_kwargs = zip(*batch, strict=True)
            kwargs = normalize_gen_kwargs(all_gen_kwargs[0], self.max_gen_toks)
            if kwargs.get("do_sample"):
                raise ConfigError("gen_kwargs do_sample", "the longctx model decodes greedily only")
            until = tuple(s for s in handle_stop_sequences(kwargs.get("until"), eos=eos) if s)
            max_new = kwargs["max_gen_toks"]
            if max_new >= self.max_length:
                raise ConfigError(
                    "max_gen_toks", f"{max_new} leaves no room for a prompt in max_length={self.max_length}"
                )
            generations = generate(
                self.model,
                [self.tok_encode(context)[-(self.max_length - max_new) :] for context in contexts],
                max_new_tokens=max_new,
                stop=StopRule(eos_ids=frozenset({self.eot_token_id}), stop_strings=until),
                decode=self.tok_decode,
                position_method=self.position_method,
                batch_size=self.batch_size,
                prefill_chunk_tokens=self.chunk_tokens,
                cuda_decoding=self.cuda_decoding,
            )
            for context, gen_kwargs, generation in zip(contexts, all_gen_kwargs, generations, strict=True):
                text = generation.text or ""  # always decoded: generate was given `decode`
                results.append(text)
                self.cache_hook.add_partial("generate_until", (context, gen_kwargs), text)
                progress.update(1)
        progress.close()
        return order.get_original(results)

    # ------------------------------------------------------------------ processes

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        if self.world_size == 1:
            return tensor
        parts = [torch.zeros_like(tensor) for _ in range(self.world_size)]
        torch.distributed.all_gather(parts, tensor)
        return torch.stack(parts) if tensor.dim() == 0 else torch.cat(parts)

    def gather_object(self, obj: Any, dst: int = 0) -> list | None:
        if self.world_size == 1:
            return [obj]
        gathered: list | None = [None] * self.world_size if self.rank == dst else None
        torch.distributed.gather_object(obj, gathered, dst=dst)
        return gathered

    def barrier(self) -> None:
        if self.world_size > 1:
            torch.distributed.barrier()
