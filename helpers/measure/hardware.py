"""What this device is and what it supports, and emulating a smaller GPU (a T4) on a bigger one.

The datasheets of the GPUs it compares against are in :mod:`helpers.measure.gpus`; power and clocks
while a workload runs in :mod:`helpers.measure.power`.
"""

from __future__ import annotations

import contextlib
import os
import platform
import shutil
import warnings
from dataclasses import asdict, dataclass, field

import torch

from helpers.measure.gpus import PROFILES, GPUProfile, match_profile


def compile_support(device: torch.device) -> tuple[bool, str]:
    """Whether torch.compile (inductor) can generate code here, and why (no compilation is run).

    CUDA needs Triton and compute capability >= 7.0; CPU needs a C++ compiler on PATH.
    """
    if device.type == "cuda":
        cap = capability(device)
        if cap < (7, 0):
            return (
                False,
                (
                    "inductor's Triton backend needs compute capability >= 7.0, "
                    f"this GPU is {cap[0]}.{cap[1]}"
                ),
            )
        if _datasheet:
            return True, "Triton (shipped with Linux CUDA builds of torch) supports >= 7.0"
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


# SDPA kernels that need compute capability >= 8.0
_SM80_ATTENTION = ("FLASH_ATTENTION", "CUDNN_ATTENTION")


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
        # CUDNN_ATTENTION is missing from some torch versions
        backend = getattr(SDPBackend, name, None)
        if backend is None:
            result[name.lower()] = "not in this torch version"
            continue
        if (
            device.type == "cuda"
            and _emulated is not None
            and name in _SM80_ATTENTION
            and _emulated.capability < (8, 0)
        ):
            # sdpa_kernel(backend) would switch the kernel back on for the probe: answer as the
            # emulated GPU
            result[name.lower()] = (
                f"unavailable (emulating a {_emulated.key}: "
                f"sm{_emulated.capability[0]}{_emulated.capability[1]} has no {name.lower()})"
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
    """Compute capability of a CUDA ``device`` (the emulated profile's while emulating); None on
    CPU."""
    if device.type != "cuda":
        return None
    if _emulated is not None:
        return _emulated.capability
    return torch.cuda.get_device_capability(device)


def emulate(
    profile_key: str = "T4", device: torch.device | str = "cuda", memory_bytes: int | None = None
) -> dict:
    """Make this process behave like the GPU ``profile_key`` (default a T4) on a bigger CUDA GPU, so
    the fallback paths really run: usable memory capped with
    ``torch.cuda.set_per_process_memory_fraction`` (T4: 15 GB), bf16 and TF32 refused (they need
    compute capability 8.0), SDPA limited to the kernels the profile's GPU has (no FlashAttention-2
    or cuDNN attention below sm80), and the recipe chosen as for that GPU. Speed is still the real
    GPU's: MFU is not reported while emulating, and results say "emulated". Undo with
    :func:`stop_emulation`.

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
            "emulation caps a bigger CUDA GPU: it needs one "
            f"(on a CPU there is nothing to emulate){hint}"
        )
    if profile_key not in PROFILES or PROFILES[profile_key].capability is None:
        raise ValueError(
            f"unknown profile {profile_key!r} (a GPU to emulate); "
            f"known: {sorted(k for k, p in PROFILES.items() if p.capability)}"
        )
    prof = PROFILES[profile_key]
    # set_per_process_memory_fraction needs an indexed device ("cuda:0", not "cuda")
    if device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    props = torch.cuda.get_device_properties(device)
    if prof.memory_gb is None:
        raise ValueError(f"profile {prof.key} has no memory size to cap to")
    cap_bytes = memory_bytes or (
        T4_USABLE_BYTES if prof.key == "T4" else int(prof.memory_gb * 10**9)
    )
    if cap_bytes > props.total_memory:
        raise ValueError(
            f"{props.name} has {props.total_memory / 1e9:.0f} GB, "
            f"less than the {cap_bytes / 1e9:.0f} GB to emulate"
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
    # The caching allocator raises OutOfMemoryError once it would reserve more than fraction x
    # total.
    torch.cuda.set_per_process_memory_fraction(cap_bytes / props.total_memory, device)
    disabled = []
    if prof.capability < (8, 0):
        disabled = [name for name in _SDPA_TOGGLES if _set_sdpa_enabled(name, False)]
        # TF32 off the documented way (also the new fp32_precision switches of torch >= 2.9); the
        # Trainer sets the precision before every step anyway, and unsupported_reason refuses
        # "tf32".
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
    """``torch.backends.cuda.enable_<name>_sdp(on)`` where this torch has it (cuDNN attention's
    switch is missing from older versions); returns whether it existed. The switches are global:
    they hold for eager code and for graphs torch.compile traces after they are set (the kernel is
    chosen at trace time)."""
    fn = getattr(torch.backends.cuda, f"enable_{name}_sdp", None)
    if fn is None:
        return False
    fn(on)
    return True


_datasheet = False  # True inside datasheet(): the profile answers, no GPU stands behind it


@contextlib.contextmanager
def datasheet(profile: GPUProfile):
    """Answer capability questions for ``torch.device("cuda")`` as ``profile``'s GPU would, from
    its datasheet alone: no GPU is needed or touched (no memory cap, no kernel switches). Inside
    it, :func:`capability`, :func:`native_bf16`, :func:`tf32_supported`, :func:`compile_support`
    and the kernels' ``available`` checks answer for the profile, assuming a Linux CUDA build of
    torch (which ships Triton). This is how chapter 08's recipe and the ladder's skip rules are
    asked about a GPU this machine does not have. Yields the device to ask about.

    Raises:
        ValueError: a profile without a compute capability (a CPU), or while emulating a GPU.
    """
    global _emulated, _datasheet
    if profile.capability is None:
        raise ValueError(f"profile {profile.key} is not a GPU: ask torch.device('cpu') instead")
    if _emulated is not None:
        raise ValueError(f"emulating {_emulated.key}: call stop_emulation() first")
    _emulated, _datasheet = profile, True
    try:
        yield torch.device("cuda")
    finally:
        _emulated, _datasheet = None, False


def from_datasheet() -> bool:
    """Whether capability questions are answered from a datasheet (inside :func:`datasheet`)."""
    return _datasheet


def stop_emulation(device: torch.device | str = "cuda") -> None:
    """Undo :func:`emulate`: full memory, and the SDPA kernels and matmul precision as they were
    before."""
    global _emulated, _emulated_memory, _saved_switches
    if _emulated is None or _datasheet:  # a datasheet() context ends by itself
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
    """Context for code whose SDPA runs on CPU tensors while a GPU is emulated: turns the
    FlashAttention switch back on inside it. :func:`emulate` turns
    ``torch.backends.cuda.enable_flash_sdp`` off to emulate an sm75 GPU, but torch reads that same
    switch for CPU tensors, so it would also take the fused kernel away from the CPU (which a real
    T4 machine's CPU has), and chapter 06's CPU demonstrations would build (T, T) scores. Nothing
    changes when not emulating.
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
    """Emulate the profile named by ``$COURSE_EMULATE_GPU`` (e.g. T4), if set and a GPU is
    present."""
    key = os.environ.get(EMULATE_ENV, "").strip()
    if not key:
        return None
    if key not in PROFILES or PROFILES[key].capability is None:
        raise ValueError(
            f"unknown profile {key!r} in ${EMULATE_ENV} (a GPU to emulate); "
            f"known: {sorted(k for k, p in PROFILES.items() if p.capability)} (or unset it)"
        )
    if not torch.cuda.is_available():
        warnings.warn(
            f"${EMULATE_ENV}={key} is set but there is no CUDA GPU to emulate it with: "
            "running on the CPU as usual (unset it to silence this)",
            stacklevel=2,
        )
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
    return (
        "bf16 is not native below compute capability 8.0 "
        f"(this GPU is {cap[0]}.{cap[1]}: emulated, slow)"
    )


def torch_says_bf16(device: torch.device | str = "cuda") -> dict[str, bool | None]:
    """What ``torch.cuda.is_bf16_supported`` answers on ``device``:
    ``{"default": ..., "without_emulation": ...}``.

    The default call counts emulated bf16 and is True on a T4 (sm75) on recent torch: the trap that
    :func:`native_bf16` avoids. ``without_emulation`` is
    ``is_bf16_supported(including_emulation=False)``, or None where this torch version has no such
    argument. Both are False on a CPU (no CUDA device).
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
    """Smallest dimension multiple (in elements) that lets cuBLAS use tensor cores for ``dtype``: 16
    bytes' worth (8 for fp16/bf16, 4 for tf32/fp32, 16 for 8-bit types). Larger multiples (64, 128)
    also avoid partly empty tiles ("tile quantization"). Source: NVIDIA Deep Learning Performance
    Guide, "Matrix Multiplication Background" and "Tensor Core Requirements"
    (https://docs.nvidia.com/deeplearning/performance/dl-performance-matrix-multiplication/)."""
    return max(1, 16 // (torch.finfo(dtype).bits // 8))


_env_emulation_done = False  # $COURSE_EMULATE_GPU is applied once per process (see default_device)


def default_device() -> torch.device:
    """``cuda`` when a CUDA GPU is visible, else ``cpu``.

    The first call also applies ``$COURSE_EMULATE_GPU`` (e.g. ``COURSE_EMULATE_GPU=T4``, see
    :func:`emulate`) when a GPU is visible: every notebook starts with this call, so the variable
    runs the whole course as on that GPU (memory cap, no bf16/TF32, sm75 attention kernels). Later
    calls do not re-apply it, so a :func:`stop_emulation` holds.

    Raises:
        ValueError: ``$COURSE_EMULATE_GPU`` names an unknown profile, or a GPU smaller than the cap.
    """
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    apply_env_emulation_once(device)
    return device


def apply_env_emulation_once(device: torch.device | str) -> dict | None:
    """Apply ``$COURSE_EMULATE_GPU`` (see :func:`apply_env_emulation`) the first time a CUDA device
    is chosen in this process (:func:`default_device`, ``helpers.tools.cli.device``); later calls,
    calls for a CPU and calls after an explicit :func:`emulate` do nothing. A failing first call (an
    unknown profile) raises again on the next call instead of silently running without emulation.

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
            return (
                f"CPU ({self.name}), torch {self.torch_version}: "
                "no GPU, notebooks use the small CPU config"
            )
        mem = f"{self.total_memory_bytes / 2**30:.0f} GiB"
        cap = f"sm{self.capability[0]}{self.capability[1]}"
        return (
            f"{self.name} ({cap}, {mem}), torch {self.torch_version}, CUDA {self.cuda_version}; "
            f"bf16 {'native' if self.native_bf16 else 'no'}, TF32 {'yes' if self.tf32 else 'no'}, "
            f"compile {'yes' if self.compile_ok else 'no'}"
        )

    def as_dict(self) -> dict:
        return asdict(self)


def cpu_model(cpuinfo: str = "/proc/cpuinfo") -> str:
    """The CPU's model name ("AMD EPYC 9R14 96-Core Processor") from Linux's ``cpuinfo``, else
    ``platform.processor()`` or the architecture ("x86_64", "arm64")."""
    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "Model") and value.strip():
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


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
            name=cpu_model(),
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
