"""Rung "+ fp8 MLP": the MLP's forward and input-gradient matmuls on fp8 tensor cores, with the
GELU and the casts around it in two hand-written one-pass Triton kernels.

Each block's MLP is ``y = c_proj(GELU(c_fc(x)))`` with ``c_fc`` (C -> 4C) and ``c_proj`` (4C -> C):
46% of the weight matmuls' FLOPs in GPT-2 124M. Each linear runs three matmuls per step: the
forward ``y = x @ W.T``, the input gradient ``dx = dy @ W`` and the weight gradient
``dW = dy.T @ x``. :func:`mlp_fp8` runs the first two of each in fp8 (``torch._scaled_mm``, one
fp32 scale per row of each operand, :func:`~helpers.core.kernels.fp8.rowwise_e4m3`) and keeps the
weight gradients in bf16: torchao's float8 recipe "rowwise with the weight gradient in high
precision" (``ROWWISE_WITH_GW_HP``, https://github.com/pytorch/ao/tree/main/torchao/float8).
Hopper's fp8 matmul wants the summed dimension contiguous in both operands; for ``dy.T @ x`` that
is the token dimension, which would need transposed fp8 copies of both.

Why hand-written kernels: an fp8 operand needs its rows' largest magnitudes (amax) before it can
be cast. The GELU's rows are 4C = 3072 wide, over inductor's 1024-element limit for a one-pass
reduction, so the kernels torch.compile generated wrote the GELU output, read it back for the
amax and again for the cast: with them the fp8 MLP was slower than bf16
(results/perf-log.md, 2026-12-02 and 2026-12-03). Here one program holds whole rows in registers:

- forward: ``x8 = e4m3(LayerNorm output)`` (768 wide: inductor fuses it into the LayerNorm),
  ``h = x8 @ W_fc8.T + b_fc``, then :func:`gelu_rowwise_e4m3` reads ``h`` once and writes
  ``a = GELU(h)`` in bf16 (for ``c_proj``'s bf16 weight gradient), ``a`` in e4m3 and each row's
  scale; ``y = a8 @ W_proj8.T + b_proj``.
- backward: ``da = dy8 @ W_proj`` in fp8, then :func:`gelu_backward_rowwise_e4m3` reads ``da``
  and ``h`` once and writes ``dh`` in bf16 (for ``c_fc``'s weight gradient), in e4m3 with its row
  scales (for ``dx = dh8 @ W_fc``) and per-program column sums for the bias gradient.

The kernels are ``torch.library.triton_op``s: torch.compile launches them from its own generated
code (as opaque custom ops, called through Python, they doubled the host's time per B=16 step).
On a GPU they are autotuned at the first call (rows per tile, tiles per program, warps, and
whether a program issues its next tile's loads before this tile's row reduction and stores, which
keeps memory busy while it waits on them: -6% for the backward kernel on an H100, perf-log
2026-12-06) and cast to e4m3 with the hardware's instruction; Triton's CPU interpreter (the
tests) runs one configuration and a hand-written rounding (:func:`_e4m3_bits`), equal to torch's
cast bit for bit. A NaN stays NaN in the e4m3 values (and so in the matmul's output row); the
row's scale comes from its other values.

Measured on the H200 (results/perf-log.md): -4.3 to -7.8 ms per B=64 step against the bf16 MLP;
at B=16, where the matmuls are 4x smaller, within the steps' spread.
"""

from __future__ import annotations

import math

import torch

from helpers.core.kernels._triton import (
    _INTERPRETED_AT_IMPORT,
    TRITON_OP_MISSING,
    autotuned,
    launch,
    tl,
    triton,
)
from helpers.core.kernels.fp8 import E4M3_MAX, rowwise_e4m3, scaled_mm

