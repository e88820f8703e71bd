import torch

from helpers import precision


def test_format_table_matches_the_ieee_and_bf16_layouts():
    rows = {r["format"]: r for r in precision.format_table()}
    assert (rows["fp32"]["exponent"], rows["fp32"]["mantissa"]) == (8, 23)
    assert (rows["bf16"]["exponent"], rows["bf16"]["mantissa"]) == (8, 7)
    assert (rows["fp16"]["exponent"], rows["fp16"]["mantissa"]) == (5, 10)
    assert (rows["tf32"]["exponent"], rows["tf32"]["mantissa"], rows["tf32"]["bits"]) == (8, 10, 19)
    assert rows["fp16"]["max"] == 65504.0 and rows["bf16"]["eps"] == 2.0**-7
    if hasattr(torch, "float8_e4m3fn"):
        assert rows["fp8 e4m3"]["max"] == 448.0 and rows["fp8 e5m2"]["max"] == 57344.0


def test_native_formats_by_compute_capability():
    assert precision.native_on((7, 5)) == ["fp32", "fp16"]
    assert set(precision.native_on((8, 0))) == {"fp32", "tf32", "bf16", "fp16"}
    assert "fp8 e4m3" in precision.native_on((9, 0)) and precision.native_on(None) == ["fp32"]


def test_demonstrations_show_underflow_rounding_and_overflow():
    d = precision.demonstrations()
    assert d["bf16_1_plus_2^-8_equals_1"] and not d["bf16_1_plus_2^-7_equals_1"]
    assert d["fp16_1e-8"] == 0.0 and abs(d["fp16_1e-8_scaled_by_2^16_then_unscaled"] - 1e-8) < 1e-10
    assert d["fp16_70000"] == float("inf") and d["bf16_70000"] < float("inf")


def test_autocast_dtype_choice():
    assert precision.autocast_dtype_for((7, 5)) is torch.float16
    assert precision.autocast_dtype_for((8, 0)) is torch.bfloat16
    assert precision.autocast_dtype_for(None) is None
