"""Weight perturbation: each protected weight is stored as a keyed, invertible transform of itself.

The rule, for a weight ``W`` of ``n`` elements::

    S[i] = W.flat[(a*i + b) mod n] + R[i]          (a coprime with n: a permutation)

- the mapping (``a``, ``b``) scatters neighbouring elements, so no row, channel or kernel of ``W``
  stays together in ``S``;
- the noise ``R`` is drawn from AES-CTR under a per-tensor random seed, with magnitudes up to
  ``2**8`` times the largest ``|W|``, so the stored values carry almost no trace of the weight
  (its correlation with ``W`` is of the order of 1/256 plus chance);
- exactness: ``S`` is stored wider than ``W`` (float64 for floating weights, int32/int64 for
  integers) and every ``R[i]`` is a 24-bit integer times a power of two, so ``W + R`` is exact
  and ``S - R`` gives back ``W`` bit for bit. Where it would not be (an element far below the
  tensor's scale, a negative zero, an infinity or NaN) ``R[i]`` is 0 and the index is recorded;
- chance correlation: the signs of ``R`` are flipped, greedily, until ``S`` correlates with no
  original weight of the same size (``targets``) above ``TARGET_CORRELATION``; the flips are part
  of the transform. The inverse needs the seed, ``a``, ``b``, the flips and the exceptions: all of
  them live in the encrypted library, none in the visible graph.

Preconditions: ``supported(array)`` (a float16/bfloat16/float32 or 8/16/32-bit integer weight of
at least ``MIN_ELEMENTS`` elements); smaller or other weights go into the library whole. Below
that size, chance alone correlates two tensors by more than 1/32, too close to what the
perturbation must stay under against every original weight of the same size; and a weight the
flips could not bring under ``TARGET_CORRELATION`` goes there too.
"""

from __future__ import annotations

import base64
import json
import math
import os
from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from modelpress.protect.correlation import standardized

MIN_ELEMENTS = 1024
TARGET_CORRELATION = 0.01
NOISE_OCTAVES = 8  # |R| < 2**8 * max|W|
_FLOAT_TYPES = {np.dtype(np.float32), np.dtype(np.float16)}
# integer weight dtype -> the dtype S is stored in, and the bits of noise it has room for
_INT_STORE = {
    np.dtype(np.int8): (np.dtype(np.int32), 24),
    np.dtype(np.uint8): (np.dtype(np.int32), 24),
    np.dtype(np.int16): (np.dtype(np.int32), 24),
    np.dtype(np.uint16): (np.dtype(np.int32), 24),
    np.dtype(np.int32): (np.dtype(np.int64), 48),
    np.dtype(np.uint32): (np.dtype(np.int64), 48),
    # int64 has no wider type: S = W + R wraps around, and so does S - R, back to W exactly
    np.dtype(np.int64): (np.dtype(np.int64), 32),
}
_MAX_FLIP_STEPS = 400


@dataclass(frozen=True)
class Transform:
    """How one stored tensor ``S`` maps back to its weight (see the module docstring)."""

    dtype: ir.DataType  # the weight's
    shape: tuple[int, ...]
    seed: bytes  # 32 bytes: the AES key of the noise stream
    scale_exp: int  # floats: R = k * 2**(scale_exp - 23), k a 24-bit integer; ints: unused
    noise_bits: int  # ints: R = k >> (64 - noise_bits), k a 64-bit integer
    a: int
    b: int
    flips: np.ndarray  # packed bits: R[i] negated where set
    exceptions: np.ndarray  # int64 indices where R[i] = 0

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def is_float(self) -> bool:
        return self.noise_bits == 0

    @property
    def store_dtype(self) -> np.dtype:
        return (
            np.dtype(np.float64) if self.is_float else _INT_STORE[np.dtype(self.dtype.numpy())][0]
        )

    def to_json(self) -> str:
        return json.dumps(
            {
                "dtype": int(self.dtype),
                "shape": list(self.shape),
                "seed": self.seed.hex(),
                "scale_exp": self.scale_exp,
                "noise_bits": self.noise_bits,
                "a": self.a,
                "b": self.b,
                "flips": base64.b64encode(self.flips.tobytes()).decode(),
                "exceptions": base64.b64encode(self.exceptions.astype("<i8").tobytes()).decode(),
            },
            separators=(",", ":"),
        )

    @classmethod
    def from_json(cls, text: str) -> Transform:
        d = json.loads(text)
        return cls(
            dtype=ir.DataType(d["dtype"]),
            shape=tuple(d["shape"]),
            seed=bytes.fromhex(d["seed"]),
            scale_exp=d["scale_exp"],
            noise_bits=d["noise_bits"],
            a=d["a"],
            b=d["b"],
            flips=np.frombuffer(base64.b64decode(d["flips"]), dtype=np.uint8).copy(),
            exceptions=np.frombuffer(base64.b64decode(d["exceptions"]), dtype="<i8").astype(
                np.int64
            ),
        )


