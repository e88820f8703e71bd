"""Number formats and the mixed-precision facts of chapter 04, computed, not quoted.

Every number here comes from ``torch.finfo`` or from a computation on this machine, except TF32,
which is not a storage dtype in PyTorch: its layout (1 sign, 8 exponent, 10 mantissa bits) is from
NVIDIA's "A100 Tensor Core GPU Architecture" whitepaper (2020).
"""

from __future__ import annotations

import math

import torch

# (name, torch dtype or None for TF32, minimum compute capability with native tensor-core support)
FORMATS = [
    ("fp32", torch.float32, None),
    ("tf32", None, (8, 0)),
    ("bf16", torch.bfloat16, (8, 0)),
    ("fp16", torch.float16, (7, 0)),
    ("fp8 e4m3", getattr(torch, "float8_e4m3fn", None), (8, 9)),
    ("fp8 e5m2", getattr(torch, "float8_e5m2", None), (8, 9)),
]


def format_table() -> list[dict]:
    """Sign/exponent/mantissa bits, largest value, smallest normal value and machine epsilon of each
    format (fp8 rows only where this torch has the dtypes). Mantissa bits = -log2(eps)."""
    rows = []
    for name, dtype, native_from in FORMATS:
        if name == "tf32":
            m, e = 10, 8
            row = {"bits": 19, "max": (2 - 2.0**-m) * 2.0**127, "tiny": 2.0**-126, "eps": 2.0**-m}
        elif dtype is None:
            continue
        else:
            fi = torch.finfo(dtype)
            m = round(-math.log2(fi.eps))
            e = fi.bits - 1 - m
            row = {"bits": fi.bits, "max": float(fi.max), "tiny": float(fi.tiny), "eps": float(fi.eps)}
        rows.append({"format": name, "sign": 1, "exponent": e, "mantissa": m, **row,
                     "native_tensor_cores_from": native_from})
    return rows


def native_on(capability: tuple[int, int] | None) -> list[str]:
    """Formats whose matmuls run natively on tensor cores of this compute capability (None = CPU:
    fp32 only). fp16 from 7.0 (Volta), TF32 and bf16 from 8.0 (Ampere), fp8 from 8.9 (Ada, Hopper)."""
    if capability is None:
        return ["fp32"]
    return ["fp32"] + [name for name, _, since in FORMATS if since is not None and capability >= since]


def demonstrations() -> dict[str, object]:
    """Three facts measured on this machine's arithmetic:

    - ``bf16_1_plus_2^-8``: (1 + 2⁻⁸) rounded to bf16 equals 1 (8 mantissa bits: eps is 2⁻⁷);
    - ``fp16_underflow``: a gradient of 1e-8 becomes 0 in fp16, and survives when scaled by 2¹⁶ first
      (what GradScaler does);
    - ``overflow``: 70000 is inf in fp16 (max 65504) and finite in bf16 (fp32's exponent range).
    """
    one = torch.tensor(1.0)
    tiny_grad = torch.tensor(1e-8)
    scale = 2.0**16
    big = torch.tensor(70000.0)
    return {
        "bf16_1_plus_2^-8_equals_1": bool((one + 2.0**-8).to(torch.bfloat16) == 1),
        "bf16_1_plus_2^-7_equals_1": bool((one + 2.0**-7).to(torch.bfloat16) == 1),
        "fp16_1e-8": float(tiny_grad.to(torch.float16)),
        "fp16_1e-8_scaled_by_2^16_then_unscaled": float((tiny_grad * scale).to(torch.float16).float() / scale),
        "fp16_70000": float(big.to(torch.float16)),
        "bf16_70000": float(big.to(torch.bfloat16)),
    }


def autocast_dtype_for(capability: tuple[int, int] | None) -> torch.dtype | None:
    """The course's choice of autocast dtype: bf16 with native support (compute capability >= 8.0),
    fp16 (with GradScaler) on older GPUs, none (fp32) on a CPU, where the course only checks results."""
    if capability is None:
        return None
    return torch.bfloat16 if capability >= (8, 0) else torch.float16
