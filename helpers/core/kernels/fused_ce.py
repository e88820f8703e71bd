"""Rung "+ fused LM-head CE": the LM head and its cross-entropy together, in chunks of rows.

:func:`linear_cross_entropy`: one kernel writes each row's loss and its gradient in the forward
pass, and the LM head's backward matmuls run there too, so the logits (6.6 GB at B=64, see
:mod:`helpers.core.kernels.triton_ce`) never exist whole and nothing logits-sized waits for
backward (Liger Kernel's fused linear cross-entropy, https://arxiv.org/abs/2410.10989).

The kernel is registered with ``torch.library.triton_op`` so ``torch.compile`` traces it into its
graph (no graph break), and it is called inside a ``torch.autograd.Function``
(:class:`_LinearCrossEntropy`). It reads each row with the two-kernel CE's row passes
(``_row_loss``, ``_store_row_grad`` of ``triton_ce``); without gradients the loss comes from that
CE's forward kernel alone.

With ``fp8=True`` (rung "+ fp8 LM head") the three matmuls run on fp8 tensor cores and a variant of
the kernel writes the gradient as float8_e5m2 (``_ce_fused_e5m2_kernel``); the formats, their
scales and the transposes the matmuls need are in :mod:`helpers.core.kernels.fp8`.
"""

from __future__ import annotations

import torch

from helpers.core.kernels._triton import (
    _INTERPRETED_AT_IMPORT,
    TRITON_OP_MISSING,
    available,
    launch,
    tl,
    triton,
)
from helpers.core.kernels.fp8 import FP8_GRAD_SCALE, fp8_available, to_fp8_e4m3, transpose_fp8
from helpers.core.kernels.triton_ce import IGNORE_INDEX

# Warps per row program of the fused kernel. On the H200 (results/h200-lm-head-ce-2026-11-30.json)
# the fused kernel alone moved the logits at 2.8 TB/s (counting one read and one write) with 4
# warps, 2.3 TB/s with 16.
FUSED_NUM_WARPS = 4
FUSED_BLOCK = 4096  # columns per iteration of the fused kernel (8192 was slower at 4 warps)
# Rows of the LM head per chunk in linear_cross_entropy (None: all rows at once). The same file:
# forward+backward at N=65536 took 28.5 ms unchunked, 28.7 ms in chunks of 32768, 29.5 in chunks of
# 16384. A B=64 training step (results/h200-perf-fused-ce-chunks-2026-11-30.json) peaked at
# 32.2 GiB unchunked, 26.2 GiB with 32768 rows and 23.3 GiB with 16384 (two-kernel CE: 32.7 GiB).
FUSED_CHUNK_ROWS: int | None = 32768
# On a Hopper GPU (compute capability 9.0 or more) the fp8 LM head's kernel converts its gradient to
# e5m2 with the hardware's instruction: for finite values the same bytes as the written-out
# rounding _e5m2_bits, which the CPU interpreter and older GPUs run (Triton's conversion below 9.0
# may round twice). On the H200 (results/h200-ce-rows-in-flight-2026-12-04.json) a 32768-row chunk
# took 2.07 ms with it and 2.85 ms with _e5m2_bits; False runs _e5m2_bits everywhere
# (benchmarks/perf.py's variant software-e5m2).
E5M2_HARDWARE_CAST = True


