"""Timing GPU work correctly: warm-up excluded, device synchronised, median of N.

CUDA kernels are launched asynchronously: a host clock read right after a call measures the
launch, not the work. On CUDA each step is bracketed by CUDA events and read after a
synchronise; on the CPU a monotonic host clock is exact. The first steps pay one-off costs
(CUDA context, cuBLAS handles, autotuning, torch.compile) and are reported apart as warm-up.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from helpers import hardware


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

    Returns (None, reason) for a CPU or a GPU with no datasheet profile in :mod:`helpers.hardware`.
    """
    device = torch.device(device)
    if device.type != "cuda":
        return None, f"no peak FLOP/s table for device type '{device.type}'"
    name = torch.cuda.get_device_name(device)
    prof = hardware.match_profile(name, torch.cuda.get_device_properties(device).total_memory)
    if prof is None:
        return None, f"'{name}' has no datasheet profile in helpers.hardware.PROFILES"
    return prof.peak_tensor_tflops * 1e12, f"{prof.name} dense 16-bit tensor peak, {prof.source}"


def mfu(flops_per_token: float, tokens_per_s: float, peak_flops_per_s: float | None) -> tuple[float | None, str]:
    """Model FLOPs utilisation = achieved FLOP/s / peak FLOP/s (PaLM, Chowdhery et al. 2022, App. B).

    Returns (None, reason) when the peak is unknown, or when the achieved rate would exceed the
    peak (a wrong timing or peak: never reported as MFU > 1).
    """
    if peak_flops_per_s is None or peak_flops_per_s <= 0:
        return None, "peak FLOP/s unknown for this device"
    achieved = flops_per_token * tokens_per_s
    value = achieved / peak_flops_per_s
    if value > 1.0:
        return None, f"achieved {achieved / 1e12:.1f} TFLOP/s exceeds the peak {peak_flops_per_s / 1e12:.1f}: timing or peak is wrong"
    return value, "ok"
