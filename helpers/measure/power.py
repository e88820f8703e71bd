"""Power and clocks while a workload runs: nvidia-smi sampled in the background.

Used where a measured speed depends on the clock the GPU held (chapter 10, ``benchmarks/perf.py``):
a step that makes the driver lower clocks to stay under the power limit is slower for that reason.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass

import torch

# clocks_throttle_reasons.active is the older name of clocks_event_reasons.active; drivers accept
# both, and older ones (as on Colab) only the former.
SMI_QUERY = (
    "timestamp,clocks.sm,power.draw,power.limit,clocks_throttle_reasons.active,temperature.gpu"
)
# the clock-event reason bit "SW power cap": the driver lowers clocks to stay under the power limit
SW_POWER_CAP = 0x4
# the bits "SW thermal slowdown" (0x20) and "HW thermal slowdown" (0x40): clocks lowered because
# the GPU (or its memory) is too hot (NVML's nvmlClocksEventReasons, nvidia-smi -q -d PERFORMANCE)
THERMAL_SLOWDOWN = 0x20 | 0x40


@dataclass
class PowerSample:
    """One nvidia-smi reading: ``t`` (time.time(), s, when the line arrived), SM clock (MHz), power
    draw and limit (W), the clock-event reasons bit mask (:data:`SW_POWER_CAP` = 0x4,
    :data:`THERMAL_SLOWDOWN` = 0x20 | 0x40; 0 = nothing holds the clock) and the GPU's core
    temperature (°C, ``temperature.gpu``). A field nvidia-smi reports as "[N/A]" is None.

    The clock is the current one. ``power.draw`` is, on Ampere and newer GPUs, the driver's average
    over about the last second (``nvidia-smi --help-query-gpu``), so it lags a load that has just
    started; on older GPUs (a T4) it is the last instantaneous reading."""

    t: float
    sm_clock_mhz: float | None
    power_w: float | None
    power_limit_w: float | None
    reasons: int | None
    temperature_c: float | None = None


def parse_smi_line(line: str, t: float) -> PowerSample | None:
    """A :class:`PowerSample` from one line of
    ``nvidia-smi --query-gpu=SMI_QUERY --format=csv,noheader,nounits`` (e.g.
    ``"2026/11/30 03:39:09.345, 1740, 697.75, 700.00, 0x0000000000000004, 45"``; a line without
    the last field, the temperature, is read too); "[N/A]" fields become None. None for a line that
    is not a reading (a header, an error message)."""
    parts = [p.strip() for p in line.split(",")]
    if len(parts) not in (5, 6):
        return None

    def num(x: str, base: int = 0):
        if x.startswith("[") or x in ("N/A", ""):  # "[N/A]", "[Not Supported]"
            return None
        return int(x, 16) if base == 16 else float(x)

    try:
        values = [num(parts[1]), num(parts[2]), num(parts[3]), num(parts[4], 16)]
        values.append(num(parts[5]) if len(parts) == 6 else None)
    except ValueError:
        return None
    if all(v is None for v in values):
        return None
    return PowerSample(t, *values)


def samples_in_window(
    samples: list[PowerSample], t0: float | None = None, t1: float | None = None
) -> list[PowerSample]:
    """The samples that arrived in [t0, t1] (time.time() s; None = no bound)."""
    return [s for s in samples if (t0 is None or s.t >= t0) and (t1 is None or s.t <= t1)]


def power_reading_is_average(device: torch.device | str = "cuda") -> bool:
    """Whether nvidia-smi's ``power.draw`` on this CUDA GPU is a ~1 s average (Ampere and newer:
    compute capability >= 8.0, ``nvidia-smi --help-query-gpu``) rather than an instantaneous reading
    (a T4). Reads the real GPU's capability, also under :func:`emulate`."""
    return torch.cuda.get_device_capability(torch.device(device)) >= (8, 0)


