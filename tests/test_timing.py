import time

import pytest
import torch

from helpers.measure import timing


def test_warmup_steps_are_excluded_from_the_median():
    calls = {"n": 0}

    def step():
        calls["n"] += 1
        time.sleep(0.2 if calls["n"] == 1 else 0.005)  # a slow first call, like compile

    t = timing.measure(step, "cpu", warmup=2, iters=5)
    assert calls["n"] == 7
    assert len(t.times_ms) == 5 and len(t.warmup_ms) == 2
    assert t.warmup_ms[0] >= 150
    assert 4 <= t.median_ms < 50


def test_median_resists_one_outlier():
    t = timing.StepTiming(times_ms=[10, 10, 11, 10, 500], warmup_ms=[])
    assert t.median_ms == 10
    assert t.spread_pct == pytest.approx(4900)


def test_bad_iteration_counts_raise():
    with pytest.raises(ValueError):
        timing.measure(lambda: None, "cpu", iters=0)


def test_tokens_per_second():
    assert timing.tokens_per_second(16 * 1024, 35.0) == pytest.approx(468_114.3, rel=1e-6)
    with pytest.raises(ValueError):
        timing.tokens_per_second(100, 0)


def test_mfu_is_none_for_unknown_peak_and_never_above_one():
    value, reason = timing.mfu(1e9, 1e5, None)
    assert value is None and "unknown" in reason
    value, _ = timing.mfu(855e6, 467_000, 989.4e12)
    assert value == pytest.approx(855e6 * 467_000 / 989.4e12)
    value, reason = timing.mfu(855e6, 2e6, 989.4e12)  # 1710 TFLOP/s > peak: impossible
    assert value is None and "exceeds" in reason


@pytest.mark.parametrize("tokens_per_s", [float("nan"), float("inf"), -467_000.0, 0.0])
def test_mfu_refuses_a_throughput_that_is_not_positive_and_finite(tokens_per_s):
    value, reason = timing.mfu(855e6, tokens_per_s, 989.4e12)
    assert value is None and "positive finite" in reason
    value, reason = timing.mfu(float("nan"), 467_000, 989.4e12)
    assert value is None and "FLOPs per token" in reason


@pytest.mark.parametrize(
    "flops_per_token,tokens_per_s,peak",
    [
        (855e6, 467_000, float("nan")),
        (855e6, 467_000, float("inf")),  # would be "0 % MFU", reported as measured
        (855e6, 467_000, -1.0),
        (855e6, 467_000, 0),
        (855e6, 467_000, "989.4e12"),  # a string: a reason, not a TypeError
        (855e6, True, 989.4e12),  # a bool is not 1 token/s
        (True, 467_000, 989.4e12),
        (855e6, 467_000, torch.tensor(float("nan"))),
        (855e6, torch.ones(2), 989.4e12),
        (855e6, [467_000], 989.4e12),
        (855e6, torch.tensor(True), 989.4e12),
        (10**400, 1, 989.4e12),  # an int beyond float's range
        (855e6, torch.empty((), device="meta"), 989.4e12),  # a tensor without data
    ],
)
def test_mfu_refuses_any_argument_that_is_not_a_positive_finite_real(
    flops_per_token, tokens_per_s, peak
):
    value, reason = timing.mfu(flops_per_token, tokens_per_s, peak)
    assert value is None and "must be a positive finite number" in reason, reason


def test_mfu_accepts_numpy_scalars_and_0d_tensors_and_returns_a_float():
    np = pytest.importorskip("numpy")
    expected = 855e6 * 467_000 / 989.4e12
    for tokens in (np.float32(467_000), np.int64(467_000), torch.tensor(467_000.0)):
        value, reason = timing.mfu(np.float64(855e6), tokens, torch.tensor(989.4e12))
        assert reason == "ok" and type(value) is float
        assert value == pytest.approx(expected, rel=1e-6)
    value, reason = timing.mfu(1e200, 1e200, 989.4e12)  # overflows to inf: refused
    assert value is None and "exceeds the peak" in reason


def test_cpu_has_no_peak_flops():
    peak, reason = timing.peak_flops(torch.device("cpu"))
    assert peak is None and "cpu" in reason


def test_matmul_benchmark_measures_fp32_and_skips_tf32_on_cpu():
    fp32 = timing.benchmark_matmul(256, "fp32", "cpu", warmup=1, iters=3)
    assert fp32["status"] == "measured" and fp32["ms"] > 0
    assert fp32["tflops"] == pytest.approx(2 * 256**3 / (fp32["ms"] / 1e3) / 1e12)
    tf32 = timing.benchmark_matmul(256, "tf32", "cpu")
    assert tf32["status"] == "skipped" and "8.0" in tf32["reason"]
    assert torch.get_float32_matmul_precision() == "highest"
    with pytest.raises(ValueError):
        timing.benchmark_matmul(256, "fp8", "cpu")


def test_matmul_markdown_gives_the_peaks_unit_and_a_skipped_modes_reason():
    rows = [
        {
            "mode": "bf16",
            "status": "measured",
            "ms": 0.171,
            "tflops": 803.25,
            "peak_tflops": 989.4,
            "reason": "ok",
        },
        timing.benchmark_matmul(256, "tf32", "cpu"),
    ]
    md = timing.matmul_markdown(rows).splitlines()
    assert md[0] == "| mode | ms | TFLOP/s | peak (TFLOP/s) | % of peak | note |"
    assert md[2] == "| bf16 | 0.171 | 803.25 | 989.4 | 81% |  |"
    assert md[3].startswith("| tf32 | - | - | - | - | skipped: TF32")


def test_roofline_markdown_has_one_row_per_point_with_units():
    point = {
        "op": "gelu (tanh)",
        "dtype": "bfloat16",
        "intensity": 2.25,
        "flops_per_s": 7.598e12,
        "ms": 0.06,
    }
    md = timing.roofline_markdown([point]).splitlines()
    assert md[0] == "| op | dtype | intensity (FLOP/B) | TFLOP/s | ms |"
    assert md[2] == "| gelu (tanh) | bfloat16 | 2.25 | 7.598 | 0.060 |"


def test_host_timers_and_bandwidth_on_cpu():
    assert timing.host_time_without_sync(lambda: time.sleep(0.002), iters=3) >= 2
    assert timing.host_time_with_sync(lambda: time.sleep(0.002), "cpu", iters=3) >= 2
    assert timing.copy_bandwidth("cpu", n_bytes=2**22) > 1e8  # > 0.1 GB/s on any machine


def test_roofline_puts_matmul_far_above_elementwise_ops():
    points = {p["op"]: p for p in timing.roofline_points("cpu")}
    assert points["matmul"]["intensity"] == pytest.approx(1024 / 6)  # 2n^3 / (3 n^2 * 4 bytes)
    assert points["layernorm"]["intensity"] < 2 and points["gelu (tanh)"]["intensity"] < 2
    assert all(p["flops_per_s"] > 0 for p in points.values())