def supported(array: np.ndarray, min_elements: int = MIN_ELEMENTS) -> bool:
    """Whether ``array`` can be stored perturbed (else it goes into the library whole)."""
    kind_ok = (
        array.dtype in _FLOAT_TYPES or array.dtype in _INT_STORE or array.dtype.name == "bfloat16"
    )
    return kind_ok and array.size >= min_elements


def _keystream(seed: bytes, nbytes: int) -> np.ndarray:
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

    enc = Cipher(algorithms.AES(seed), modes.CTR(b"\0" * 16)).encryptor()
    return np.frombuffer(enc.update(bytes(nbytes)) + enc.finalize(), dtype=np.uint8)


def noise(t: Transform) -> np.ndarray:
    """``R`` (flips and exceptions applied), in the dtype ``S`` is stored in."""
    n = t.size
    if t.is_float:
        k = _keystream(t.seed, 4 * n).view("<i4") >> 8  # 24-bit signed integers
        r = k.astype(np.float64)
        r *= 2.0 ** (t.scale_exp - 23)
    else:
        k = _keystream(t.seed, 8 * n).view("<i8") >> (64 - t.noise_bits)
        r = k.astype(t.store_dtype)
    np.negative(r, out=r, where=np.unpackbits(t.flips, count=n).view(bool))
    r[t.exceptions] = 0
    return r


def _affine(n: int, a: int, b: int) -> np.ndarray:
    """``(a * i + b) mod n`` for ``i`` in [0, n), as int64. In float64, which numpy runs several
    times faster than int64 products and divisions: every value is an integer below 2**53, so
    each step is exact except the rounded quotient, which the last two lines correct by one."""
    if n * n + n >= 2**53:
        return (np.arange(n, dtype=np.int64) * a + b) % n
    x = np.arange(n, dtype=np.float64)
    x *= a
    x += b
    x -= np.floor(x / n) * n
    x[x < 0] += n
    x[x >= n] -= n
    return x.astype(np.int64)


def _permutation(n: int, a: int, b: int) -> np.ndarray:
    return _affine(n, a, b)


def inverse_index(t: Transform) -> np.ndarray:
    """``j -> i`` with ``perm(i) = j``: the Gather indices that undo the mapping."""
    n = t.size
    ainv = pow(t.a, -1, n) if n > 1 else 0
    # i = ainv * (j - b) mod n = (ainv * j + ainv * (n - b)) mod n
    idx = _affine(n, ainv, (ainv * (n - t.b)) % n)
    return idx.astype(np.int32) if n < 2**31 else idx


def _as_numpy(array: np.ndarray) -> np.ndarray:
    if array.dtype.name == "bfloat16":  # widen exactly; Cast back restores it
        return array.astype(np.float32)
    return array


