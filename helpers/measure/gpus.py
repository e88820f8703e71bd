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
    # FP16 tensor cores (FP32 accumulate where the datasheet distinguishes)
    fp16_tflops: float | None
    source: str
    note: str = ""  # why a figure is None although the hardware has the feature

    @property
    def peak_tensor_tflops(self) -> float | None:
        """The dense 16-bit tensor-core peak (bf16 where native, else fp16): MFU's denominator.
        None where no datasheet gives one (a CPU, an A10G)."""
        return self.bf16_tflops if self.bf16_tflops is not None else self.fp16_tflops

    @property
    def autocast_label(self) -> str:
        """The autocast of this profile's recipe
        (:func:`helpers.chapters.ch08_t4_colab.recommend_recipe`): bf16 where native (compute
        capability >= 8.0), else fp16 with a GradScaler; none on a CPU."""
        if self.capability is None:
            return "none (fp32)"
        return "bf16" if self.native_bf16 else "fp16 + GradScaler"

    @property
    def native_bf16(self) -> bool:
        """bf16 tensor cores: compute capability >= 8.0. A CPU profile answers True (bf16 runs, see
        :func:`native_bf16`). Never ``torch.cuda.is_bf16_supported()``: it is True on a T4,
        emulated."""
        return self.capability is None or self.capability >= (8, 0)


PROFILES: dict[str, GPUProfile] = {
    p.key: p
    for p in [
        GPUProfile(
            key="T4",
            name="NVIDIA T4",
            capability=(7, 5),
            memory_gb=16,
            bandwidth_gbs=320,
            fp32_tflops=8.1,
            tf32_tflops=None,
            bf16_tflops=None,
            fp16_tflops=65,
            source="NVIDIA T4 Tensor Core GPU datasheet (2019)",
        ),
        GPUProfile(
            key="V100",
            name="NVIDIA V100 SXM2",
            capability=(7, 0),
            memory_gb=16,
            bandwidth_gbs=900,
            fp32_tflops=15.7,
            tf32_tflops=None,
            bf16_tflops=None,
            fp16_tflops=125,
            source="NVIDIA V100 Tensor Core GPU datasheet (2020), SXM2",
        ),
        GPUProfile(
            key="A10",
            name="NVIDIA A10",
            capability=(8, 6),
            memory_gb=24,
            bandwidth_gbs=600,
            fp32_tflops=31.2,
            tf32_tflops=62.5,
            bf16_tflops=125,
            fp16_tflops=125,
            source="NVIDIA A10 Tensor Core GPU datasheet (2021)",
        ),
        GPUProfile(
            key="A10G",
            name="NVIDIA A10G",
            capability=(8, 6),
            memory_gb=24,
            bandwidth_gbs=600,
            fp32_tflops=None,
            tf32_tflops=None,
            bf16_tflops=None,
            fp16_tflops=None,
            source=(
                "no NVIDIA datasheet (an AWS-only variant of the A10, EC2 G5 instances); "
                "24 GB GDDR6 and 600 GB/s as in Baseten, "
                "'NVIDIA A10 vs A10G for ML model inference' (2023)"
            ),
            note="NVIDIA publishes no A10G peak FLOP/s: no MFU is claimed on it",
        ),
        GPUProfile(
            key="L4",
            name="NVIDIA L4",
            capability=(8, 9),
            memory_gb=24,
            bandwidth_gbs=300,
            fp32_tflops=30.3,
            tf32_tflops=60,
            bf16_tflops=121,
            fp16_tflops=121,
            source="NVIDIA L4 Tensor Core GPU datasheet (2023); sparse figures halved",
        ),
        GPUProfile(
            key="A100-40GB",
            name="NVIDIA A100 40GB",
            capability=(8, 0),
            memory_gb=40,
            bandwidth_gbs=1555,
            fp32_tflops=19.5,
            tf32_tflops=156,
            bf16_tflops=312,
            fp16_tflops=312,
            source="NVIDIA A100 Tensor Core GPU datasheet (2021)",
        ),
        GPUProfile(
            key="A100-80GB",
            name="NVIDIA A100 80GB SXM",
            capability=(8, 0),
            memory_gb=80,
            bandwidth_gbs=2039,
            fp32_tflops=19.5,
            tf32_tflops=156,
            bf16_tflops=312,
            fp16_tflops=312,
            source="NVIDIA A100 Tensor Core GPU datasheet (2021), SXM",
        ),
        GPUProfile(
            key="H100-PCIe",
            name="NVIDIA H100 PCIe",
            capability=(9, 0),
            memory_gb=80,
            bandwidth_gbs=2000,
            fp32_tflops=51,
            tf32_tflops=378,
            bf16_tflops=756,
            fp16_tflops=756,
            source="NVIDIA H100 Tensor Core GPU datasheet (2023), PCIe; sparse figures halved",
        ),
        GPUProfile(
            key="H100-SXM",
            name="NVIDIA H100 SXM",
            capability=(9, 0),
            memory_gb=80,
            bandwidth_gbs=3350,
            fp32_tflops=67,
            tf32_tflops=494.7,
            bf16_tflops=989.4,
            fp16_tflops=989.4,
            source="NVIDIA H100 Tensor Core GPU datasheet (2023), SXM; sparse figures halved",
        ),
        GPUProfile(
            key="H200",
            name="NVIDIA H200 SXM",
            capability=(9, 0),
            memory_gb=141,
            bandwidth_gbs=4800,
            fp32_tflops=67,
            tf32_tflops=494.7,
            bf16_tflops=989.4,
            fp16_tflops=989.4,
            source="NVIDIA H200 Tensor Core GPU datasheet (2024), SXM; sparse figures halved",
        ),
        GPUProfile(
            key="CPU",
            name="CPU (any)",
            capability=None,
            memory_gb=None,
            bandwidth_gbs=None,
            fp32_tflops=None,
            tf32_tflops=None,
            bf16_tflops=None,
            fp16_tflops=None,
            source="no datasheet: CPUs differ too much for one figure",
            note=(
                "peak FLOP/s and bandwidth depend on the CPU model, its cores and vector units; "
                "memory is the machine's RAM: no MFU is claimed on a CPU"
            ),
        ),
    ]
}


