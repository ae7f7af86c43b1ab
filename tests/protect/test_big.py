"""A model over 2 GB (its weights in external data) is encrypted and decrypted as a stream: the
memory the process allocates stays at a few chunks (tracemalloc and the resident-set peak), and
every byte comes back where it was."""

from __future__ import annotations

import shutil
import tempfile
import tracemalloc
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

from modelpress.protect import package, protect
from modelpress.protect.payload import LOCATION, PAYLOAD_MAGIC
from modelpress.runtime.measure import peak_memory_mb

CHUNK = 64 << 10
ELEMENTS = (2**31 + 2**22) // 4  # 2.15 GB of float32: past protobuf's and ONNX's 2 GiB limit
MARKS = {0: b"first", ELEMENTS * 2 + 3: b"middle", ELEMENTS * 4 - 4: b"last"}
LIMIT_BYTES = 24 << 20  # a few chunks and the read pieces, not the model's 2 GB


def _big_model(folder) -> str:
    data = folder / "big.onnx.data"
    with open(data, "wb") as f:  # sparse: zeros cost no disk; a few marked bytes
        f.truncate(ELEMENTS * 4)
        for offset, mark in MARKS.items():
            f.seek(offset)
            f.write(mark)
    weight = TensorProto(name="table", data_type=TensorProto.FLOAT, dims=[ELEMENTS])
    weight.data_location = TensorProto.EXTERNAL
    for k, v in (("location", data.name), ("offset", "0"), ("length", str(ELEMENTS * 4))):
        weight.external_data.add(key=k, value=v)
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "ids"], ["rows"])],
        "big",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["n"])],
        [helper.make_tensor_value_info("rows", TensorProto.FLOAT, ["n"])],
        [weight],
    )
    path = folder / "big.onnx"
    path.write_bytes(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    )
    return path


def _scratch(tmp_path) -> Path:
    """A folder for 4.3 GB of files: memory-backed when the machine has room (the test is then
    bound by the CPU, not by writing 2 GB to a disk), else the test's own folder."""
    shm = Path("/dev/shm")
    if shm.is_dir() and shutil.disk_usage(shm).free > 6 * 2**30:
        return Path(tempfile.mkdtemp(prefix="modelpress-big-", dir=shm))
    return tmp_path


def test_over_2gb_in_and_out_with_bounded_memory(tmp_path, key):
    folder = _scratch(tmp_path)
    source = _big_model(folder)
    out = folder / "big.mpk"
    try:
        tracemalloc.start()
        holder = {}
        rss = peak_memory_mb(
            lambda: holder.setdefault("r", protect(source, key=key, output=out, chunk_size=CHUNK))
        )
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        result = holder["r"]
        assert result.notes and "not verified" in result.notes[0]
        assert result.bytes == out.stat().st_size > ELEMENTS * 4
        assert peak < LIMIT_BYTES, f"encryption allocated {peak / 2**20:.0f} MiB"
        assert rss is None or rss < 200, f"resident memory grew by {rss:.0f} MiB"

        # decrypt as a stream: parse the payload's head, then scan the tensor bytes chunk by chunk
        tracemalloc.start()
        head = bytearray()
        proto = None
        position = 0  # in the tensor section
        nonzero: dict[int, int] = {}
        for view in package.decrypt_stream(out, key):
            view = bytes(view)
            if proto is None:
                head += view
                if len(head) < len(PAYLOAD_MAGIC) + 8:
                    continue
                size = int.from_bytes(head[8:16], "big")
                if len(head) < 16 + size:
                    continue
                assert head[:8] == PAYLOAD_MAGIC
                proto = onnx.ModelProto.FromString(bytes(head[16 : 16 + size]))
                view = bytes(head[16 + size :])
            arr = np.frombuffer(view, dtype=np.uint8)
            for i in np.flatnonzero(arr):
                nonzero[position + int(i)] = int(arr[i])
            position += len(view)
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert peak < LIMIT_BYTES, f"decryption allocated {peak / 2**20:.0f} MiB"
        assert position == ELEMENTS * 4
        (table,) = proto.graph.initializer
        assert {e.key: e.value for e in table.external_data} == {
            "location": LOCATION,
            "offset": "0",
            "length": str(ELEMENTS * 4),
        }
        want = {o + i: b for o, mark in MARKS.items() for i, b in enumerate(mark)}
        assert nonzero == want
    finally:  # 4.3 GB of files: do not leave them to pytest's retention
        shutil.rmtree(folder, ignore_errors=True)


def test_a_model_in_memory_opens_with_memory_bounded_by_its_tensors(tmp_path, key):
    """open_package fills each tensor's own buffer straight from the decrypted chunks."""
    from modelpress.ir import from_proto
    from modelpress.protect import open_package

    table = np.random.default_rng(0).standard_normal(16 << 20 >> 2).astype(np.float32)  # 16 MiB
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "ids"], ["rows"])],
        "g",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["n"])],
        [helper.make_tensor_value_info("rows", TensorProto.FLOAT, ["n"])],
        [onnx.numpy_helper.from_array(table, "table")],
    )
    model = from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    out = tmp_path / "m.mpk"
    protect(model, key=key, output=out, chunk_size=CHUNK, verify=False)
    del model, graph
    tracemalloc.start()
    opened = open_package(out, key)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < table.nbytes + 4 * CHUNK + (1 << 20), (
        f"{(peak - table.nbytes) / 2**20:.1f} MiB over the tensor"
    )
    assert opened.graph.initializers["table"].const_value.numpy().tobytes() == table.tobytes()
