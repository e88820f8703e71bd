"""Rung "+ Triton CE": the LM head's cross-entropy in two hand-written Triton kernels.

Why (measured, ``results/perf-log.md``): at B=64 the LM head's logits are 64·1024 × 50304 bf16
values, 6.6 GB. ``torch.compile`` turns ``F.cross_entropy(logits.float(), targets)`` into two
reduction kernels that took 4.8 + 5.1 ms per step on the H200: the forward read the logits at
~1.3 TB/s, a third of the copy bandwidth chapter 02 measures.

:func:`cross_entropy` moves the minimum traffic of a separate loss. One read of the logits forward
(a running max and sum of exponentials, the "online softmax" of Milakov & Gimelshein 2018,
https://arxiv.org/abs/1805.02867), one read plus one write backward (grad = softmax(x) -
onehot(target), times the upstream gradient): 3 × 6.6 GB.

The kernels are registered with ``torch.library.triton_op`` so ``torch.compile`` traces them into
its graph (no graph break), and the backward is registered with autograd
(https://docs.pytorch.org/tutorials/recipes/torch_compile_user_defined_triton_kernel_tutorial.html).
Their row passes, the Triton functions ``_row_loss`` (one read: loss and log-sum-exp) and
``_store_row_grad`` (one read and one write: the gradient), are shared with the fused LM-head CE
(:mod:`helpers.core.kernels.fused_ce`), which also takes this module's forward op for a loss
without gradients.
"""

from __future__ import annotations

import torch

from helpers.core.kernels._triton import TRITON_OP_MISSING, available, launch, tl, triton

IGNORE_INDEX = -100  # the target id F.cross_entropy skips by default; the kernel skips it too
BLOCK = 4096  # columns per loop iteration of one row (50304 columns -> 13 iterations)
# Warps per row program. On the H200 (results/h200-lm-head-ce-2026-11-30.json), LM head + CE
# forward+backward at N=65536 rows with this two-kernel CE: 28.3 ms with 4 warps, 29.7 ms with 16.
NUM_WARPS = 4