def power_summary(
    samples: list[PowerSample], t0: float | None = None, t1: float | None = None
) -> dict:
    """Min / median / max of power (W) and SM clock (MHz) over the samples taken in [t0, t1]
    (time.time() s; None = no bound), the window's length, the power limit, and the fraction of
    samples whose clock-event reasons include :data:`SW_POWER_CAP` (and, as
    ``thermal_fraction``, :data:`THERMAL_SLOWDOWN`), and min / median / max of the GPU's
    temperature (°C, ``temperature_c``). Fields nvidia-smi could not read
    ("[N/A]") are left out of each statistic (a statistic with no value is None).

    Returns ``{"samples": 0, "window_s": ...}`` when no sample falls in the window (e.g. a window
    shorter than the sampling interval).
    """
    import statistics

    sel = samples_in_window(samples, t0, t1)
    window = (t1 - t0) if t0 is not None and t1 is not None else None
    if not sel:
        return {"samples": 0, "window_s": window}

    def stats(xs):
        xs = [x for x in xs if x is not None]
        return {"min": min(xs), "median": statistics.median(xs), "max": max(xs)} if xs else None

    reasons = [s.reasons for s in sel if s.reasons is not None]
    limits = [s.power_limit_w for s in sel if s.power_limit_w is not None]
    return {
        "samples": len(sel),
        "window_s": window,
        "power_w": stats([s.power_w for s in sel]),
        "sm_clock_mhz": stats([s.sm_clock_mhz for s in sel]),
        "temperature_c": stats([s.temperature_c for s in sel]),
        "power_limit_w": limits[-1] if limits else None,
        "sw_power_cap_fraction": (sum(bool(r & SW_POWER_CAP) for r in reasons) / len(reasons))
        if reasons
        else None,
        "thermal_fraction": (sum(bool(r & THERMAL_SLOWDOWN) for r in reasons) / len(reasons))
        if reasons
        else None,
    }


def format_power_summary(
    summary: dict, max_clock_mhz: float | None = None, power_is_average: bool = True
) -> str:
    """Lines for a learner from :func:`power_summary`'s dict: the SM clock against
    ``max_clock_mhz``, the power against its limit (marked as a ~1 s average when
    ``power_is_average``: Ampere and newer), the GPU's temperature, and the share of samples in
    which the driver named its power cap or a thermal slowdown."""
    if not summary.get("samples"):
        return "no nvidia-smi sample fell inside the window"
    lines = [f"{summary['samples']} samples"]
    c = summary.get("sm_clock_mhz")
    if c:
        lines[0] += (
            "; SM clock min / median / max: "
            f"{c['min']:.0f} / {c['median']:.0f} / {c['max']:.0f} MHz"
        )
        if max_clock_mhz:
            lines.append(
                f"maximum SM clock {max_clock_mhz:.0f} MHz: "
                f"the median is {100 * c['median'] / max_clock_mhz:.0f}% of it"
            )
    p = summary.get("power_w")
    if p:
        limit = (
            f" of a {summary['power_limit_w']:.0f} W limit" if summary.get("power_limit_w") else ""
        )
        lag = " (a ~1 s average: it lags the load)" if power_is_average else ""
        lines.append(f"power draw median {p['median']:.0f} W, up to {p['max']:.0f} W{limit}{lag}")
    temp = summary.get("temperature_c")
    if temp:
        lines.append(
            "GPU temperature min / median / max: "
            f"{temp['min']:.0f} / {temp['median']:.0f} / {temp['max']:.0f} °C"
        )
    if summary.get("sw_power_cap_fraction") is not None:
        lines.append(
            "the driver named its power cap as a clock-event reason in "
            f"{summary['sw_power_cap_fraction']:.0%} of the samples"
        )
    if summary.get("thermal_fraction") is not None:
        lines.append(
            "and a thermal slowdown (the GPU too hot) in "
            f"{summary['thermal_fraction']:.0%} of the samples"
        )
    return "\n".join(lines)


def _smi_gpu_id(device: torch.device) -> str:
    """nvidia-smi's ``-i`` for a torch CUDA device: its UUID (right whatever CUDA_VISIBLE_DEVICES
    renumbers)."""
    if device.type != "cuda":
        raise RuntimeError(
            f"nvidia-smi reads an NVIDIA GPU's counters; {device} is not a CUDA device"
        )
    if not torch.cuda.is_available():
        raise RuntimeError(
            "this PyTorch cannot see a CUDA GPU (a CPU-only build, or no driver), "
            "so there is no GPU to read: "
            "install a CUDA build of torch on a machine with an NVIDIA GPU"
        )
    if shutil.which("nvidia-smi") is None:
        raise RuntimeError(
            "nvidia-smi is not on PATH: it ships with the NVIDIA driver. Without it, power and "
            "clocks cannot be read here (benchmarks/perf.py: run without --power)."
        )
    uuid = str(torch.cuda.get_device_properties(device).uuid)
    return uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}"


