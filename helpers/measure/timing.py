"""Timing GPU work correctly: warm-up excluded, device synchronised, median of N.

CUDA kernels are launched asynchronously: a host clock read right after a call measures the
launch, not the work. On CUDA each step is bracketed by CUDA events and read after a
synchronise; on the CPU a monotonic host clock is exact. The first steps pay one-off costs
(CUDA context, cuBLAS handles, autotuning, torch.compile) and are reported apart as warm-up.
"""

from __future__ import annotations

import math
import numbers
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from helpers.measure import gpus, hardware


@dataclass
class StepTiming:
    """Times of a repeated step, in ms. ``median_ms`` is the figure to quote."""

    times_ms: list[float]  # measured steps, after warm-up
    warmup_ms: list[float]  # the warm-up steps (first one includes compile / context start-up)

    @property
    def median_ms(self) -> float:
        return statistics.median(self.times_ms)

    @property
    def min_ms(self) -> float:
        return min(self.times_ms)

    @property
    def max_ms(self) -> float:
        return max(self.times_ms)

    @property
    def spread_pct(self) -> float:
        """(max - min) / median of the measured steps, in percent: how noisy the figure is."""
        return 100.0 * (self.max_ms - self.min_ms) / self.median_ms


def synchronize(device: torch.device | str) -> None:
    """Wait for all queued work on ``device`` (no-op on CPU)."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(
    step: Callable[[], object], device: torch.device | str, warmup: int = 3, iters: int = 10
) -> StepTiming:
    """Time ``step()`` ``iters`` times after ``warmup`` untimed calls.

    CUDA: each call is bracketed by ``torch.cuda.Event(enable_timing=True)`` records and all
    elapsed times are read after one ``torch.cuda.synchronize``. CPU: ``time.perf_counter``.
    Warm-up calls are timed too (synchronised), and returned apart in ``warmup_ms``.

    Raises:
        ValueError: if ``iters`` < 1 or ``warmup`` < 0.
    """
    if iters < 1 or warmup < 0:
        raise ValueError(f"need iters >= 1 and warmup >= 0, got iters={iters}, warmup={warmup}")
    device = torch.device(device)
    warm = []
    for _ in range(warmup):
        synchronize(device)
        t0 = time.perf_counter()
        step()
        synchronize(device)
        warm.append(1e3 * (time.perf_counter() - t0))
    if device.type == "cuda":
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
        for s, e in zip(starts, ends, strict=False):
            s.record()
            step()
            e.record()
        torch.cuda.synchronize(device)
        times = [s.elapsed_time(e) for s, e in zip(starts, ends, strict=False)]
    else:
        times = []
        for _ in range(iters):
            t0 = time.perf_counter()
            step()
            times.append(1e3 * (time.perf_counter() - t0))
    return StepTiming(times_ms=times, warmup_ms=warm)


def tokens_per_second(tokens_per_step: int, step_ms: float) -> float:
    """Throughput in tokens/s from B*T tokens per step and a step time in ms."""
    if step_ms <= 0:
        raise ValueError(f"step time must be > 0 ms, got {step_ms}")
    return tokens_per_step / (step_ms / 1e3)


def peak_flops(device: torch.device | str) -> tuple[float | None, str]:
    """Dense 16-bit tensor-core peak of ``device`` in FLOP/s, and where the number comes from.

    Returns (None, reason) for a CPU or a GPU with no datasheet profile in
    :mod:`helpers.measure.hardware`.
    """
    device = torch.device(device)
    if device.type != "cuda":
        return None, f"no peak FLOP/s table for device type '{device.type}'"
    if hardware.emulated_profile() is not None:
        return (
            None,
            f"emulating a {hardware.emulated_profile().key}: the speed is the real GPU's, "
            "so no MFU is claimed",
        )
    name = torch.cuda.get_device_name(device)
    prof = gpus.match_profile(name, torch.cuda.get_device_properties(device).total_memory)
    if prof is None or prof.peak_tensor_tflops is None:
        return None, f"'{name}' has no datasheet profile in helpers.measure.gpus.PROFILES"
    return prof.peak_tensor_tflops * 1e12, f"{prof.name} dense 16-bit tensor peak, {prof.source}"


def _real(value: object) -> float | None:
    """``value`` as a float when it is one real number: an int or float, a NumPy scalar, or a
    one-element 0-d tensor; None for anything else (a bool, a string, a list, a bigger tensor)."""
    if type(value).__name__ in ("bool", "bool_"):  # Python's and NumPy's booleans
        return None
    try:
        if isinstance(value, torch.Tensor):
            ok = value.ndim == 0 and not value.is_complex() and value.dtype != torch.bool
            return float(value) if ok and value.device.type != "meta" else None
        return float(value) if isinstance(value, numbers.Real) else None  # np.float32, np.int64
    except (OverflowError, RuntimeError):  # an int beyond float's range; a tensor without data
        return None


def mfu(
    flops_per_token: float, tokens_per_s: float, peak_flops_per_s: float | None
) -> tuple[float | None, str]:
    """Model FLOPs utilisation = achieved FLOP/s / peak FLOP/s
    (PaLM, Chowdhery et al. 2022, App. B).

    Each argument is one real number: a Python int or float, a NumPy scalar or a 0-d tensor
    (never a bool). Returns (value as a float, "ok"), or (None, reason) when the peak is None
    (unknown for this device), when any argument is not a positive finite real number (a NaN, an
    infinite or negative timing or peak, a string, True), or when the achieved rate would exceed
    the peak (a wrong timing or peak: never reported as MFU > 1).
    """
    if peak_flops_per_s is None:
        return None, "peak FLOP/s unknown for this device"
    checked = []
    for what, value in (
        ("tokens/s", tokens_per_s),
        ("FLOPs per token", flops_per_token),
        ("peak FLOP/s", peak_flops_per_s),
    ):
        x = _real(value)
        if x is None or not math.isfinite(x) or x <= 0:
            return None, f"{what} must be a positive finite number, got {value!r}: check it"
        checked.append(x)
    tokens, per_token, peak = checked
    achieved = per_token * tokens
    value = achieved / peak
    if not math.isfinite(value) or value > 1.0:
        return (
            None,
            f"achieved {achieved / 1e12:.4g} TFLOP/s exceeds the peak "
            f"{peak / 1e12:.4g}: timing or peak is wrong",
        )
    return value, "ok"


MATMUL_MODES = ("fp32", "tf32", "bf16", "fp16")


def benchmark_matmul(
    n: int, mode: str, device: torch.device | str, warmup: int = 3, iters: int = 10
) -> dict:
    """Time C = A @ B for random (n, n) matrices in ``mode`` ("fp32" with TF32 off, "tf32", "bf16",
    "fp16") on ``device`` with :func:`measure`; FLOPs = 2·n³ (one multiply and one add per term).

    Returns {"mode", "n", "status" ("measured"/"skipped"), "ms", "tflops", "peak_tflops", "reason"};
    a mode the device cannot run natively (TF32 below sm80 or on a CPU, bf16 below sm80, fp16 on a
    CPU) is "skipped" with the reason, never timed in another mode. Restores the global matmul
    precision it changes.
    """
    if mode not in MATMUL_MODES:
        raise ValueError(f"mode must be one of {MATMUL_MODES}, got {mode!r}")
    device = torch.device(device)
    row = {
        "mode": mode,
        "n": n,
        "status": "skipped",
        "ms": None,
        "tflops": None,
        "peak_tflops": None,
        "reason": "",
    }
    if mode == "tf32" and not hardware.tf32_supported(device):
        row["reason"] = "TF32 tensor cores need an NVIDIA GPU of compute capability >= 8.0"
        return row
    if mode == "bf16" and not hardware.native_bf16(device):
        row["reason"] = hardware.no_native_bf16_reason(device)
        return row
    if mode == "fp16" and device.type == "cpu":
        row["reason"] = "fp16 matmuls are a GPU tensor-core format; CPUs emulate them slowly"
        return row
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(mode, torch.float32)
    gen = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(n, n, device=device, dtype=dtype, generator=gen)  # random, never zeros
    b = torch.randn(n, n, device=device, dtype=dtype, generator=gen)
    old = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high" if mode == "tf32" else "highest")
    try:
        t = measure(lambda: a @ b, device, warmup=warmup, iters=iters)
    finally:
        torch.set_float32_matmul_precision(old)
    row.update(
        status="measured", ms=t.median_ms, tflops=2 * n**3 / (t.median_ms / 1e3) / 1e12, reason="ok"
    )
    if device.type == "cuda":
        prof = gpus.match_profile(torch.cuda.get_device_name(device))
        if prof is not None:
            row["peak_tflops"] = {
                "fp32": prof.fp32_tflops,
                "tf32": prof.tf32_tflops,
                "bf16": prof.bf16_tflops,
                "fp16": prof.fp16_tflops,
            }[mode]
    return row


def matmul_markdown(rows: list[dict]) -> str:
    """A Markdown table of :func:`benchmark_matmul` rows, for ``IPython.display.Markdown``: mode,
    ms, TFLOP/s, the datasheet peak in TFLOP/s ("-" where none is known), % of peak, and a note
    that gives the reason of a skipped mode."""
    from helpers.measure.results import markdown_table

    cells = []
    for r in rows:
        if r["status"] != "measured":
            cells.append([r["mode"], None, None, None, None, f"skipped: {r['reason']}"])
            continue
        peak = r["peak_tflops"]
        pct = f"{100 * r['tflops'] / peak:.0f}%" if peak else None
        cells.append([r["mode"], f"{r['ms']:.3f}", f"{r['tflops']:.2f}", peak, pct, ""])
    heads = ["mode", "ms", "TFLOP/s", "peak (TFLOP/s)", "% of peak", "note"]
    return markdown_table(heads, cells, "lrrrrl")


# --------------------------------------------------------------------------------------------
# Chapter 02: the wrong and the right way to time, and a roofline
# --------------------------------------------------------------------------------------------


def host_time_without_sync(fn: Callable[[], object], iters: int = 10) -> float:
    """Mean ms per call of ``fn`` by a host clock *without* synchronising: the wrong way on a GPU.

    On CUDA this measures how fast kernels are queued, not how long they run. Shown in chapter 02
    next to :func:`host_time_with_sync` and :func:`measure`; never use it to report a speed.
    """
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return 1e3 * (time.perf_counter() - t0) / iters


def host_time_with_sync(
    fn: Callable[[], object], device: torch.device | str, iters: int = 10
) -> float:
    """Mean ms per call of ``fn`` by a host clock,
    synchronising before the start and after the end."""
    synchronize(device)
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    synchronize(device)
    return 1e3 * (time.perf_counter() - t0) / iters


def copy_bandwidth(device: torch.device | str, n_bytes: int = 2**30) -> float:
    """Measured memory bandwidth in bytes/s: a device-to-device copy of ``n_bytes``, counting the
    bytes read plus the bytes written (2 · n_bytes per copy);
    median of 10 after 3 warm-up copies."""
    src = torch.randn(n_bytes // 4, device=device)
    dst = torch.empty_like(src)
    t = measure(lambda: dst.copy_(src), device, warmup=3, iters=10)
    return 2 * src.numel() * 4 / (t.median_ms / 1e3)


# FLOPs per element of two memory-bound ops: operation counts of their formulas (an estimate; what
# matters for the roofline is that they are a few FLOPs for every 4 bytes moved).
LAYERNORM_FLOPS_PER_ELEMENT = 8  # mean, centre, square, variance, rsqrt-scale, gain, bias
GELU_TANH_FLOPS_PER_ELEMENT = 9  # 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))


def roofline_points(device: torch.device | str, dtype: torch.dtype | None = None) -> list[dict]:
    """Arithmetic intensity (FLOP/byte) and achieved FLOP/s of a large matmul, LayerNorm and
    tanh-GELU on ``device`` (each timed with :func:`measure`). Bytes are the minimum traffic: each
    input read once, each output written once. ``dtype``: bf16 on a GPU with native bf16, else fp32.
    """
    device = torch.device(device)
    if dtype is None:
        dtype = (
            torch.bfloat16
            if device.type == "cuda" and hardware.native_bf16(device)
            else torch.float32
        )
    size = torch.finfo(dtype).bits // 8
    n = 4096 if device.type == "cuda" else 1024
    rows, C = (16 * 1024, 768) if device.type == "cuda" else (2048, 768)
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    x = torch.randn(rows, C, device=device, dtype=dtype)
    h = torch.randn(rows, 4 * C, device=device, dtype=dtype)
    ln = torch.nn.LayerNorm(C, device=device, dtype=dtype)
    cases = [
        ("matmul", lambda: a @ b, 2 * n**3, 3 * n * n * size),
        ("layernorm", lambda: ln(x), LAYERNORM_FLOPS_PER_ELEMENT * x.numel(), 2 * x.numel() * size),
        (
            "gelu (tanh)",
            lambda: torch.nn.functional.gelu(h, approximate="tanh"),
            GELU_TANH_FLOPS_PER_ELEMENT * h.numel(),
            2 * h.numel() * size,
        ),
    ]
    out = []
    with torch.no_grad():
        for name, fn, flops, nbytes in cases:
            ms = measure(fn, device, warmup=3, iters=10).median_ms
            out.append(
                {
                    "op": name,
                    "flops": flops,
                    "bytes": nbytes,
                    "intensity": flops / nbytes,
                    "flops_per_s": flops / (ms / 1e3),
                    "ms": ms,
                    "dtype": str(dtype).replace("torch.", ""),
                }
            )
    return out


def roofline_markdown(points: list[dict]) -> str:
    """A Markdown table of :func:`roofline_points`, for ``IPython.display.Markdown``: op, dtype,
    arithmetic intensity in FLOP/B, achieved TFLOP/s and the time in ms."""
    from helpers.measure.results import markdown_table

    cells = [
        [
            p["op"],
            p["dtype"],
            f"{p['intensity']:.2f}",
            f"{p['flops_per_s'] / 1e12:.3f}",
            f"{p['ms']:.3f}",
        ]
        for p in points
    ]
    heads = ["op", "dtype", "intensity (FLOP/B)", "TFLOP/s", "ms"]
    return markdown_table(heads, cells, "llrrr")
