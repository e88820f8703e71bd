"""Rung "+ one-pass QKV grad": ``c_attn``'s backward with the concatenation of dq, dk, dv and its
bias gradient in one pass (``qkv_grad=True``, a ``GPT`` keyword).

In the step's backward, SDPA (cuDNN) returns dq, dk and dv as three tensors; ``c_attn``'s backward
needs them side by side as one (B*T, 3C) gradient for its input- and weight-gradient matmuls, and
summed over the rows for its bias gradient. Inductor makes the concatenation in one kernel (1.66 ms
per B=64 step on the H200, results/perf-log.md, 2026-12-05) and the bias gradient in another that
reads dq, dk, dv again (0.87 ms). :func:`qkv_grad_cat` does both in one read: each program copies a
tile of rows into its place in the (B*T, 3C) gradient and writes the tile's column sums.

The kernel is launched from an opaque custom op, which torch.compile calls without tracing the
launch, so it reads dq, dk, dv through the strides they arrive with (cuDNN returns them in
(B, T, nh, hs) memory order), and :class:`_QKVHeads`' backward reads no stride while it is traced:
torch.compile traces an autograd Function's backward with guessed, contiguous gradients, and a
backward that reads their strides makes inductor copy the real gradients into contiguous order
before the op (found on a CPU, ``tests/test_qkv_grad.py``). The same kernel from a traced
``triton_op`` (``opaque=False``, ``benchmarks/perf.py``'s variant ``qkv-grad``) gets such a copy
in front of it, which cost more than it saved (2.4 ms against 0.92; an H100, 2026-12-06).

Measured on an H100 at B=64 (results/h100-perf-qkv-adamw-b64-2026-12-07.json): the kernel (2.66 ms
per step) and its partial sums' reduction (+0.16) replace inductor's two kernels (3.60 ms), -0.78
ms in the kernels it replaces, no copy added.

:func:`qkv_heads` is ``c_attn`` plus the split into heads, as an autograd Function whose backward
calls the kernel; ``CausalSelfAttention`` calls it in place of ``c_attn`` when the rung is on.
"""

from __future__ import annotations

import contextlib
from unittest import mock

import torch

from helpers.core.kernels._triton import TRITON_OP_MISSING, launch, tl, triton

# The rung launches the kernel from the opaque custom op; False: from the traced triton_op
# (benchmarks/perf.py's variant qkv-grad, the record of why the op must be opaque)
OPAQUE = True
ROWS = 64  # rows per program: its column sums are one partial-sum row
COLS = 256  # columns per inner step (768 = 3 x 256 for GPT-2 124M)

