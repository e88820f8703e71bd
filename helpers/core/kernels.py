"""Hand-written Triton kernels for the LM head's cross-entropy (two rungs of the ladder).

Why (measured, ``results/perf-log.md``): at B=64 the LM head's logits are 64·1024 × 50304 bf16
values, 6.6 GB. ``torch.compile`` turns ``F.cross_entropy(logits.float(), targets)`` into two
reduction kernels that took 4.8 + 5.1 ms per step on the H200: the forward read the logits at
~1.3 TB/s, a third of the copy bandwidth chapter 02 measures.

- :func:`cross_entropy` (rung "+ Triton CE"): the minimum traffic of a separate loss. One read of
  the logits forward (a running max and sum of exponentials, the "online softmax" of Milakov &
  Gimelshein 2018, https://arxiv.org/abs/1805.02867), one read plus one write backward
  (grad = softmax(x) - onehot(target), times the upstream gradient): 3 × 6.6 GB.
- :func:`linear_cross_entropy` (rung "+ fused LM-head CE"): the LM head and the loss together, in
  chunks of rows. One kernel writes each row's loss and its gradient in the forward pass, and the LM
  head's backward matmuls run there too, so the logits never exist whole and nothing logits-sized
  waits for backward (Liger Kernel's fused linear cross-entropy, https://arxiv.org/abs/2410.10989).

The kernels are registered with ``torch.library.triton_op`` so ``torch.compile`` traces them into
its graph (no graph break); the two-kernel version registers its backward with autograd
(https://docs.pytorch.org/tutorials/recipes/torch_compile_user_defined_triton_kernel_tutorial.html),
the fused one is called inside a ``torch.autograd.Function``.
Triton is imported lazily: on a CPU-only install without the ``triton`` package, importing
``helpers`` still works and :func:`available` says why the kernels cannot run. With
``TRITON_INTERPRET=1`` set before this module is imported, Triton's interpreter runs the same
kernels on CPU tensors (slowly): that is how CI tests them on a machine without a GPU.
"""

from __future__ import annotations

import os

import torch

IGNORE_INDEX = -100  # the target id F.cross_entropy skips by default; the kernel skips it too
BLOCK = 4096  # columns per loop iteration of one row (50304 columns -> 13 iterations)
# Warps per row program. On the H200 (results/h200-lm-head-ce-2026-11-30.json), LM head + CE forward+backward at
# N=65536 rows: two-kernel CE 28.3 ms with 4 warps, 29.7 ms with 16; the fused kernel alone moved the logits at
# 2.8 TB/s (counting one read and one write) with 4 warps, 2.3 TB/s with 16.
NUM_WARPS = 4  # the two-kernel cross-entropy
FUSED_NUM_WARPS = 4  # the fused forward+backward kernel
FUSED_BLOCK = 4096  # columns per iteration of the fused kernel (8192 was slower at 4 warps)
# Rows of the LM head per chunk in linear_cross_entropy (None: all rows at once). The same file: forward+backward at
# N=65536 took 28.5 ms unchunked, 28.7 ms in chunks of 32768, 29.5 in chunks of 16384. A B=64 training step
# (results/h200-perf-fused-ce-chunks-2026-11-30.json) peaked at 32.2 GiB unchunked, 26.2 GiB with 32768 rows and
# 23.3 GiB with 16384 (two-kernel CE: 32.7 GiB).
FUSED_CHUNK_ROWS: int | None = 32768
# FP8 LM head (linear_cross_entropy(..., fp8=True)). x and the weight are cast to float8_e4m3fn with one scale per
# tensor (amax -> the format's largest value, 448, as torchao's tensorwise float8 recipe); the logits' gradient
# softmax - onehot lies in [-1, 1] and is stored as float8_e5m2 times a fixed 2**15 (largest e5m2 value: 57344), so
# probabilities down to ~5e-10 stay representable instead of flushing to 0.
E4M3_MAX = 448.0
FP8_GRAD_SCALE = 2.0**15
TRANSPOSE_TILE = 64  # bytes per side of transpose_fp8's tiles

try:  # pragma: no cover - which branch runs depends on the install
    import triton
    import triton.language as tl
except ImportError:  # CPU-only torch ships without Triton
    triton = None
    tl = None


