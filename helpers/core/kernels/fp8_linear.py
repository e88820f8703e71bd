"""Rung "+ fp8 attention linears": a linear layer whose forward and input-gradient matmuls run on
fp8 tensor cores, with a one-pass kernel for the casts of wide gradient rows.

:func:`linear_fp8` is ``F.linear(x, W, b)`` with the recipe of the fp8 MLP
(:mod:`helpers.core.kernels.fp8_mlp`): ``y = x @ W.T`` and ``dx = dy @ W`` as ``torch._scaled_mm``
with one fp32 scale per row of each e4m3 operand (:func:`~helpers.core.kernels.fp8.rowwise_e4m3`),
the weight gradient ``dW = dy.T @ x`` in bf16 (torchao's ``ROWWISE_WITH_GW_HP``). The model uses it
for the attention's two linears, ``c_attn`` (C -> 3C) and ``c_proj`` (C -> C): a third of each
block's weight-matmul FLOPs.

Where each cast happens:

- ``x``: the LayerNorm's output (for ``c_attn``) or the attention's output (``c_proj``), rows C =
  768 wide. ``rowwise_e4m3`` is torch ops; torch.compile fuses the row's amax and the cast into the
  kernel that makes ``x`` (a one-pass, "persistent" reduction: inductor makes those for rows up to
  1024 wide).
- ``dy``: ``c_proj``'s is 768 wide, cast by torch ops as well; ``c_attn``'s is the 2304-wide
  concatenated gradient of q, k and v. For rows that wide inductor's reduction reads the row twice
  (2026-12-03 in ``results/perf-log.md``: its cast took 4.55 ms per B=64 step against 1.66 for the
  copy alone), so :func:`rowwise_e4m3_colsum` does it in one read: each row's amax, the e4m3 row,
  its scale, and per-program column sums for the bias gradient.
"""

from __future__ import annotations

import torch

from helpers.core.kernels._triton import (
    _INTERPRETED_AT_IMPORT,
    TRITON_OP_MISSING,
    launch,
    tl,
    triton,
)
from helpers.core.kernels.fp8 import E4M3_MAX, rowwise_e4m3, scaled_mm

# Rows at least this wide are cast by rowwise_e4m3_colsum: inductor's one-pass reductions stop at
# rows of 1024 elements (torch._inductor's persistent-reduction limit).
ONE_PASS_MIN_WIDTH = 1025
MAX_WIDTH = 4096  # rowwise_e4m3_colsum holds a whole row in registers
ROWS_PER_PROGRAM = 32  # rows each program sums into its column partial sums

