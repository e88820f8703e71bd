"""The column sums of a (R, N) fp32 matrix in one Triton kernel, and the switch that hands
inductor's mix-order reductions their last sum through it (``final_sums="triton"``, rung
"+ Triton final sums").

Inductor fuses a LayerNorm backward's row reduction (dx) with its weight and bias gradients' column
sums into one Triton kernel (a "mix-order reduction", ``torch._inductor.codegen.simd``'s
``_codegen_mix_order_reduction``). That kernel leaves one partial column sum per ``split_size``
rows in a workspace, and the generated wrapper adds them with an eager
``ws[a:b].view(nsplit, N).sum(dim=0)``. On an H100 at B=16 (split 16: a (1024, 768) fp32 view) the
step ran 62 of those sums, 0.45 ms of PyTorch's ``reduce_kernel`` and 0.05 ms of memsets per step
(``results/h100-perf-launchers-b16-2026-12-07.json``, ``perf.py --launchers``): about 7 us per
3 MB, under 0.5 TB/s. :func:`colsum` reads the matrix once with one program per 32 columns, each
looping over the rows, in a fixed order (deterministic, like the sum it replaces).
:func:`triton_final_sums` rewrites the wrapper line to call it while inductor generates code.
"""

from __future__ import annotations

import contextlib
import re

import torch

from helpers.core.kernels._triton import TRITON_OP_MISSING, available, tl, triton

BLOCK_R, BLOCK_N = 64, 32  # rows per loop iteration, columns per program (128 bytes of a row)

# the wrapper line inductor writes for a mix-order reduction's last sum (torch 2.11-2.13):
# "buf12 = ws[0 : 1024 * 768].view(1024, 768).sum(dim=0)" with an optional ".view([768])" and
# ".to(torch.bfloat16)" after it. amax / amin (other reductions) are left as they are.
# The source is a workspace slice and one view: brackets without "]" inside, the view's arguments
# with at most one level of parentheses (sizes like "(s0 + 15) // 16").
_FINAL_SUM = re.compile(
    r"^(?P<indent>\s*)(?P<buf>\w+) = "
    r"(?P<src>\w+\[[^\]]*\]\.view\([^()]*(?:\([^()]*\)[^()]*)*\))"
    r"\.sum\(dim=0\)(?P<rest>.*)$",
    re.DOTALL,
)


def _check(x) -> None:
    if not isinstance(x, torch.Tensor) or x.dtype != torch.float32:
        raise TypeError(f"colsum takes a float32 tensor, got {getattr(x, 'dtype', type(x))}")
    if x.dim() != 2 or not x.is_contiguous():
        raise ValueError(f"colsum takes a contiguous (R, N) tensor, got shape {tuple(x.shape)}")


def rewrite_final_sum(line: str) -> str:
    """One line of inductor's wrapper code: a mix-order reduction's ``.sum(dim=0)`` of its
    workspace becomes ``torch.ops.fastgpt2.colsum(...)``; any other line is returned unchanged."""
    m = _FINAL_SUM.match(line)
    if m is None:
        return line
    return f"{m['indent']}{m['buf']} = torch.ops.fastgpt2.colsum({m['src']}){m['rest']}"