def max_sm_clock_mhz(device: torch.device | str = "cuda") -> float | None:
    """The GPU's maximum SM clock in MHz (``nvidia-smi --query-gpu=clocks.max.sm``), e.g. 1980 on an
    H200 SXM; None if nvidia-smi cannot say (no CUDA device, no nvidia-smi, "[N/A]")."""
    import subprocess

    try:
        cmd = [
            "nvidia-smi",
            "-i",
            _smi_gpu_id(torch.device(device)),
            "--query-gpu=clocks.max.sm",
            "--format=csv,noheader,nounits",
        ]
        return float(subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout.strip())
    except (RuntimeError, ValueError, OSError, subprocess.SubprocessError):
        return None


class GPUPowerSampler:
    """Reads a GPU's SM clock, power draw and clock-event reasons every ``interval_ms`` while a
    block runs.

    ``nvidia-smi --query-gpu=... -lms interval_ms`` runs in the background (NVIDIA's tool, reading
    the driver's NVML counters); a thread timestamps each line as it arrives::

        with power.GPUPowerSampler(torch.device("cuda")) as smi:
            t0 = time.time(); run_steps(); t1 = time.time()
        print(power.format_power_summary(power.power_summary(smi.samples, t0, t1)))
        if smi.problem(): print(smi.problem())     # why there are no samples, when there are none

    See :class:`PowerSample` for what each reading means (the power is a ~1 s average on Ampere and
    newer). Sampling only reads; it never changes clocks or limits.

    Raises:
        RuntimeError: on entering, if the device is not a CUDA GPU this torch can see, or
            ``nvidia-smi`` is not on PATH (it ships with the NVIDIA driver; on a CPU or without it,
            time the workload without sampling).
    """

    def __init__(
        self,
        device: torch.device | str = "cuda",
        interval_ms: int = 100,
        command: list[str] | None = None,
    ):
        self.device = torch.device(device)
        self.interval_ms = int(interval_ms)
        self.command = command
        self.samples: list[PowerSample] = []
        # the first lines nvidia-smi printed that were not readings (its errors)
        self.unparsed: list[str] = []
        self.returncode: int | None = None
        self._proc = None
        self._thread = None

    def _default_command(self) -> list[str]:
        return [
            "nvidia-smi",
            "-i",
            _smi_gpu_id(self.device),
            f"--query-gpu={SMI_QUERY}",
            "--format=csv,noheader,nounits",
            "-lms",
            str(self.interval_ms),
        ]

    def __enter__(self) -> "GPUPowerSampler":
        import subprocess
        import threading
        import time

        cmd = self.command or self._default_command()
        self._proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )

        def read():
            for line in self._proc.stdout:
                s = parse_smi_line(line, time.time())
                if s is not None:
                    self.samples.append(s)
                elif line.strip() and len(self.unparsed) < 5:
                    self.unparsed.append(line.strip())

        self._thread = threading.Thread(target=read, daemon=True)
        self._thread.start()
        return self

    def problem(self) -> str | None:
        """Why no sample was read (nvidia-smi's own message and exit status), or None when there are
        samples."""
        if self.samples:
            return None
        said = "; ".join(self.unparsed) or "nothing"
        status = "still running" if self.returncode is None else f"exit status {self.returncode}"
        return f"nvidia-smi gave no reading ({status}); it printed: {said}"

    def __exit__(self, *exc) -> None:
        import subprocess

        if self._proc is not None:
            self.returncode = self._proc.poll()  # not None: nvidia-smi stopped by itself (an error)
            if self.returncode is None:
                self._proc.terminate()
                try:
                    self._proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    self._proc.kill()
                    self._proc.wait()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._proc is not None and self._proc.stdout is not None:
            self._proc.stdout.close()
