"""What this device is and what it supports, plus datasheet profiles of common GPUs.

Peak numbers are *dense* (no 2:4 sparsity) per-GPU figures from each vendor datasheet named in
``GPUProfile.source``. They are the ceilings MFU is measured against; measured ceilings are lower
(e.g. a bf16 8192^3 matmul reaches ~790-806 TFLOP/s on the H200 of ../shared/reference).
"""

from __future__ import annotations

import contextlib
import os
import platform
import shutil
import warnings
from dataclasses import asdict, dataclass, field

import torch


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


def compile_support(device: torch.device) -> tuple[bool, str]:
    """Whether torch.compile (inductor) can generate code here, and why (no compilation is run).

    CUDA needs Triton and compute capability >= 7.0; CPU needs a C++ compiler on PATH.
    """
    if device.type == "cuda":
        cap = capability(device)
        if cap < (7, 0):
            return (
                False,
                f"inductor's Triton backend needs compute capability >= 7.0, this GPU is {cap[0]}.{cap[1]}",
            )
        try:
            import triton  # noqa: F401
        except ImportError:
            return (
                False,
                "Triton is not installed (pip install triton, or use a Linux CUDA build of torch)",
            )
        return True, "Triton available"
    compiler = next((c for c in ("c++", "g++", "clang++", "cl") if shutil.which(c)), None)
    if compiler is None:
        return (
            False,
            "no C++ compiler on PATH: inductor's CPU backend needs one (e.g. apt install g++)",
        )
    return True, f"C++ compiler {compiler} found"


_SM80_ATTENTION = (
    "FLASH_ATTENTION",
    "CUDNN_ATTENTION",
)  # SDPA kernels that need compute capability >= 8.0


def sdpa_backends(device: torch.device, dtype: torch.dtype | None = None) -> dict[str, str]:
    """Try each SDPA backend on a tiny causal attention and report 'ok' or why it cannot run.

    ``dtype`` defaults to bf16 where native, fp16 on older GPUs, fp32 on CPU. Uses
    ``torch.nn.attention.sdpa_kernel`` (PyTorch >= 2.3) to force one backend at a time.
    """
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if dtype is None:
        dtype = (
            torch.float32
            if device.type == "cpu"
            else (torch.bfloat16 if native_bf16(device) else torch.float16)
        )
    q = torch.randn(1, 2, 64, 64, device=device, dtype=dtype)
    result = {}
    for name in ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION", "MATH"):
        backend = getattr(
            SDPBackend, name, None
        )  # CUDNN_ATTENTION is missing from some torch versions
        if backend is None:
            result[name.lower()] = "not in this torch version"
            continue
        if (
            device.type == "cuda"
            and _emulated is not None
            and name in _SM80_ATTENTION
            and _emulated.capability < (8, 0)
        ):
            # sdpa_kernel(backend) would switch the kernel back on for the probe: answer as the emulated GPU
            result[name.lower()] = (
                f"unavailable (emulating a {_emulated.key}: sm{_emulated.capability[0]}{_emulated.capability[1]} has no {name.lower()})"
            )
            continue
        try:
            with warnings.catch_warnings(), sdpa_kernel(backend):
                warnings.simplefilter("ignore")
                torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
            result[name.lower()] = "ok"
        except RuntimeError as e:
            first = str(e).strip().split("\n")[0].split(". ")[0]
            result[name.lower()] = f"unavailable ({first[:100]})"
    return result


# --------------------------------------------------------------------------------------------
# Emulating a smaller GPU (a T4) on a bigger one
# --------------------------------------------------------------------------------------------

EMULATE_ENV = "COURSE_EMULATE_GPU"  # e.g. COURSE_EMULATE_GPU=T4: apply_env_emulation() emulates it
T4_USABLE_BYTES = 15 * 10**9  # a Colab T4 offers about 15 GB of its 16 GB to PyTorch
_emulated: GPUProfile | None = None
_emulated_memory: int | None = None  # the memory cap while emulating, bytes


