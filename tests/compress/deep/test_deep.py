"""Deep Compression: weight sharing, sparse indices, the .mpz round trip, damaged and malformed
files, the CLI."""

from __future__ import annotations

import json
import struct

import numpy as np
import onnx_ir as ir
import pytest
import zstandard
from train_models import image_batch, residual_cnn

from modelpress.cli.main import main
from modelpress.cli.options import open_model
from modelpress.compress.deep import decode, deep_compress, encode, index, open_mpz
from modelpress.compress.deep.half import rounded
from modelpress.compress.deep.kmeans import share
from modelpress.compress.deep.mpz import SharedTensor
from modelpress.compress.train import TrainConfig
from modelpress.errors import ModelLoadError
from modelpress.ir import save
from modelpress.ir.match import const_array
from modelpress.verify import run_model


def test_share_linear_kmeans(rng):
    w = rng.standard_normal((6, 40)).astype(np.float32)
    mask = rng.random(w.shape) > 0.5
    book, codes = share(w, mask, 3)
    assert book.size == 8 and (np.diff(book) > 0).all()
    # every kept weight takes its nearest centroid, and centroids are their clusters' means
    nearest = np.abs(w[mask][:, None] - book[None, :]).argmin(1)
    np.testing.assert_array_equal(codes[mask], nearest)
    for k in range(8):
        if (codes[mask] == k).any():
            assert book[k] == pytest.approx(w[mask][codes[mask] == k].mean(), abs=1e-5)


@pytest.mark.parametrize("density", [0.0, 0.002, 0.1, 0.5, 1.0])
def test_index_gaps_and_masks_give_the_kept_positions(rng, density):
    mask = rng.random((7, 300)) < density
    mask[0, 254] = mask[1, 209] = density > 0  # gaps of exactly 255 and 256 (254 -> 509 -> 510)
    mask[1, 210] = density > 0
    expected = np.flatnonzero(mask)
    for kind in index.KINDS:
        stream = index.gaps(mask) if kind == "gaps" else np.packbits(mask.reshape(-1)).tobytes()
        got = index.decode(kind, stream, size=mask.size, kept=expected.size)
        np.testing.assert_array_equal(got, expected)
    # the gap bytes by hand: 255 (a byte), 256 = a 255-skip (zero byte) then 1
    assert index.gaps(np.eye(1, 511, 254, dtype=bool)) == bytes([255])
    assert index.gaps(np.eye(1, 511, 255, dtype=bool)) == bytes([0, 1])
    assert index.gaps(np.eye(1, 511, 510, dtype=bool)) == bytes([0, 0, 1])


def test_index_keeps_the_smaller_stream(rng):
    sparse, dense = rng.random(4000) < 0.01, rng.random(4000) < 0.9
    assert index.encode(sparse, len)[0] == "gaps"  # 40 bytes against 500
    assert index.encode(dense, len)[0] == "masks"  # 500 bytes against 3600
    with pytest.raises(ValueError, match="kept positions"):
        index.decode("gaps", index.gaps(sparse), size=4000, kept=int(sparse.sum()) + 1)
    with pytest.raises(ValueError, match="bitmask of"):
        index.decode("masks", b"\xff", size=4000, kept=8)


def _shared_residual(rng, bits: int = 4):
    """residual_cnn with its BatchNorm scales rounded to float16 (those go to the side section)
    and every Conv/Gemm weight pruned to ~10% and shared."""
    model = residual_cnn()
    for node in model.graph:
        if node.op_type == "BatchNormalization":
            value = node.inputs[1]
            value.const_value = ir.tensor(rounded(const_array(value)), name=value.name)
    tensors = []
    for name in [n.inputs[1].name for n in model.graph if n.op_type in ("Conv", "Gemm")]:
        w = const_array(model.graph.initializers[name])
        mask = rng.random(w.shape) > 0.9  # sparse: gaps over 255 happen in the long tensors too
        mask.reshape(-1)[-1] = True
        book, codes = share(w, mask, bits)
        tensors.append(SharedTensor(name, book, codes, mask, bits))
    return model, tensors


def test_mpz_round_trip_exact_and_damage(rng):
    model, tensors = _shared_residual(rng)
    data, parts = encode(model, tensors)
    assert sum(parts.values()) == len(data) and parts["side"] > 0
    back = decode(data)
    shared = {t.name: t for t in tensors}
    for name, value in model.graph.initializers.items():
        want = shared[name].dense() if name in shared else const_array(value)
        got = const_array(back.graph.initializers[name])
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)
    x = image_batch(rng)
    assert run_model(back, x)["y"].shape == (4, 4)
    with pytest.raises(ModelLoadError, match="damaged or truncated"):
        decode(data[: len(data) - 10])
    with pytest.raises(ModelLoadError, match="damaged or truncated"):
        decode(data + b"\0")
    with pytest.raises(ModelLoadError, match="not a modelpress .mpz"):
        decode(b"PK\x03\x04" + data[4:])


