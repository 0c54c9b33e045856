"""Prepared datasets in an object store: `prepare` writes to s3://, `PackedSource` and
`pretrain` read from it, against a real S3-compatible server (moto) on 127.0.0.1."""

import io
import json
import uuid

import numpy as np
import pytest
import torch

from longctx.cli import main
from longctx.data import storage
from longctx.data.corpus import embedded_documents
from longctx.data.packing import LENGTHS_FILE, PackedSource
from longctx.data.prepare import prepare, read_manifest
from longctx.data.tokenizer import train_bpe

moto_server = pytest.importorskip("moto.server")


@pytest.fixture(scope="module")
def s3_bucket():
    """A fresh bucket on a moto S3 server listening on 127.0.0.1 only, for this module."""
    import boto3

    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    with pytest.MonkeyPatch.context() as patch:
        for key, value in {
            "AWS_ENDPOINT_URL": f"http://{host}:{port}",
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
        }.items():
            patch.setenv(key, value)
        # litdata moves chunks with obstore when installed, whose client refuses plain http
        # (litdata passes no allow_http); a local server has no TLS, so litdata takes its
        # boto3 path, the one it uses wherever obstore is missing or unusable.
        patch.setattr("litdata.streaming.downloader._OBSTORE_AVAILABLE", False)
        for key in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE"):
            patch.delenv(key, raising=False)
        bucket = f"longctx-{uuid.uuid4().hex[:12]}"  # litdata caches chunks by URL: never reuse one
        boto3.client("s3").create_bucket(Bucket=bucket)
        yield bucket
    server.stop()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("object-store")
    texts = [doc.text for _, doc in zip(range(40), embedded_documents(("prose",)), strict=False)]
    (root / "corpus.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    train_bpe(texts, vocab_size=512, path=root / "tokenizer.json")
    prepare(str(root / "corpus.jsonl"), root / "local", str(root / "tokenizer.json"), verbose=False)
    return root


@pytest.fixture(scope="module")
def remote_dataset(s3_bucket, corpus):
    url = f"s3://{s3_bucket}/prepared/data"
    prepare(str(corpus / "corpus.jsonl"), url, str(corpus / "tokenizer.json"), verbose=False)
    return url


def test_storage_round_trips_files_and_keeps_the_url(s3_bucket):
    url = f"s3://{s3_bucket}/some/dir"
    assert storage.join(url, "lengths.npy") == f"s3://{s3_bucket}/some/dir/lengths.npy"
    assert not storage.exists(f"{url}/missing.json")
    storage.write_bytes(f"{url}/a.bin", b"\x00\x01payload")
    assert storage.exists(f"{url}/a.bin") and storage.read_bytes(f"{url}/a.bin") == b"\x00\x01payload"
    with pytest.raises(FileNotFoundError, match=f"s3://{s3_bucket}/some/dir/missing.json does not exist"):
        storage.read_bytes(f"{url}/missing.json")


@pytest.mark.parametrize("where", ["bucket", "local"])
def test_side_files_round_trip_and_a_missing_one_reads_as_none(s3_bucket, tmp_path, where):
    root = f"s3://{s3_bucket}/side-{uuid.uuid4().hex}" if where == "bucket" else str(tmp_path)
    assert storage.read_json_or_none(storage.join(root, "ledger.json")) is None
    storage.write_json(storage.join(root, "ledger.json"), {"rounds": [1, 2], "complete": False})
    assert storage.read_json_or_none(storage.join(root, "ledger.json")) == {"rounds": [1, 2], "complete": False}
    assert storage.read_bytes(storage.join(root, "ledger.json")).endswith(b"}\n")  # indented, newline-ended
    lengths = np.array([3, 1, 4], dtype=np.int64)
    storage.write_array(storage.join(root, "lengths.npy"), lengths)
    assert np.array_equal(storage.read_array(storage.join(root, "lengths.npy")), lengths)


def test_prepare_writes_every_file_to_the_bucket(remote_dataset, corpus):
    import boto3

    bucket, prefix = remote_dataset.removeprefix("s3://").split("/", 1)
    keys = {
        item["Key"].removeprefix(prefix + "/")
        for item in boto3.client("s3").list_objects_v2(Bucket=bucket, Prefix=prefix)["Contents"]
    }
    assert {"index.json", LENGTHS_FILE, "prepare.json"} <= keys
    local, remote = read_manifest(corpus / "local"), read_manifest(remote_dataset)
    assert remote["complete"] and remote["tokens"] == local["tokens"] and remote["documents"] == local["documents"]
    assert not any(name.startswith("s3:") for name in (p.name for p in corpus.iterdir()))  # no mangled local path


def test_a_packed_source_in_s3_streams_the_same_tokens_as_its_local_copy(remote_dataset, corpus):
    local, remote = PackedSource(corpus / "local", seed=3), PackedSource(remote_dataset, seed=3)
    assert np.array_equal(remote.lengths, local.lengths)
    assert torch.equal(remote.read(0, 700), local.read(0, 700))
    assert torch.equal(remote.read(remote.epoch_tokens - 50, 120), local.read(local.epoch_tokens - 50, 120))


def test_a_missing_remote_dataset_is_named(s3_bucket):
    with pytest.raises(FileNotFoundError, match=f"s3://{s3_bucket}/nothing is not a prepared dataset"):
        PackedSource(f"s3://{s3_bucket}/nothing", seed=0)


@pytest.mark.slow  # a short training run: ~30 s on 2 busy cores
def test_pretrain_streams_from_the_bucket(remote_dataset, corpus, tmp_path):
    out = tmp_path / "run"
    args = {
        "model.preset": "debug",
        "model.vocab_size": 512,
        "model.max_position": 64,
        "model.attention_backend": "varlen",
        "data.path": remote_dataset,
        "data.tokenizer": corpus / "tokenizer.json",
        "data.window": 64,
        "train.micro_batch_size": 2,
        "train.global_batch_tokens": 256,
        "train.max_steps": 2,
        "train.warmup_steps": 1,
        "train.out_dir": out,
        "log.wandb_mode": "disabled",
        "probe.fi": False,
    }
    assert main(["pretrain", *(f"{key}={value}" for key, value in args.items())]) == 0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows if "train/loss" in row] == [1, 2]


