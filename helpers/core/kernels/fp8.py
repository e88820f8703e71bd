"""Rung "+ fp8 LM head": the fp8 formats, scales and transposes of the LM head's matmuls.

``linear_cross_entropy(..., fp8=True)`` (:mod:`helpers.core.kernels.fused_ce`) runs the LM head's
three matmuls on fp8 tensor cores (``torch._scaled_mm``, which computes (a @ b) * scale_a * scale_b
with fp32 accumulation). x and the weight are cast to float8_e4m3fn with one scale per tensor
(:func:`to_fp8_e4m3`: amax -> the format's largest value, 448, as torchao's tensorwise float8
recipe); the logits' gradient softmax - onehot lies in [-1, 1] and is stored as float8_e5m2 times a
fixed 2**15 (:data:`FP8_GRAD_SCALE`; largest e5m2 value: 57344), so probabilities down to ~5e-10
stay representable instead of flushing to 0. The fused kernel's e5m2 variant, in ``fused_ce``,
writes that gradient.

Hopper's fp8 matmul wants both operands with the reduction dimension contiguous: a row-major, b
column-major. :func:`transpose_fp8` makes the transposed copies (a tiled Triton copy, an opaque
custom op that torch.compile calls as it is). fp8 tensor cores need compute capability >= 8.9:
:func:`fp8_available` says whether this device has them.
"""

from __future__ import annotations

import torch

from helpers.core.kernels._triton import (
    _INTERPRETED_AT_IMPORT,
    TRITON_OP_MISSING,
    autotuned,
    available,
    tl,
    triton,
)

E4M3_MAX = 448.0  # the largest float8_e4m3fn value
FP8_GRAD_SCALE = 2.0**15  # the e5m2 gradient's fixed scale
# transpose_fp8's tiles: BM source rows x BN source columns (bytes), and warps. On a GPU it is
# autotuned over these (the fastest at the first call of each shape); 128-byte sides fill whole
# 128-byte cache lines on the read (BN) and on the write (BM). The CPU interpreter runs one config.
TRANSPOSE_CONFIGS = [
    {"BM": bm, "BN": bn, "num_warps": w}
    for bm, bn in ((64, 64), (64, 128), (128, 64), (128, 128), (128, 256), (256, 128))
    for w in (4, 8)
]
INTERPRETER_TRANSPOSE = {"BM": 64, "BN": 64, "num_warps": 4}


if triton is not None and TRITON_OP_MISSING is None:

    @triton.jit
    def _transpose_kernel(src_ptr, dst_ptr, M, N, BM: tl.constexpr, BN: tl.constexpr):
        # dst (N, M) = src (M, N).T, both contiguous, one BM x BN tile per program (bytes: any
        # 1-byte dtype)
        rm = tl.program_id(0).to(tl.int64) * BM + tl.arange(0, BM)
        rn = tl.program_id(1).to(tl.int64) * BN + tl.arange(0, BN)
        mask = (rm[:, None] < M) & (rn[None, :] < N)
        tile = tl.load(src_ptr + rm[:, None] * N + rn[None, :], mask=mask)
        tl.store(dst_ptr + rn[None, :] * M + rm[:, None], tile, mask=mask)

    if _INTERPRETED_AT_IMPORT:
        _transpose_tuned, _TRANSPOSE_FIXED = _transpose_kernel, dict(INTERPRETER_TRANSPOSE)
    else:
        _transpose_tuned = autotuned(_transpose_kernel, TRANSPOSE_CONFIGS, key=["M", "N"])
        _TRANSPOSE_FIXED = {}  # autotune chooses

    def _transpose_impl(src: torch.Tensor, config: dict | None = None) -> torch.Tensor:
        # config: one of TRANSPOSE_CONFIGS to launch as it is (benchmarks, tests), else autotuned
        M, N = src.shape
        kernel, fixed = (
            (_transpose_tuned, _TRANSPOSE_FIXED) if config is None else (_transpose_kernel, config)
        )
        dst = torch.empty((N, M), dtype=src.dtype, device=src.device)
        kernel[lambda meta: (triton.cdiv(M, meta["BM"]), triton.cdiv(N, meta["BN"]))](
            src.view(torch.uint8), dst.view(torch.uint8), M, N, **fixed
        )
        return dst

    @torch.library.custom_op("fastgpt2::transpose_fp8", mutates_args=())
    def _transpose_fp8(src: torch.Tensor) -> torch.Tensor:
        return _transpose_impl(src)

    @_transpose_fp8.register_fake
    def _(src):
        return src.new_empty((src.shape[1], src.shape[0]))