def match_profile(device_name: str, total_memory_bytes: int | None = None) -> GPUProfile | None:
    """The datasheet profile for a CUDA device name (e.g. 'NVIDIA A100-SXM4-80GB'), or None if
    unknown."""
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
    # not "A10G": PROFILES["A10G"] has no peak FLOP/s to compute an MFU against
    if "A10" in n.split():
        return PROFILES["A10"]
    return None


_PROFILE_COLUMNS = [  # (header, fixed-width spec); the autocast dtype comes last
    ("profile", "<10"),
    ("sm", ">4"),
    ("GB", ">5"),
    ("GB/s", ">6"),
    ("fp32", ">6"),
    ("tf32", ">6"),
    ("bf16", ">6"),
    ("fp16", ">6"),
    ("autocast", ""),
]


def _profile_cells(p: GPUProfile) -> list[str]:
    def num(x: float | None) -> str:
        return "-" if x is None else f"{x:g}"

    sm = "-" if p.capability is None else f"{p.capability[0]}{p.capability[1]}"
    peaks = (p.fp32_tflops, p.tf32_tflops, p.bf16_tflops, p.fp16_tflops)
    return [p.key, sm, num(p.memory_gb), num(p.bandwidth_gbs), *map(num, peaks), p.autocast_label]


def _profile_source(p: GPUProfile) -> str:
    return f"{p.key}: {p.source}" + (f" ({p.note})" if p.note else "")


def format_profiles(profiles: list[GPUProfile] | None = None) -> str:
    """The datasheet profiles as a fixed-width table: capability, memory (GB), bandwidth (GB/s),
    dense peak TFLOP/s per format ('-' = no native support or not published; see each profile's
    note), and the autocast dtype the course uses there (:attr:`GPUProfile.autocast_label`).
    Sources follow the table, one line per profile. :func:`profiles_markdown` is the same table
    for a rendered notebook."""
    profiles = list(PROFILES.values()) if profiles is None else profiles
    specs = [spec for _, spec in _PROFILE_COLUMNS[:-1]]
    head = " ".join(f"{h:{spec}}" for h, spec in _PROFILE_COLUMNS[:-1]) + "  autocast"
    lines = [head, "-" * len(head)]
    for p in profiles:
        cells = _profile_cells(p)
        fixed = " ".join(f"{c:{spec}}" for c, spec in zip(cells[:-1], specs, strict=True))
        lines.append(f"{fixed}  {cells[-1]}")
    lines.append("TFLOP/s dense. Sources:")
    lines += [f"  {_profile_source(p)}" for p in profiles]
    return "\n".join(lines)


def profiles_markdown(profiles: list[GPUProfile] | None = None) -> str:
    """:func:`format_profiles` as Markdown, for ``IPython.display.Markdown``: the same table
    (numbers right-aligned, the TFLOP/s columns named as such), then the sources as a list."""
    from helpers.measure.results import markdown_table

    profiles = list(PROFILES.values()) if profiles is None else profiles
    heads = [
        h if h not in ("fp32", "tf32", "bf16", "fp16") else f"{h} TFLOP/s"
        for h, _ in _PROFILE_COLUMNS
    ]
    table = markdown_table(heads, [_profile_cells(p) for p in profiles], "l" + "r" * 7 + "l")
    sources = "\n".join(f"- {_profile_source(p)}" for p in profiles)
    return f"{table}\n\nTFLOP/s dense. Sources:\n\n{sources}"