if triton is not None and TRITON_OP_MISSING is None:

    @triton.jit
    def _colsum_kernel(x_ptr, out_ptr, R, N, BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr):
        # columns [pid * BLOCK_N, +BLOCK_N) summed over all R rows, BLOCK_R rows at a time
        cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        col_in = cols < N
        acc = tl.zeros((BLOCK_R, BLOCK_N), dtype=tl.float32)
        for r0 in range(0, R, BLOCK_R):
            rows = r0 + tl.arange(0, BLOCK_R)
            mask = (rows[:, None] < R) & col_in[None, :]
            acc += tl.load(x_ptr + rows[:, None].to(tl.int64) * N + cols[None, :], mask=mask,
                           other=0.0)  # fmt: skip
        tl.store(out_ptr + cols, tl.sum(acc, axis=0), mask=col_in)

    def _colsum_impl(x, block_r: int, block_n: int, num_warps: int = 4) -> torch.Tensor:
        # the launch at one config (benchmarks/colsum.py sweeps them)
        R, N = x.shape
        out = torch.empty(N, dtype=torch.float32, device=x.device)
        _colsum_kernel[(triton.cdiv(N, block_n),)](
            x, out, R, N, BLOCK_R=block_r, BLOCK_N=block_n, num_warps=num_warps
        )
        return out

    # Opaque: inductor's generated wrapper calls it at run time, outside any traced graph.
    @torch.library.custom_op("fastgpt2::colsum", mutates_args=())
    def _colsum_op(x: torch.Tensor) -> torch.Tensor:
        _check(x)  # the rewritten wrapper line calls the op, not colsum()
        return _colsum_impl(x, BLOCK_R, BLOCK_N)

    @_colsum_op.register_fake
    def _(x):
        return x.new_empty(x.shape[1], dtype=torch.float32)


def colsum(x: torch.Tensor) -> torch.Tensor:
    """Column sums of ``x``: ``x.sum(dim=0)`` in one Triton kernel.

    Args:
        x: (R, N) float32, contiguous, on a CUDA GPU (or a CPU under ``TRITON_INTERPRET=1``).

    Returns:
        (N,) float32.

    Raises:
        TypeError: ``x`` is not a float32 tensor.
        ValueError: ``x`` is not 2-D and contiguous.
        RuntimeError: the Triton kernels cannot run here (:func:`_triton.available` says why).
    """
    _check(x)
    ok, why = available(x.device)
    if not ok:
        raise RuntimeError(f"colsum cannot run: {why}")
    return torch.ops.fastgpt2.colsum(x)


def final_sums_problem() -> str | None:
    """Why :func:`triton_final_sums` cannot patch this torch's inductor (it has no mix-order
    reduction), or None if it can."""
    from torch._inductor.codegen import simd

    if not hasattr(simd.SIMDScheduling, "_codegen_mix_order_reduction"):
        return (
            f"torch {torch.__version__}'s inductor has no mix-order reduction "
            "(_codegen_mix_order_reduction) whose final sums the Triton final sums replace"
        )
    return None


@contextlib.contextmanager
def triton_final_sums():
    """While open, torch.compile's inductor writes each mix-order reduction's last sum as
    :func:`colsum` instead of an eager ``.sum(dim=0)`` (this module's docstring), and the one-pass
    QKV gradient's op adds its partial sums with it too. Compile inside the context: the generated
    code keeps calling the op afterwards, while the QKV op is itself again once the context
    closes (the step runs in it: ``Trainer.kernels``).

    Raises:
        RuntimeError: this torch's inductor has no mix-order reduction to patch.
    """
    from unittest import mock

    import torch._inductor.config
    from torch._inductor import virtualized
    from torch._inductor.codegen import simd

    if (why := final_sums_problem()) is not None:
        raise RuntimeError(why)
    original = simd.SIMDScheduling._codegen_mix_order_reduction

    def patched(self, node1, node2):
        wrapper = virtualized.V.graph.wrapper_code
        own = wrapper.__dict__.get("writeline")  # None: the class's method
        write = wrapper.writeline
        wrapper.writeline = lambda line: write(
            rewrite_final_sum(line) if isinstance(line, str) else line
        )
        try:
            return original(self, node1, node2)
        finally:
            if own is None:
                del wrapper.writeline
            else:
                wrapper.writeline = own

    # no cached compiled graph either: it would hold the eager sums, and the patch is not part
    # of the caches' keys
    from helpers.core.kernels import qkv_grad

    with (
        mock.patch.object(simd.SIMDScheduling, "_codegen_mix_order_reduction", patched),
        torch._inductor.config.patch(force_disable_caches=True),
        mock.patch.object(qkv_grad, "_sum_partials", colsum),  # the QKV op's partial sums too
    ):
        yield
