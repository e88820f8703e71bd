"""An experiment, not yet measured: the fp8 LM head's cross-entropy kernel writing its e5m2
gradient in both layouts, so that no transpose of it is needed.

    python benchmarks/perf.py --batch-size 64 --variants final ce-transposed-grad --profile

In the fp8 LM head (``helpers.core.kernels.fused_ce``), per chunk of rows, the kernel writes
``G = (softmax - onehot) * 2**15`` as e5m2, (rows, V); ``dx = G @ W`` reads it as it is, but
``dW = G.T @ x`` sums over the rows, and Hopper's fp8 matmul wants the summed dimension contiguous
in both operands, so ``transpose_fp8`` copies G into (V, rows): a read and a write of 1.65 GB per
32768-row chunk, 2.2 ms per B=64 step with the small transposes (``results/perf-log.md``,
2026-12-04). Here one program takes :data:`ROWS` rows at a time (the online log-sum-exp over
column tiles, then the gradient), and stores each (ROWS, BLOCK) gradient tile twice: into G and,
transposed, into G.T, whose rows then get ROWS contiguous bytes per tile. Expected: the transpose's
read and write replaced by one more write, about -0.5 ms per chunk (-1 ms per B=64 step, -0.25 at
B=16), if the row-tile kernel keeps the row kernel's speed.
"""

from __future__ import annotations

import contextlib
from unittest import mock

import torch

from helpers.core.kernels import fused_ce
from helpers.core.kernels._triton import (
    _INTERPRETED_AT_IMPORT,
    TRITON_OP_MISSING,
    tl,
    triton,
)
from helpers.core.kernels.fp8 import FP8_GRAD_SCALE, to_fp8_e4m3, transpose_fp8
from helpers.core.kernels.triton_ce import IGNORE_INDEX

VARIANTS = ("ce-transposed-grad",)
ROWS = 32  # rows per program: 32 contiguous bytes per row of G.T per tile
BLOCK = 256  # columns per tile

