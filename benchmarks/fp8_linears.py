"""An experiment, not a rung (results/perf-log.md, 2026-12-03): the transformer blocks' linears
with their forward and input-gradient matmuls on fp8 tensor cores, the weight gradient in bf16.

    python benchmarks/perf.py --batch-size 64 --variants final fp8-linears-fwd-mv --profile

``benchmarks/perf.py``'s ``fp8-linears*`` variants run the ladder's last rung with every
``nn.Linear`` the step calls (the blocks' four; the LM head goes through the fused LM-head CE)
replaced by :func:`fp8_linear` (:func:`experiment`). On the H200 the matmuls got 9-14 ms faster
per B=64 step and the casts around them cost more than that, so it is not a switch.

Each block has four linears (``c_attn``, the attention's ``c_proj``, ``c_fc``, the MLP's
``c_proj``); each runs three matmuls per step: the forward ``y = x @ W.T``, the input gradient
``dx = dy @ W`` and the weight gradient ``dW = dy.T @ x``. :func:`fp8_linear` runs the first two
in fp8 (``torch._scaled_mm``) and keeps the third in bf16. That is torchao's float8 recipe
"rowwise with the weight gradient in high precision" (``ROWWISE_WITH_GW_HP``,
https://github.com/pytorch/ao/tree/main/torchao/float8), chosen for two reasons:

- **Rowwise scales** (one fp32 scale per row of each operand, :func:`rowwise_e4m3`): a row's
  largest magnitude is a reduction over that row only, so torch.compile fuses the amax and the
  cast into the kernel that makes the tensor (the LayerNorm, the GELU, the residual gradient). A
  tensorwise scale needs the whole tensor's amax first: a pass of its own, which made an earlier
  fp8 MLP slower than bf16 (``results/perf-log.md``, 2026-12-02). Rowwise also keeps each row's
  precision when rows differ in size, so the gradients use e4m3 too, not e5m2.
- **No fp8 weight gradient**: Hopper's fp8 matmul takes both operands with the summed dimension
  contiguous; for ``dy.T @ x`` that is the token dimension, so both would need a transposed copy
  (the fp8 LM head's ``transpose_fp8``). bf16 matmuls take transposed operands as they are.

fp8 tensor cores need compute capability >= 8.9 (:func:`helpers.core.kernels.fp8.fp8_available`).
On a CPU the same arithmetic runs emulated in fp32 (:func:`scaled_mm`), for the tests only.

Variant names: ``-fwd`` keeps the input gradient in bf16 (fp8 forward only); ``-mv`` computes the
bias gradient as a matrix-vector product instead of a sum inductor fuses where it likes; ``-mk``
turns on inductor's ``triton.multi_kernel`` (persistent reductions for rows wider than 1024).

``fp8-attn`` (results/perf-log.md, 2026-12-04 evening) is ``fp8-linears`` with the fp8 MLP rung on,
so only the attention's two linears go through :func:`fp8_linear`, and with the gradient rows of
1025 or more elements (``c_attn``'s 2304-wide concatenated dq, dk, dv) cast by
:func:`rowwise_e4m3_colsum`, a one-pass Triton kernel that also sums the columns for the bias
gradient; ``fp8-attn-hw`` casts every gradient with it; ``fp8-attn-qkv`` runs only ``c_attn`` in
fp8. On the H200 the attention's matmuls got 3.8 ms faster per B=64 step and the casts cost 4.2 ms
more: not a rung either.
"""

from __future__ import annotations

import contextlib
from unittest import mock

import torch

from helpers.core.kernels._triton import (
    _INTERPRETED_AT_IMPORT,
    TRITON_OP_MISSING,
    launch,
    tl,
    triton,
)
from helpers.core.kernels.fp8 import E4M3_MAX, rowwise_e4m3, scaled_mm

VARIANTS = (
    "fp8-linears",
    "fp8-linears-mv",
    "fp8-linears-mv-mk",
    "fp8-linears-fwd",
    "fp8-linears-fwd-mv",
    "fp8-attn",
    "fp8-attn-hw",
    "fp8-attn-qkv",
)