ROW_BLOCK = 4096  # the kernels' row width in registers: the next power of 2 above 4 * 768
BACKWARD_ROWS = 32  # rows per program in the backward kernel (its bias-gradient partial sums)
GELU_C = math.sqrt(2.0 / math.pi)  # GELU's tanh approximation (Hendrycks & Gimpel 2016, eq. 2)
# On a GPU each kernel is autotuned over these configs (the fastest at the first call): rows per
# tile, tiles per program (GROUPS), whether the next tile's loads are issued before this tile's
# stores (PREFETCH), warps. The backward's programs each cover BACKWARD_ROWS rows (its partial
# bias sums are per program). The CPU interpreter runs one config (it cannot time kernels).
FORWARD_CONFIGS = [
    *({"ROWS": rows, "GROUPS": 1, "PREFETCH": False, "num_warps": w} for rows in (1, 2, 4)
      for w in (4, 8, 16)),
    *({"ROWS": rows, "GROUPS": groups, "PREFETCH": True, "num_warps": w} for rows in (1, 2)
      for groups in (4, 8) for w in (4, 8, 16)),
]  # fmt: skip
BACKWARD_CONFIGS = [
    {"ROWS": rows, "GROUPS": BACKWARD_ROWS // rows, "PREFETCH": prefetch, "num_warps": w}
    for prefetch in (False, True)
    for rows in (1, 2, 4)
    for w in (4, 8, 16)
]
INTERPRETER_FORWARD = {"ROWS": 2, "GROUPS": 5, "PREFETCH": True, "num_warps": 4}
INTERPRETER_BACKWARD = {"ROWS": 2, "GROUPS": BACKWARD_ROWS // 2, "PREFETCH": True, "num_warps": 4}
if any(c["ROWS"] * c["GROUPS"] != BACKWARD_ROWS for c in [*BACKWARD_CONFIGS, INTERPRETER_BACKWARD]):
    raise ValueError("each backward config must cover BACKWARD_ROWS rows per program")

if triton is not None and TRITON_OP_MISSING is None:
    from helpers.core.kernels._triton import _INTERPRETED_AT_IMPORT

    @triton.jit
    def _e4m3_bits(v):
        # fp32 -> float8_e4m3fn bits (uint8), round to nearest even, for finite |v| <= 448 (the
        # callers clamp), for Triton's CPU interpreter, which casts to fp8 wrongly (mantissa
        # carries into the exponent are lost); a GPU casts in hardware (cvt.rn.satfinite).
        # Normal values (|v| >= 2**-6): round fp32's 23-bit mantissa to 3 bits (a carry moves into
        # the exponent as it should), then rebias the exponent from 127 to 7. Subnormals: the
        # nearest multiple of 2**-9, found by adding and subtracting 2**23 in fp32.
        bits = v.to(tl.int32, bitcast=True)
        sign = (bits >> 24) & 0x80
        a = tl.abs(v)
        abits = a.to(tl.int32, bitcast=True)
        normal = ((abits + 0x7FFFF + ((abits >> 20) & 1)) >> 20) - ((127 - 7) << 3)
        sub = ((a * 512.0 + 8388608.0) - 8388608.0).to(tl.int32)
        out = tl.where(a >= 0.015625, normal, sub)
        return tl.where(v != v, 0x7F, out | sign).to(tl.uint8)  # NaN: e4m3fn's NaN, 0x7F

    @triton.jit
    def _store_rowwise_e4m3(x, ptr, off, mask, inv_ptr, rows, row_mask, E4M3_MAX, HW_CAST):
        # x (ROWS, BLOCK) fp32: each row's amax maps to 448 (as rowwise_e4m3); stores x * scale
        # in e4m3 at ptr + off and 1 / scale at inv_ptr + rows. A NaN stays NaN and does not
        # reach its row's scale: on a GPU, max skips it (PTX max.f32) and the cast keeps it
        # (cvt.rn.satfinite, which also saturates: no clamp); the interpreter's numpy max would
        # propagate it, so it is masked out there, and kept past the clamp _e4m3_bits needs
        if HW_CAST:
            amax = tl.max(tl.abs(x), axis=1)
        else:
            amax = tl.max(tl.where(x == x, tl.abs(x), 0.0), axis=1)
        scale = E4M3_MAX / tl.maximum(amax, 1e-12)
        q = x * scale[:, None]
        if HW_CAST:
            tl.store(ptr + off, q.to(tl.float8e4nv), mask=mask)
        else:
            q = tl.where(q != q, q, tl.minimum(tl.maximum(q, -E4M3_MAX), E4M3_MAX))
            tl.store(ptr + off, _e4m3_bits(q), mask=mask)
        tl.store(inv_ptr + rows, 1.0 / scale, mask=row_mask)

    @triton.jit
    def _sigmoid_2u(h, GELU_C: tl.constexpr):
        # GELU(h) = 0.5 h (1 + tanh(u)) = h * sigmoid(2u), u = sqrt(2/pi) (h + 0.044715 h^3):
        # no cancellation in 1 + tanh(u) for large negative h (libdevice's tanh is not in the
        # CPU interpreter either); an approximate division (2 ulp) is plenty before bf16
        u = GELU_C * (h + 0.044715 * h * h * h)
        return tl.fdiv(1.0, 1.0 + tl.exp(-2.0 * u), ieee_rounding=False)

    @triton.jit
    def _tile(rows1, cols, n_rows, n_cols):
        # the offsets and mask of the (ROWS, BLOCK) tile of rows ``rows1`` in an (M, N) tensor
        rows = rows1[:, None]
        return rows * n_cols + cols, (rows < n_rows) & (cols < n_cols)

    @triton.jit
    def _gelu_cast_kernel(
        h_ptr, a_ptr, a8_ptr, inv_ptr, n_rows, n_cols,
        GELU_C: tl.constexpr, E4M3_MAX: tl.constexpr, BLOCK: tl.constexpr, ROWS: tl.constexpr,
        GROUPS: tl.constexpr, PREFETCH: tl.constexpr, HW_CAST: tl.constexpr,
    ):  # fmt: skip
        # GROUPS tiles of ROWS rows per program: a = GELU(h) in bf16, a * scale in e4m3,
        # 1 / scale. PREFETCH: the next tile's loads are issued before this tile's reduction
        # and stores, so they are in flight while the program waits on those
        pid = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK)[None, :]
        first = pid * GROUPS * ROWS + tl.arange(0, ROWS)
        if PREFETCH:
            off, mask = _tile(first, cols, n_rows, n_cols)
            h_next = tl.load(h_ptr + off, mask=mask, other=0.0)
        for g in range(GROUPS):
            rows1 = first + g * ROWS
            off, mask = _tile(rows1, cols, n_rows, n_cols)
            if PREFETCH:
                h = h_next.to(tl.float32)
                ahead = tl.where(g + 1 < GROUPS, n_rows, 0)  # no tile after the last
                off_n, mask_n = _tile(rows1 + ROWS, cols, ahead, n_cols)
                h_next = tl.load(h_ptr + off_n, mask=mask_n, other=0.0)
            else:
                h = tl.load(h_ptr + off, mask=mask, other=0.0).to(tl.float32)
            a16 = (h * _sigmoid_2u(h, GELU_C)).to(tl.bfloat16)
            tl.store(a_ptr + off, a16, mask=mask)
            # cast what c_proj's weight gradient sees (the bf16 a), as rowwise_e4m3(a) would
            _store_rowwise_e4m3(
                a16.to(tl.float32), a8_ptr, off, mask, inv_ptr, rows1, rows1 < n_rows, E4M3_MAX,
                HW_CAST,
            )  # fmt: skip

    @triton.jit
    def _gelu_backward_cast_kernel(
        da_ptr, h_ptr, dh_ptr, dh8_ptr, inv_ptr, dbias_ptr, n_rows, n_cols,
        GELU_C: tl.constexpr, E4M3_MAX: tl.constexpr, BLOCK: tl.constexpr, ROWS: tl.constexpr,
        GROUPS: tl.constexpr, PREFETCH: tl.constexpr, HW_CAST: tl.constexpr,
    ):  # fmt: skip
        # GROUPS tiles of ROWS rows per program: dh = da * GELU'(h) in bf16 and e4m3 (row
        # scale), and this program's column sums of dh (fp32) for the bias gradient. PREFETCH:
        # as in _gelu_cast_kernel
        pid = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK)[None, :]
        colsum = tl.zeros((BLOCK,), dtype=tl.float32)
        first = pid * GROUPS * ROWS + tl.arange(0, ROWS)
        if PREFETCH:
            off, mask = _tile(first, cols, n_rows, n_cols)
            da_next = tl.load(da_ptr + off, mask=mask, other=0.0)
            h_next = tl.load(h_ptr + off, mask=mask, other=0.0)
        for g in range(GROUPS):
            rows1 = first + g * ROWS
            off, mask = _tile(rows1, cols, n_rows, n_cols)
            if PREFETCH:
                da, h = da_next.to(tl.float32), h_next.to(tl.float32)
                ahead = tl.where(g + 1 < GROUPS, n_rows, 0)  # no tile after the last
                off_n, mask_n = _tile(rows1 + ROWS, cols, ahead, n_cols)
                da_next = tl.load(da_ptr + off_n, mask=mask_n, other=0.0)
                h_next = tl.load(h_ptr + off_n, mask=mask_n, other=0.0)
            else:
                da = tl.load(da_ptr + off, mask=mask, other=0.0).to(tl.float32)
                h = tl.load(h_ptr + off, mask=mask, other=0.0).to(tl.float32)
            # GELU'(h) = s + 2 h s (1 - s) u'(h), s = sigmoid(2u)
            s = _sigmoid_2u(h, GELU_C)
            d = s + 2.0 * h * s * (1.0 - s) * GELU_C * (1.0 + 3 * 0.044715 * h * h)
            dh16 = (da * d).to(tl.bfloat16)
            tl.store(dh_ptr + off, dh16, mask=mask)
            dh = dh16.to(tl.float32)
            colsum += tl.sum(dh, axis=0)
            _store_rowwise_e4m3(
                dh, dh8_ptr, off, mask, inv_ptr, rows1, rows1 < n_rows, E4M3_MAX, HW_CAST
            )
        tl.store(
            dbias_ptr + pid * n_cols + tl.arange(0, BLOCK),
            colsum,
            mask=tl.arange(0, BLOCK) < n_cols,
        )

    if _INTERPRETED_AT_IMPORT:
        _fwd_kernel, _bwd_kernel = _gelu_cast_kernel, _gelu_backward_cast_kernel
        _FWD_FIXED, _BWD_FIXED = dict(INTERPRETER_FORWARD), dict(INTERPRETER_BACKWARD)
    else:
        _fwd_kernel = autotuned(_gelu_cast_kernel, FORWARD_CONFIGS, key=["n_cols"])
        _bwd_kernel = autotuned(_gelu_backward_cast_kernel, BACKWARD_CONFIGS, key=["n_cols"])
        _FWD_FIXED = _BWD_FIXED = {}  # autotune chooses

    def _fp8_out(t: torch.Tensor) -> torch.Tensor:
        # what the kernels store e4m3 into: the fp8 tensor itself on a GPU, its bytes in the
        # interpreter (which writes the bits _e4m3_bits makes)
        return t.view(torch.uint8) if _INTERPRETED_AT_IMPORT else t

    def _gelu_impl(h, launch, config=None):
        # config: one of FORWARD_CONFIGS to launch as it is (benchmarks, tests), else autotuned
        M, N = h.shape
        kernel, fixed = (_fwd_kernel, _FWD_FIXED) if config is None else (_gelu_cast_kernel, config)
        a = torch.empty_like(h)
        a8 = torch.empty((M, N), dtype=torch.float8_e4m3fn, device=h.device)
        inv = torch.empty((M, 1), dtype=torch.float32, device=h.device)
        launch(kernel)[lambda meta: (triton.cdiv(M, meta["ROWS"] * meta["GROUPS"]),)](
            h, a, _fp8_out(a8), inv, M, N,
            GELU_C=GELU_C, E4M3_MAX=E4M3_MAX, BLOCK=ROW_BLOCK,
            HW_CAST=not _INTERPRETED_AT_IMPORT, **fixed,
        )  # fmt: skip
        return a, a8, inv

    def _gelu_backward_impl(da, h, launch, config=None):
        # config: one of BACKWARD_CONFIGS to launch as it is, else autotuned
        M, N = h.shape
        kernel = _bwd_kernel if config is None else _gelu_backward_cast_kernel
        fixed = _BWD_FIXED if config is None else config
        # every autotune config covers BACKWARD_ROWS rows per program
        per_program = BACKWARD_ROWS if config is None else config["ROWS"] * config["GROUPS"]
        programs = triton.cdiv(M, per_program)
        dh = torch.empty_like(h)
        dh8 = torch.empty((M, N), dtype=torch.float8_e4m3fn, device=h.device)
        inv = torch.empty((M, 1), dtype=torch.float32, device=h.device)
        partial = torch.empty((programs, N), dtype=torch.float32, device=h.device)
        launch(kernel)[(programs,)](
            da, h, dh, _fp8_out(dh8), inv, partial, M, N,
            GELU_C=GELU_C, E4M3_MAX=E4M3_MAX, BLOCK=ROW_BLOCK, HW_CAST=not _INTERPRETED_AT_IMPORT,
            **fixed,
        )  # fmt: skip
        return dh, dh8, inv, partial.sum(0)

    # triton_op: torch.compile sees the launch and the torch ops around it and launches the
    # kernel from its own generated code
    @torch.library.triton_op("fastgpt2::gelu_rowwise_e4m3", mutates_args={})
    def _gelu_traced(h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return _gelu_impl(h, launch)

    @torch.library.triton_op("fastgpt2::gelu_backward_rowwise_e4m3", mutates_args={})
    def _gelu_backward_traced(
        da: torch.Tensor, h: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        return _gelu_backward_impl(da, h, launch)


def _check_rows(t: torch.Tensor, name: str) -> None:
    if t.dim() != 2 or t.dtype != torch.bfloat16 or not t.is_contiguous():
        raise ValueError(
            f"{name} expects a contiguous 2-D bf16 tensor, got {t.dtype} {tuple(t.shape)}"
        )
    if t.shape[1] > ROW_BLOCK:
        raise ValueError(f"{name} handles rows up to {ROW_BLOCK} wide, got {t.shape[1]}")


def gelu_rowwise_e4m3(h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """GELU (tanh approximation) and its rowwise e4m3 cast in one pass over ``h``.

    Args:
        h: (M, N) bf16, contiguous, N <= 4096 (c_fc's output, bias included).

    Returns:
        (a, a8, inv_scale): a = GELU(h) (M, N) bf16; a8 (M, N) float8_e4m3fn with
        ``a8.float() * inv_scale ≈ a`` (each row's amax maps to 448, as ``rowwise_e4m3`` of ``a``);
        inv_scale (M, 1) fp32.

    Raises:
        ValueError: ``h`` not a contiguous 2-D bf16 tensor of rows <= 4096 wide.
    """
    _check_rows(h, "gelu_rowwise_e4m3")
    return _gelu_traced(h)


def gelu_backward_rowwise_e4m3(
    da: torch.Tensor, h: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The GELU's backward, its rowwise e4m3 cast and the bias gradient in one pass.

    Args:
        da: (M, N) bf16, the gradient of GELU(h); h: (M, N) bf16, GELU's input. Both contiguous.

    Returns:
        (dh, dh8, inv_scale, dbias): dh = da * GELU'(h) (M, N) bf16; dh8 (M, N) float8_e4m3fn
        with rowwise inv_scale (M, 1) fp32; dbias (N,) fp32, the column sums of dh.

    Raises:
        ValueError: bad shapes or dtypes.
    """
    _check_rows(h, "gelu_backward_rowwise_e4m3")
    _check_rows(da, "gelu_backward_rowwise_e4m3")
    if da.shape != h.shape:
        raise ValueError(f"da {tuple(da.shape)} and h {tuple(h.shape)} differ in shape")
    return _gelu_backward_traced(da, h)


class _Fp8MLP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w_fc, b_fc, w_proj, b_proj, grad_fast_accum):
        lead, C = x.shape[:-1], x.shape[-1]
        x2 = x.reshape(-1, C).to(torch.bfloat16)  # (M, C): kept for c_fc's weight gradient
        x8, x_inv = rowwise_e4m3(x2)
        wfc8, wfc_inv = rowwise_e4m3(w_fc)  # (4C, C)
        h = scaled_mm(x8, wfc8.t(), x_inv, wfc_inv.t(), True, b_fc.to(torch.bfloat16))
        a, a8, a_inv = gelu_rowwise_e4m3(h)  # (M, 4C)
        wpr8, wpr_inv = rowwise_e4m3(w_proj)  # (C, 4C)
        y = scaled_mm(a8, wpr8.t(), a_inv, wpr_inv.t(), True, b_proj.to(torch.bfloat16))
        ctx.save_for_backward(x2, h, a, w_fc, w_proj)
        ctx.x_dtype = x.dtype
        ctx.grad_fast_accum = grad_fast_accum
        return y.view(*lead, C)

    @staticmethod
    def backward(ctx, dy):
        x2, h, a, w_fc, w_proj = ctx.saved_tensors
        lead, C = dy.shape[:-1], dy.shape[-1]
        dy2 = dy.reshape(-1, C).to(torch.bfloat16)  # (M, C)
        dy8, dy_inv = rowwise_e4m3(dy2)
        wprt8, wprt_inv = rowwise_e4m3(w_proj.t())  # (4C, C): one scale per input feature
        fast = ctx.grad_fast_accum
        da = scaled_mm(dy8, wprt8.t(), dy_inv, wprt_inv.t(), fast)  # (M, 4C)
        dw_proj = (dy2.t() @ a).to(w_proj.dtype)
        db_proj = dy2.float().sum(0).to(w_proj.dtype)
        dh, dh8, dh_inv, db_fc = gelu_backward_rowwise_e4m3(da, h)
        wfct8, wfct_inv = rowwise_e4m3(w_fc.t())  # (C, 4C)
        dx = scaled_mm(dh8, wfct8.t(), dh_inv, wfct_inv.t(), fast)  # (M, C)
        dw_fc = (dh.t() @ x2).to(w_fc.dtype)
        dx = dx.view(*lead, C).to(ctx.x_dtype)
        return dx, dw_fc, db_fc.to(w_fc.dtype), dw_proj, db_proj, None


def width_problem(C: int) -> str | None:
    """Why the fp8 MLP cannot take a model of width C (n_embd), or None if it can: fp8 matmuls
    need C a multiple of 16, and the kernels hold a whole 4C-wide row in registers
    (:data:`ROW_BLOCK`)."""
    if C % 16:
        return f"n_embd={C} is not a multiple of 16 (fp8 matmuls need one)"
    if 4 * C > ROW_BLOCK:
        return f"4 * n_embd = {4 * C} > {ROW_BLOCK} (its kernels hold a 4C-wide row in registers)"
    return None


def mlp_fp8(
    x: torch.Tensor,
    w_fc: torch.Tensor,
    b_fc: torch.Tensor,
    w_proj: torch.Tensor,
    b_proj: torch.Tensor,
    grad_fast_accum: bool = False,
) -> torch.Tensor:
    """The MLP ``c_proj(GELU_tanh(c_fc(x)))`` with fp8 forward and input-gradient matmuls.

    Args:
        x: (..., C) fp32 or bf16, the LayerNorm's output; C a multiple of 16 and 4C <= 4096.
        w_fc: (4C, C) and b_fc: (4C,), ``c_fc``'s weight and bias (fp32 master weights);
        w_proj: (C, 4C) and b_proj: (C,), ``c_proj``'s. No dropout (the caller checks).
        grad_fast_accum: the two input-gradient matmuls with Hopper's fast fp8 accumulation
            (``torch._scaled_mm(use_fast_accum=True)``: partial sums are not promoted to fp32
            every few steps of K), as the forward's matmuls always run; False (the default, as
            torchao's recipe) promotes them (DeepSeek-V3 report, section 3.3.2). The model's
            ``fp8_fast_accum`` switch, rung "+ fp8 fast accum" (results/perf-log.md, 2026-12-07).

    Returns:
        (..., C) bf16, as autocast's ``c_proj`` gives. Its relative error against the bf16 MLP
        is e4m3's rounding, about 0.05 in the value and the gradients (tests/test_fp8_mlp.py).
        Gradients flow to x and all four parameters; the weights' in bf16 matmuls.

    Raises:
        ValueError: x not at least 2-D, not fp32 or bf16, C not a multiple of 16, 4C over 4096
            (the kernels hold a whole row in registers), or a weight or bias of another shape.
        RuntimeError: x on a device the Triton kernels cannot run on (a CPU without
            ``TRITON_INTERPRET=1`` set before import); check ``kernels.fp8_available`` first.
    """
    # shapes, dtypes, device.type and the import-time flag are constants to torch.compile
    if x.dim() < 2 or x.dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(
            "mlp_fp8 needs x of shape (..., C), at least 2-D, fp32 or bf16; got shape "
            f"{tuple(x.shape)}, {x.dtype}"
        )
    C = x.shape[-1]
    if (why := width_problem(C)) is not None:
        raise ValueError(f"mlp_fp8 cannot take x of shape {tuple(x.shape)}: {why}")
    expected = {"w_fc": (4 * C, C), "b_fc": (4 * C,), "w_proj": (C, 4 * C), "b_proj": (C,)}
    for name, t in zip(expected, (w_fc, b_fc, w_proj, b_proj)):
        if tuple(t.shape) != expected[name]:
            raise ValueError(
                f"mlp_fp8: {name} must have shape {expected[name]} for C={C}, got {tuple(t.shape)}"
            )
    if x.device.type != "cuda" and not (x.device.type == "cpu" and _INTERPRETED_AT_IMPORT):
        raise RuntimeError(
            f"mlp_fp8 runs its Triton kernels on a CUDA GPU (or a CPU in Triton's interpreter, "
            f"TRITON_INTERPRET=1 set before import); x is on {x.device}: build the model without "
            "mlp_fp8 here (train.unsupported_reason says why a run cannot use it)"
        )
    return _Fp8MLP.apply(x, w_fc, b_fc, w_proj, b_proj, bool(grad_fast_accum))