if triton is not None and TRITON_OP_MISSING is None:
    # Triton resolves the jit functions a kernel calls from the kernel's module globals
    from helpers.core.kernels.fp8_mlp import (
        INTERPRETER_CONFIG,
        TILE_CONFIGS,
        _fp8_out,
        _store_rowwise_e4m3,
    )

    @triton.jit
    def _cast_colsum_kernel(
        x_ptr, x8_ptr, inv_ptr, colsum_ptr, n_rows, n_cols,
        E4M3_MAX: tl.constexpr, BLOCK: tl.constexpr, ROWS: tl.constexpr, GROUPS: tl.constexpr,
        HW_CAST: tl.constexpr,
    ):  # fmt: skip
        # GROUPS tiles of ROWS rows per program: each row in e4m3 with its scale (one read of
        # the row), and this program's column sums (fp32) for the bias gradient
        pid = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK)[None, :]
        colsum = tl.zeros((BLOCK,), dtype=tl.float32)
        for g in range(GROUPS):
            rows1 = (pid * GROUPS + g) * ROWS + tl.arange(0, ROWS)
            rows = rows1[:, None]
            mask = (rows < n_rows) & (cols < n_cols)
            off = rows * n_cols + cols
            x = tl.load(x_ptr + off, mask=mask, other=0.0).to(tl.float32)
            colsum += tl.sum(x, axis=0)
            _store_rowwise_e4m3(
                x, x8_ptr, off, mask, inv_ptr, rows1, rows1 < n_rows, E4M3_MAX, HW_CAST
            )
        tl.store(
            colsum_ptr + pid * n_cols + tl.arange(0, BLOCK),
            colsum,
            mask=tl.arange(0, BLOCK) < n_cols,
        )

    if _INTERPRETED_AT_IMPORT:
        _kernel = _cast_colsum_kernel
        _rows, _warps = INTERPRETER_CONFIG
        _FIXED = {"ROWS": _rows, "GROUPS": ROWS_PER_PROGRAM // _rows, "num_warps": _warps}
    else:
        _kernel = triton.autotune(
            [
                triton.Config({"ROWS": r, "GROUPS": ROWS_PER_PROGRAM // r}, num_warps=w)
                for r, w in TILE_CONFIGS
            ],
            key=["n_cols"],
        )(_cast_colsum_kernel)
        _FIXED = {}  # autotune chooses

    @torch.library.triton_op("fastgpt2::rowwise_e4m3_colsum", mutates_args={})
    def _cast_colsum_traced(
        x: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        M, N = x.shape
        programs = triton.cdiv(M, ROWS_PER_PROGRAM)  # every config covers ROWS_PER_PROGRAM rows
        x8 = torch.empty((M, N), dtype=torch.float8_e4m3fn, device=x.device)
        inv = torch.empty((M, 1), dtype=torch.float32, device=x.device)
        partial = torch.empty((programs, N), dtype=torch.float32, device=x.device)
        launch(_kernel)[(programs,)](
            x, _fp8_out(x8), inv, partial, M, N,
            E4M3_MAX=E4M3_MAX, BLOCK=triton.next_power_of_2(N),
            HW_CAST=not _INTERPRETED_AT_IMPORT, **_FIXED,
        )  # fmt: skip
        return x8, inv, partial.sum(0)


def _check_device(t: torch.Tensor, name: str) -> None:
    if t.device.type != "cuda" and not (t.device.type == "cpu" and _INTERPRETED_AT_IMPORT):
        raise RuntimeError(
            f"{name} runs a Triton kernel on a CUDA GPU (or a CPU in Triton's interpreter, "
            f"TRITON_INTERPRET=1 set before import); its input is on {t.device}"
        )


def rowwise_e4m3_colsum(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``rowwise_e4m3(x)`` and ``x.float().sum(0)`` in one read of ``x``.

    Args:
        x: (M, N) bf16, contiguous, N <= 4096 (:data:`MAX_WIDTH`): a linear's output gradient.

    Returns:
        (x8, inv_scale, colsum): x8 (M, N) float8_e4m3fn with ``x8.float() * inv_scale ≈ x``
        (each row's amax maps to 448, as :func:`~helpers.core.kernels.fp8.rowwise_e4m3`);
        inv_scale (M, 1) fp32; colsum (N,) fp32, the column sums (the bias gradient).

    Raises:
        ValueError: x not a contiguous 2-D bf16 tensor with rows of at most 4096.
        RuntimeError: x on a device the kernel cannot run on (see :func:`_check_device`).
    """
    if x.dim() != 2 or x.dtype != torch.bfloat16 or not x.is_contiguous():
        raise ValueError(
            "rowwise_e4m3_colsum expects a contiguous 2-D bf16 tensor, got "
            f"{x.dtype} {tuple(x.shape)}"
        )
    if x.shape[1] > MAX_WIDTH:
        raise ValueError(
            f"rowwise_e4m3_colsum handles rows up to {MAX_WIDTH} wide, got {x.shape[1]}"
        )
    _check_device(x, "rowwise_e4m3_colsum")
    return _cast_colsum_traced(x)


class _Fp8Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias):
        lead, K = x.shape[:-1], x.shape[-1]
        x2 = x.reshape(-1, K).to(torch.bfloat16)  # (M, K): kept for the bf16 weight gradient
        x8, x_inv = rowwise_e4m3(x2)
        w8, w_inv = rowwise_e4m3(weight)  # (N, K): one scale per output feature
        b16 = None if bias is None else bias.to(torch.bfloat16)
        y = scaled_mm(x8, w8.t(), x_inv, w_inv.t(), True, b16)  # (M, N) bf16
        ctx.save_for_backward(x2, weight)
        ctx.x_dtype = x.dtype
        ctx.has_bias = bias is not None
        return y.view(*lead, weight.shape[0])

    @staticmethod
    def backward(ctx, dy):
        x2, weight = ctx.saved_tensors
        lead, N = dy.shape[:-1], dy.shape[-1]
        dy2 = dy.reshape(-1, N).to(torch.bfloat16).contiguous()  # (M, N)
        if N >= ONE_PASS_MIN_WIDTH:
            dy8, dy_inv, db = rowwise_e4m3_colsum(dy2)
        else:
            dy8, dy_inv = rowwise_e4m3(dy2)
            db = dy2.float().sum(0) if ctx.has_bias else None
        wt8, wt_inv = rowwise_e4m3(weight.t())  # (K, N): one scale per input feature
        dx = scaled_mm(dy8, wt8.t(), dy_inv, wt_inv.t(), False)  # (M, K) bf16
        dw = (dy2.t() @ x2).to(weight.dtype)  # bf16 matmul, fp32 accumulation
        db = db.to(weight.dtype) if ctx.has_bias else None
        return dx.view(*lead, x2.shape[1]).to(ctx.x_dtype), dw, db


def width_problem(in_features: int, out_features: int) -> str | None:
    """Why :func:`linear_fp8` cannot take a linear of these widths, or None if it can: fp8
    matmuls need multiples of 16, and a gradient row wider than 4096 does not fit the cast
    kernel's registers."""
    if in_features % 16 or out_features % 16:
        return (
            f"in_features={in_features} and out_features={out_features} must be multiples of 16 "
            "(fp8 matmuls need them)"
        )
    if out_features > MAX_WIDTH:
        return (
            f"out_features={out_features} > {MAX_WIDTH} (the cast kernel holds a row in registers)"
        )
    return None


def linear_fp8(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` with the forward and input-gradient matmuls in fp8 (rowwise
    e4m3 scales) and the weight gradient in bf16 (see the module's text).

    Args:
        x: (..., K) fp32 or bf16 (under bf16 autocast the LayerNorm hands over fp32).
        weight: (N, K) (fp32 master weights); bias: (N,) or None. K and N multiples of 16,
            N <= 4096.

    Returns:
        (..., N) bf16, the dtype autocast gives a linear. Its relative error against a bf16
        linear is e4m3's rounding, about 0.05 in the value and the gradients
        (tests/test_fp8_linear.py). Gradients reach x, weight and bias in their dtypes.

    Raises:
        ValueError: x not at least 2-D or not fp32/bf16, widths that :func:`width_problem`
            refuses, or a bias of another shape.
        RuntimeError: x on a device the kernels cannot run on (a CPU without
            ``TRITON_INTERPRET=1`` set before import); check ``kernels.fp8_available`` first.
    """
    if x.dim() < 2 or x.dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(
            "linear_fp8 needs x of shape (..., K), at least 2-D, fp32 or bf16; got shape "
            f"{tuple(x.shape)}, {x.dtype}"
        )
    N, K = weight.shape
    if (why := width_problem(K, N)) is not None:
        raise ValueError(f"linear_fp8: {why}")
    if x.shape[-1] != K or (bias is not None and tuple(bias.shape) != (N,)):
        raise ValueError(
            f"linear_fp8: x {tuple(x.shape)}, weight {(N, K)} and bias "
            f"{None if bias is None else tuple(bias.shape)} do not fit (x (..., K), bias (N,))"
        )
    _check_device(x, "linear_fp8")
    return _Fp8Linear.apply(x, weight, bias)