# The variants' knobs (set by experiment())
BACKWARD_FP8 = True  # the input gradient in fp8 too (False: forward only)
BIAS_GRAD_MATMUL = False  # the bias gradient as a matrix-vector product (not an inductor sum)
# gradient rows at least this wide are cast by rowwise_e4m3_colsum (None: none are); inductor's
# one-pass ("persistent") reductions stop at rows of 1024 elements
ONE_PASS_MIN_WIDTH: int | None = None
MAX_WIDTH = 4096  # rowwise_e4m3_colsum holds a whole row in registers
ROWS_PER_PROGRAM = 32  # rows each of its programs sums into its column partial sums

if triton is not None and TRITON_OP_MISSING is None:
    # Triton resolves the jit functions a kernel calls from the kernel's module globals
    from helpers.core.kernels.fp8_mlp import (
        BACKWARD_CONFIGS,
        INTERPRETER_BACKWARD,
        _fp8_out,
        _store_rowwise_e4m3,
    )

    # the fp8 MLP backward's (rows per tile, warps), without its prefetching
    TILE_CONFIGS = sorted({(c["ROWS"], c["num_warps"]) for c in BACKWARD_CONFIGS})
    INTERPRETER_CONFIG = (INTERPRETER_BACKWARD["ROWS"], INTERPRETER_BACKWARD["num_warps"])
    if any(ROWS_PER_PROGRAM % rows for rows, _ in [*TILE_CONFIGS, INTERPRETER_CONFIG]):
        raise ValueError("each tile's rows must divide ROWS_PER_PROGRAM (rows per program)")

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


def rowwise_e4m3_colsum(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``rowwise_e4m3(x)`` and ``x.float().sum(0)`` in one read of ``x``, by a Triton kernel.

    Args:
        x: (M, N) bf16, contiguous, N <= 4096 (:data:`MAX_WIDTH`): a linear's output gradient,
            on a CUDA GPU (or a CPU with ``TRITON_INTERPRET=1`` set before import).

    Returns:
        (x8, inv_scale, colsum): x8 (M, N) float8_e4m3fn with ``x8.float() * inv_scale ≈ x``
        (each row's amax maps to 448, as :func:`~helpers.core.kernels.fp8.rowwise_e4m3`; a NaN
        stays NaN in its element, not in the scale); inv_scale (M, 1) fp32; colsum (N,) fp32,
        the column sums (the bias gradient).

    Raises:
        ValueError: x not a contiguous 2-D bf16 tensor with rows of at most 4096.
        RuntimeError: no Triton here, a torch without ``torch.library.triton_op``, or x on a CPU
            without Triton's interpreter.
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
    if triton is None or TRITON_OP_MISSING is not None:
        raise RuntimeError(
            f"rowwise_e4m3_colsum needs Triton: {TRITON_OP_MISSING or 'triton is not installed'}"
        )
    if x.device.type != "cuda" and not (x.device.type == "cpu" and _INTERPRETED_AT_IMPORT):
        raise RuntimeError(
            "rowwise_e4m3_colsum runs on a CUDA GPU (or a CPU with TRITON_INTERPRET=1 set before "
            f"import); x is on {x.device}"
        )
    return _cast_colsum_traced(x)


class _Fp8Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias):
        lead, K = x.shape[:-1], x.shape[-1]
        x_bf16 = x.reshape(-1, K).to(torch.bfloat16)  # (M, K): kept for the bf16 weight gradient
        x8, x_inv = rowwise_e4m3(x_bf16)  # (M, K), (M, 1)
        w8, w_inv = rowwise_e4m3(weight)  # (N, K), (N, 1): one scale per output feature
        b16 = None if bias is None else bias.to(torch.bfloat16)
        y = scaled_mm(x8, w8.t(), x_inv, w_inv.t(), fast_accum=True, bias=b16)  # (M, N) bf16
        ctx.save_for_backward(x_bf16, weight)
        ctx.x_dtype = x.dtype
        ctx.has_bias = bias is not None
        return y.view(*lead, weight.shape[0])

    @staticmethod
    def backward(ctx, dy):
        x_bf16, weight = ctx.saved_tensors
        lead, N = dy.shape[:-1], dy.shape[-1]
        dy2 = dy.reshape(-1, N).to(torch.bfloat16)  # (M, N)
        one_pass = BACKWARD_FP8 and ONE_PASS_MIN_WIDTH is not None and N >= ONE_PASS_MIN_WIDTH
        if one_pass:
            dy8, dy_inv, db = rowwise_e4m3_colsum(dy2.contiguous())  # db: (N,) fp32
        if BACKWARD_FP8:
            if not one_pass:
                dy8, dy_inv = rowwise_e4m3(dy2)  # (M, N), (M, 1)
            wt8, wt_inv = rowwise_e4m3(weight.t())  # (K, N), (K, 1): one scale per input feature
            dx = scaled_mm(dy8, wt8.t(), dy_inv, wt_inv.t(), fast_accum=False)  # (M, K) bf16
        else:
            dx = dy2 @ weight.to(torch.bfloat16)
        dw = (dy2.t() @ x_bf16).to(weight.dtype)  # (N, K): bf16 matmul, fp32 accumulation
        if not ctx.has_bias:
            db = None
        elif one_pass:
            db = db.to(weight.dtype)
        elif BIAS_GRAD_MATMUL:
            ones = torch.ones(dy2.shape[0], 1, dtype=dy2.dtype, device=dy2.device)
            db = (dy2.t() @ ones).view(-1).to(weight.dtype)
        else:
            db = dy2.float().sum(0).to(weight.dtype)
        return dx.view(*lead, x_bf16.shape[1]).to(ctx.x_dtype), dw, db