if triton is not None and TRITON_OP_MISSING is None:
    from helpers.core.kernels.fused_ce import _e5m2_bits  # noqa: F401  (the kernel calls it)

    @triton.jit
    def _ce_rows_e5m2_both_kernel(
        logits_ptr, targets_ptr, loss_ptr, g_ptr, gt_ptr, n_rows, row_stride, ignore_index,
        n_cols: tl.constexpr, ROWS: tl.constexpr, BLOCK: tl.constexpr,
        GRAD_SCALE: tl.constexpr, HW_CAST: tl.constexpr,
    ):  # fmt: skip
        # ROWS rows per program: each row's loss (online log-sum-exp over column tiles, as
        # triton_ce._row_loss), then G = (softmax - onehot) * GRAD_SCALE in e5m2, stored into
        # g (n_rows, n_cols) and, transposed, into gt (n_cols, n_rows)
        rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
        row_ok = rows < n_rows
        cols = tl.arange(0, BLOCK)
        base = logits_ptr + rows[:, None] * row_stride
        m = tl.full([ROWS], -3.0e38, tl.float32)
        s = tl.zeros([ROWS], tl.float32)
        for start in range(0, n_cols, BLOCK):
            idx = start + cols
            mask = row_ok[:, None] & (idx[None, :] < n_cols)
            x = tl.load(base + idx[None, :], mask=mask, other=-3.0e38).to(tl.float32)
            m_new = tl.maximum(m, tl.max(x, axis=1))
            s = s * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new[:, None]), axis=1)
            m = m_new
        log_s = tl.log(s)
        target = tl.load(targets_ptr + rows, mask=row_ok, other=ignore_index)
        in_range = (target >= 0) & (target < n_cols)
        x_t = tl.load(
            logits_ptr + rows * row_stride + tl.where(in_range, target, 0), mask=row_ok, other=0.0
        ).to(tl.float32)
        loss = (m - x_t) + log_s
        loss = tl.where(target == ignore_index, 0.0, tl.where(in_range, loss, float("nan")))
        tl.store(loss_ptr + rows, loss, mask=row_ok)
        lse = m + log_s
        keep = tl.where(target != ignore_index, GRAD_SCALE, 0.0)
        keep = tl.where(in_range | (target == ignore_index), keep, float("nan"))
        for start in range(0, n_cols, BLOCK):
            idx = start + cols
            mask = row_ok[:, None] & (idx[None, :] < n_cols)
            x = tl.load(base + idx[None, :], mask=mask, other=0.0).to(tl.float32)
            onehot = tl.where(idx[None, :] == target[:, None], 1.0, 0.0)
            g = (tl.exp(x - lse[:, None]) - onehot) * keep[:, None]
            if HW_CAST:
                g8 = g.to(tl.float8e5)
            else:
                g8 = _e5m2_bits(g)
            tl.store(g_ptr + rows[:, None] * n_cols + idx[None, :], g8, mask=mask)
            tl.store(gt_ptr + idx[None, :] * n_rows + rows[:, None], g8, mask=mask)

    # opaque to torch.compile, as fused_ce's own e5m2 op: called as it is from compiled code
    @torch.library.custom_op("fastgpt2_experiment::ce_rows_e5m2_both", mutates_args=())
    def _both_op(
        logits: torch.Tensor, targets: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        N, V = logits.shape
        on_gpu = not _INTERPRETED_AT_IMPORT
        hw = on_gpu and torch.cuda.get_device_capability(logits.device) >= (9, 0)
        loss = torch.empty(N, dtype=torch.float32, device=logits.device)
        g = torch.empty((N, V), dtype=torch.float8_e5m2, device=logits.device)
        gt = torch.empty((V, N), dtype=torch.float8_e5m2, device=logits.device)
        out = (g, gt) if hw else (g.view(torch.uint8), gt.view(torch.uint8))
        _ce_rows_e5m2_both_kernel[(triton.cdiv(N, ROWS),)](
            logits, targets, loss, *out, N, logits.stride(0), IGNORE_INDEX,
            n_cols=V, ROWS=ROWS, BLOCK=BLOCK, GRAD_SCALE=FP8_GRAD_SCALE, HW_CAST=hw, num_warps=4,
        )  # fmt: skip
        return loss, g, gt

    @_both_op.register_fake
    def _(logits, targets):
        N, V = logits.shape
        return (
            logits.new_empty(N, dtype=torch.float32),
            logits.new_empty((N, V), dtype=torch.float8_e5m2),
            logits.new_empty((V, N), dtype=torch.float8_e5m2),
        )


def rows_with_e5m2_grad_both(
    logits: torch.Tensor, targets: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(loss (N,) fp32, G (N, V) e5m2, G.T (V, N) e5m2, contiguous): ``fused_ce``'s
    ``_cross_entropy_rows_with_e5m2_grad`` plus the transposed copy, from one kernel.

    Args:
        logits: (N, V) bf16 or fp32, rows contiguous; targets: (N,) int64 (``IGNORE_INDEX``
            rows get loss 0 and a zero gradient).
    """
    return _both_op(logits, targets)


def _forward_fp8_both(ctx, x, weight, targets):
    # fused_ce._LinearCrossEntropy._forward_fp8 with G.T from the kernel instead of transpose_fp8
    x8, x_inv = to_fp8_e4m3(x)
    w8, w_inv = to_fp8_e4m3(weight)
    w8_t = transpose_fp8(w8)
    g_inv = torch.full((), 1.0 / FP8_GRAD_SCALE, dtype=torch.float32, device=x.device)
    losses, dxs, dweight = [], [], None
    for s, e in fused_ce._row_chunks(x.shape[0]):
        logits = torch._scaled_mm(
            x8[s:e], w8.t(), scale_a=x_inv, scale_b=w_inv, out_dtype=x.dtype, use_fast_accum=True
        )
        loss_rows, g8, g8_t = rows_with_e5m2_grad_both(logits, targets[s:e])
        losses.append(loss_rows)
        dxs.append(torch._scaled_mm(g8, w8_t.t(), scale_a=g_inv, scale_b=w_inv, out_dtype=x.dtype))
        dw = torch._scaled_mm(
            g8_t, transpose_fp8(x8[s:e]).t(), scale_a=g_inv, scale_b=x_inv, out_dtype=torch.float32
        )
        dweight = dw if dweight is None else dweight + dw
    return fused_ce._LinearCrossEntropy._finish(ctx, losses, dxs, dweight, weight.dtype, targets)


def experiment(name: str) -> contextlib.AbstractContextManager:
    """The context of ``benchmarks/perf.py``'s variant ``name``: the fp8 LM head's forward with
    the gradient written in both layouts (its kernel is an opaque custom op, as fused_ce's: a
    compiled step calls it as it is).

    Raises:
        ValueError: an unknown variant name.
    """
    if name not in VARIANTS:
        raise ValueError(f"unknown ce-transposed-grad variant {name!r}; known: {VARIANTS}")
    return mock.patch.object(
        fused_ce._LinearCrossEntropy, "_forward_fp8", staticmethod(_forward_fp8_both)
    )
