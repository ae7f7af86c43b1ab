"""Keys: keygen writes 32 random bytes readable by the owner only; load_key reads files and
environment variables and refuses anything that is not a key, with one line naming the source."""

from __future__ import annotations

import stat

import pytest

from modelpress.errors import ModelSaveError, OptionError
from modelpress.protect import keygen, load_key
from modelpress.protect.keys import check_key, key_id


def test_keygen_writes_a_fresh_owner_only_key(tmp_path):
    a = keygen(tmp_path / "a.bin")
    b = keygen(tmp_path / "b.bin")
    assert stat.S_IMODE(a.stat().st_mode) == 0o600
    assert len(a.read_bytes()) == 32 and a.read_bytes() != b.read_bytes()
    assert load_key(key_file=a) == a.read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.bin", "b.bin"]  # no temporary left


def test_keygen_refuses_to_replace_a_key_unless_told(tmp_path):
    path = keygen(tmp_path / "k.bin")
    old = path.read_bytes()
    with pytest.raises(OptionError, match="already there"):
        keygen(path)
    assert path.read_bytes() == old
    keygen(path, overwrite=True)
    assert path.read_bytes() != old and stat.S_IMODE(path.stat().st_mode) == 0o600


def test_keygen_into_a_missing_directory(tmp_path):
    with pytest.raises(ModelSaveError, match="does not exist"):
        keygen(tmp_path / "nope" / "k.bin")


def test_a_key_in_hex_from_a_file_or_the_environment(tmp_path, monkeypatch):
    raw = bytes(range(32))
    (tmp_path / "k.hex").write_text(raw.hex() + "\n")
    assert load_key(key_file=tmp_path / "k.hex") == raw
    monkeypatch.setenv("MP_TEST_KEY", raw.hex().upper())
    assert load_key(key_env="MP_TEST_KEY") == raw


@pytest.mark.parametrize("content", [b"", b"short", b"x" * 31, b"x" * 33, b"g" * 64])
def test_what_is_not_a_key_is_refused(tmp_path, content):
    (tmp_path / "bad").write_bytes(content)
    with pytest.raises(OptionError, match="not a key"):
        load_key(key_file=tmp_path / "bad")


def test_key_options_misused(tmp_path, monkeypatch):
    monkeypatch.delenv("MP_UNSET_KEY", raising=False)
    with pytest.raises(OptionError, match="needs a key"):
        load_key()
    with pytest.raises(OptionError, match="not both"):
        load_key(key_file="a", key_env="B")
    with pytest.raises(OptionError, match="no such file"):
        load_key(key_file=tmp_path / "missing.bin")
    with pytest.raises(OptionError, match="not set"):
        load_key(key_env="MP_UNSET_KEY")
    monkeypatch.setenv("MP_BAD_KEY", "zz" * 32)
    with pytest.raises(OptionError, match="MP_BAD_KEY"):
        load_key(key_env="MP_BAD_KEY")
    with pytest.raises(OptionError):
        check_key(b"x" * 16)


def test_the_key_id_names_a_key_without_being_it():
    k1, k2 = bytes(32), bytes([1]) + bytes(31)
    assert key_id(k1) == key_id(bytes(32)) and key_id(k1) != key_id(k2)
    assert len(key_id(k1)) == 16 and key_id(k1) not in k1
