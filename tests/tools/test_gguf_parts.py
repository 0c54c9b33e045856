"""tools/gpu/gguf_parts.py: a file split into parts and joined back is the same file (its
SHA-256 computed here by hashlib on the original bytes), in order whatever order the parts
arrive in; a missing part is named, a damaged one fails the hash and leaves no output."""

import hashlib
import json
import os
import shutil

import pytest

from tests.tools.helpers import gpu

parts = gpu("gguf_parts")
PartsError, join, main, split = parts.PartsError, parts.join, parts.main, parts.split


@pytest.fixture
def original(tmp_path):
    path = tmp_path / "model.gguf"
    path.write_bytes(os.urandom(2_500_000))  # 2.38 MiB: parts of 1 MiB -> 3, the last 0.38 MiB
    return path


def test_split_then_join_gives_the_same_bytes(original, tmp_path):
    parts = split(original, tmp_path / "parts", part_mib=1)
    assert [p.name for p in parts] == ["part-000-of-003", "part-001-of-003", "part-002-of-003"]
    assert [p.stat().st_size for p in parts] == [2**20, 2**20, 2_500_000 - 2 * 2**20]
    expected = hashlib.sha256(original.read_bytes()).hexdigest()
    listing = json.loads((tmp_path / "parts" / "parts.json").read_text())
    assert (listing["bytes"], listing["sha256"]) == (2_500_000, expected)
    # on the device the parts arrive one call at a time, in a folder of their own
    parked = tmp_path / "parked"
    parked.mkdir()
    for part in reversed(parts):
        shutil.copy(part, parked / part.name)
    joined = join(parked, tmp_path / "joined.gguf", expected.upper())
    assert joined.read_bytes() == original.read_bytes()


def test_a_missing_part_is_named(original, tmp_path):
    parts = split(original, tmp_path / "parts", part_mib=1)
    parts[1].unlink()
    with pytest.raises(PartsError, match="lacks part-001-of-003 \\(has 2 of 3\\)"):
        join(tmp_path / "parts", tmp_path / "joined.gguf", "0" * 64)


def test_a_damaged_part_fails_the_hash_and_writes_nothing(original, tmp_path, capsys):
    parts = split(original, tmp_path / "parts", part_mib=1)
    expected = hashlib.sha256(original.read_bytes()).hexdigest()
    damaged = bytearray(parts[2].read_bytes())
    damaged[100] ^= 1
    parts[2].write_bytes(bytes(damaged))
    with pytest.raises(PartsError, match=f"expected {expected}"):
        join(tmp_path / "parts", tmp_path / "joined.gguf", expected)
    assert not list(tmp_path.glob("joined*"))
    assert main(["join", str(tmp_path / "parts"), str(tmp_path / "joined.gguf"), "--sha256", expected]) == 1
    assert "error: joined 3 parts" in capsys.readouterr().out


def test_the_command_line_round_trip(original, tmp_path, capsys):
    assert main(["split", str(original), str(tmp_path / "p"), "--part-mib", "2"]) == 0
    expected = hashlib.sha256(original.read_bytes()).hexdigest()
    assert f"sha256 {expected}" in capsys.readouterr().out
    assert main(["join", str(tmp_path / "p"), str(tmp_path / "j.gguf"), "--sha256", expected]) == 0
    assert (tmp_path / "j.gguf").read_bytes() == original.read_bytes()