def _rewrite(data: bytes, edit) -> bytes:
    """``data`` with its header and tensor table rewritten by ``edit(header, table)``, by hand
    from the documented layout (so the test also pins the layout down)."""
    (n,) = struct.unpack("<I", data[4:8])
    header = json.loads(data[8 : 8 + n])
    offset, frames = 8 + n, {}
    for name, length in header["sections"]:
        frames[name] = zstandard.ZstdDecompressor().decompress(data[offset : offset + length])
        offset += length
    (m,) = struct.unpack("<I", frames["model"][:4])
    table = json.loads(frames["model"][4 : 4 + m])
    skeleton = frames["model"][4 + m :]
    edit(header, table)
    head = json.dumps(table).encode()
    frames["model"] = struct.pack("<I", len(head)) + head + skeleton
    packed = {k: zstandard.ZstdCompressor().compress(v) for k, v in frames.items()}
    header["sections"] = [[k, len(packed.get(k, b""))] for k, _ in header["sections"]]
    raw = json.dumps(header).encode()
    return data[:4] + struct.pack("<I", len(raw)) + raw + b"".join(packed.values())


def _first(form: str, key: str, value):
    def edit(header, table):
        next(e for e in table if e["form"] == form)[key] = value

    return edit


@pytest.mark.parametrize(
    "edit",
    [
        _first("shared", "bits", 9),
        _first("shared", "book", 17),
        _first("shared", "book", 1),  # codes then point past the codebook
        _first("shared", "book_dtype", "float64"),
        _first("shared", "index", "runs"),
        _first("shared", "index_bytes", 1),
        _first("shared", "kept", 1),
        _first("shared", "shape", [-1, 3]),
        _first("shared", "dtype", "not-a-dtype"),
        _first("shared", "form", "int4"),
        _first("shared", "name", "absent"),
        _first("float16", "shape", [1000]),
        lambda header, table: table[0].pop("kept"),
        lambda header, table: table.pop(),  # its side bytes are left over
        lambda header, table: header["sections"].append(["extra", 0]),
    ],
)
def test_malformed_mpz_is_one_error(rng, edit):
    model, tensors = _shared_residual(rng)
    data, _ = encode(model, tensors)
    assert np.array_equal(
        const_array(decode(_rewrite(data, lambda h, t: None)).graph.initializers[tensors[0].name]),
        tensors[0].dense(),
    )
    with pytest.raises(ModelLoadError, match="damaged or truncated") as info:
        decode(_rewrite(data, edit), source="m.mpz")
    assert str(info.value).startswith("m.mpz: ") and "\n" not in str(info.value)


def test_other_mpz_version_is_refused(rng):
    model, tensors = _shared_residual(rng)
    data, _ = encode(model, tensors)

    def version_1(header, table):
        header["version"] = 1

    with pytest.raises(ModelLoadError, match="version 1 is not supported"):
        decode(_rewrite(data, version_1))


def test_deep_compress_and_run_from_mpz(tmp_path, rng):
    model = residual_cnn()
    data = {"x": rng.standard_normal((32, 3, 8, 8)).astype(np.float32)}
    result = deep_compress(
        model, data=data, sparsity=0.8, bits=4, train=TrainConfig(steps=2, batch_size=16)
    )
    assert [s["stage"] for s in result.stages][0] == "float32"
    assert result.stages[-1]["bytes"] == len(result.data) and result.ratio > 1
    assert result.sparsity == pytest.approx(0.8, abs=0.01)
    assert result.parts["side"] > 0 and sum(result.parts.values()) == len(result.data)
    # BatchNorm was folded into the convs first; every tensor of more than one value (codebook
    # entries and side tensors alike) was trained to float16 values and is stored so
    assert "BatchNormalization" not in {n.op_type for n in result.model.graph}
    for value in result.model.graph.initializers.values():
        array = const_array(value)
        assert array.size <= 1 or np.array_equal(rounded(array), array), value.name
    path = tmp_path / "m.mpz"
    path.write_bytes(result.data)
    decoded = open_model(path)  # the route of run, bench and verify
    x = image_batch(rng)
    np.testing.assert_array_equal(run_model(decoded, x)["y"], run_model(result.model, x)["y"])
    with pytest.raises(ModelLoadError, match="no such file"):
        open_mpz(tmp_path / "none.mpz")


def test_cli_compress_then_run(tmp_path, rng, capsys):
    save(residual_cnn(), tmp_path / "m.onnx")
    np.savez(tmp_path / "d.npz", x=rng.standard_normal((32, 3, 8, 8)).astype(np.float32))
    np.savez(tmp_path / "in.npz", x=rng.standard_normal((2, 3, 8, 8)).astype(np.float32))
    out = tmp_path / "m.mpz"
    assert (
        main(
            [
                "compress",
                str(tmp_path / "m.onnx"),
                "-o",
                str(out),
                "--data",
                str(tmp_path / "d.npz"),
                "--steps",
                "1",
                "--bits",
                "4",
                "--keep-anyway",  # a random CNN at 4 bits after one step: outside the budget
            ]
        )
        == 0
    )
    assert out.exists()
    assert (
        main(["run", str(out), "--inputs", str(tmp_path / "in.npz"), "-o", str(tmp_path / "o.npz")])
        == 0
    )
    got = np.load(tmp_path / "o.npz")["y"]
    np.testing.assert_allclose(
        got, run_model(open_mpz(out), dict(np.load(tmp_path / "in.npz")))["y"], rtol=1e-5, atol=1e-6
    )
