"""The service planner: its batches and latency against a discrete-event simulation of the same
queue, the replicas and serve settings it names, and the CLI that prints them."""

from __future__ import annotations

import collections
import heapq
import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from modelpress.advisor.batching import analyse
from modelpress.advisor.catalog import load_catalog
from modelpress.advisor.curve import ServiceCurve, estimate_curve, sample_batches
from modelpress.advisor.measured import record_curve
from modelpress.advisor.recommend import Request, recommend
from modelpress.advisor.service import NoServiceError, plan_option, plan_service
from modelpress.cli.main import main
from modelpress.errors import InputError, OptionError
from modelpress.ir import load
from modelpress.profile import get_workload
from modelpress.profile.workload import workload_from_onnx
from modelpress.report.record import SCHEMA


def simulate(rate, service, *, max_batch, delay, n=100_000, seed=0):
    """Event-driven simulation of one dynamic-batching worker, independent of the analysis:
    Poisson arrivals; when the worker is free it sends the waiting requests (up to max_batch,
    oldest first) once max_batch wait or the oldest has waited ``delay``; a batch of k keeps it
    busy service(k) seconds. Returns (mean batch, p99 latency ms), the first 10% dropped."""
    rng = np.random.default_rng(seed)
    arrive = np.cumsum(rng.exponential(1.0 / rate, n)).tolist()
    events = [(t, 0, i) for i, t in enumerate(arrive)]  # (time, kind, request); 0 arrival
    heapq.heapify(events)
    waiting, busy, armed = collections.deque(), False, None
    latency, sizes = [0.0] * n, []
    while events:
        now, kind, i = heapq.heappop(events)
        if kind == 0:
            waiting.append(i)
        elif kind == 1:  # the worker finished its batch
            busy = False
        elif kind == 2:  # a batching deadline
            armed = None
        if busy or not waiting:
            continue
        oldest = arrive[waiting[0]]
        if len(waiting) >= max_batch or now >= oldest + delay - 1e-12:
            batch = [waiting.popleft() for _ in range(min(max_batch, len(waiting)))]
            done = now + float(service(len(batch)))
            for j in batch:
                latency[j] = done - arrive[j]
            sizes.append(len(batch))
            busy = True
            heapq.heappush(events, (done, 1, -1))
        elif armed != oldest + delay:
            armed = oldest + delay
            heapq.heappush(events, (armed, 2, -1))
    skip = n // 10
    return float(np.mean(sizes[len(sizes) // 10 :])), float(np.percentile(latency[skip:], 99)) * 1e3


@pytest.fixture(scope="module")
def catalog():
    return load_catalog()


@pytest.fixture(scope="module")
def t4_curve(catalog):
    # service times of ResNet-50 INT8 batches on a T4, from the advisor's estimate
    return estimate_curve(
        get_workload("resnet50"), catalog.find("T4"), precision="int8", target_s=0.05
    )


@pytest.mark.parametrize(
    ("load", "delay_ms"),
    [(0.3, 0.0), (0.9, 0.0), (1.8, 0.0), (0.5, 1.0), (1.5, 2.0)],
)
def test_batch_and_latency_agree_with_a_simulation(t4_curve, load, delay_ms):
    # ``load`` requests arrive, on average, during the service of a batch of one
    rate = load / float(t4_curve(1))
    q = analyse(rate, t4_curve, max_batch=64, max_delay_s=delay_ms / 1e3)
    batch, p99 = simulate(rate, t4_curve, max_batch=64, delay=delay_ms / 1e3, seed=int(load * 10))
    assert not q.saturated
    assert q.mean_batch == pytest.approx(batch, rel=0.02)
    assert q.p99_ms == pytest.approx(p99, rel=0.05)


def test_a_binding_max_batch_is_reported_as_saturation(t4_curve):
    rate = 3.0 * 8 / float(t4_curve(8))  # three times what batches of 8 can serve
    q = analyse(rate, t4_curve, max_batch=8)
    assert q.saturated and q.overflow > 0.5 and q.batch_p50 == 8


def test_planned_settings_hold_in_simulation(t4_curve):
    option = plan_option("T4", "gpu", t4_curve, qps=6000, p99_ms=8.0, rates=(1.0, None))
    assert option.replicas >= 2 and option.serve_args.startswith(f"--max-batch {option.max_batch} ")
    rate = 6000 / option.replicas
    batch, p99 = simulate(
        rate, t4_curve, max_batch=option.max_batch, delay=option.max_delay_ms / 1e3, seed=3
    )
    assert p99 <= 8.0 * 1.03 and batch == pytest.approx(option.queue.mean_batch, rel=0.03)
    # the fewest replicas: one fewer misses the target (or saturates) at every delay tried
    fewer = analyse(6000 / (option.replicas - 1), t4_curve, max_batch=t4_curve.limit)
    assert fewer.saturated or fewer.p99_ms > 8.0
    # cost per million requests: replicas x rate / requests per hour
    assert option.cloud_usd_per_million == pytest.approx(option.replicas / (6000 * 3600) * 1e6)
    assert option.own_usd_per_million is None


def _tiny_cnn(path):
    """A digits-sized CNN (8x8 input, one conv, one dense layer), built in code."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((8, 1, 3, 3)).astype(np.float32), "w")
    fc = numpy_helper.from_array(rng.standard_normal((8 * 8 * 8, 10)).astype(np.float32), "fc")
    shape = numpy_helper.from_array(np.array([-1, 8 * 8 * 8], dtype=np.int64), "shape")
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("Reshape", ["r", "shape"], ["f"]),
        helper.make_node("MatMul", ["f", "fc"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "digits",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 1, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 10])],
        [w, fc, shape],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def test_a_tiny_model_gets_the_batch_its_traffic_forms(tmp_path, catalog):
    path = tmp_path / "digits.onnx"
    _tiny_cnn(path)
    workload = workload_from_onnx(load(path), name="digits")
    gpus = [catalog.find(n) for n in ("L4", "A100 SXM4 80GB", "H100 SXM", "RTX 4090")]
    plan = plan_service(workload, gpus, qps=2000, p99_ms=5.0, precision="int8")
    for o in plan.options:
        # 2000 requests/s against microsecond batches: almost every batch is a single request
        assert o.replicas == 1 and o.queue.mean_batch < 1.1 and o.max_batch <= 4
        assert o.queue.p99_ms < 1.0
    # without traffic, the online ranking keeps the batch bounded and leaves room to queue
    rec = recommend(workload, gpus, Request(task="infer", precision="int8", latency_ms=5.0))
    for r in rec.ranked:
        assert r.estimate.batch <= 256 and 2 * r.estimate.latency_ms <= 5.0


def test_curve_interpolates_and_never_falls():
    curve = ServiceCurve((1, 4, 8), (1e-3, 2e-3, 1.5e-3), 16, "test")
    assert curve(2) == pytest.approx(1e-3 + (2e-3 - 1e-3) / 3)
    assert curve(8) == pytest.approx(2e-3)  # a batch is never faster than a smaller one
    assert curve(16) == pytest.approx(2e-3)  # past the last point: its last slope (flat here)
    assert sample_batches(16) == [1, 2, 3, 4, 6, 8, 12, 16]
    with pytest.raises(OptionError, match="batch 1"):
        ServiceCurve((2, 4), (1e-3, 2e-3), 4, "test")


def test_bench_records_make_a_curve(tmp_path):
    one = tmp_path / "b8.json"
    one.write_text(json.dumps({"result": {"batch": 8, "models": [{"timing": {"median_ms": 4.0}}]}}))
    curve = record_curve([one])
    # flat below the measured batch, proportional above it
    assert float(curve(1)) == pytest.approx(4e-3) and float(curve(16)) == pytest.approx(8e-3)
    bad = tmp_path / "bad.json"
    bad.write_text('{"result": {"batch": 8}}')
    with pytest.raises(InputError, match="bad.json: not a `modelpress bench --json` record"):
        record_curve([bad])
    broken = tmp_path / "broken.json"
    broken.write_text('{"result": ')
    with pytest.raises(InputError, match="broken.json: not a JSON bench record"):
        record_curve([broken])


def test_no_device_can_serve(catalog):
    with pytest.raises(NoServiceError, match=r"no candidate serves 100 requests/s at p99 0.01 ms"):
        plan_service(
            get_workload("resnet50"), [catalog.find("T4")], qps=100, p99_ms=0.01, precision="int8"
        )
    with pytest.raises(OptionError, match="`qps` must be positive"):
        plan_service(
            get_workload("resnet50"), [catalog.find("T4")], qps=0, p99_ms=5, precision="int8"
        )


def _advise(capsys, *argv):
    rc = main(["advise", *argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_cli_plans_a_service(tmp_path, capsys):
    out = tmp_path / "plan.json"
    rc, stdout, _ = _advise(
        capsys,
        "--workload",
        "resnet50",
        "--precision",
        "int8",
        "--qps",
        "2000",
        "--p99-ms",
        "50",
        "--gpu",
        "L4,T4",
        "--gpu",
        "V100 16GB",
        "--json",
        str(out),
        "--html",
        str(tmp_path / "plan.html"),
    )
    assert rc == 0
    page = (tmp_path / "plan.html").read_text()
    assert "Options" in page and "--max-batch" in page and "http" not in page.split("<body>")[0]
    record = json.loads(out.read_text())
    assert record["command"] == "advise" and record["schema"] == SCHEMA
    plan = record["result"]["service"]
    assert plan["qps"] == 2000 and plan["p99_ms"] == 50
    devices = {o["device"]: o for o in plan["options"]}
    assert set(devices) == {"NVIDIA L4", "NVIDIA T4", "NVIDIA V100 SXM2 16GB"}
    for o in plan["options"]:
        assert o["p99_ms"] <= 50 and o["replicas"] >= 1
        assert o["serve_args"].startswith(f"--max-batch {o['max_batch']} --max-delay-ms ")
        assert o["service_curve"]["source"] == "roofline estimate"
    assert "most common variant" in devices["NVIDIA V100 SXM2 16GB"]["notes"][0]
    assert "note: 'V100 16GB' also fits NVIDIA V100 PCIe 16GB" in stdout
    assert "modelpress serve MODEL --max-batch" in stdout


def test_cli_measures_the_model_on_this_cpu(tmp_path, capsys):
    path = tmp_path / "digits.onnx"
    _tiny_cnn(path)
    out = tmp_path / "plan.json"
    rc, stdout, _ = _advise(
        capsys, str(path), "--qps", "200", "--p99-ms", "20", "--gpu", "T4", "--json", str(out)
    )
    assert rc == 0
    plan = json.loads(out.read_text())["result"]["service"]
    cpu = next(o for o in plan["options"] if o["kind"] == "cpu")
    assert cpu["service_curve"]["source"].startswith("measured: ONNX Runtime on this machine")
    assert cpu["p99_ms"] <= 20 and cpu["cloud_usd_per_hour"] > 0
    assert "this machine" in stdout and "modelpress serve" in stdout


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--workload", "resnet50", "--qps", "100"],
            "error: service planning needs both --qps and --p99-ms",
        ),
        (
            ["--workload", "resnet50", "--qps", "100", "--p99-ms", "0.001", "--gpu", "T4"],
            "error: resnet50: no candidate serves 100 requests/s at p99 0.001 ms",
        ),
        (
            ["--workload", "resnet50", "--qps", "100", "--p99-ms", "5", "--max-batch", "0"],
            "error: --max-batch must be at least 1",
        ),
        (
            ["--workload", "resnet50", "--qps", "100", "--p99-ms", "5", "--task", "train"],
            "error: --qps plans an inference service",
        ),
    ],
)
def test_cli_service_errors(tmp_path, capsys, argv, message):
    out = tmp_path / "plan.json"
    rc, _, err = _advise(capsys, *argv, "--json", str(out))
    assert rc == 1 and message in err and err.count("\n") == 1 and "Traceback" not in err
    assert not out.exists()


def test_measured_curve_of_a_fixed_batch_model(tmp_path):
    from modelpress.advisor.measured import measure_curve

    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((16, 16)).astype(np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "fixed",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 16])],
        [w],
    )
    path = tmp_path / "fixed.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    curve = measure_curve(load(path), target_s=1.0, budget_s=2.0)
    # one run serves up to 4 requests: a batch of 1 to 4 takes the same time
    assert curve.batches == (1, 4) and curve.limit == 4
    assert float(curve(1)) == float(curve(4)) > 0
    assert "fixed batch 4" in curve.source