# The kernels are registered with torch.library.triton_op and launched through wrap_triton (torch >= 2.6);
# on an older torch the module still imports and available() says why the Triton rungs are skipped.
TRITON_OP_MISSING: str | None = (
    None
    if all(hasattr(torch.library, name) for name in ("triton_op", "wrap_triton"))
    else (
        f"torch {torch.__version__} has no torch.library.triton_op (torch >= 2.6 has it): "
        "the Triton kernels need a newer torch"
    )
)

# True when Triton's CPU interpreter runs the kernels (TRITON_INTERPRET=1). Triton reads the variable
# when the kernels are decorated, at import, so this module reads it then too.
_INTERPRETED_AT_IMPORT = os.environ.get("TRITON_INTERPRET", "0") == "1"


def available(device: torch.device | str) -> tuple[bool, str]:
    """(whether the Triton cross-entropy kernels can run on ``device``, the reason if not).

    It needs the ``triton`` package and a CUDA GPU of compute capability >= 7.0 (Triton's minimum), or
    a CPU when ``TRITON_INTERPRET=1`` was set before this module was imported (tests).
    """
    device = torch.device(device)
    if device.type not in ("cuda", "cpu") or (device.type == "cpu" and not _INTERPRETED_AT_IMPORT):
        return (
            False,
            f"the Triton kernels run on a CUDA GPU; this device is a {device.type.upper()}",
        )
    if triton is None:
        return (
            False,
            "the 'triton' package is not installed (it comes with the CUDA builds of torch)",
        )
    if TRITON_OP_MISSING is not None:
        return False, TRITON_OP_MISSING
    if device.type == "cuda" and not torch.cuda.is_available():
        return False, "no CUDA GPU is available here (torch.cuda.is_available() is False)"
    if device.type == "cuda":
        from helpers.measure import hardware

        cap = hardware.capability(device)
        if cap < (7, 0):
            return False, f"Triton needs compute capability >= 7.0; this GPU is {cap}"
        return True, ""
    return True, ""  # a CPU with TRITON_INTERPRET=1 set before import (tests)


