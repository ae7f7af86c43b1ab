"""modelpress advise: the JSON fields per device, HTML with plots, inputs by file, clear errors."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from modelpress.cli.main import main

FIELDS = (
    "gpu",
    "num_gpus",
    "fits",
    "memory_gb",
    "throughput",
    "unit",
    "latency_ms",
    "bound",
    "cloud_usd_per_hour",
    "own_usd_per_hour",
    "cloud_usd_per_million",
    "own_usd_per_million",
    "reason",
    "rank",
)


def _advise(capsys, *argv):
    rc = main(["advise", *argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_json_fields_per_device(tmp_path, capsys):
    out = tmp_path / "out.json"
    rc, stdout, _ = _advise(
        capsys,
        "--workload",
        "resnet50",
        "--task",
        "infer",
        "--precision",
        "int8",
        "--batch",
        "32",
        "--gpu",
        "a100-sxm-80gb,L4,T4",
        "--latency-ms",
        "20",
        "--json",
        str(out),
    )
    assert rc == 0
    data = json.loads(out.read_text())["result"]
    assert data["scenario"] == "online" and data["workload"]["name"] == "resnet50"
    assert [d["gpu"] for d in data["devices"]][0] in ("NVIDIA A100 SXM4 80GB", "NVIDIA L4")
    for d in data["devices"]:
        for field in FIELDS:
            assert field in d, field
        assert d["unit"] == "samples/s" and d["bound"] in ("compute", "memory", "overhead")
        assert d["num_gpus"] == 1 and d["batch"] <= 32
    assert "A100 SXM4 80GB" in stdout


def test_engine_eager_is_estimated_op_by_op(tmp_path, capsys):
    # `--engine` reaches the ranking too, not only the service planner: eager PyTorch dispatches
    # every op from the host, so its estimate equals the estimator's eager one, below compiled's
    from modelpress.advisor.catalog import load_catalog
    from modelpress.advisor.estimate import estimate
    from modelpress.profile.workloads import get_workload

    got = {}
    for engine in ("eager", "compiled"):
        out = tmp_path / f"{engine}.json"
        argv = ["--workload", "resnet50", "--precision", "fp16", "--batch-size", "8"]
        argv += ["--gpu", "L4", "--engine", engine, "--no-cpu", "--json", str(out)]
        rc, _, _ = _advise(capsys, *argv)
        assert rc == 0
        got[engine] = json.loads(out.read_text())["result"]["devices"][0]["throughput"]
    gpu = load_catalog().lookup("L4").gpu
    for engine in ("eager", "compiled"):
        expected = estimate(
            get_workload("resnet50"),
            gpu,
            task="infer",
            precision="fp16",
            batch=8,
            engine=engine,
        ).throughput
        assert got[engine] == pytest.approx(expected, rel=1e-9)
    assert got["eager"] < 0.5 * got["compiled"]


def test_training_llm_config_tokens(tmp_path, capsys):
    cfg = tmp_path / "config.json"
    cfg.write_text(
        json.dumps(
            {
                "model_type": "llama",
                "hidden_size": 2048,
                "intermediate_size": 5632,
                "num_attention_heads": 32,
                "num_key_value_heads": 4,
                "num_hidden_layers": 22,
                "vocab_size": 32000,
                "max_position_embeddings": 2048,
            }
        )
    )
    out = tmp_path / "o.json"
    rc, _, _ = _advise(
        capsys,
        str(cfg),
        "--task",
        "train",
        "--precision",
        "bf16",
        "--batch",
        "4",
        "--seq",
        "1024",
        "--gpu",
        "H100 SXM",
        "--num-gpus",
        "8",
        "--samples",
        "1e9",
        "--json",
        str(out),
    )
    assert rc == 0
    (d,) = json.loads(out.read_text())["result"]["devices"]
    assert d["unit"] == "tokens/s" and d["num_gpus"] == 8 and d["fits"]
    assert d["job_hours"] == pytest.approx(1e9 / d["throughput"] / 3600)


def test_html_has_both_plots(tmp_path, capsys):
    page = tmp_path / "r.html"
    rc, _, _ = _advise(
        capsys,
        "--workload",
        "bert-base",
        "--task",
        "infer",
        "--precision",
        "fp16",
        "--batch",
        "16",
        "--gpu",
        "L4,A10,RTX 4090",
        "--html",
        str(page),
    )
    assert rc == 0
    text = page.read_text()
    assert (
        text.count("<svg") == 2 and "Roofline on" in text and "http" not in text.split("<body>")[0]
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--workload", "resnet50", "--gpu", "TPU"],
            "error: --gpu 'TPU' is ambiguous: it matches Google TPU v4",
        ),
        (["--workload", "resnet50", "--gpu", "Z9000"], "error: --gpu 'Z9000': no such accelerator"),
        (
            ["--workload", "resnet50", "--gpu", "L4,T4", "--latency-ms", "0.001"],
            "error: resnet50 (infer, fp16): no device meets --latency-ms 0.001",
        ),
        (
            ["--workload", "llama-2-70b", "--task", "train", "--gpu", "L4,T4"],
            "fits on none of the 2 candidate devices",
        ),
        ([], "error: give either a model file (.onnx or config.json) or --workload NAME"),
        (["--workload", "resnet50", "--batch", "0"], "error: --batch-size must be at least 1"),
    ],
)
def test_errors_are_one_line_and_write_nothing(tmp_path, capsys, argv, message):
    out = tmp_path / "out.json"
    rc, _, err = _advise(capsys, *argv, "--json", str(out))
    assert rc == 1
    assert message in err and err.count("\n") == 1 and "Traceback" not in err
    assert not out.exists() and list(tmp_path.iterdir()) == []


def _tiny_onnx(path):
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((64, 64)).astype(np.float32), "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 64])],
        [w],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def test_onnx_model_with_calibration(tmp_path, capsys):
    model = tmp_path / "tiny.onnx"
    _tiny_onnx(model)
    out = tmp_path / "c.json"
    rc, stdout, _ = _advise(
        capsys,
        str(model),
        "--task",
        "infer",
        "--precision",
        "fp32",
        "--batch",
        "4",
        "--gpu",
        "T4",
        "--calibrate",
        "--json",
        str(out),
    )
    assert rc == 0
    data = json.loads(out.read_text())["result"]
    cal = data["calibration"]
    assert cal["matmul_gflops"] > 0 and cal["copy_gbs"] > 0 and cal["node_overhead_us"] > 0
    assert cal["measured_ms"] > 0 and cal["predicted_ms"] > 0
    assert data["workload"]["params"] == 64 * 64
    assert "calibration on" in stdout


def test_list_gpus(capsys):
    rc, stdout, _ = _advise(capsys, "--list-gpus")
    assert rc == 0 and "MI300X" in stdout


def test_user_catalog_and_edge_scenario(tmp_path, capsys):
    mine = tmp_path / "mine.csv"
    mine.write_text(
        "name,memory_gb,memory_bandwidth_gbs,int8_tops,fp32_tflops,tdp_w,price_usd,src_memory\nAcme Edge 1,8,100,50,5,15,300,my datasheet\n"
    )
    out = tmp_path / "e.json"
    rc, _, _ = _advise(
        capsys,
        "--workload",
        "mobilenet-v2",
        "--precision",
        "int8",
        "--batch",
        "4",
        "--power-cap-w",
        "20",
        "--catalog",
        str(mine),
        "--gpu",
        "acme edge 1,T4",
        "--json",
        str(out),
    )
    assert rc == 0
    data = json.loads(out.read_text())["result"]
    assert data["scenario"] == "edge"
    first, second = data["devices"]
    assert first["gpu"] == "Acme Edge 1" and first["rank"] == 1 and first["own_usd_per_hour"] > 0
    assert (
        second["gpu"] == "NVIDIA T4"
        and second["rank"] is None
        and "over the 20 W cap" in second["reason"]
    )