def usable_memory_bytes(device: torch.device | str = "cuda") -> int | None:
    """The memory size a CUDA ``device`` offers, bytes: the GPU's total memory
    (``torch.cuda.get_device_properties(...).total_memory``; the CUDA context and other processes
    take some of it), or the cap while emulating a smaller GPU (:func:`emulate`, e.g. 15 GB for a
    T4). None on a CPU."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    if _emulated_memory is not None:
        return _emulated_memory
    return torch.cuda.get_device_properties(device).total_memory


def emulated_profile() -> GPUProfile | None:
    """The profile being emulated (see :func:`emulate`), or None."""
    return _emulated


def capability(device: torch.device) -> tuple[int, int] | None:
    """Compute capability of a CUDA ``device`` (the emulated profile's while emulating); None on CPU."""
    if device.type != "cuda":
        return None
    if _emulated is not None:
        return _emulated.capability
    return torch.cuda.get_device_capability(device)


def emulate(
    profile_key: str = "T4", device: torch.device | str = "cuda", memory_bytes: int | None = None
) -> dict:
    """Make this process behave like the GPU ``profile_key`` (default a T4) on a bigger CUDA GPU, so the
    fallback paths really run: usable memory capped with ``torch.cuda.set_per_process_memory_fraction``
    (T4: 15 GB), bf16 and TF32 refused (they need compute capability 8.0), SDPA limited to the kernels
    the profile's GPU has (no FlashAttention-2 or cuDNN attention below sm80), and the recipe chosen as
    for that GPU. Speed is still the real GPU's: MFU is not reported while emulating, and results say
    "emulated". Undo with :func:`stop_emulation`.

    Raises:
        ValueError: no CUDA GPU, an unknown profile, or a real GPU with less memory than the cap.
    """
    global _emulated, _emulated_memory, _saved_switches, _env_emulation_done
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        hint = (
            f" (unset ${EMULATE_ENV} to run on a CPU)"
            if os.environ.get(EMULATE_ENV, "").strip()
            else ""
        )
        raise ValueError(
            f"emulation caps a bigger CUDA GPU: it needs one (on a CPU there is nothing to emulate){hint}"
        )
    if profile_key not in PROFILES or PROFILES[profile_key].capability is None:
        raise ValueError(
            f"unknown profile {profile_key!r} (a GPU to emulate); known: {sorted(k for k, p in PROFILES.items() if p.capability)}"
        )
    prof = PROFILES[profile_key]
    if (
        device.index is None
    ):  # set_per_process_memory_fraction needs an indexed device ("cuda:0", not "cuda")
        device = torch.device("cuda", torch.cuda.current_device())
    props = torch.cuda.get_device_properties(device)
    if prof.memory_gb is None:
        raise ValueError(f"profile {prof.key} has no memory size to cap to")
    cap_bytes = memory_bytes or (
        T4_USABLE_BYTES if prof.key == "T4" else int(prof.memory_gb * 10**9)
    )
    if cap_bytes > props.total_memory:
        raise ValueError(
            f"{props.name} has {props.total_memory / 1e9:.0f} GB, less than the {cap_bytes / 1e9:.0f} GB to emulate"
        )
    if _emulated is None:  # remember the real switches once, so stop_emulation restores them
        _saved_switches = {
            "matmul_precision": torch.get_float32_matmul_precision(),
            **{
                name: getattr(torch.backends.cuda, f"{name}_sdp_enabled")()
                for name in _SDPA_TOGGLES
                if hasattr(torch.backends.cuda, f"{name}_sdp_enabled")
            },
        }
    # The caching allocator raises OutOfMemoryError once it would reserve more than fraction x total.
    torch.cuda.set_per_process_memory_fraction(cap_bytes / props.total_memory, device)
    disabled = []
    if prof.capability < (8, 0):
        disabled = [name for name in _SDPA_TOGGLES if _set_sdpa_enabled(name, False)]
        # TF32 off the documented way (also the new fp32_precision switches of torch >= 2.9); the
        # Trainer sets the precision before every step anyway, and unsupported_reason refuses "tf32".
        torch.set_float32_matmul_precision("highest")
    _emulated, _emulated_memory = prof, cap_bytes
    _env_emulation_done = True  # an explicit emulation supersedes $COURSE_EMULATE_GPU
    return {
        "profile": prof.key,
        "real_gpu": props.name,
        "memory_cap_bytes": cap_bytes,
        "sdpa_disabled": disabled,
    }


_SDPA_TOGGLES = ("flash", "cudnn")  # global SDPA kernel switches an sm75 GPU lacks
_saved_switches: dict = {}


def _set_sdpa_enabled(name: str, on: bool) -> bool:
    """``torch.backends.cuda.enable_<name>_sdp(on)`` where this torch has it (cuDNN attention's switch
    is missing from older versions); returns whether it existed. The switches are global: they hold for
    eager code and for graphs torch.compile traces after they are set (the kernel is chosen at trace time)."""
    fn = getattr(torch.backends.cuda, f"enable_{name}_sdp", None)
    if fn is None:
        return False
    fn(on)
    return True


def stop_emulation(device: torch.device | str = "cuda") -> None:
    """Undo :func:`emulate`: full memory, and the SDPA kernels and matmul precision as they were before."""
    global _emulated, _emulated_memory, _saved_switches
    if _emulated is None:
        return
    device = torch.device(device)
    torch.cuda.set_per_process_memory_fraction(
        1.0, device if device.index is not None else torch.cuda.current_device()
    )
    for name in _SDPA_TOGGLES:
        _set_sdpa_enabled(name, _saved_switches.get(name, True))
    torch.set_float32_matmul_precision(_saved_switches.get("matmul_precision", "highest"))
    _emulated, _emulated_memory, _saved_switches = None, None, {}


@contextlib.contextmanager
def cpu_sdpa_kernels():
    """Context for code whose SDPA runs on CPU tensors while a GPU is emulated: turns the FlashAttention
    switch back on inside it. :func:`emulate` turns ``torch.backends.cuda.enable_flash_sdp`` off to
    emulate an sm75 GPU, but torch reads that same switch for CPU tensors, so it would also take the
    fused kernel away from the CPU (which a real T4 machine's CPU has), and chapter 06's CPU
    demonstrations would build (T, T) scores. Nothing changes when not emulating.
    """
    if _emulated is None or not hasattr(torch.backends.cuda, "flash_sdp_enabled"):
        yield
        return
    was = torch.backends.cuda.flash_sdp_enabled()
    torch.backends.cuda.enable_flash_sdp(True)
    try:
        yield
    finally:
        torch.backends.cuda.enable_flash_sdp(was)


def apply_env_emulation(device: torch.device | str = "cuda") -> dict | None:
    """Emulate the profile named by ``$COURSE_EMULATE_GPU`` (e.g. T4), if set and a GPU is present."""
    key = os.environ.get(EMULATE_ENV, "").strip()
    if not key or not torch.cuda.is_available():
        return None
    return emulate(key, device)


CPU_BF16_ENV = "COURSE_CPU_BF16"  # "fast" or "slow": overrides cpu_bf16()'s detection


def cpu_bf16() -> tuple[bool, str]:
    """Whether this CPU runs bf16 matmuls fast, and why: ``(fast, reason)``.

    Fast needs bf16 instructions that PyTorch uses: AVX-512 BF16 or AMX (Intel Cooper Lake, Sapphire
    Rapids and later; AMD Zen 4 and later). Without them (AVX2-only CPUs, e.g. many AMD EPYC cloud
    machines) a bf16 matmul is converted to fp32 piece by piece: a 512x512 bf16 matmul took 225 ms
    there against 7.2 ms in fp32. The answer comes from what torch reports, never from "bf16
    exists": ``torch.backends.cpu.get_cpu_capability()`` (the vector unit ATen dispatches to, which
    ``ATEN_CPU_CAPABILITY`` can lower), ``torch.cpu._is_avx512_bf16_supported()`` and
    ``_is_amx_tile_supported()``, and oneDNN's ISA cap ``ONEDNN_MAX_CPU_ISA`` where set.
    ``$COURSE_CPU_BF16`` (``fast`` or ``slow``) overrides the detection.

    Raises:
        ValueError: ``$COURSE_CPU_BF16`` is set to something other than ``fast`` or ``slow``.
    """
    forced = os.environ.get(CPU_BF16_ENV, "").strip().lower()
    if forced:
        if forced not in ("fast", "slow"):
            raise ValueError(
                f"${CPU_BF16_ENV} must be 'fast' or 'slow', got {forced!r}: unset it to detect"
            )
        return forced == "fast", f"${CPU_BF16_ENV}={forced}"
    vector_unit = torch.backends.cpu.get_cpu_capability()
    has = {
        name: bool(getattr(torch.cpu, f"_is_{name}_supported", lambda: False)())
        for name in ("avx512_bf16", "amx_tile")
    }
    onednn_cap = os.environ.get("ONEDNN_MAX_CPU_ISA", "").upper()
    if not (vector_unit.startswith("AVX512") or vector_unit.startswith("AMX")):
        return False, f"this CPU's vector unit is {vector_unit}, without bf16 instructions"
    if not any(has.values()):
        return False, f"this CPU has {vector_unit} but neither AVX-512 BF16 nor AMX"
    if (
        onednn_cap
        and onednn_cap not in ("ALL", "DEFAULT")
        and not any(k in onednn_cap for k in ("BF16", "FP16", "AMX"))
    ):
        return (
            False,
            f"ONEDNN_MAX_CPU_ISA={onednn_cap} keeps oneDNN's matmuls off the bf16 instructions",
        )
    return True, "AMX" if has["amx_tile"] else "AVX-512 BF16"


def native_bf16(device: torch.device) -> bool:
    """True when bf16 math is native: CUDA compute capability >= 8.0 (Ampere+), or a CPU with fast
    bf16 instructions (:func:`cpu_bf16`).

    ``torch.cuda.is_bf16_supported()`` alone is not enough: it can say True on a T4 (sm75), where
    bf16 is emulated and slow. While emulating (see :func:`emulate`) the emulated GPU answers.
    """
    if device.type == "cuda":
        return capability(device) >= (8, 0)
    return device.type == "cpu" and cpu_bf16()[0]


def no_native_bf16_reason(device: torch.device | str) -> str | None:
    """Why bf16 is not native on ``device`` (None where it is, see :func:`native_bf16`), in one line
    that says what the course does instead."""
    device = torch.device(device)
    if native_bf16(device):
        return None
    if device.type == "cpu":
        return (
            f"no fast bf16 on this CPU ({cpu_bf16()[1]}): a bf16 matmul runs ~30x slower than fp32 "
            f"here, so the CPU path uses fp32 (set {CPU_BF16_ENV}=fast to run bf16 anyway)"
        )
    cap = capability(device)
    return f"bf16 is not native below compute capability 8.0 (this GPU is {cap[0]}.{cap[1]}: emulated, slow)"


def torch_says_bf16(device: torch.device | str = "cuda") -> dict[str, bool | None]:
    """What ``torch.cuda.is_bf16_supported`` answers on ``device``: ``{"default": ..., "without_emulation": ...}``.

    The default call counts emulated bf16 and is True on a T4 (sm75) on recent torch: the trap that
    :func:`native_bf16` avoids. ``without_emulation`` is ``is_bf16_supported(including_emulation=False)``,
    or None where this torch version has no such argument. Both are False on a CPU (no CUDA device).
    While emulating, torch still answers for the real GPU.
    """
    import inspect

    if torch.device(device).type != "cuda" or not torch.cuda.is_available():
        return {"default": False, "without_emulation": False}
    fn = torch.cuda.is_bf16_supported
    strict = (
        fn(including_emulation=False)
        if "including_emulation" in inspect.signature(fn).parameters
        else None
    )
    return {"default": bool(fn()), "without_emulation": strict}


def tf32_supported(device: torch.device) -> bool:
    """TF32 tensor-core matmuls exist on NVIDIA GPUs of compute capability >= 8.0 only."""
    return device.type == "cuda" and capability(device) >= (8, 0)


def tensor_core_multiple(dtype: torch.dtype) -> int:
    """Smallest dimension multiple (in elements) that lets cuBLAS use tensor cores for ``dtype``:
    16 bytes' worth (8 for fp16/bf16, 4 for tf32/fp32, 16 for 8-bit types). Larger multiples (64,
    128) also avoid partly empty tiles ("tile quantization"). Source: NVIDIA Deep Learning Performance
    Guide, "Matrix Multiplication Background" and "Tensor Core Requirements"
    (https://docs.nvidia.com/deeplearning/performance/dl-performance-matrix-multiplication/)."""
    return max(1, 16 // (torch.finfo(dtype).bits // 8))


_env_emulation_done = False  # $COURSE_EMULATE_GPU is applied once per process (see default_device)


def default_device() -> torch.device:
    """``cuda`` when a CUDA GPU is visible, else ``cpu``.

    The first call also applies ``$COURSE_EMULATE_GPU`` (e.g. ``COURSE_EMULATE_GPU=T4``, see
    :func:`emulate`) when a GPU is visible: every notebook starts with this call, so the variable runs
    the whole course as on that GPU (memory cap, no bf16/TF32, sm75 attention kernels). Later calls do
    not re-apply it, so a :func:`stop_emulation` holds.

    Raises:
        ValueError: ``$COURSE_EMULATE_GPU`` names an unknown profile, or a GPU smaller than the cap.
    """
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    apply_env_emulation_once(device)
    return device


def apply_env_emulation_once(device: torch.device | str) -> dict | None:
    """Apply ``$COURSE_EMULATE_GPU`` (see :func:`apply_env_emulation`) the first time a CUDA device is
    chosen in this process (:func:`default_device`, ``helpers.tools.cli.device``); later calls, calls for a
    CPU and calls after an explicit :func:`emulate` do nothing. A failing first call (an unknown
    profile) raises again on the next call instead of silently running without emulation.

    Raises:
        ValueError: ``$COURSE_EMULATE_GPU`` names an unknown profile, or a GPU smaller than the cap.
    """
    global _env_emulation_done
    if _env_emulation_done or torch.device(device).type != "cuda":
        return None
    info = apply_env_emulation(device)
    _env_emulation_done = True
    return info


@dataclass
class DeviceSummary:
    """What this device is and supports (see :func:`summary`)."""

    device: str
    name: str
    capability: tuple[int, int] | None
    total_memory_bytes: int | None
    native_bf16: bool
    tf32: bool
    compile_ok: bool
    compile_reason: str
    sdpa: dict[str, str] = field(default_factory=dict)
    torch_version: str = torch.__version__
    cuda_version: str | None = torch.version.cuda
    profile: str | None = None

    def one_line(self) -> str:
        """A one-line summary for the top of every notebook."""
        if self.device == "cpu":
            return f"CPU ({self.name}), torch {self.torch_version}: no GPU, notebooks use the small CPU config"
        mem = f"{self.total_memory_bytes / 2**30:.0f} GiB"
        cap = f"sm{self.capability[0]}{self.capability[1]}"
        return (
            f"{self.name} ({cap}, {mem}), torch {self.torch_version}, CUDA {self.cuda_version}; "
            f"bf16 {'native' if self.native_bf16 else 'no'}, TF32 {'yes' if self.tf32 else 'no'}, "
            f"compile {'yes' if self.compile_ok else 'no'}"
        )

    def as_dict(self) -> dict:
        return asdict(self)


def summary(device: str | torch.device | None = None, probe_sdpa: bool = True) -> DeviceSummary:
    """Describe ``device`` (default: :func:`default_device`)."""
    device = torch.device(device) if device is not None else default_device()
    ok, reason = compile_support(device)
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        prof = _emulated or match_profile(props.name, props.total_memory)
        name = props.name if _emulated is None else f"{props.name} emulating {_emulated.name}"
        s = DeviceSummary(
            device="cuda",
            name=name,
            capability=capability(device),
            total_memory_bytes=_emulated_memory or props.total_memory,
            native_bf16=native_bf16(device),
            tf32=tf32_supported(device),
            compile_ok=ok,
            compile_reason=reason,
            profile=prof.key if prof else None,
        )
    else:
        s = DeviceSummary(
            device=device.type,
            name=platform.processor() or platform.machine(),
            capability=None,
            total_memory_bytes=None,
            native_bf16=native_bf16(device),
            tf32=False,
            compile_ok=ok,
            compile_reason=reason,
        )
    if probe_sdpa:
        s.sdpa = sdpa_backends(device)
    return s


@dataclass(frozen=True)
class RecipeChoice:
    """One switch of the recommended configuration, with the reason for it."""

    switch: str  # a RunConfig field name
    value: object
    reason: str


def recommend_recipe(
    target: GPUProfile | torch.device | str | None = None,
    batch_size: int | None = None,
    batch_reason: str = "",
) -> list[RecipeChoice]:
    """The fastest *correct* configuration for a profile (e.g. ``PROFILES["T4"]``, ``PROFILES["CPU"]``)
    or a device (default: this one; while emulating, the emulated GPU), switch by switch with the reason.

    The batch size is never guessed: pass the one ``memory.find_max_batch_size`` measured as
    ``batch_size`` (with ``batch_reason`` saying how), else the choice says to measure it. Turn the
    choices into a RunConfig with ``helpers.core.train.recipe_run_config``.

    Rules: bf16 autocast only with native bf16 (compute capability >= 8.0; never trust
    ``torch.cuda.is_bf16_supported()``, True on a T4), else fp16 + GradScaler; TF32 only from 8.0;
    torch.compile where Triton runs (>= 7.0) or a CPU has a C++ compiler; SDPA always
    (FlashAttention-2 from 8.0, the memory-efficient kernel on 7.x); vocab padded to a multiple of 64;
    fused AdamW on CUDA.
    """
    if isinstance(target, GPUProfile) and target.capability is not None:
        cap, name, compile_ok, compile_reason = (
            target.capability,
            target.name,
            target.capability >= (7, 0),
            "Triton supports >= 7.0",
        )
    else:
        device = (
            torch.device("cpu")
            if isinstance(target, GPUProfile)
            else (torch.device(target) if target is not None else default_device())
        )
        compile_ok, compile_reason = compile_support(device)
        if device.type == "cuda":
            cap = capability(device)
            name = _emulated.name if _emulated is not None else torch.cuda.get_device_name(device)
        else:
            cap, name = None, "CPU"
    c = []
    if cap is None:
        c.append(
            RecipeChoice(
                "matmul_precision",
                "fp32",
                "TF32 is a tensor-core mode of NVIDIA GPUs; a CPU computes fp32",
            )
        )
        c.append(
            RecipeChoice(
                "autocast",
                None,
                "CPU runs are for correctness: keep fp32 (bf16 autocast runs, but its speed depends on the CPU)",
            )
        )
    else:
        ampere = cap >= (8, 0)
        c.append(
            RecipeChoice(
                "matmul_precision",
                "tf32" if ampere else "fp32",
                "TF32 tensor cores (compute capability >= 8.0)"
                if ampere
                else f"sm{cap[0]}{cap[1]} has no TF32 tensor cores: the switch would do nothing",
            )
        )
        c.append(
            RecipeChoice(
                "autocast",
                "bf16" if ampere else "fp16",
                "native bf16: fp32's range, no loss scaling needed"
                if ampere
                else f"sm{cap[0]}{cap[1]} has no native bf16 (emulated, slow): fp16 tensor cores + GradScaler "
                "(fp16 overflows above 65504 and underflows small gradients)",
            )
        )
    c.append(
        RecipeChoice(
            "compile",
            "default" if compile_ok else None,
            f"torch.compile: {compile_reason}" if compile_ok else f"eager: {compile_reason}",
        )
    )
    kernel = (
        "FlashAttention-2 / cuDNN kernels"
        if cap is not None and cap >= (8, 0)
        else "the memory-efficient kernel (no FlashAttention-2 below sm80)"
        if cap is not None
        else "the fused CPU kernel"
    )
    c.append(
        RecipeChoice(
            "attention", "sdpa", f"SDPA never stores the (T, T) scores; here it uses {kernel}"
        )
    )
    c.append(
        RecipeChoice(
            "vocab_multiple",
            64,
            "50257 -> 50304 rows: aligned shapes for the LM head and the loss (chapter 07)",
        )
    )
    c.append(
        RecipeChoice(
            "optimizer",
            "fused" if cap is not None else "foreach",
            "fused AdamW: one kernel for all parameters"
            if cap is not None
            else "foreach AdamW: the CPU default",
        )
    )
    if batch_size is None:
        c.append(
            RecipeChoice(
                "batch_size",
                None,
                f"measure it on the {name}: memory.find_max_batch_size with a 10% margin",
            )
        )
    else:
        c.append(
            RecipeChoice(
                "batch_size",
                batch_size,
                batch_reason or f"measured on the {name} with memory.find_max_batch_size",
            )
        )
    return c


def format_recipe(choices: list[RecipeChoice]) -> str:
    """The choices as a fixed-width table: switch, value, reason."""
    lines = [f"{'switch':<18} {'value':<10} reason"]
    lines += [f"{ch.switch:<18} {ch.value!s:<10} {ch.reason}" for ch in choices]
    return "\n".join(lines)


def format_profiles(profiles: list[GPUProfile] | None = None) -> str:
    """The datasheet profiles as a fixed-width table: capability, memory (GB), bandwidth (GB/s), dense
    peak TFLOP/s per format ('-' = no native support or not published; see each profile's note), and
    the recipe's autocast dtype. Sources follow the table, one line per profile."""

    def num(x: float | None) -> str:
        return "-" if x is None else f"{x:g}"

    profiles = list(PROFILES.values()) if profiles is None else profiles
    head = f"{'profile':<10} {'sm':>4} {'GB':>5} {'GB/s':>6} {'fp32':>6} {'tf32':>6} {'bf16':>6} {'fp16':>6}  autocast"
    lines = [head, "-" * len(head)]
    for p in profiles:
        sm = "-" if p.capability is None else f"{p.capability[0]}{p.capability[1]}"
        dtype = next(c.value for c in recommend_recipe(p) if c.switch == "autocast")
        dtype = "fp16 + GradScaler" if dtype == "fp16" else (dtype or "none (fp32)")
        lines.append(
            f"{p.key:<10} {sm:>4} {num(p.memory_gb):>5} {num(p.bandwidth_gbs):>6} {num(p.fp32_tflops):>6} "
            f"{num(p.tf32_tflops):>6} {num(p.bf16_tflops):>6} {num(p.fp16_tflops):>6}  {dtype}"
        )
    lines.append("TFLOP/s dense. Sources:")
    lines += [f"  {p.key}: {p.source}" + (f" ({p.note})" if p.note else "") for p in profiles]
    return "\n".join(lines)


# --- power and clocks while a workload runs (nvidia-smi in the background) ---------------------------

# clocks_throttle_reasons.active is the older name of clocks_event_reasons.active; drivers accept both, and
# older ones (as on Colab) only the former.
SMI_QUERY = "timestamp,clocks.sm,power.draw,power.limit,clocks_throttle_reasons.active"
SW_POWER_CAP = 0x4  # the clock-event reason bit "SW power cap": the driver lowers clocks to stay under the power limit


@dataclass
class PowerSample:
    """One nvidia-smi reading: ``t`` (time.time(), s, when the line arrived), SM clock (MHz), power draw and
    limit (W), and the clock-event reasons bit mask (:data:`SW_POWER_CAP` = 0x4; 0 = nothing holds the clock).
    A field nvidia-smi reports as "[N/A]" is None.

    The clock is the current one. ``power.draw`` is, on Ampere and newer GPUs, the driver's average over about
    the last second (``nvidia-smi --help-query-gpu``), so it lags a load that has just started; on older GPUs
    (a T4) it is the last instantaneous reading."""

    t: float
    sm_clock_mhz: float | None
    power_w: float | None
    power_limit_w: float | None
    reasons: int | None


def parse_smi_line(line: str, t: float) -> PowerSample | None:
    """A :class:`PowerSample` from one line of ``nvidia-smi --query-gpu=SMI_QUERY --format=csv,noheader,nounits``
    (e.g. ``"2026/11/30 03:39:09.345, 1740, 697.75, 700.00, 0x0000000000000004"``); "[N/A]" fields become None.
    None for a line that is not a reading (a header, an error message)."""
    parts = [p.strip() for p in line.split(",")]
    if len(parts) != 5:
        return None

    def num(x: str, base: int = 0):
        if x.startswith("[") or x in ("N/A", ""):  # "[N/A]", "[Not Supported]"
            return None
        return int(x, 16) if base == 16 else float(x)

    try:
        values = [num(parts[1]), num(parts[2]), num(parts[3]), num(parts[4], 16)]
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
    """Whether nvidia-smi's ``power.draw`` on this CUDA GPU is a ~1 s average (Ampere and newer: compute
    capability >= 8.0, ``nvidia-smi --help-query-gpu``) rather than an instantaneous reading (a T4). Reads the
    real GPU's capability, also under :func:`emulate`."""
    return torch.cuda.get_device_capability(torch.device(device)) >= (8, 0)


def power_summary(
    samples: list[PowerSample], t0: float | None = None, t1: float | None = None
) -> dict:
    """Min / median / max of power (W) and SM clock (MHz) over the samples taken in [t0, t1] (time.time() s;
    None = no bound), the window's length, the power limit, and the fraction of samples whose clock-event
    reasons include :data:`SW_POWER_CAP`. Fields nvidia-smi could not read ("[N/A]") are left out of each
    statistic (a statistic with no value is None).

    Returns ``{"samples": 0, "window_s": ...}`` when no sample falls in the window (e.g. a window shorter than
    the sampling interval).
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
        "power_limit_w": limits[-1] if limits else None,
        "sw_power_cap_fraction": (sum(bool(r & SW_POWER_CAP) for r in reasons) / len(reasons))
        if reasons
        else None,
    }


def format_power_summary(
    summary: dict, max_clock_mhz: float | None = None, power_is_average: bool = True
) -> str:
    """Lines for a learner from :func:`power_summary`'s dict: the SM clock against ``max_clock_mhz``, the power
    against its limit (marked as a ~1 s average when ``power_is_average``: Ampere and newer), and the share of
    samples in which the driver named its power cap."""
    if not summary.get("samples"):
        return "no nvidia-smi sample fell inside the window"
    lines = [f"{summary['samples']} samples"]
    c = summary.get("sm_clock_mhz")
    if c:
        lines[0] += (
            f"; SM clock min / median / max: {c['min']:.0f} / {c['median']:.0f} / {c['max']:.0f} MHz"
        )
        if max_clock_mhz:
            lines.append(
                f"maximum SM clock {max_clock_mhz:.0f} MHz: the median is {100 * c['median'] / max_clock_mhz:.0f}% of it"
            )
    p = summary.get("power_w")
    if p:
        limit = (
            f" of a {summary['power_limit_w']:.0f} W limit" if summary.get("power_limit_w") else ""
        )
        lag = " (a ~1 s average: it lags the load)" if power_is_average else ""
        lines.append(f"power draw up to {p['max']:.0f} W{limit}{lag}")
    if summary.get("sw_power_cap_fraction") is not None:
        lines.append(
            f"the driver named its power cap as a clock-event reason in {summary['sw_power_cap_fraction']:.0%} "
            "of the samples"
        )
    return "\n".join(lines)


def _smi_gpu_id(device: torch.device) -> str:
    """nvidia-smi's ``-i`` for a torch CUDA device: its UUID (right whatever CUDA_VISIBLE_DEVICES renumbers)."""
    if device.type != "cuda":
        raise RuntimeError(
            f"nvidia-smi reads an NVIDIA GPU's counters; {device} is not a CUDA device"
        )
    if not torch.cuda.is_available():
        raise RuntimeError(
            "this PyTorch cannot see a CUDA GPU (a CPU-only build, or no driver), so there is no GPU "
            "to read: install a CUDA build of torch on a machine with an NVIDIA GPU"
        )
    if shutil.which("nvidia-smi") is None:
        raise RuntimeError(
            "nvidia-smi is not on PATH: it ships with the NVIDIA driver. Without it, power and "
            "clocks cannot be read here (benchmarks/perf.py: run without --power)."
        )
    uuid = str(torch.cuda.get_device_properties(device).uuid)
    return uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}"


def max_sm_clock_mhz(device: torch.device | str = "cuda") -> float | None:
    """The GPU's maximum SM clock in MHz (``nvidia-smi --query-gpu=clocks.max.sm``), e.g. 1980 on an H200 SXM;
    None if nvidia-smi cannot say (no CUDA device, no nvidia-smi, "[N/A]")."""
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
    """Reads a GPU's SM clock, power draw and clock-event reasons every ``interval_ms`` while a block runs.

    ``nvidia-smi --query-gpu=... -lms interval_ms`` runs in the background (NVIDIA's tool, reading the driver's
    NVML counters); a thread timestamps each line as it arrives::

        with hardware.GPUPowerSampler(torch.device("cuda")) as smi:
            t0 = time.time(); run_steps(); t1 = time.time()
        print(hardware.format_power_summary(hardware.power_summary(smi.samples, t0, t1)))
        if smi.problem(): print(smi.problem())     # why there are no samples, when there are none

    See :class:`PowerSample` for what each reading means (the power is a ~1 s average on Ampere and newer).
    Sampling only reads; it never changes clocks or limits.

    Raises:
        RuntimeError: on entering, if the device is not a CUDA GPU this torch can see, or ``nvidia-smi`` is not on
            PATH (it ships with the NVIDIA driver; on a CPU or without it, time the workload without sampling).
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
        self.unparsed: list[
            str
        ] = []  # the first lines nvidia-smi printed that were not readings (its errors)
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
        """Why no sample was read (nvidia-smi's own message and exit status), or None when there are samples."""
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
