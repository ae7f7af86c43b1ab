"""Deep Compression: weight sharing, the .mpz round trip, damaged files, the CLI."""

from __future__ import annotations

import numpy as np
import pytest
from train_models import image_batch, residual_cnn

from modelpress.cli.main import main
from modelpress.cli.options import open_model
from modelpress.compress.deep import decode, deep_compress, encode, open_mpz
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


def test_mpz_round_trip_exact_and_damage(rng):
    model = residual_cnn()
    tensors = []
    for name in [n.inputs[1].name for n in model.graph if n.op_type in ("Conv", "Gemm")]:
        w = const_array(model.graph.initializers[name])
        mask = rng.random(w.shape) > 0.9  # sparse: gaps over 255 happen in the long tensors too
        mask.reshape(-1)[-1] = True
        book, codes = share(w, mask, 4)
        tensors.append(SharedTensor(name, book, codes, mask, 4))
    data, parts = encode(model, tensors)
    back = decode(data)
    for t in tensors:
        np.testing.assert_array_equal(const_array(back.graph.initializers[t.name]), t.dense())
    x = image_batch(rng)
    assert run_model(back, x)["y"].shape == (4, 4)
    with pytest.raises(ModelLoadError, match="damaged or truncated"):
        decode(data[: len(data) - 10])
    with pytest.raises(ModelLoadError, match="not a modelpress .mpz"):
        decode(b"PK\x03\x04" + data[4:])


def test_deep_compress_and_run_from_mpz(tmp_path, rng):
    model = residual_cnn()
    data = {"x": rng.standard_normal((32, 3, 8, 8)).astype(np.float32)}
    result = deep_compress(model, data=data, sparsity=0.8, bits=4, train=TrainConfig(steps=2, batch_size=16))
    assert [s["stage"] for s in result.stages][0] == "float32"
    assert result.stages[-1]["bytes"] == len(result.data) and result.ratio > 1
    assert result.sparsity == pytest.approx(0.8, abs=0.01)
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
    assert main(["compress", str(tmp_path / "m.onnx"), "-o", str(out), "--data", str(tmp_path / "d.npz"), "--steps", "1", "--bits", "4"]) == 0
    assert out.exists()
    assert main(["run", str(out), "--inputs", str(tmp_path / "in.npz"), "-o", str(tmp_path / "o.npz")]) == 0
    got = np.load(tmp_path / "o.npz")["y"]
    np.testing.assert_allclose(got, run_model(open_mpz(out), dict(np.load(tmp_path / "in.npz")))["y"], rtol=1e-5, atol=1e-6)
