"""The .mpk container: every single-bit flip (header, every chunk, every tag), truncation, chunk
reordering, duplication, dropping, extension, wrong key and foreign file is refused with one
PackageError line; what is accepted is exactly what was sealed."""

from __future__ import annotations

import os
import struct

import numpy as np
import pytest

from modelpress.protect import package
from modelpress.protect.package import HEADER, TAG_BYTES, PackageError, decrypt_bytes, encrypt_bytes

CHUNK = 4096
KIND = package.KIND_MODEL


@pytest.fixture(scope="module")
def sealed():
    key = os.urandom(32)
    data = (
        np.random.default_rng(0).integers(0, 256, size=CHUNK * 23 + 1234, dtype=np.uint8).tobytes()
    )
    return key, data, encrypt_bytes(data, key, kind=KIND, chunk_size=CHUNK)


def _chunks(blob: bytes) -> list[bytes]:
    body = blob[HEADER.size :]
    step = CHUNK + TAG_BYTES
    return [body[i : i + step] for i in range(0, len(body), step)]


def _refused(blob: bytes, key: bytes) -> str:
    with pytest.raises(PackageError) as info:
        decrypt_bytes(blob, key, expect_kind=KIND)
    message = str(info.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize("size", [0, 1, CHUNK - 1, CHUNK, CHUNK + 1, 3 * CHUNK])
def test_round_trip_at_chunk_boundaries(size):
    key = os.urandom(32)
    data = os.urandom(size)
    blob = encrypt_bytes(data, key, kind=KIND, chunk_size=CHUNK)
    assert len(blob) == package.sealed_size(size, CHUNK)
    assert decrypt_bytes(blob, key, expect_kind=KIND) == data
    assert data[:16] not in blob[HEADER.size :] or size < 16  # the payload is not in the clear


def test_two_seals_of_one_payload_differ(sealed):
    key, data, blob = sealed
    again = encrypt_bytes(data, key, kind=KIND, chunk_size=CHUNK)
    assert again != blob and decrypt_bytes(again, key, expect_kind=KIND) == data


def test_every_header_bit_and_random_bits_everywhere_are_refused(sealed):
    key, data, blob = sealed
    rng = np.random.default_rng(1)
    positions = [(i, b) for i in range(HEADER.size) for b in range(8)]  # the whole header
    chunks = len(_chunks(blob))
    step = CHUNK + TAG_BYTES
    for c in range(chunks):  # in every chunk: its ciphertext and its tag
        start = HEADER.size + c * step
        end = min(start + step, len(blob))
        for offset in rng.integers(start, end - TAG_BYTES, size=4):
            positions.append((int(offset), int(rng.integers(8))))
        for offset in range(end - TAG_BYTES, end, 3):
            positions.append((offset, int(rng.integers(8))))
    positions += [(int(o), int(rng.integers(8))) for o in rng.integers(0, len(blob), size=300)]
    assert len(positions) > 1000
    for offset, bit in positions:
        flipped = bytearray(blob)
        flipped[offset] ^= 1 << bit
        _refused(bytes(flipped), key)


def test_payload_flips_say_wrong_key_or_modified(sealed):
    key, _, blob = sealed
    flipped = bytearray(blob)
    flipped[HEADER.size + 5 * (CHUNK + TAG_BYTES) + 7] ^= 4
    assert "wrong key or the file was modified" in _refused(bytes(flipped), key)
    assert "chunk 6 of" in _refused(bytes(flipped), key)


def test_truncations_are_refused(sealed):
    key, _, blob = sealed
    rng = np.random.default_rng(2)
    lengths = {0, 1, 7, HEADER.size - 1, HEADER.size, len(blob) - 1, len(blob) - TAG_BYTES}
    lengths |= {int(n) for n in rng.integers(1, len(blob), size=100)}
    for n in sorted(lengths):
        message = _refused(blob[:n], key)
        assert "truncated" in message or "not a modelpress package" in message, (n, message)


def test_reordered_duplicated_dropped_or_extra_chunks_are_refused(sealed):
    key, _, blob = sealed
    head, chunks = blob[: HEADER.size], _chunks(blob)
    swapped = list(chunks)
    swapped[2], swapped[3] = swapped[3], swapped[2]
    duplicated = chunks[:4] + [chunks[3]] + chunks[5:]  # same length, chunk 4 twice
    dropped = chunks[:3] + chunks[4:]
    for variant in (swapped, duplicated, dropped, chunks + [chunks[-1]], chunks[:-1]):
        _refused(head + b"".join(variant), key)
    assert "after the last chunk" in _refused(blob + b"\0", key)


def test_a_chunk_from_another_package_is_refused(sealed):
    key, data, blob = sealed
    other = encrypt_bytes(data, key, kind=KIND, chunk_size=CHUNK)
    mixed = blob[: HEADER.size] + b"".join(_chunks(blob)[:2] + _chunks(other)[2:])
    _refused(mixed, key)


def test_a_consistent_but_forged_header_is_refused(sealed):
    """Fields changed together so that sizes still add up: only the tags can tell."""
    key, data, blob = sealed
    fields = list(HEADER.unpack(blob[: HEADER.size]))
    fields[6] = os.urandom(16)  # the salt
    assert "wrong key or the file was modified" in _refused(
        HEADER.pack(*fields) + blob[HEADER.size :], key
    )


def test_wrong_key_and_wrong_kind(sealed):
    key, _, blob = sealed
    assert "wrong key or the file was modified" in _refused(blob, os.urandom(32))
    with pytest.raises(PackageError, match="operator library"):
        decrypt_bytes(blob, key, expect_kind=package.KIND_LIBRARY)


def test_a_newer_format_version_is_named(sealed):
    key, _, blob = sealed
    fields = list(HEADER.unpack(blob[: HEADER.size]))
    fields[1] = 9
    assert "version 9 is not supported" in _refused(HEADER.pack(*fields) + blob[HEADER.size :], key)


@pytest.mark.parametrize(
    "content", [b"", b"hello world" * 10, b"\x08\x07\x12\x04onnx", os.urandom(4096)]
)
def test_files_that_are_not_packages(tmp_path, content):
    path = tmp_path / "model.mpk"
    path.write_bytes(content)
    with pytest.raises(PackageError, match="not a modelpress package"):
        list(package.decrypt_stream(path, os.urandom(32)))


def test_a_missing_file(tmp_path):
    with pytest.raises(PackageError, match="no such file"):
        list(package.decrypt_stream(tmp_path / "none.mpk", os.urandom(32)))


def test_decryption_yields_only_authenticated_chunks(sealed):
    """A stream cut short by a bad chunk has yielded exactly the chunks before it."""
    key, data, blob = sealed
    flipped = bytearray(blob)
    flipped[HEADER.size + 3 * (CHUNK + TAG_BYTES) + 1] ^= 1
    got = []
    with pytest.raises(PackageError):
        for view in package.decrypt_stream(bytes(flipped), key):
            got.append(bytes(view))
    assert b"".join(got) == data[: 3 * CHUNK]


def test_header_layout_is_stable():
    # the format is versioned: a change to this layout needs a new version number
    assert HEADER.size == 68 and struct.calcsize(">8sHHHH16s16sIQQ") == 68