if triton is not None and TRITON_OP_MISSING is None:

    @triton.jit
    def _row_loss(
        row_ptr, targets_ptr, row, ignore_index, n_cols: tl.constexpr, BLOCK: tl.constexpr
    ):
        # One row's loss in one read: a running max m and sum s of exp(x - m) over the row (online
        # softmax). n_cols is a compile-time constant (one build per vocabulary size): a loop bound
        # Triton's CPU interpreter also accepts (its runtime integers cannot bound a range with
        # numpy 2). Returns (loss, lse, target, in_range); ignored rows' loss is 0, a target outside
        # [0, n_cols) gives nan (F.cross_entropy raises; a check here would sync).
        cols = tl.arange(0, BLOCK)
        m = tl.full([], -3.0e38, tl.float32)  # finite: exp(m_old - m_new) is never exp(nan)
        s = tl.zeros([], tl.float32)
        for start in range(0, n_cols, BLOCK):
            idx = start + cols
            x = tl.load(row_ptr + idx, mask=idx < n_cols, other=-3.0e38).to(tl.float32)
            m_new = tl.maximum(m, tl.max(x, axis=0))
            s = s * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new), axis=0)
            m = m_new
        log_s = tl.log(s)
        target = tl.load(targets_ptr + row)
        in_range = (target >= 0) & (target < n_cols)
        x_target = tl.load(row_ptr + tl.where(in_range, target, 0)).to(
            tl.float32
        )  # never reads outside the row
        loss = (
            m - x_target
        ) + log_s  # = lse - x_target, without rounding lse at the size of m first
        loss = tl.where(target == ignore_index, 0.0, tl.where(in_range, loss, float("nan")))
        return loss, m + log_s, target, in_range

    @triton.jit
    def _store_row_grad(
        row_ptr, out_ptr, lse, target, scale, n_cols: tl.constexpr, BLOCK: tl.constexpr
    ):
        # d loss_row / d x_j = softmax(x)_j - [j == target], times scale; one read and one write of
        # the row.
        cols = tl.arange(0, BLOCK)
        for start in range(0, n_cols, BLOCK):
            idx = start + cols
            mask = idx < n_cols
            x = tl.load(row_ptr + idx, mask=mask, other=0.0).to(tl.float32)
            g = (tl.exp(x - lse) - tl.where(idx == target, 1.0, 0.0)) * scale
            tl.store(out_ptr + idx, g.to(out_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def _ce_forward_kernel(
        logits_ptr,
        targets_ptr,
        loss_ptr,
        lse_ptr,
        row_stride,
        ignore_index,
        n_cols: tl.constexpr,
        BLOCK: tl.constexpr,
    ):
        # One program per row: its loss, and its log-sum-exp for backward.
        row = tl.program_id(0).to(tl.int64)
        loss, lse, target, in_range = _row_loss(
            logits_ptr + row * row_stride, targets_ptr, row, ignore_index, n_cols, BLOCK
        )
        tl.store(loss_ptr + row, loss)
        tl.store(lse_ptr + row, lse)

    @triton.jit
    def _ce_backward_kernel(
        logits_ptr,
        targets_ptr,
        lse_ptr,
        grad_loss_ptr,
        grad_logits_ptr,
        row_stride,
        ignore_index,
        n_cols: tl.constexpr,
        BLOCK: tl.constexpr,
    ):
        # One program per row: softmax(x) - onehot(target), scaled by the row's upstream gradient.
        row = tl.program_id(0).to(tl.int64)
        lse = tl.load(lse_ptr + row)
        target = tl.load(targets_ptr + row)
        in_range = (target >= 0) & (target < n_cols)
        scale = tl.where(target != ignore_index, tl.load(grad_loss_ptr + row).to(tl.float32), 0.0)
        scale = tl.where(
            in_range | (target == ignore_index), scale, float("nan")
        )  # as the forward's nan loss
        _store_row_grad(
            logits_ptr + row * row_stride,
            grad_logits_ptr + row * n_cols,
            lse,
            target,
            scale,
            n_cols,
            BLOCK,
        )

    @torch.library.triton_op("fastgpt2::cross_entropy_rows", mutates_args={})
    def _cross_entropy_rows(
        logits: torch.Tensor, targets: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        N, V = logits.shape
        loss = torch.empty(N, dtype=torch.float32, device=logits.device)
        lse = torch.empty(N, dtype=torch.float32, device=logits.device)
        launch(_ce_forward_kernel)[(N,)](
            logits,
            targets,
            loss,
            lse,
            logits.stride(0),
            IGNORE_INDEX,
            n_cols=V,
            BLOCK=BLOCK,
            num_warps=NUM_WARPS,
        )
        return loss, lse

    @torch.library.triton_op("fastgpt2::cross_entropy_rows_backward", mutates_args={})
    def _cross_entropy_rows_backward(
        logits: torch.Tensor, targets: torch.Tensor, lse: torch.Tensor, grad_loss: torch.Tensor
    ) -> torch.Tensor:
        N, V = logits.shape
        grad = torch.empty((N, V), dtype=logits.dtype, device=logits.device)
        launch(_ce_backward_kernel)[(N,)](
            logits,
            targets,
            lse,
            grad_loss,
            grad,
            logits.stride(0),
            IGNORE_INDEX,
            n_cols=V,
            BLOCK=BLOCK,
            num_warps=NUM_WARPS,
        )
        return grad

    def _setup_context(ctx, inputs, output):
        logits, targets = inputs
        _, lse = output
        ctx.save_for_backward(logits, targets, lse)

    def _backward(ctx, grad_loss, grad_lse):
        logits, targets, lse = ctx.saved_tensors
        return _cross_entropy_rows_backward(logits, targets, lse, grad_loss.contiguous()), None

    _cross_entropy_rows.register_autograd(_backward, setup_context=_setup_context)


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy in nats, like ``F.cross_entropy(logits.float(), targets)``, in two Triton
    kernels.

    Args:
        logits: (N, V) floating tensor (bf16, fp16, fp32; fp64 is computed in fp32); the math runs
            in fp32 inside the kernel and the gradient comes back in ``logits.dtype``. Rows whose
            columns are not contiguous are copied first.
        targets: (N,) int64 class ids in [0, V), or -100 (:data:`IGNORE_INDEX`) to skip a row.
            Unlike ``F.cross_entropy``, an id outside [0, V) is not checked on the host (that would
            sync): it makes the loss nan, and the kernel never reads outside the row.

    Returns:
        0-d fp32 tensor: the mean over the rows whose target is not -100 (nan if every row is
        skipped, as ``F.cross_entropy``). The gradient uses the stored log-sum-exp: with logits near
        1e4 its rounding shows (~1e-4 relative); at a language model's logit sizes it is ~1e-6.

    Raises:
        RuntimeError: if Triton cannot run on ``logits.device`` (see
            :func:`~helpers.core.kernels.available`).
        ValueError: on wrong shapes or dtypes.
    """
    if logits.dim() != 2 or targets.dim() != 1 or targets.shape[0] != logits.shape[0]:
        raise ValueError(
            f"expected logits (N, V) and targets (N,), got {tuple(logits.shape)} and "
            f"{tuple(targets.shape)}"
        )
    if not logits.is_floating_point() or targets.dtype != torch.int64:
        raise ValueError(
            f"expected floating logits and int64 targets, got {logits.dtype} and {targets.dtype}"
        )
    ok, reason = available(logits.device)
    if not ok:
        raise RuntimeError(
            f"helpers.core.kernels.cross_entropy cannot run: {reason}. Use F.cross_entropy instead "
            "(or, for tests on a CPU, set TRITON_INTERPRET=1 before helpers.core.kernels is "
            "imported)."
        )
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    loss_rows, _ = _cross_entropy_rows(logits, targets.contiguous())
    return loss_rows.sum() / (targets != IGNORE_INDEX).sum()