def fp8_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` with the forward and input-gradient matmuls in fp8 (rowwise
    e4m3 scales) and the weight gradient in bf16 (see the module's text).

    Args:
        x: (..., K) fp32 or bf16 (under bf16 autocast the LayerNorm hands over fp32).
        weight: (N, K) parameter (fp32 master weights); bias: (N,) or None. K and N must be
            multiples of 16 (fp8 tensor cores), and the rows of x (the product of its leading
            dimensions) too.

    Returns:
        (..., N) bf16 (the dtype autocast gives a linear). The gradients reaching ``x``,
        ``weight`` and ``bias`` have their dtypes.

    Raises:
        ValueError: K or N not a multiple of 16.
    """
    N, K = weight.shape
    if K % 16 or N % 16:
        raise ValueError(
            f"fp8_linear needs in_features and out_features that are multiples of 16, got "
            f"{K} and {N}"
        )
    return _Fp8Linear.apply(x, weight, bias)


def experiment(name: str) -> contextlib.ExitStack:
    """The context of ``benchmarks/perf.py``'s variant ``name`` (one of :data:`VARIANTS`): every
    ``nn.Linear.forward`` goes through :func:`fp8_linear`, with the variant's knobs.

    Raises:
        ValueError: an unknown variant name.
    """
    if name not in VARIANTS:
        raise ValueError(f"unknown fp8-linears variant {name!r}; known: {VARIANTS}")
    import torch._inductor.config as inductor_config

    def forward(self, x):
        if name == "fp8-attn-qkv" and self.out_features != 3 * self.in_features:
            return plain(self, x)  # only c_attn (C -> 3C) in fp8
        return fp8_linear(x, self.weight, self.bias)

    plain = torch.nn.Linear.forward

    knobs = {
        "BACKWARD_FP8": "-fwd" not in name,
        "BIAS_GRAD_MATMUL": "-mv" in name,
        "ONE_PASS_MIN_WIDTH": {"fp8-attn": 1025, "fp8-attn-hw": 0, "fp8-attn-qkv": 1025}.get(name),
    }
    stack = contextlib.ExitStack()
    stack.enter_context(mock.patch.object(torch.nn.Linear, "forward", forward))
    stack.enter_context(mock.patch.dict(globals(), knobs))
    if name.endswith("-mk"):
        stack.enter_context(inductor_config.patch({"triton.multi_kernel": 1}))
    return stack
