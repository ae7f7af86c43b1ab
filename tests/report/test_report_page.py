"""The report page: built from records of several commands, opened in headless Chromium (Debian's
``chromium`` through Playwright, never a downloaded browser): no console error, no request beyond
the file itself, every chart drawn at a visible size; a screenshot is kept under
``test-artifacts/``. Bad record files are refused in one line."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest
from quant_models import image_like, small_cnn

from modelpress.cli.main import main
from modelpress.errors import InputError
from modelpress.ir import save
from modelpress.ir.files import write_npz
from modelpress.report.page import find_loss_curves, read_records
from modelpress.report.record import SCHEMA, Record

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    assert path, (
        "Debian's chromium is needed (`make test` installs it: apt-get install -y chromium)"
    )
    return path


def open_in_chromium(page_path: Path, screenshot: Path) -> dict:
    """Load ``page_path`` from disk; what the browser saw: console errors, requests, each SVG's
    box and visibility."""
    from playwright.sync_api import sync_playwright

    seen: dict = {"errors": [], "requests": []}
    with sync_playwright() as p, tempfile.TemporaryDirectory() as profile:
        browser = p.chromium.launch_persistent_context(
            profile, executable_path=chromium(), headless=True, args=CHROMIUM_FLAGS
        )
        try:
            page = browser.new_page()
            page.on(
                "console", lambda m: seen["errors"].append(m.text) if m.type == "error" else None
            )
            page.on("pageerror", lambda e: seen["errors"].append(str(e)))
            page.on("request", lambda r: seen["requests"].append(r.url))
            page.goto(page_path.resolve().as_uri(), wait_until="load")
            svgs = page.locator("figure svg")
            seen["charts"] = [
                (svgs.nth(i).bounding_box(), svgs.nth(i).is_visible()) for i in range(svgs.count())
            ]
            seen["figures"] = page.locator("figure").count()
            seen["title"] = page.title()
            screenshot.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(screenshot), full_page=True)
        finally:
            browser.close()
    return seen


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    """Records of auto, quantize, bench, a training command and advise, as the commands write them."""
    folder = tmp_path_factory.mktemp("records")
    save(small_cnn(), folder / "cnn.onnx")
    write_npz(folder / "val.npz", {"x": image_like(np.random.default_rng(7), (48, 4, 8, 8))})
    assert (
        main(
            [
                "auto",
                str(folder / "cnn.onnx"),
                "-o",
                str(folder / "best.onnx"),
                "--data",
                str(folder / "val.npz"),
                # (static only: a float winner, when int8 times slower on a busy machine, has no layer chart)
                "--levels",
                "2",
                "--modes",
                "static",
                "--methods",
                "minmax",
                "--timing",
                "0.05",
                "--cache",
                str(folder / "cache"),
                "--json",
                str(folder / "auto.json"),
                "--report",
                str(folder / "auto.html"),
            ]
        )
        == 0
    )
    auto = json.loads((folder / "auto.json").read_text())
    layers = auto["result"]["winner"]["layers"]
    quantize = dict(
        auto,
        command="quantize",
        result={
            "mode": "static",
            "method": "minmax",
            "size_before": 10000,
            "size_after": 4000,
            "output_error": 0.01,
            "layers": layers,
            "notes": ["a note"],
            "accuracy": {
                "metric_float": 0.9,
                "metric_quantized": 0.89,
                "drop": 0.01,
                "budget": 0.02,
                "met": True,
                "kept_float": [],
            },
            "latency_ms": {
                "float": {"median_ms": 1.0, "p25_ms": 0.9, "p75_ms": 1.2, "runs": 9},
                "quantized": {"median_ms": 0.6, "p25_ms": 0.5, "p75_ms": 0.7, "runs": 9},
                "ratio": 0.6,
            },
        },
    )
    bench = dict(
        auto,
        command="bench",
        models={},
        charts={},
        result={
            "backend": "ort",
            "batch": 1,
            "models": [
                {
                    "model": "a.onnx",
                    "timing": {"median_ms": 2.0, "p25_ms": 1.8, "p75_ms": 2.3, "runs": 50},
                    "gflops": 3.0,
                },
                {
                    "model": "b.onnx",
                    "timing": {"median_ms": 1.5, "p25_ms": 1.4, "p75_ms": 1.7, "runs": 50},
                    "gflops": 4.0,
                },
            ],
        },
    )
    train = dict(
        auto,
        command="prune",
        models={},
        charts={},
        result={
            "ratio": 0.5,
            "loss_curve": {"train": [2.0, 1.2, 0.8, 0.6], "held-out": [[0, 2.1], [3, 0.9]]},
        },
    )
    paths = []
    for name, data in (
        ("1-auto", auto),
        ("2-quantize", quantize),
        ("3-bench", bench),
        ("4-prune", train),
    ):
        paths.append(folder / f"{name}.json")
        paths[-1].write_text(json.dumps(data))
    return folder, paths


def test_the_report_renders_in_headless_chromium_with_every_chart(records, tmp_path):
    folder, paths = records
    out = tmp_path / "report.html"
    assert main(["report", str(folder / "1-auto.json"), *map(str, paths[1:]), "-o", str(out)]) == 0
    text = out.read_text()
    # self-contained: no script, no stylesheet, font or image from elsewhere
    for outside in ("<script", "<link", "<img", "@import", "url(http", 'href="http', "src="):
        assert outside not in text, outside
    seen = open_in_chromium(out, ARTIFACTS / "report.png")
    assert seen["errors"] == [] and seen["requests"] == [out.resolve().as_uri()]
    # auto: op counts, before/after, Pareto, layer errors, roofline, costs; quantize (with the
    # same cards and advisor charts): op counts, before/after, layer errors, roofline, costs;
    # bench: before/after; prune: loss curve
    assert seen["figures"] == len(seen["charts"]) == 13
    for box, visible in seen["charts"]:
        assert visible and box["width"] > 200 and box["height"] > 100
    assert (ARTIFACTS / "report.png").stat().st_size > 10_000
    # the page --report wrote alongside the auto run renders too
    single = open_in_chromium(folder / "auto.html", tmp_path / "auto.png")
    assert (
        single["errors"] == []
        and len(single["charts"]) == 6
        and single["title"] == "modelpress auto"
    )


def test_loss_curves_are_found_in_the_shapes_training_records_use():
    assert find_loss_curves({"a": {"loss_curve": {"train": [3, 2]}}}) == {
        "train": [(0.0, 3.0), (1.0, 2.0)]
    }
    rows = [{"step": 10, "loss": 1.5, "val_loss": 1.7}, {"step": 20, "loss": 1.0}]
    assert find_loss_curves({"history": rows}) == {
        "loss": [(10.0, 1.5), (20.0, 1.0)],
        "val_loss": [(10.0, 1.7)],
    }
    assert find_loss_curves({"nothing": 1}) == {}


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"schema": "modelpress.record/2", "command": "x", "res', "not a JSON record"),
        ('{"command": "x", "result": {}}', "not a modelpress record (field 'schema' is None"),
        (
            f'{{"schema": "{SCHEMA}", "command": "x", "result": []}}',
            "field 'result' is not an object",
        ),
        (f'{{"schema": "{SCHEMA}", "result": {{}}}}', "record has no field 'command'"),
        (
            f'{{"schema": "{SCHEMA}", "command": "x", "result": {{}}, "models": {{"in": 3}}}}',
            "field 'models.in' is not an object",
        ),
        ("\x00\xff binary", "not a JSON record"),
    ],
)
def test_a_bad_record_is_one_clear_line(tmp_path, capsys, content, message):
    bad = tmp_path / "bad.json"
    bad.write_bytes(content.encode("latin-1"))
    with pytest.raises(InputError, match="^" + str(bad).replace("\\", "\\\\") + ": "):
        Record.read(bad)
    code = main(["report", str(bad), "-o", str(tmp_path / "r.html")])
    err = capsys.readouterr().err.strip()
    assert code == 1 and message in err and "\n" not in err and not (tmp_path / "r.html").exists()


def test_missing_records_and_empty_folders_are_refused(tmp_path):
    with pytest.raises(InputError, match="no such file"):
        read_records([tmp_path / "none.json"])
    with pytest.raises(InputError, match="no .json records in this folder"):
        read_records([tmp_path])


def test_a_format_1_record_is_read(tmp_path):
    p = tmp_path / "old.json"
    p.write_text(
        json.dumps(
            {
                "schema": "modelpress.record/1",
                "command": "optimize",
                "result": {"level": 2, "passes": []},
            }
        )
    )
    (r,) = read_records([p])
    assert r.command == "optimize" and r.models == {} and r.schema == SCHEMA


def test_commands_write_their_page_with_report(records, tmp_path, capsys):
    folder, _ = records
    model, data = str(folder / "cnn.onnx"), str(folder / "val.npz")
    runs = {
        "optimize": ["optimize", model, "-o", str(tmp_path / "o.onnx")],
        "quantize": [
            "quantize",
            model,
            "-o",
            str(tmp_path / "q.onnx"),
            "--calib",
            data,
            "--no-latency",
        ],
        "bench": [
            "bench",
            model,
            "--vs",
            str(folder / "best.onnx"),
            "--runs",
            "3",
            "--warmup",
            "1",
            "--dim",
            "N=2",
        ],
        "advise": [
            "advise",
            model,
            "--gpu",
            "L4",
            "--gpu",
            "A100 SXM4 80GB",
            "--precision",
            "fp16",
            "--batch",
            "4",
        ],
    }
    for name, argv in runs.items():
        page = tmp_path / f"{name}.html"
        assert main([*argv, "--report", str(page)]) == 0, name
        text = page.read_text()
        assert f"<title>modelpress {name}</title>" in text and "model card" in text, name
        # optimize: nothing to fold in this model, so no op-count chart; quantize: op counts and
        # the layer errors (no latency asked); bench: op counts of the two models, latencies;
        # advise: roofline and costs
        charts = {"optimize": 0, "quantize": 2, "bench": 2, "advise": 2}[name]
        assert text.count("<figure>") == charts, (name, text.count("<figure>"))
    assert "verified against the input: passed" in (tmp_path / "optimize.html").read_text()
    capsys.readouterr()
