"""An experiment, not a rung (results/perf-log.md, 2026-12-06): ``c_attn``'s bias as one more
column of its weight, multiplied by a column of ones appended to its input.

    python benchmarks/perf.py --batch-size 64 16 --variants final bias-in-matmul --profile

In the last rung's backward, ``c_attn``'s bias gradient is the column sum of its (B*T, 3C) output
gradient: a separate pass that reads dq, dk and dv again (0.87 ms per B=64 step on the H200,
1.27 ms on an H100). With the input written as [x, 1, 0, ..., 0] (B, T, C + PAD) and the weight as
[W, b, 0, ..., 0] (3C, C + PAD), the forward matmul adds the bias itself
(x @ W.T + 1 * b) and the weight-gradient matmul ``dqkv.T @ [x, 1, 0...]`` returns the bias
gradient as its column C: ``dqkv.T @ 1`` is the column sum. The cost: PAD = 8 more columns in the
three matmuls of ``c_attn`` (+1% of their FLOPs; 8 keeps each row a multiple of 16 bytes, which
cuBLAS's fast kernels need), and the input written 1% wider.
The function is the same: same parameters, same outputs; the bias is added and its gradient summed
in the matmul's fp32 accumulator, then rounded to bf16, as autocast's bf16 bias is.
Predicted: -1.1 ms of kernel time per B=64 step on an H100, about -0.75 on the H200.

Measured on the H200 (results/perf-log.md, 2026-12-06): the sum went (-0.89 ms per B=64 step), but
the kernels cuBLAS picked for the 776-wide matmuls took 0.71 ms more (likely tile quantization: 8
more columns can cost a whole tile, 13 steps of 64 instead of 12, 7 tiles of 128 instead of 6), and
inductor normalized the LayerNorm's output into the wider buffer in a kernel of its own (+0.49 ms
net): +0.94 ms of kernels per B=64 step, +0.41 at B=16. Not a rung.
"""

from __future__ import annotations

import contextlib
from unittest import mock

import torch
import torch.nn.functional as F

PAD = 8  # the ones column and 7 zero columns: rows stay a multiple of 8 elements (16 bytes)


def augmented(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, pad: int = PAD):
    """x (..., C) -> [x, 1, 0 * (pad - 1)] (..., C + pad); w (N, C), b (N,) -> [w, b, 0...]
    (N, C + pad), so that ``augmented_x @ augmented_w.T == x @ w.T + b``.

    Raises:
        ValueError: pad < 1, or w and b that do not fit x.
    """
    if pad < 1 or w.shape[1] != x.shape[-1] or b.shape != (w.shape[0],):
        raise ValueError(
            f"augmented needs pad >= 1, w (N, C) and b (N,) for x (..., C); got pad={pad}, "
            f"x {tuple(x.shape)}, w {tuple(w.shape)}, b {tuple(b.shape)}"
        )
    ones = x.new_ones(*x.shape[:-1], 1)
    x_aug = torch.cat([x, ones, x.new_zeros(*x.shape[:-1], pad - 1)], dim=-1)
    w_aug = torch.cat([w, b[:, None], w.new_zeros(w.shape[0], pad - 1)], dim=1)
    return x_aug, w_aug


def qkv_projection(self, x: torch.Tensor) -> torch.Tensor:
    """``CausalSelfAttention._qkv`` with ``c_attn``'s bias inside its matmul: (B, T, C) ->
    (B, T, 3C)."""
    x_aug, w_aug = augmented(x, self.c_attn.weight, self.c_attn.bias)
    return F.linear(x_aug, w_aug)


def experiment() -> contextlib.AbstractContextManager:
    """``benchmarks/perf.py``'s variant ``bias-in-matmul``: every block's attention projects q, k, v
    with :func:`qkv_projection` while the context is open."""
    from helpers.core.model import CausalSelfAttention

    return mock.patch.object(CausalSelfAttention, "_qkv", qkv_projection)