def transpose_fp8(t: torch.Tensor) -> torch.Tensor:
    """``t.T.contiguous()`` for a 2-D fp8 tensor, by a tiled Triton copy.

    Hopper's fp8 tensor cores take both matmul operands with the reduction dimension contiguous, so
    the weight gradient G.T @ x needs G transposed in memory. PyTorch's own copy moved a
    32768 x 50304 fp8 tensor in 10.7 ms on the H200 (``results/h200-fp8-matmul-2026-11-30.json``).

    Args:
        t: (M, N) contiguous float8_e4m3fn or float8_e5m2.

    Returns:
        (N, M) contiguous tensor of ``t``'s dtype.

    Raises:
        ValueError: if ``t`` is not a contiguous 2-D fp8 tensor.
    """
    if (
        t.dim() != 2
        or not t.is_contiguous()
        or t.dtype not in (torch.float8_e4m3fn, torch.float8_e5m2)
    ):
        raise ValueError(
            f"transpose_fp8 expects a contiguous 2-D fp8 tensor, got {t.dtype} {tuple(t.shape)}"
        )
    return _transpose_fp8(t)


def to_fp8_e4m3(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``t`` in float8_e4m3fn with one scale for the whole tensor, and the scale that undoes it.

    The scale maps ``t``'s largest magnitude (amax) to e4m3's largest value, 448
    (:data:`E4M3_MAX`); this is the "tensorwise" dynamic scaling of torchao's float8 training recipe
    and of Micikevicius et al. 2022, "FP8 Formats for Deep Learning"
    (https://arxiv.org/abs/2209.05433). e4m3 keeps 3 mantissa bits: each value is rounded by at
    most 1/16 of itself (relative); magnitudes below ~3.5e-5 of amax (2**-6 / 448) become
    subnormals with fewer bits, and below ~2.2e-6 of amax (2**-10 / 448) zero.

    Args:
        t: floating tensor of any shape.

    Returns:
        (t8, inv_scale): t8 float8_e4m3fn of ``t``'s shape with t8 ≈ t * scale; inv_scale a 0-d
        fp32 tensor, 1 / scale, so that ``t8.float() * inv_scale ≈ t`` (what ``torch._scaled_mm``'s
        scale_a/scale_b take). An all-zero ``t`` gives zeros and a finite scale.
    """
    amax = t.detach().abs().amax().float()
    scale = E4M3_MAX / amax.clamp(min=1e-12)
    t8 = (t.float() * scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return t8, scale.reciprocal()


def rowwise_e4m3(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``t`` in float8_e4m3fn with one scale per row, and the scales that undo it.

    Each row's largest magnitude (amax) maps to e4m3's largest value, 448 (:data:`E4M3_MAX`), as in
    torchao's rowwise float8 recipe; within a row, values are rounded to 3 mantissa bits (at most
    1/16 of themselves, relative) and magnitudes below ~2.2e-6 of the row's amax become zero.

    Args:
        t: (R, K) floating tensor (fp32 or bf16).

    Returns:
        (t8, inv_scale): t8 (R, K) float8_e4m3fn, contiguous; inv_scale (R, 1) fp32 with
        ``t8.float() * inv_scale ≈ t`` (what ``torch._scaled_mm`` takes as a rowwise scale). An
        all-zero row gives zeros and a finite scale.

    Raises:
        ValueError: if ``t`` is not 2-D.
    """
    if t.dim() != 2:
        raise ValueError(f"rowwise_e4m3 expects a 2-D tensor (rows, K), got shape {tuple(t.shape)}")
    amax = t.detach().abs().amax(dim=1, keepdim=True).float()  # (R, 1)
    scale = E4M3_MAX / amax.clamp(min=1e-12)
    t8 = (t.float() * scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return t8.contiguous(), scale.reciprocal()


def scaled_mm(
    a8: torch.Tensor,
    b8: torch.Tensor,
    scale_a: torch.Tensor,
    scale_b: torch.Tensor,
    fast_accum: bool,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """``(a8 * scale_a) @ (b8 * scale_b)`` in bf16: ``torch._scaled_mm`` with rowwise scales.

    Args:
        a8: (M, K) float8_e4m3fn, row-major; scale_a: (M, 1) fp32.
        b8: (K, N) float8_e4m3fn, column-major (``w8.t()`` of a contiguous (N, K) ``w8``);
            scale_b: (1, N) fp32.
        fast_accum: the tensor cores' faster fp8 accumulation, no periodic promotion of partial
            sums to fp32 (the fp8 MLP's forward always; its backward with ``grad_fast_accum``).

    Returns:
        (M, N) bf16. On a CPU (no fp8 tensor cores) the same product in fp32 then rounded to bf16:
        the tests' path, never a speed path (the switches refuse CPUs).
    """
    if a8.device.type == "cuda":
        return torch._scaled_mm(
            a8,
            b8,
            scale_a=scale_a,
            scale_b=scale_b,
            out_dtype=torch.bfloat16,
            use_fast_accum=fast_accum,
            bias=bias,
        )
    out = (a8.float() * scale_a) @ (b8.float() * scale_b)
    return (out if bias is None else out + bias.float()).to(torch.bfloat16)


def fp8_available(device: torch.device | str) -> tuple[bool, str]:
    """(whether ``linear_cross_entropy`` can run with ``fp8=True`` on ``device``, the reason if
    not).

    fp8 tensor cores (``torch._scaled_mm``) need compute capability >= 8.9: Ada (L4, RTX 40xx),
    Hopper (H100, H200) or newer; a T4 (7.5) and an A100 (8.0) have none. On a CPU it runs for the
    tests (PyTorch's CPU ``_scaled_mm``, Triton's interpreter), as
    :func:`~helpers.core.kernels.available` says.
    """
    ok, reason = available(device)
    if not ok:
        return (
            ok,
            f"{reason}; fp8 matmuls need an NVIDIA GPU of compute capability >= 8.9 (Ada, Hopper "
            "or newer)",
        )
    device = torch.device(device)
    if device.type == "cuda":
        from helpers.measure import hardware

        cap = hardware.capability(device)
        if cap < (8, 9):
            return False, (
                f"fp8 matmuls need compute capability >= 8.9 (Ada, Hopper or newer); this GPU is "
                f"{cap[0]}.{cap[1]}"
            )
        return True, ""
    return _cpu_scaled_mm_fp8()


def _cpu_scaled_mm_fp8() -> tuple[bool, str]:
    """Whether PyTorch's CPU ``_scaled_mm`` runs an e4m3 matmul here: it goes to oneDNN, which has
    fp8 kernels only for some instruction sets (none with AVX2 alone)."""
    a = torch.ones(16, 16).to(torch.float8_e4m3fn)
    one = torch.ones((), dtype=torch.float32)
    try:
        torch._scaled_mm(a, a.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    except RuntimeError as e:
        return False, (
            f"PyTorch's CPU _scaled_mm cannot run fp8 on this CPU "
            f"({str(e).splitlines()[0][:120]}); "
            "fp8 matmuls need an NVIDIA GPU of compute capability >= 8.9"
        )
    return True, ""