def _balance(p: np.ndarray, r: np.ndarray, X: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Signs (+1/-1) for ``r`` such that ``p + signs * r`` correlates with no target above
    ``TARGET_CORRELATION``. ``X``: the targets, ``standardized`` (rows of zero mean, unit norm).

    Greedy on the sum of squared covariances with the targets (``X @ s``, exact since the rows
    of ``X`` have zero mean): each round flips the ``batch`` signs that each reduce it most; a
    round that does not reduce it is undone and the batch halved. The stopping test uses the
    exact Pearson correlations."""
    n = len(r)
    signs = np.where(rng.random(n) < 0.5, -1.0, 1.0)
    if not len(X):
        return signs
    s = p + signs * r
    num = X @ s
    XR = h = None
    batch = max(1, n // 64)
    for _ in range(_MAX_FLIP_STEPS):
        centered = s - s.mean()
        var = float(centered @ centered)
        if var <= 0 or np.max(np.abs(num)) <= TARGET_CORRELATION * math.sqrt(var):
            break
        if XR is None:
            XR = X * r  # column i: how the covariances move when r_i's sign does
            h = np.einsum("ij,ij->j", XR, XR)
        c = -2.0 * signs  # flipping i adds c_i * XR[:, i] to num
        gain = 2.0 * c * (XR.T @ num) + c * c * h
        take = min(batch, int((gain < 0).sum()))
        if take == 0:
            break  # no single flip helps any more
        idx = np.argpartition(gain, take - 1)[:take]
        new = num + XR[:, idx] @ c[idx]
        if new @ new >= num @ num:
            batch //= 2
            if batch == 0:
                break
            continue
        num = new
        s[idx] += c[idx] * r[idx]
        signs[idx] = -signs[idx]
    return signs


def encode(
    array: np.ndarray,
    *,
    rng: np.random.Generator,
    targets: np.ndarray | None = None,
    permute: bool = True,
) -> tuple[np.ndarray, Transform]:
    """``(S, transform)`` for a weight (``supported(array)``). ``targets``: the original weights of
    the same size that ``S`` must not correlate with, ``standardized`` (the weight itself
    included; by default it alone). ``permute=False``: no mapping (``a = 1, b = 0``), so ``S``
    keeps the weight's layout and ``S - R`` is the weight itself (runtime mode, where ``R`` is
    supplied at run time)."""
    dtype = ir.DataType.from_numpy(array.dtype)
    w = np.ascontiguousarray(_as_numpy(array)).reshape(-1)
    n = w.size
    a = int(rng.integers(1, n))
    while math.gcd(a, n) != 1:
        a = int(rng.integers(1, n))
    if n >= 2**31:  # a*i must not overflow int64: a plain rotation for such tensors
        a = 1
    b = int(rng.integers(0, n))
    if not permute:
        a, b = 1, 0
    p = w[_permutation(n, a, b)]
    seed = os.urandom(32)
    flips = np.zeros((n + 7) // 8, dtype=np.uint8)
    empty = np.zeros(0, dtype=np.int64)
    if w.dtype.kind == "f":
        finite = np.abs(p[np.isfinite(p)])
        top = float(finite.max()) if finite.size else 0.0
        scale_exp = (math.frexp(top)[1] if top > 0 else 0) + NOISE_OCTAVES
        t = Transform(dtype, tuple(array.shape), seed, scale_exp, 0, a, b, flips, empty)
        r = noise(t)
        p64 = p.astype(np.float64)
        s = p64 + r
        # exact where S - R gives W back bit for bit; else no noise there
        back = (s - r).astype(p.dtype)
        bad = (back.view(np.uint8).reshape(n, -1) != p.view(np.uint8).reshape(n, -1)).any(axis=1)
        bad |= ~np.isfinite(p) | (np.signbit(p) & (p == 0))
    else:
        store, bits = _INT_STORE[w.dtype]
        t = Transform(dtype, tuple(array.shape), seed, 0, bits, a, b, flips, empty)
        r = noise(t)
        p64 = p.astype(store)
        bad = np.zeros(n, dtype=bool)
    exceptions = np.flatnonzero(bad).astype(np.int64)
    r[exceptions] = 0
    X = standardized([w]) if targets is None else targets
    finite = np.nan_to_num(p64.astype(np.float64), nan=0.0, posinf=0.0, neginf=0.0)
    signs = _balance(finite, r.astype(np.float64), X, rng)
    flips = np.packbits(signs < 0)
    t = Transform(
        dtype, tuple(array.shape), seed, t.scale_exp, t.noise_bits, a, b, flips, exceptions
    )
    s = p64 + noise(t)
    s[exceptions] = p64[exceptions]  # -0.0 + 0.0 would be +0.0: keep such elements as they are
    return s.astype(t.store_dtype), t


def stored(array: np.ndarray, t: Transform) -> np.ndarray:
    """``S`` again, from the weight and its transform (what ``encode`` returned, bit for bit)."""
    w = np.ascontiguousarray(_as_numpy(array)).reshape(-1)
    p = w[_permutation(t.size, t.a, t.b)]
    del w
    p64 = p.astype(t.store_dtype)
    del p
    s = p64 + noise(t)
    s[t.exceptions] = p64[t.exceptions]
    return s


def lazy_stored(source: ir.TensorProtocol, t: Transform, name: str) -> ir.LazyTensor:
    """``S`` as a tensor computed from ``source`` (the weight) each time it is read, never kept:
    a storage-mode model holds its stored weights (twice the weights' size in float64) only
    one at a time, while it is signed, measured and written."""
    return ir.LazyTensor(
        lambda: ir.tensor(stored(source.numpy(), t)),
        dtype=ir.DataType.from_numpy(t.store_dtype),
        shape=ir.Shape([t.size]),
        name=name,
    )


def decode(stored: np.ndarray, t: Transform) -> np.ndarray:
    """The weight back from ``S`` (numpy; bit for bit what the ONNX form computes)."""
    target = np.dtype(t.dtype.numpy())
    flat = (stored.reshape(-1) - noise(t)).astype(
        np.float32 if target.name == "bfloat16" else target
    )
    if target.name == "bfloat16":
        flat = flat.astype(target)
    return flat[inverse_index(t)].reshape(t.shape)


def decode_nodes(t: Transform, stored: ir.Value, opset: int) -> tuple[list[ir.Node], ir.Value]:
    """ONNX nodes computing the weight from ``stored`` (``S``): Cast(S - R) gathered back into
    place and reshaped. ``R`` and the indices are materialised here, in memory, from the
    transform; the runtime folds the whole chain once at load."""
    r = noise(t)
    if t.is_float:  # R is exactly representable in float32: ship it at half the size
        r_const = ir.node("Constant", [], attributes={"value": ir.tensor(r.astype(np.float32))})
        r_value = ir.node("Cast", [r_const.outputs[0]], attributes={"to": ir.DataType.DOUBLE})
        nodes = [r_const, r_value]
    else:
        r_value = ir.node("Constant", [], attributes={"value": ir.tensor(r)})
        nodes = [r_value]
    diff = ir.node("Sub", [stored, r_value.outputs[0]])
    cast = ir.node("Cast", [diff.outputs[0]], attributes={"to": t.dtype})
    idx = ir.node("Constant", [], attributes={"value": ir.tensor(inverse_index(t))})
    gather = ir.node("Gather", [cast.outputs[0], idx.outputs[0]], attributes={"axis": 0})
    shape = np.array(t.shape, dtype=np.int64)
    if opset >= 5:
        shape_const = ir.node("Constant", [], attributes={"value": ir.tensor(shape)})
        reshape = ir.node("Reshape", [gather.outputs[0], shape_const.outputs[0]])
        nodes += [diff, cast, idx, gather, shape_const, reshape]
    else:
        reshape = ir.node(
            "Reshape",
            [gather.outputs[0]],
            attributes={"shape": ir.AttrInt64s("shape", list(shape))},
        )
        nodes += [diff, cast, idx, gather, reshape]
    return nodes, reshape.outputs[0]


def constant_tensors(model: ir.Model, *, kinds: str, min_size: int) -> list[ir.TensorProtocol]:
    """``constant_arrays``, as the tensors themselves (read only when used)."""
    out = []
    for graph in model.graphs():
        tensors = [v.const_value for v in graph.initializers.values() if v.const_value is not None]
        tensors += [
            n.attributes["value"].value
            for n in graph
            if n.op_type == "Constant" and "value" in n.attributes
        ]
        for t in tensors:
            try:
                kind = np.dtype(t.dtype.numpy()).kind
            except Exception:  # noqa: BLE001 - strings and exotic types are not weights
                continue
            if kind in kinds and t.size >= min_size and t.dtype.bitwidth >= 8:
                out.append(t)
    return out


def constant_arrays(model: ir.Model, *, kinds: str, min_size: int) -> list[np.ndarray]:
    """Every constant tensor of ``model`` (initializers and Constant nodes, in every graph) of a
    numeric ``kinds`` and at least ``min_size`` elements, as arrays: the weights the correlation
    checks compare."""
    return [t.numpy() for t in constant_tensors(model, kinds=kinds, min_size=min_size)]