@pytest.mark.slow  # a second upload and several downloads: ~45 s on 2 busy cores (a boto3 client per call)
def test_a_remote_dataset_records_its_chunks_and_full_verify_downloads_and_checks_them(s3_bucket, corpus, capsys):
    """What is checked in an object store (data/integrity.py): sizes are not checked when a
    remote dataset opens (no size without a download); `--verify` and data.verify=full
    download every chunk and compare size and SHA-256; a damaged chunk that litdata then
    fails to read is named by its URL."""
    import hashlib

    from longctx.errors import DataIntegrityError

    url = f"s3://{s3_bucket}/to-damage/data"
    prepare(str(corpus / "corpus.jsonl"), url, str(corpus / "tokenizer.json"), verbose=False)
    local = {r["file"]: r for r in read_manifest(corpus / "local")["chunks"]}
    for record in read_manifest(url)["chunks"]:  # the same bytes as the local preparation
        assert record == local[record["file"]]
    assert main(["prepare", "--verify", url]) == 0
    assert "checksums match" in capsys.readouterr().out

    name = sorted(local)[0]
    damaged = bytearray((corpus / "local" / name).read_bytes())
    damaged[4:40] = b"\xff" * 36
    storage.write_bytes(f"{url}/{name}", bytes(damaged))
    source = PackedSource(url, seed=0, shuffle=False)  # opens: remote sizes are not checked on open
    with pytest.raises(DataIntegrityError, match=f"{url}/{name}: document 0 cannot be read: chunk checksum"):
        source.read(0, 10)
    assert main(["prepare", "--verify", url]) == 2
    assert f"{url}/{name}: chunk checksum is sha256 {hashlib.sha256(damaged).hexdigest()}" in capsys.readouterr().err


@pytest.mark.slow  # ~55 s on one core: three litdata uploads to the local server and a merge
def test_sharded_corpus_prepared_on_two_nodes_and_joined_in_the_store(s3_bucket, corpus, tmp_path):
    """Each node writes its part under the prefix; --join merges them there (litdata's
    merge_datasets copying objects) into what PackedSource streams."""
    lines = (corpus / "corpus.jsonl").read_text().splitlines(keepends=True)
    for number in range(3):
        (tmp_path / "shards" / f"s{number}.jsonl").parent.mkdir(exist_ok=True)
        (tmp_path / "shards" / f"s{number}.jsonl").write_text("".join(lines[number::3]))
    url = f"s3://{s3_bucket}/sharded/data"
    node = ["prepare", str(tmp_path / "shards"), url, "--tokenizer", str(corpus / "tokenizer.json"), "--nodes", "2"]
    assert main([*node, "--node-rank", "0"]) == 0 and main([*node, "--node-rank", "1"]) == 0
    assert main(["prepare", "--join", url, "--nodes", "2"]) == 0
    local = np.load(corpus / "local" / LENGTHS_FILE)
    remote = np.load(io.BytesIO(storage.read_bytes(storage.join(url, LENGTHS_FILE))))
    assert sorted(remote.tolist()) == sorted(local.tolist()) and read_manifest(url)["documents"] == len(lines)
    assert main(["prepare", "--verify", url]) == 0