if triton is not None and TRITON_OP_MISSING is None:

    @triton.jit
    def _row_loss(
        row_ptr, targets_ptr, row, ignore_index, n_cols: tl.constexpr, BLOCK: tl.constexpr
    ):
        # One row's loss in one read: a running max m and sum s of exp(x - m) over the row (online softmax).
        # n_cols is a compile-time constant (one build per vocabulary size): a loop bound Triton's CPU
        # interpreter also accepts (its runtime integers cannot bound a range with numpy 2).
        # Returns (loss, lse, target, in_range); ignored rows' loss is 0, a target outside [0, n_cols) gives
        # nan (F.cross_entropy raises; a check here would sync).
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
        # d loss_row / d x_j = softmax(x)_j - [j == target], times scale; one read and one write of the row.
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

    def _launch(kernel):
        # wrap_triton lets torch.compile trace the launch; the CPU interpreter's kernels are plain Python
        # functions that older torch (2.11) refuses to wrap, and compile is not used with them.
        return kernel if _INTERPRETED_AT_IMPORT else torch.library.wrap_triton(kernel)

    @torch.library.triton_op("fastgpt2::cross_entropy_rows", mutates_args={})
    def _cross_entropy_rows(
        logits: torch.Tensor, targets: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        N, V = logits.shape
        loss = torch.empty(N, dtype=torch.float32, device=logits.device)
        lse = torch.empty(N, dtype=torch.float32, device=logits.device)
        _launch(_ce_forward_kernel)[(N,)](
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
        _launch(_ce_backward_kernel)[(N,)](
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
        # Forward and backward of one row in one program: the forward kernel's pass (_row_loss), then a
        # second read of the row (from L2 when it is still there) that writes softmax(x) - onehot(target),
        # *not* scaled by 1/n or the upstream gradient: that scale is applied later to the two small
        # matmul outputs (see _LinearCrossEntropy), so no logits-sized pass waits for backward.
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
        _launch(_ce_fused_kernel)[(N,)](
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
        # fp32 -> float8_e5m2 bits (uint8), rounded to nearest, ties to even, as torch's .to(torch.float8_e5m2) for
        # finite |g| < 57344 (here |g| <= 2**15). A NaN g is not kept as NaN on the GPU (the fp16 NaN the hardware
        # makes rounds to -0 or inf); it only arises from a target outside [0, V) or non-finite logits, and the
        # row's loss is nan then. e5m2 is fp16 without its 8 lowest mantissa bits (same sign, exponent and bias): truncate to
        # fp16, set the lowest bit if that lost anything ("round to odd", so the second rounding cannot meet a
        # false tie), then round the 16 bits to their top 8. Written out because Triton's CPU interpreter casts
        # to fp8 wrongly; the same arithmetic runs on the GPU and in the tests.
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
    ):
        # _ce_fused_kernel for the fp8 LM head: the gradient times GRAD_SCALE, written as float8_e5m2 bits
        # (grad_ptr: the uint8 view of a float8_e5m2 tensor). Its loop repeats _store_row_grad's on purpose: a
        # version that shared it (a constexpr switch and a runtime scale in _store_row_grad) made the bf16 fused
        # kernel fail Triton 3.6's LLVM lowering when torch.compile built it on the H200 (results/perf-log.md).
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
            tl.store(grad_ptr + row * n_cols + idx, _e5m2_bits(g), mask=mask)

    # The fp8 ops are opaque custom ops: torch.compile calls them as they are and does not re-compile their
    # kernels (launched here by Triton's own JIT), so the compiled step runs the same kernels as eager code.
    @torch.library.custom_op("fastgpt2::cross_entropy_rows_with_e5m2_grad", mutates_args=())
    def _cross_entropy_rows_with_e5m2_grad(
        logits: torch.Tensor, targets: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # As _cross_entropy_rows_with_grad, but the gradient times FP8_GRAD_SCALE, stored as float8_e5m2.
        N, V = logits.shape
        loss = torch.empty(N, dtype=torch.float32, device=logits.device)
        grad = torch.empty((N, V), dtype=torch.float8_e5m2, device=logits.device)
        _ce_fused_e5m2_kernel[(N,)](
            logits,
            targets,
            loss,
            grad.view(torch.uint8),
            logits.stride(0),
            IGNORE_INDEX,
            n_cols=V,
            BLOCK=FUSED_BLOCK,
            GRAD_SCALE=FP8_GRAD_SCALE,
            num_warps=FUSED_NUM_WARPS,
        )
        return loss, grad

    @_cross_entropy_rows_with_e5m2_grad.register_fake
    def _(logits, targets):
        N, V = logits.shape
        return logits.new_empty(N, dtype=torch.float32), logits.new_empty(
            (N, V), dtype=torch.float8_e5m2
        )

    @triton.jit
    def _transpose_kernel(src_ptr, dst_ptr, M, N, BM: tl.constexpr, BN: tl.constexpr):
        # dst (N, M) = src (M, N).T, both contiguous, one BM x BN tile per program (bytes: any 1-byte dtype)
        rm = tl.program_id(0).to(tl.int64) * BM + tl.arange(0, BM)
        rn = tl.program_id(1).to(tl.int64) * BN + tl.arange(0, BN)
        mask = (rm[:, None] < M) & (rn[None, :] < N)
        tile = tl.load(src_ptr + rm[:, None] * N + rn[None, :], mask=mask)
        tl.store(dst_ptr + rn[None, :] * M + rm[:, None], tile, mask=mask)

    @torch.library.custom_op("fastgpt2::transpose_fp8", mutates_args=())
    def _transpose_fp8(src: torch.Tensor) -> torch.Tensor:
        M, N = src.shape
        dst = torch.empty((N, M), dtype=src.dtype, device=src.device)
        _transpose_kernel[(triton.cdiv(M, TRANSPOSE_TILE), triton.cdiv(N, TRANSPOSE_TILE))](
            src.view(torch.uint8),
            dst.view(torch.uint8),
            M,
            N,
            BM=TRANSPOSE_TILE,
            BN=TRANSPOSE_TILE,
            num_warps=4,
        )
        return dst

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


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy in nats, like ``F.cross_entropy(logits.float(), targets)``, in two Triton kernels.

    Args:
        logits: (N, V) floating tensor (bf16, fp16, fp32; fp64 is computed in fp32); the math runs in
            fp32 inside the kernel and the gradient comes back in ``logits.dtype``. Rows whose columns
            are not contiguous are copied first.
        targets: (N,) int64 class ids in [0, V), or -100 (:data:`IGNORE_INDEX`) to skip a row. Unlike
            ``F.cross_entropy``, an id outside [0, V) is not checked on the host (that would sync): it
            makes the loss nan, and the kernel never reads outside the row.

    Returns:
        0-d fp32 tensor: the mean over the rows whose target is not -100 (nan if every row is skipped,
        as ``F.cross_entropy``). The gradient uses the stored log-sum-exp: with logits near 1e4 its
        rounding shows (~1e-4 relative); at a language model's logit sizes it is ~1e-6.

    Raises:
        RuntimeError: if Triton cannot run on ``logits.device`` (see :func:`available`).
        ValueError: on wrong shapes or dtypes.
    """
    if logits.dim() != 2 or targets.dim() != 1 or targets.shape[0] != logits.shape[0]:
        raise ValueError(
            f"expected logits (N, V) and targets (N,), got {tuple(logits.shape)} and {tuple(targets.shape)}"
        )
    if not logits.is_floating_point() or targets.dtype != torch.int64:
        raise ValueError(
            f"expected floating logits and int64 targets, got {logits.dtype} and {targets.dtype}"
        )
    ok, reason = available(logits.device)
    if not ok:
        raise RuntimeError(
            f"helpers.core.kernels.cross_entropy cannot run: {reason}. Use F.cross_entropy instead "
            "(or, for tests on a CPU, set TRITON_INTERPRET=1 before helpers.core.kernels is imported)."
        )
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    loss_rows, _ = _cross_entropy_rows(logits, targets.contiguous())
    return loss_rows.sum() / (targets != IGNORE_INDEX).sum()


def _row_chunks(n: int) -> list[tuple[int, int]]:
    """[(start, end), ...] covering rows 0..n-1 in chunks of FUSED_CHUNK_ROWS (None: one chunk)."""
    if FUSED_CHUNK_ROWS is not None and (
        not isinstance(FUSED_CHUNK_ROWS, int) or FUSED_CHUNK_ROWS < 1
    ):
        raise ValueError(
            f"kernels.FUSED_CHUNK_ROWS must be None or an int >= 1, got {FUSED_CHUNK_ROWS!r}"
        )
    step = FUSED_CHUNK_ROWS or max(n, 1)
    return [(s, min(s + step, n)) for s in range(0, n, step)]


class _LinearCrossEntropy(torch.autograd.Function):
    """LM head + cross-entropy whose gradients are computed in the forward pass, in chunks of rows.

    forward, per chunk of rows: logits = x @ weight.T; one Triton kernel gives each row's loss and
    G = softmax(logits) - onehot(targets); then dx = G @ weight and dweight += G.T @ x (fp32 sum over
    chunks). Only dx (N, C) and dweight (V, C) are kept for backward, which scales them by grad_loss / n.
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
        # The same three matmuls on fp8 tensor cores (torch._scaled_mm computes (a @ b) * scale_a * scale_b,
        # fp32 accumulation). Hopper's fp8 matmul wants both operands with the reduction dimension contiguous:
        # a row-major, b column-major, hence the transposes (small ones for x and the weight, one of G per chunk).
        x8, x_inv = to_fp8_e4m3(x)  # (N, C)
        w8, w_inv = to_fp8_e4m3(weight)  # (V, C)
        w8_t = transpose_fp8(
            w8
        )  # (C, V): w8_t.t() is the weight in the column-major layout dx's matmul needs
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
            loss_rows, g8 = _cross_entropy_rows_with_e5m2_grad(
                logits, targets[s:e]
            )  # g8 = G * FP8_GRAD_SCALE
            losses.append(loss_rows)
            dxs.append(
                torch._scaled_mm(g8, w8_t.t(), scale_a=g_inv, scale_b=w_inv, out_dtype=x.dtype)
            )  # (rows, C)
            dw = torch._scaled_mm(
                transpose_fp8(g8),
                transpose_fp8(x8[s:e]).t(),
                scale_a=g_inv,
                scale_b=x_inv,
                out_dtype=torch.float32,
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
        # 0-d fp32: the mean over rows and the upstream gradient in one scalar. With every row ignored, dx and
        # dweight are 0 and so is the gradient (as F.cross_entropy's), while the loss is nan (0 / 0).
        scale = grad_loss / n_valid.clamp(min=1)
        return dx * scale, dweight * scale, None, None


def to_fp8_e4m3(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``t`` in float8_e4m3fn with one scale for the whole tensor, and the scale that undoes it.

    The scale maps ``t``'s largest magnitude (amax) to e4m3's largest value, 448 (:data:`E4M3_MAX`);
    this is the "tensorwise" dynamic scaling of torchao's float8 training recipe and of Micikevicius et
    al. 2022, "FP8 Formats for Deep Learning" (https://arxiv.org/abs/2209.05433). e4m3 keeps 3 mantissa
    bits: each value is rounded by at most 1/16 of itself (relative); magnitudes below ~3.5e-5 of amax
    (2**-6 / 448) become subnormals with fewer bits, and below ~2.2e-6 of amax (2**-10 / 448) zero.

    Args:
        t: floating tensor of any shape.

    Returns:
        (t8, inv_scale): t8 float8_e4m3fn of ``t``'s shape with t8 ≈ t * scale; inv_scale a 0-d fp32 tensor,
        1 / scale, so that ``t8.float() * inv_scale ≈ t`` (what ``torch._scaled_mm``'s scale_a/scale_b take).
        An all-zero ``t`` gives zeros and a finite scale.
    """
    amax = t.detach().abs().amax().float()
    scale = E4M3_MAX / amax.clamp(min=1e-12)
    t8 = (t.float() * scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return t8, scale.reciprocal()


def fp8_available(device: torch.device | str) -> tuple[bool, str]:
    """(whether :func:`linear_cross_entropy` can run with ``fp8=True`` on ``device``, the reason if not).

    fp8 tensor cores (``torch._scaled_mm``) need compute capability >= 8.9: Ada (L4, RTX 40xx), Hopper
    (H100, H200) or newer; a T4 (7.5) and an A100 (8.0) have none. On a CPU it runs for the tests
    (PyTorch's CPU ``_scaled_mm``, Triton's interpreter), as :func:`available` says.
    """
    ok, reason = available(device)
    if not ok:
        return (
            ok,
            f"{reason}; fp8 matmuls need an NVIDIA GPU of compute capability >= 8.9 (Ada, Hopper or newer)",
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
    """Whether PyTorch's CPU ``_scaled_mm`` runs an e4m3 matmul here: it goes to oneDNN, which has fp8
    kernels only for some instruction sets (none with AVX2 alone)."""
    a = torch.ones(16, 16).to(torch.float8_e4m3fn)
    one = torch.ones((), dtype=torch.float32)
    try:
        torch._scaled_mm(a, a.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    except RuntimeError as e:
        return False, (
            f"PyTorch's CPU _scaled_mm cannot run fp8 on this CPU ({str(e).splitlines()[0][:120]}); "
            "fp8 matmuls need an NVIDIA GPU of compute capability >= 8.9"
        )
    return True, ""


def linear_cross_entropy(
    x: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, fp8: bool = False
) -> torch.Tensor:
    """LM head and mean cross-entropy in one step: the logits are made in chunks and never kept whole.

    Equal to ``F.cross_entropy((x @ weight.T).float(), targets)``. The rows go in chunks of
    :data:`FUSED_CHUNK_ROWS`. When gradients are wanted, per chunk one matmul makes the logits, one
    Triton kernel reads them, writes each row's loss and the gradient softmax - onehot (a second read,
    mostly from L2), and the two backward matmuls run right away; backward only scales the (N, C) and
    (V, C) results by the upstream gradient over n. No logits-sized tensor outlives its chunk, and no
    logits-sized pass runs in backward. Without gradients, each chunk's loss comes from the forward
    kernel alone. The idea is Liger Kernel's fused linear cross-entropy (Hsu et al. 2024,
    https://arxiv.org/abs/2410.10989). In bf16 the gradients carry one more rounding than
    ``nn.Linear`` + ``F.cross_entropy``'s (the scale is applied after the matmuls): relative
    differences of a few 1e-3, as bf16 itself.

    With ``fp8=True`` (rung "+ fp8 LM head") the three matmuls run on fp8 tensor cores, 1.5-1.9x
    faster than in bf16 on the H200 (``results/h200-fp8-matmul-2026-11-30.json``): x and the weight in
    float8_e4m3fn with one scale each (:func:`to_fp8_e4m3`), the gradient softmax - onehot in
    float8_e5m2 times :data:`FP8_GRAD_SCALE`, written so by the kernel. The loss then differs from
    bf16's by the rounding of 3 mantissa bits (e4m3) in the logits, and the gradients by that of 2
    (e5m2): a numerics change, checked by training (``benchmarks/loss_check.py``), not a bit-level
    equality. It is the same recipe as the FP8 LM head of the modded-nanogpt speedrun
    (https://github.com/KellerJordan/modded-nanogpt) and the e4m3-forward / e5m2-gradient split of
    Micikevicius et al. 2022 (https://arxiv.org/abs/2209.05433).

    Args:
        x: (N, C) floating activations (the final LayerNorm's output). Under autocast, ``x`` and
            ``weight`` are cast to the autocast dtype first, as ``nn.Linear`` would.
        weight: (V, C) LM-head weight (tied to the token embedding in GPT-2).
        targets: (N,) int64 ids in [0, V), or -100 to skip a row; an id outside [0, V) makes the loss nan.
        fp8: run the LM head's matmuls in fp8 (see above). C and V must be multiples of 16 (pad the
            vocabulary: ``GPTConfig(vocab_multiple=64)``); rows are padded to a multiple of 16 inside.

    Returns:
        0-d fp32 mean over the non-skipped rows (nan if all are skipped, or N = 0; the gradients are then
        0, as ``F.cross_entropy``'s). The logits are not returned.

    Raises:
        RuntimeError: if Triton cannot run on ``x.device`` (see :func:`available`), or under fp16:
            the gradient is rounded before any loss scale reaches it, so fp16 would lose small values.
            fp32 (no autocast) and bf16 autocast are fine.
        ValueError: on wrong shapes or dtypes, or a :data:`FUSED_CHUNK_ROWS` that is not None or >= 1;
            with ``fp8``: C or V not a multiple of 16, or a :data:`FUSED_CHUNK_ROWS` that is not.
        RuntimeError: with ``fp8`` on a GPU without fp8 tensor cores (see :func:`fp8_available`).
    """
    if (
        x.dim() != 2
        or weight.dim() != 2
        or targets.dim() != 1
        or x.shape[0] != targets.shape[0]
        or x.shape[1] != weight.shape[1]
    ):
        raise ValueError(
            f"expected x (N, C), weight (V, C), targets (N,); got {tuple(x.shape)}, {tuple(weight.shape)}, "
            f"{tuple(targets.shape)}"
        )
    if not x.is_floating_point() or not weight.is_floating_point() or targets.dtype != torch.int64:
        raise ValueError(
            f"expected floating x and weight and int64 targets, got {x.dtype}, {weight.dtype} and {targets.dtype}"
        )
    ok, reason = available(x.device)
    if not ok:
        raise RuntimeError(
            f"helpers.core.kernels.linear_cross_entropy cannot run: {reason}. Use loss_kernel='pytorch' "
            "(or, for tests on a CPU, set TRITON_INTERPRET=1 before helpers.core.kernels is imported)."
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
                f"fp8 matmuls need multiples of 16: C={x.shape[1]} (n_embd), V={weight.shape[0]} (pad the "
                f"vocabulary: GPTConfig(vocab_multiple=64)), kernels.FUSED_CHUNK_ROWS={FUSED_CHUNK_ROWS}"
            )
    if x.shape[0] == 0:  # no rows: nan, as F.cross_entropy; zero gradients through the graph
        return (
            torch.full((), float("nan"), device=x.device) + (x.sum() * weight.sum()).float() * 0.0
        )
    if fp8:
        pad = (
            -x.shape[0] % 16
        )  # zero rows with ignored targets: no loss, no gradient, sliced off again by autograd
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
