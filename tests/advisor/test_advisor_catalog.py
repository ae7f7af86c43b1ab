"""The catalog: every number has a source, peaks are dense, names match loosely, users override."""

from __future__ import annotations

import json

import pytest

from modelpress.advisor.catalog import NUMERIC, SOURCE_OF, load_catalog
from modelpress.errors import InputError, OptionError


@pytest.fixture(scope="module")
def catalog():
    return load_catalog()


def test_loads_and_every_number_has_a_source(catalog):
    assert len(catalog.gpus) >= 26
    for gpu in catalog.gpus:
        assert gpu.memory_gb > 0 and gpu.memory_bandwidth_gbs > 0, gpu.name
        for number in NUMERIC:
            if getattr(gpu, number) is not None:
                assert gpu.source(number), (
                    f"{gpu.name}: {number} has no source ({SOURCE_OF[number]})"
                )
        assert gpu.changes, f"{gpu.name}: the changes column says what was changed (or 'none')"


def test_tensor_peaks_are_dense(catalog):
    # dense FP16 is twice dense TF32 on every NVIDIA part with both (a sparse figure would be 4x)
    for gpu in catalog.gpus:
        if gpu.tf32_tflops and gpu.fp16_tflops:
            assert gpu.fp16_tflops / gpu.tf32_tflops == pytest.approx(2.0, rel=0.02), gpu.name
    h100 = catalog.find("H100 SXM")
    assert (h100.fp16_tflops, h100.fp8_tflops, h100.memory_bandwidth_gbs) == (989.5, 1979, 3350)


@pytest.mark.parametrize(
    "name", ["a100-sxm-80gb", "A100 SXM4 80GB", "NVIDIA A100 SXM4 80GB", "nvidia_a100_sxm_80gb"]
)
def test_loose_names_resolve_to_one_entry(catalog, name):
    assert catalog.find(name).name == "NVIDIA A100 SXM4 80GB"


def test_other_spellings(catalog):
    assert catalog.find("rtx 4090").name == "NVIDIA GeForce RTX 4090"
    assert catalog.find("L40").name == "NVIDIA L40"  # not L40S
    assert catalog.find("mi300x").vendor == "AMD"


def test_ambiguous_name_lists_the_candidates(catalog):
    # TPU v4 and v5e are two generations, not variants of one part: no default
    with pytest.raises(OptionError) as err:
        catalog.find("TPU")
    msg = str(err.value)
    assert "ambiguous" in msg and "\n" not in msg
    assert "Google TPU v4" in msg and "Google TPU v5e" in msg


@pytest.mark.parametrize(
    ("query", "name", "others"),
    [
        ("V100 16GB", "NVIDIA V100 SXM2 16GB", ["V100 PCIe 16GB"]),
        ("V100", "NVIDIA V100 SXM2 16GB", ["V100 SXM2 32GB", "V100 PCIe 16GB"]),
        ("A100", "NVIDIA A100 SXM4 80GB", ["A100 SXM4 40GB", "A100 PCIe 40GB", "A100 PCIe 80GB"]),
        ("A100 40GB", "NVIDIA A100 SXM4 40GB", ["A100 PCIe 40GB"]),
        ("a100-80gb", "NVIDIA A100 SXM4 80GB", ["A100 PCIe 80GB"]),
        ("H100", "NVIDIA H100 SXM5 80GB", ["H100 PCIe 80GB"]),
    ],
)
def test_loose_names_take_the_most_common_variant(catalog, query, name, others):
    found = catalog.lookup(query)
    assert found.gpu.name == name
    assert f"took {name}, the most common variant" in found.note
    assert all(o in found.note for o in others) and "A800" not in found.note
    assert "\n" not in found.note and found.note.endswith("name the variant to choose another")


def test_default_variants_have_a_reason_and_exact_names_no_note(catalog):
    for gpu in catalog.gpus:
        if gpu.default_for:
            assert dict(gpu.sources).get("src_default"), gpu.name
    assert catalog.lookup("V100 PCIe 16GB").note == ""
    assert catalog.lookup("NVIDIA A100 SXM4 40GB").note == ""
    # two entries cannot both be the default for one name
    defaults = [d.lower() for g in catalog.gpus for d in g.default_for]
    assert len(defaults) == len(set(defaults))


def test_unknown_name_suggests_close_ones(catalog):
    with pytest.raises(OptionError, match=r"'H1000': no such accelerator.*did you mean .*H100"):
        catalog.find("H1000")


def test_user_file_overrides_and_adds(tmp_path):
    csv_file = tmp_path / "mine.csv"
    csv_file.write_text("name,price_usd,src_price\nNVIDIA L4,2500,my quote 2026-01\n")
    json_file = tmp_path / "mine.json"
    json_file.write_text(
        json.dumps(
            {
                "gpus": [
                    {
                        "name": "Acme X1",
                        "memory_gb": 64,
                        "memory_bandwidth_gbs": 2000,
                        "bf16_tflops": 400,
                        "tdp_w": 300,
                    }
                ]
            }
        )
    )
    cat = load_catalog([csv_file, json_file])
    l4 = cat.find("L4")
    assert l4.price_usd == 2500 and l4.source("price_usd") == "my quote 2026-01"
    assert l4.memory_gb == 24  # untouched fields keep the built-in value
    x1 = cat.find("acme x1")
    assert x1.bf16_tflops == 400 and x1.source("bf16_tflops") == "user file mine.json"
    assert x1.peak_tflops("fp16") == (400.0, "bf16")


def test_bad_user_files(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("name,memory_gb\nNVIDIA L4,lots\n")
    with pytest.raises(InputError, match="bad.csv entry 1: column memory_gb has 'lots'"):
        load_catalog([bad])
    new = tmp_path / "new.csv"
    new.write_text("name,fp16_tflops\nAcme Y,100\n")
    with pytest.raises(InputError, match="needs memory_gb"):
        load_catalog([new])
    with pytest.raises(InputError, match="no such file"):
        load_catalog([tmp_path / "missing.json"])