if triton is not None and TRITON_OP_MISSING is None:

    @triton.jit
    def _copy_colsum(src_ptr, out_ptr, part_ptr, pid, j, M, T, sB, sH, sT, sD, C: tl.constexpr,
                     HS: tl.constexpr, ROWS: tl.constexpr, COLS: tl.constexpr):  # fmt: skip
        # rows [pid * ROWS, +ROWS) of src, a (B, nh, T, hs) tensor read as (M = B*T, C = nh*hs)
        # through its strides, into columns [j * C, +C) of out (M, 3C), and their column sums
        # (fp32) into part[pid, j * C : (j + 1) * C]
        rows = pid * ROWS + tl.arange(0, ROWS)
        row_off = (rows // T) * sB + (rows % T) * sT
        for c0 in range(0, C, COLS):
            cols = c0 + tl.arange(0, COLS)
            col_off = (cols // HS) * sH + (cols % HS) * sD
            mask = (rows < M)[:, None] & (cols < C)[None, :]
            x = tl.load(src_ptr + row_off[:, None] + col_off[None, :], mask=mask, other=0.0)
            tl.store(out_ptr + rows[:, None] * (3 * C) + j * C + cols[None, :], x, mask=mask)
            s = tl.sum(x.to(tl.float32), axis=0)
            tl.store(part_ptr + pid * (3 * C) + j * C + cols, s, mask=cols < C)

    @triton.jit
    def _qkv_grad_kernel(dq_ptr, dk_ptr, dv_ptr, out_ptr, part_ptr, M, T, sB, sH, sT, sD,
                         C: tl.constexpr, HS: tl.constexpr, ROWS: tl.constexpr,
                         COLS: tl.constexpr):  # fmt: skip
        # grid (row tiles, 3): program (i, j) copies row tile i of dq / dk / dv (j = 0 / 1 / 2)
        pid = tl.program_id(0).to(tl.int64)
        j = tl.program_id(1)
        if j == 0:
            _copy_colsum(dq_ptr, out_ptr, part_ptr, pid, 0, M, T, sB, sH, sT, sD, C, HS, ROWS, COLS)
        elif j == 1:
            _copy_colsum(dk_ptr, out_ptr, part_ptr, pid, 1, M, T, sB, sH, sT, sD, C, HS, ROWS, COLS)
        else:
            _copy_colsum(dv_ptr, out_ptr, part_ptr, pid, 2, M, T, sB, sH, sT, sD, C, HS, ROWS, COLS)

    def _qkv_grad_run(dq, dk, dv, launcher):
        B, nh, T, hs = dq.shape
        M, C = B * T, nh * hs
        out = torch.empty((M, 3 * C), dtype=dq.dtype, device=dq.device)
        programs = triton.cdiv(M, ROWS)
        part = torch.empty((programs, 3 * C), dtype=torch.float32, device=dq.device)
        launcher(_qkv_grad_kernel)[(programs, 3)](
            dq, dk, dv, out, part, M, T, *dq.stride(), C=C, HS=hs, ROWS=ROWS, COLS=COLS,
            num_warps=4,
        )  # fmt: skip
        return out, part.sum(0)

    # Traced: torch.compile sees the launch, with the strides it traced as constants, and copies
    # inputs that arrive in another memory order into that order first.
    @torch.library.triton_op("fastgpt2::qkv_grad_cat", mutates_args={})
    def _qkv_grad_traced(
        dq: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return _qkv_grad_run(dq, dk, dv, launch)

    # Opaque: torch.compile calls it as it is, and the kernel reads the strides it is given at run
    # time, so no copy is needed whatever order SDPA's backward returns.
    @torch.library.custom_op("fastgpt2::qkv_grad_cat_opaque", mutates_args=())
    def _qkv_grad_opaque(
        dq: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not (dk.stride() == dv.stride() == dq.stride()):
            dq, dk, dv = (t.contiguous() for t in (dq, dk, dv))
        return _qkv_grad_run(dq, dk, dv, lambda kernel: kernel)

    @_qkv_grad_opaque.register_fake
    def _(dq, dk, dv):
        B, nh, T, hs = dq.shape
        C = nh * hs
        return dq.new_empty((B * T, 3 * C)), dq.new_empty((3 * C,), dtype=torch.float32)


def qkv_grad_cat(
    dq: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor, opaque: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """The gradients of q, k, v side by side as c_attn's (B*T, 3C) output gradient, and its
    column sums (c_attn's bias gradient), in one pass over the three.

    Args:
        dq, dk, dv: (B, nh, T, hs), one dtype (bf16 in the step) and one set of strides (any
            memory order: SDPA's backends return (B, nh, T, hs) or (B, T, nh, hs) order; the
            opaque op also takes three different ones), with C = nh * hs a multiple of 256.
        opaque: launch the kernel from an opaque custom op (torch.compile does not trace it and
            the kernel takes the strides it is given) instead of a traced ``triton_op``.

    Returns:
        (dqkv (B*T, 3C) of their dtype, row-major; colsum (3C,) fp32).

    Raises:
        TypeError: an argument that is not a tensor.
        ValueError: shapes, dtypes, devices or (traced op) strides that differ between the three,
            a dtype other than bf16, fp16 or fp32, or C not a positive multiple of 256.
    """
    if not all(isinstance(t, torch.Tensor) for t in (dq, dk, dv)):
        raise TypeError(f"qkv_grad_cat takes three tensors, got {[type(t) for t in (dq, dk, dv)]}")
    if (
        dq.dim() != 4
        or dq.dtype not in (torch.bfloat16, torch.float16, torch.float32)
        or any(
            t.shape != dq.shape
            or t.dtype != dq.dtype
            or t.device != dq.device
            or (not opaque and t.stride() != dq.stride())  # the opaque op checks when it runs
            for t in (dk, dv)
        )
    ):
        raise ValueError(
            "qkv_grad_cat needs three (B, nh, T, hs) bf16, fp16 or fp32 tensors of one dtype, "
            "device and (unless opaque) memory layout, got "
            f"{[(tuple(t.shape), t.dtype, str(t.device), t.stride()) for t in (dq, dk, dv)]}"
        )
    C = dq.shape[1] * dq.shape[3]
    if C == 0 or C % COLS:
        raise ValueError(f"qkv_grad_cat needs C = nh * hs a positive multiple of {COLS}, got {C}")
    return (_qkv_grad_opaque if opaque else _qkv_grad_traced)(dq, dk, dv)


class _QKVHeads(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, b, n_head, opaque):
        B, T, C = x.shape
        hs = C // n_head
        x2 = x.reshape(B * T, C).to(torch.bfloat16)  # as autocast casts c_attn's input
        qkv = torch.addmm(b.to(torch.bfloat16), x2, w.to(torch.bfloat16).t())  # (B*T, 3C)
        ctx.save_for_backward(x2, w)
        ctx.meta = (B, T, C, x.dtype, b.dtype, opaque)
        q, k, v = qkv.view(B, T, 3 * C).split(C, dim=2)
        return tuple(t.view(B, T, n_head, hs).transpose(1, 2) for t in (q, k, v))

    @staticmethod
    def backward(ctx, dq, dk, dv):
        x2, w = ctx.saved_tensors
        B, T, C, x_dtype, b_dtype, opaque = ctx.meta
        g = [t.to(torch.bfloat16) for t in (dq, dk, dv)]
        if opaque:
            # no stride may be read here: torch.compile traces this backward with guessed
            # (contiguous) gradients, and code that reads their strides makes it copy the real
            # ones into that order; the op reads them when it runs
            dqkv, db = qkv_grad_cat(*g, opaque=True)
        else:
            if not (g[1].stride() == g[2].stride() == g[0].stride()):
                g = [t.contiguous() for t in g]
            dqkv, db = qkv_grad_cat(*g)  # read in whatever memory order SDPA returned
        dx = (dqkv @ w.to(torch.bfloat16)).view(B, T, C).to(x_dtype)
        dw = (dqkv.t() @ x2).to(w.dtype)
        return dx, dw, db.to(b_dtype), None, None


def qkv_heads(
    x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, n_head: int, opaque: bool | None = None
):
    """``c_attn`` (bf16 matmul, as under autocast) and the split into heads: q, k, v, each
    (B, n_head, T, C / n_head) bf16, from x (B, T, C), w (3C, C), b (3C,); the backward runs
    :func:`qkv_grad_cat` (``opaque`` as there; None: :data:`OPAQUE`)."""
    return _QKVHeads.apply(x, w, b, n_head, OPAQUE if opaque is None else opaque)


def experiment() -> contextlib.AbstractContextManager:
    """``benchmarks/perf.py``'s variant ``qkv-grad``: the rung's kernel launched from the traced
    ``triton_op`` instead of the opaque op while the context is open."""
    return mock.patch(f"{__name__}.OPAQUE", False)
