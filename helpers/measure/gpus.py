"""Datasheet profiles of the GPUs the course names, and of a CPU.

Peak numbers are *dense* (no 2:4 sparsity) per-GPU figures from each vendor datasheet named in
``GPUProfile.source``. They are the ceilings MFU is measured against; measured ceilings are lower
(e.g. a bf16 8192^3 matmul reaches ~790-806 TFLOP/s on the H200 of ../shared/reference).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GPUProfile:
    """Datasheet facts of one device model. TFLOP/s are dense; None = no native support, or (with
    ``note`` saying which) not published."""

    key: str
    name: str
    capability: tuple[int, int] | None  # CUDA compute capability; None for a CPU
    memory_gb: float | None  # marketed memory, GB (1e9 bytes); None where it is the machine's RAM
    bandwidth_gbs: float | None  # memory bandwidth, GB/s
    fp32_tflops: float | None  # plain FP32 (CUDA cores)
    tf32_tflops: float | None  # TF32 tensor cores (>= sm80)
    bf16_tflops: float | None  # BF16 tensor cores (>= sm80)
    fp16_tflops: (
        float | None
    )  # FP16 tensor cores (FP32 accumulate where the datasheet distinguishes)
    source: str
    note: str = ""  # why a figure is None although the hardware has the feature

    @property
    def peak_tensor_tflops(self) -> float | None:
        """The dense 16-bit tensor-core peak (bf16 where native, else fp16): MFU's denominator.
        None where no datasheet gives one (a CPU, an A10G)."""
        return self.bf16_tflops if self.bf16_tflops is not None else self.fp16_tflops

    @property
    def autocast_label(self) -> str:
        """The autocast of this profile's recipe (:func:`helpers.chapters.ch08_t4_colab.recommend_recipe`):
        bf16 where native (compute capability >= 8.0), else fp16 with a GradScaler; none on a CPU."""
        if self.capability is None:
            return "none (fp32)"
        return "bf16" if self.native_bf16 else "fp16 + GradScaler"

    @property
    def native_bf16(self) -> bool:
        """bf16 tensor cores: compute capability >= 8.0. A CPU profile answers True (bf16 runs, see
        :func:`native_bf16`). Never ``torch.cuda.is_bf16_supported()``: it is True on a T4, emulated."""
        return self.capability is None or self.capability >= (8, 0)


PROFILES: dict[str, GPUProfile] = {
    p.key: p
    for p in [
        GPUProfile(
            "T4",
            "NVIDIA T4",
            (7, 5),
            16,
            320,
            8.1,
            None,
            None,
            65,
            "NVIDIA T4 Tensor Core GPU datasheet (2019)",
        ),
        GPUProfile(
            "V100",
            "NVIDIA V100 SXM2",
            (7, 0),
            16,
            900,
            15.7,
            None,
            None,
            125,
            "NVIDIA V100 Tensor Core GPU datasheet (2020), SXM2",
        ),
        GPUProfile(
            "A10",
            "NVIDIA A10",
            (8, 6),
            24,
            600,
            31.2,
            62.5,
            125,
            125,
            "NVIDIA A10 Tensor Core GPU datasheet (2021)",
        ),
        GPUProfile(
            "A10G",
            "NVIDIA A10G",
            (8, 6),
            24,
            600,
            None,
            None,
            None,
            None,
            "no NVIDIA datasheet (an AWS-only variant of the A10, EC2 G5 instances); 24 GB GDDR6 "
            "and 600 GB/s as in Baseten, 'NVIDIA A10 vs A10G for ML model inference' (2023)",
            note="NVIDIA publishes no A10G peak FLOP/s: no MFU is claimed on it",
        ),
        GPUProfile(
            "L4",
            "NVIDIA L4",
            (8, 9),
            24,
            300,
            30.3,
            60,
            121,
            121,
            "NVIDIA L4 Tensor Core GPU datasheet (2023); sparse figures halved",
        ),
        GPUProfile(
            "A100-40GB",
            "NVIDIA A100 40GB",
            (8, 0),
            40,
            1555,
            19.5,
            156,
            312,
            312,
            "NVIDIA A100 Tensor Core GPU datasheet (2021)",
        ),
        GPUProfile(
            "A100-80GB",
            "NVIDIA A100 80GB SXM",
            (8, 0),
            80,
            2039,
            19.5,
            156,
            312,
            312,
            "NVIDIA A100 Tensor Core GPU datasheet (2021), SXM",
        ),
        GPUProfile(
            "H100-PCIe",
            "NVIDIA H100 PCIe",
            (9, 0),
            80,
            2000,
            51,
            378,
            756,
            756,
            "NVIDIA H100 Tensor Core GPU datasheet (2023), PCIe; sparse figures halved",
        ),
        GPUProfile(
            "H100-SXM",
            "NVIDIA H100 SXM",
            (9, 0),
            80,
            3350,
            67,
            494.7,
            989.4,
            989.4,
            "NVIDIA H100 Tensor Core GPU datasheet (2023), SXM; sparse figures halved",
        ),
        GPUProfile(
            "H200",
            "NVIDIA H200 SXM",
            (9, 0),
            141,
            4800,
            67,
            494.7,
            989.4,
            989.4,
            "NVIDIA H200 Tensor Core GPU datasheet (2024), SXM; sparse figures halved",
        ),
        GPUProfile(
            "CPU",
            "CPU (any)",
            None,
            None,
            None,
            None,
            None,
            None,
            None,
            "no datasheet: CPUs differ too much for one figure",
            note="peak FLOP/s and bandwidth depend on the CPU model, its cores and vector units; "
            "memory is the machine's RAM: no MFU is claimed on a CPU",
        ),
    ]
}


def match_profile(device_name: str, total_memory_bytes: int | None = None) -> GPUProfile | None:
    """The datasheet profile for a CUDA device name (e.g. 'NVIDIA A100-SXM4-80GB'), or None if unknown."""
    n = device_name.upper().replace("-", " ")
    if "H200" in n:
        return PROFILES["H200"] if "NVL" not in n else None
    if "H100" in n:
        return (
            PROFILES["H100-PCIe"]
            if "PCIE" in n
            else (PROFILES["H100-SXM"] if "NVL" not in n else None)
        )
    if "A100" in n:
        big = "80GB" in n.replace(" ", "") or (total_memory_bytes or 0) > 45e9
        return PROFILES["A100-80GB" if big else "A100-40GB"]
    if "V100" in n:
        return PROFILES["V100"]
    if "T4" in n.split() or n.endswith("T4"):
        return PROFILES["T4"]
    if "L4" in n.split():
        return PROFILES["L4"]
    if (
        "A10" in n.split()
    ):  # not "A10G": PROFILES["A10G"] has no peak FLOP/s to compute an MFU against
        return PROFILES["A10"]
    return None


def format_profiles(profiles: list[GPUProfile] | None = None) -> str:
    """The datasheet profiles as a fixed-width table: capability, memory (GB), bandwidth (GB/s), dense
    peak TFLOP/s per format ('-' = no native support or not published; see each profile's note), and
    the autocast dtype the course uses there (:attr:`GPUProfile.autocast_label`). Sources follow the table, one line per profile."""

    def num(x: float | None) -> str:
        return "-" if x is None else f"{x:g}"

    profiles = list(PROFILES.values()) if profiles is None else profiles
    head = f"{'profile':<10} {'sm':>4} {'GB':>5} {'GB/s':>6} {'fp32':>6} {'tf32':>6} {'bf16':>6} {'fp16':>6}  autocast"
    lines = [head, "-" * len(head)]
    for p in profiles:
        sm = "-" if p.capability is None else f"{p.capability[0]}{p.capability[1]}"
        dtype = p.autocast_label
        lines.append(
            f"{p.key:<10} {sm:>4} {num(p.memory_gb):>5} {num(p.bandwidth_gbs):>6} {num(p.fp32_tflops):>6} "
            f"{num(p.tf32_tflops):>6} {num(p.bf16_tflops):>6} {num(p.fp16_tflops):>6}  {dtype}"
        )
    lines.append("TFLOP/s dense. Sources:")
    lines += [f"  {p.key}: {p.source}" + (f" ({p.note})" if p.note else "") for p in profiles]
    return "\n".join(lines)