if triton is not None and TRITON_OP_MISSING is None:
    # Triton resolves the jit functions a kernel calls from the kernel's module globals
    from helpers.core.kernels.triton_ce import (
        _cross_entropy_rows,
        _row_loss,
        _store_row_grad,
    )

    @triton.jit
    def _ce_fused_kernel(
        logits_ptr,
        targets_ptr,
        loss_ptr,
        grad_ptr,
        row_stride,
        ignore_index,
        n_cols: tl.constexpr,
        BLOCK: tl.constexpr,
    ):
        # Forward and backward of one row in one program: the forward kernel's pass (_row_loss),
        # then a second read of the row (from L2 when it is still there) that writes
        # softmax(x) - onehot(target), *not* scaled by 1/n or the upstream gradient: that scale is
        # applied later to the two small matmul outputs (see _LinearCrossEntropy), so no
        # logits-sized pass waits for backward.
        row = tl.program_id(0).to(tl.int64)
        row_ptr = logits_ptr + row * row_stride
        loss, lse, target, in_range = _row_loss(
            row_ptr, targets_ptr, row, ignore_index, n_cols, BLOCK
        )
        tl.store(loss_ptr + row, loss)
        keep = tl.where(target != ignore_index, 1.0, 0.0)  # an ignored row's gradient is 0
        keep = tl.where(in_range | (target == ignore_index), keep, float("nan"))
        _store_row_grad(row_ptr, grad_ptr + row * n_cols, lse, target, keep, n_cols, BLOCK)

    @torch.library.triton_op("fastgpt2::cross_entropy_rows_with_grad", mutates_args={})
    def _cross_entropy_rows_with_grad(
        logits: torch.Tensor, targets: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        N, V = logits.shape
        loss = torch.empty(N, dtype=torch.float32, device=logits.device)
        grad = torch.empty((N, V), dtype=logits.dtype, device=logits.device)
        launch(_ce_fused_kernel)[(N,)](
            logits,
            targets,
            loss,
            grad,
            logits.stride(0),
            IGNORE_INDEX,
            n_cols=V,
            BLOCK=FUSED_BLOCK,
            num_warps=FUSED_NUM_WARPS,
        )
        return loss, grad

    @triton.jit
    def _e5m2_bits(g):
        # fp32 -> float8_e5m2 bits (uint8), rounded to nearest, ties to even, as torch's
        # .to(torch.float8_e5m2) for finite |g| < 57344 (here |g| <= 2**15), for Triton's CPU
        # interpreter, which casts to fp8 wrongly; a GPU converts in hardware (see
        # E5M2_HARDWARE_CAST). A NaN g does not stay NaN here (the fp16 NaN rounds to -0 or inf);
        # it only arises from a target outside [0, V) or non-finite logits, and the row's loss is
        # nan then. e5m2 is fp16 without its 8 lowest mantissa bits (same sign, exponent and bias):
        # truncate to fp16, set the lowest bit if that lost anything ("round to odd", so the second
        # rounding cannot meet a false tie), then round the 16 bits to their top 8.
        h = g.to(tl.float16, fp_downcast_rounding="rtz")
        bits = (h.to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF) | (h.to(tl.float32) != g).to(
            tl.int32
        )
        return (((bits + 0x7F + ((bits >> 8) & 1)) >> 8) & 0xFF).to(tl.uint8)

    @triton.jit
    def _ce_fused_e5m2_kernel(
        logits_ptr,
        targets_ptr,
        loss_ptr,
        grad_ptr,
        row_stride,
        ignore_index,
        n_cols: tl.constexpr,
        BLOCK: tl.constexpr,
        GRAD_SCALE: tl.constexpr,
        HW_CAST: tl.constexpr,
    ):
        # _ce_fused_kernel for the fp8 LM head: the gradient times GRAD_SCALE, written as
        # float8_e5m2 (HW_CAST: by the GPU's conversion; else as bits by _e5m2_bits, grad_ptr the
        # uint8 view of the float8_e5m2 tensor). Its loop repeats
        # _store_row_grad's on purpose: a version that shared it (a constexpr switch and a runtime
        # scale in _store_row_grad) made the bf16 fused kernel fail Triton 3.6's LLVM lowering when
        # torch.compile built it on the H200 (results/perf-log.md).
        row = tl.program_id(0).to(tl.int64)
        row_ptr = logits_ptr + row * row_stride
        loss, lse, target, in_range = _row_loss(
            row_ptr, targets_ptr, row, ignore_index, n_cols, BLOCK
        )
        tl.store(loss_ptr + row, loss)
        keep = tl.where(target != ignore_index, GRAD_SCALE, 0.0)
        keep = tl.where(in_range | (target == ignore_index), keep, float("nan"))
        cols = tl.arange(0, BLOCK)
        for start in range(0, n_cols, BLOCK):
            idx = start + cols
            mask = idx < n_cols
            x = tl.load(row_ptr + idx, mask=mask, other=0.0).to(tl.float32)
            g = (tl.exp(x - lse) - tl.where(idx == target, 1.0, 0.0)) * keep
            if HW_CAST:
                tl.store(grad_ptr + row * n_cols + idx, g.to(tl.float8e5), mask=mask)
            else:
                tl.store(grad_ptr + row * n_cols + idx, _e5m2_bits(g), mask=mask)

    # The fp8 ops are opaque custom ops: torch.compile calls them as they are and does not
    # re-compile their kernels (launched here by Triton's own JIT), so the compiled step runs the
    # same kernels as eager code.
    @torch.library.custom_op("fastgpt2::cross_entropy_rows_with_e5m2_grad", mutates_args=())
    def _cross_entropy_rows_with_e5m2_grad(
        logits: torch.Tensor, targets: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # As _cross_entropy_rows_with_grad, but the gradient times FP8_GRAD_SCALE, stored as
        # float8_e5m2.
        N, V = logits.shape
        loss = torch.empty(N, dtype=torch.float32, device=logits.device)
        grad = torch.empty((N, V), dtype=torch.float8_e5m2, device=logits.device)
        hw_cast = _hardware_e5m2(logits.device)
        _ce_fused_e5m2_kernel[(N,)](
            logits,
            targets,
            loss,
            grad if hw_cast else grad.view(torch.uint8),
            logits.stride(0),
            IGNORE_INDEX,
            n_cols=V,
            BLOCK=FUSED_BLOCK,
            GRAD_SCALE=FP8_GRAD_SCALE,
            HW_CAST=hw_cast,
            num_warps=FUSED_NUM_WARPS,
        )
        return loss, grad

    @_cross_entropy_rows_with_e5m2_grad.register_fake
    def _(logits, targets):
        N, V = logits.shape
        return logits.new_empty(N, dtype=torch.float32), logits.new_empty(
            (N, V), dtype=torch.float8_e5m2
        )

    def _hardware_e5m2(device: torch.device) -> bool:
        """Whether the e5m2 kernels convert with the GPU's instruction (E5M2_HARDWARE_CAST)."""
        return (
            E5M2_HARDWARE_CAST
            and not _INTERPRETED_AT_IMPORT
            and torch.cuda.get_device_capability(device) >= (9, 0)
        )


def _row_chunks(n: int) -> list[tuple[int, int]]:
    """[(start, end), ...] covering rows 0..n-1 in chunks of FUSED_CHUNK_ROWS (None: one chunk)."""
    if FUSED_CHUNK_ROWS is not None and (
        not isinstance(FUSED_CHUNK_ROWS, int) or FUSED_CHUNK_ROWS < 1
    ):
        raise ValueError(
            "helpers.core.kernels.fused_ce.FUSED_CHUNK_ROWS must be None or an int >= 1, got "
            f"{FUSED_CHUNK_ROWS!r}"
        )
    step = FUSED_CHUNK_ROWS or max(n, 1)
    return [(s, min(s + step, n)) for s in range(0, n, step)]


class _LinearCrossEntropy(torch.autograd.Function):
    """LM head + cross-entropy whose gradients are computed in the forward pass, in chunks of rows.

    forward, per chunk of rows: logits = x @ weight.T; one Triton kernel gives each row's loss and
    G = softmax(logits) - onehot(targets); then dx = G @ weight and dweight += G.T @ x (fp32 sum
    over chunks). Only dx (N, C) and dweight (V, C) are kept for backward, which scales them by
    grad_loss / n.
    """

    @staticmethod
    def forward(ctx, x, weight, targets, fp8=False):
        if fp8:
            return _LinearCrossEntropy._forward_fp8(ctx, x, weight, targets)
        losses, dxs, dweight = [], [], None
        for s, e in _row_chunks(x.shape[0]):
            logits = x[s:e] @ weight.t()  # (rows, V), x's dtype; freed after this chunk
            loss_rows, grad = _cross_entropy_rows_with_grad(logits, targets[s:e])
            losses.append(loss_rows)
            dxs.append(grad @ weight)  # (rows, C)
            dw = grad.t() @ x[s:e]  # (V, C)
            dweight = dw if dweight is None else dweight.float() + dw
        return _LinearCrossEntropy._finish(ctx, losses, dxs, dweight, weight.dtype, targets)

    @staticmethod
    def _forward_fp8(ctx, x, weight, targets):
        # The same three matmuls on fp8 tensor cores (torch._scaled_mm computes
        # (a @ b) * scale_a * scale_b). Hopper's fp8 matmul wants both operands with the
        # reduction dimension contiguous: a row-major, b column-major, hence the transposes
        # (small ones for x and the weight, one of G per chunk). The logits' matmul takes the fast
        # accumulator; the two gradient matmuls promote partial sums to fp32 (use_fast_accum
        # False): fast accumulation made them slower and less accurate on an H100 (perf-log,
        # 2026-12-07).
        x8, x_inv = to_fp8_e4m3(x)  # (N, C)
        w8, w_inv = to_fp8_e4m3(weight)  # (V, C)
        # (C, V): w8_t.t() is the weight in the column-major layout dx's matmul needs
        w8_t = transpose_fp8(w8)
        g_inv = torch.full((), 1.0 / FP8_GRAD_SCALE, dtype=torch.float32, device=x.device)
        losses, dxs, dweight = [], [], None
        for s, e in _row_chunks(x.shape[0]):
            logits = torch._scaled_mm(
                x8[s:e],
                w8.t(),
                scale_a=x_inv,
                scale_b=w_inv,
                out_dtype=x.dtype,
                use_fast_accum=True,
            )  # (rows, V)
            # g8 = G * FP8_GRAD_SCALE, g8_t its transpose (V, rows) for dW's matmul
            loss_rows, g8 = _cross_entropy_rows_with_e5m2_grad(logits, targets[s:e])
            g8_t = transpose_fp8(g8)
            losses.append(loss_rows)
            dxs.append(
                torch._scaled_mm(
                    g8,
                    w8_t.t(),
                    scale_a=g_inv,
                    scale_b=w_inv,
                    out_dtype=x.dtype,
                    use_fast_accum=False,
                )
            )  # (rows, C)
            dw = torch._scaled_mm(
                g8_t,
                transpose_fp8(x8[s:e]).t(),
                scale_a=g_inv,
                scale_b=x_inv,
                out_dtype=torch.float32,
                use_fast_accum=False,
            )  # (V, C)
            dweight = dw if dweight is None else dweight + dw
        return _LinearCrossEntropy._finish(ctx, losses, dxs, dweight, weight.dtype, targets)

    @staticmethod
    def _finish(ctx, losses, dxs, dweight, weight_dtype, targets):
        n_valid = (targets != IGNORE_INDEX).sum()
        ctx.save_for_backward(
            dxs[0] if len(dxs) == 1 else torch.cat(dxs), dweight.to(weight_dtype), n_valid
        )
        loss_rows = losses[0] if len(losses) == 1 else torch.cat(losses)
        return loss_rows.sum() / n_valid

    @staticmethod
    def backward(ctx, grad_loss):
        dx, dweight, n_valid = ctx.saved_tensors
        # 0-d fp32: the mean over rows and the upstream gradient in one scalar. With every row
        # ignored, dx and dweight are 0 and so is the gradient (as F.cross_entropy's), while the
        # loss is nan (0 / 0).
        scale = grad_loss / n_valid.clamp(min=1)
        return dx * scale, dweight * scale, None, None


def linear_cross_entropy(
    x: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    fp8: bool = False,
) -> torch.Tensor:
    """LM head and mean cross-entropy in one step: the logits are made in chunks and never kept
    whole.

    Equal to ``F.cross_entropy((x @ weight.T).float(), targets)``. The rows go in chunks of
    :data:`FUSED_CHUNK_ROWS`. When gradients are wanted, per chunk one matmul makes the logits, one
    Triton kernel reads them, writes each row's loss and the gradient softmax - onehot (a second
    read, mostly from L2), and the two backward matmuls run right away; backward only scales the
    (N, C) and (V, C) results by the upstream gradient over n. No logits-sized tensor outlives its
    chunk, and no logits-sized pass runs in backward. Without gradients, each chunk's loss comes
    from the forward kernel alone. The idea is Liger Kernel's fused linear cross-entropy (Hsu et al.
    2024, https://arxiv.org/abs/2410.10989). In bf16 the gradients carry one more rounding than
    ``nn.Linear`` + ``F.cross_entropy``'s (the scale is applied after the matmuls): relative
    differences of a few 1e-3, as bf16 itself.

    With ``fp8=True`` (rung "+ fp8 LM head") the three matmuls run on fp8 tensor cores, 1.5-1.9x
    faster than in bf16 on the H200 (``results/h200-fp8-matmul-2026-11-30.json``): x and the weight
    in float8_e4m3fn with one scale each (:func:`~helpers.core.kernels.fp8.to_fp8_e4m3`), the
    gradient softmax - onehot in float8_e5m2 times
    :data:`~helpers.core.kernels.fp8.FP8_GRAD_SCALE`, written so by the kernel. The loss then
    differs from bf16's by the rounding of 3 mantissa bits (e4m3) in the logits, and the gradients
    by that of 2 (e5m2): a numerics change, checked by training (``benchmarks/loss_check.py``), not
    a bit-level equality. It is the same recipe as the FP8 LM head of the modded-nanogpt speedrun
    (https://github.com/KellerJordan/modded-nanogpt) and the e4m3-forward / e5m2-gradient split of
    Micikevicius et al. 2022 (https://arxiv.org/abs/2209.05433).

    Args:
        x: (N, C) floating activations (the final LayerNorm's output). Under autocast, ``x`` and
            ``weight`` are cast to the autocast dtype first, as ``nn.Linear`` would.
        weight: (V, C) LM-head weight (tied to the token embedding in GPT-2).
        targets: (N,) int64 ids in [0, V), or -100 to skip a row; an id outside [0, V) makes the
            loss nan.
        fp8: run the LM head's matmuls in fp8 (see above). C and V must be multiples of 16 (pad the
            vocabulary: ``GPTConfig(vocab_multiple=64)``); rows are padded to a multiple of 16
            inside.

    Returns:
        0-d fp32 mean over the non-skipped rows (nan if all are skipped, or N = 0; the gradients
        are then 0, as ``F.cross_entropy``'s). The logits are not returned.

    Raises:
        RuntimeError: if Triton cannot run on ``x.device`` (see
            :func:`~helpers.core.kernels.available`), or under fp16: the gradient is rounded before
            any loss scale reaches it, so fp16 would lose small values. fp32 (no autocast) and bf16
            autocast are fine.
        ValueError: on wrong shapes or dtypes, or a :data:`FUSED_CHUNK_ROWS` that is not None or
            >= 1; with ``fp8``: C or V not a multiple of 16, or a :data:`FUSED_CHUNK_ROWS` that is
            not.
        RuntimeError: with ``fp8`` on a GPU without fp8 tensor cores (see
            :func:`~helpers.core.kernels.fp8.fp8_available`).
    """
    if (
        x.dim() != 2
        or weight.dim() != 2
        or targets.dim() != 1
        or x.shape[0] != targets.shape[0]
        or x.shape[1] != weight.shape[1]
    ):
        raise ValueError(
            f"expected x (N, C), weight (V, C), targets (N,); got {tuple(x.shape)}, "
            f"{tuple(weight.shape)}, {tuple(targets.shape)}"
        )
    if not x.is_floating_point() or not weight.is_floating_point() or targets.dtype != torch.int64:
        raise ValueError(
            f"expected floating x and weight and int64 targets, got {x.dtype}, {weight.dtype} and "
            f"{targets.dtype}"
        )
    ok, reason = available(x.device)
    if not ok:
        raise RuntimeError(
            f"helpers.core.kernels.linear_cross_entropy cannot run: {reason}. Use "
            "loss_kernel='pytorch' (or, for tests on a CPU, set TRITON_INTERPRET=1 before "
            "helpers.core.kernels is imported)."
        )
    dev = x.device.type
    dtype = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else x.dtype
    if dtype == torch.float16:
        raise RuntimeError(
            "linear_cross_entropy computes the logits' gradient before the fp16 GradScaler's scale "
            "reaches it, so small gradients would round to 0: use loss_kernel='triton' under fp16"
        )
    x, weight, targets = x.to(dtype), weight.to(dtype), targets.contiguous()
    if fp8:
        ok, reason = fp8_available(x.device)
        if not ok:
            raise RuntimeError(
                f"linear_cross_entropy(fp8=True) cannot run: {reason}. Use fp8=False (bf16)."
            )
        if (
            x.shape[1] % 16
            or weight.shape[0] % 16
            or (FUSED_CHUNK_ROWS is not None and FUSED_CHUNK_ROWS % 16)
        ):
            raise ValueError(
                f"fp8 matmuls need multiples of 16: C={x.shape[1]} (n_embd), V={weight.shape[0]} "
                "(pad the vocabulary: GPTConfig(vocab_multiple=64)), "
                f"helpers.core.kernels.fused_ce.FUSED_CHUNK_ROWS={FUSED_CHUNK_ROWS}"
            )
    if x.shape[0] == 0:  # no rows: nan, as F.cross_entropy; zero gradients through the graph
        return (
            torch.full((), float("nan"), device=x.device) + (x.sum() * weight.sum()).float() * 0.0
        )
    if fp8:
        # zero rows with ignored targets: no loss, no gradient, sliced off again by autograd
        pad = -x.shape[0] % 16
        if pad:
            x = torch.nn.functional.pad(x, (0, 0, 0, pad))
            targets = torch.nn.functional.pad(targets, (0, pad), value=IGNORE_INDEX)
    if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad):
        return _LinearCrossEntropy.apply(x, weight, targets, fp8)
    total = torch.zeros((), dtype=torch.float32, device=x.device)
    if fp8:
        x8, x_inv = to_fp8_e4m3(x)
        w8, w_inv = to_fp8_e4m3(weight)
    for s, e in _row_chunks(x.shape[0]):  # no gradient wanted: the loss alone, chunk by chunk
        if fp8:
            logits = torch._scaled_mm(
                x8[s:e],
                w8.t(),
                scale_a=x_inv,
                scale_b=w_inv,
                out_dtype=x.dtype,
                use_fast_accum=True,
            )
        else:
            logits = x[s:e] @ weight.t()
        loss_rows, _ = _cross_entropy_rows(logits, targets[s:e])
        total = total + loss_rows.sum()
    return total / (targets != IGNORE_INDEX).sum()
