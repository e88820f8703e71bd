"""Microbenchmark: the fp8 LM head's fused cross-entropy kernel, one program per row against a
persistent grid that keeps fewer rows in flight, so that its second read of each row can come
from L2 instead of HBM.

    python benchmarks/ce_rows_in_flight.py --out results/h200-ce-rows-in-flight-DATE.json

``fused_ce._ce_fused_e5m2_kernel`` reads each 50304-wide bf16 row of logits twice (the online
log-sum-exp, then the gradient it writes as e5m2): 2 x 100 KB per row. With one program per row,
about as many rows are in flight as the SMs hold programs, more than the 50 MB L2 keeps, so both
reads come from HBM. :func:`persistent` launches ``programs`` programs that each loop over rows
``pid, pid + programs, ...``: with few enough of them, a row is still in L2 at its second read.
Both grids round to e5m2 in integer arithmetic (``_e5m2_bits``), as ``fused_ce``'s kernel did when
this ran; :func:`hw_cast` is that kernel with the GPU's own conversion, which it now uses.
Same arithmetic per row (other warps sum in another order: equal to fp32 rounding, checked).
Timing: 5 warm-up calls, median of 20 CUDA-event-timed calls (``fp8_matmuls.bench``), one call =
one chunk of the fused LM-head CE (32768 rows at B=64, 16384 at B=16), logits ~ N(0, 2^2)
bf16, random targets.
"""

from __future__ import annotations

import argparse
import sys
from unittest import mock

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from fp8_matmuls import bench  # noqa: E402

from helpers.core.kernels import fused_ce  # noqa: E402
from helpers.core.kernels._triton import tl, triton  # noqa: E402
from helpers.core.kernels.fp8 import FP8_GRAD_SCALE  # noqa: E402
from helpers.core.kernels.fused_ce import _e5m2_bits  # noqa: E402, F401  (the kernel calls it)
from helpers.core.kernels.triton_ce import IGNORE_INDEX, _row_loss  # noqa: E402
from helpers.measure import results  # noqa: E402

V = 50304


@triton.jit
def _persistent_kernel(
    logits_ptr, targets_ptr, loss_ptr, grad_ptr, row_stride, ignore_index, n_rows,
    n_cols: tl.constexpr, BLOCK: tl.constexpr, GRAD_SCALE: tl.constexpr,
    ROWS_EACH: tl.constexpr,
):  # fmt: skip
    # _ce_fused_e5m2_kernel's body for rows pid, pid + programs, ... (ROWS_EACH of them)
    pid = tl.program_id(0).to(tl.int64)
    programs = tl.num_programs(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    for i in range(ROWS_EACH):
        row = pid + i * programs
        if row < n_rows:
            row_ptr = logits_ptr + row * row_stride
            loss, lse, target, in_range = _row_loss(
                row_ptr, targets_ptr, row, ignore_index, n_cols, BLOCK
            )
            tl.store(loss_ptr + row, loss)
            keep = tl.where(target != ignore_index, GRAD_SCALE, 0.0)
            keep = tl.where(in_range | (target == ignore_index), keep, float("nan"))
            for start in range(0, n_cols, BLOCK):
                idx = start + cols
                mask = idx < n_cols
                x = tl.load(row_ptr + idx, mask=mask, other=0.0).to(tl.float32)
                g = (tl.exp(x - lse) - tl.where(idx == target, 1.0, 0.0)) * keep
                tl.store(grad_ptr + row * n_cols + idx, _e5m2_bits(g), mask=mask)


@triton.jit
def _hw_cast_kernel(
    logits_ptr, targets_ptr, loss_ptr, grad_ptr, row_stride, ignore_index,
    n_cols: tl.constexpr, BLOCK: tl.constexpr, GRAD_SCALE: tl.constexpr,
):  # fmt: skip
    # _ce_fused_e5m2_kernel with the GPU's own fp32 -> e5m2 conversion instead of _e5m2_bits
    row = tl.program_id(0).to(tl.int64)
    row_ptr = logits_ptr + row * row_stride
    loss, lse, target, in_range = _row_loss(row_ptr, targets_ptr, row, ignore_index, n_cols, BLOCK)
    tl.store(loss_ptr + row, loss)
    keep = tl.where(target != ignore_index, GRAD_SCALE, 0.0)
    keep = tl.where(in_range | (target == ignore_index), keep, float("nan"))
    cols = tl.arange(0, BLOCK)
    for start in range(0, n_cols, BLOCK):
        idx = start + cols
        mask = idx < n_cols
        x = tl.load(row_ptr + idx, mask=mask, other=0.0).to(tl.float32)
        g = (tl.exp(x - lse) - tl.where(idx == target, 1.0, 0.0)) * keep
        tl.store(grad_ptr + row * n_cols + idx, g.to(tl.float8e5), mask=mask)


def hw_cast(logits, targets, warps: int = 4):
    """(loss, grad) as ``fused_ce``'s op, one program per row, the e5m2 cast in hardware."""
    N, n_cols = logits.shape
    loss = torch.empty(N, dtype=torch.float32, device=logits.device)
    grad = torch.empty((N, n_cols), dtype=torch.float8_e5m2, device=logits.device)
    _hw_cast_kernel[(N,)](
        logits, targets, loss, grad, logits.stride(0), IGNORE_INDEX,
        n_cols=n_cols, BLOCK=fused_ce.FUSED_BLOCK, GRAD_SCALE=FP8_GRAD_SCALE, num_warps=warps,
    )  # fmt: skip
    return loss, grad


def persistent(logits, targets, programs: int, block: int, warps: int):
    """(loss (N,) fp32, grad (N, V) e5m2) as ``fused_ce``'s op, from ``programs`` programs."""
    N, n_cols = logits.shape
    loss = torch.empty(N, dtype=torch.float32, device=logits.device)
    grad = torch.empty((N, n_cols), dtype=torch.float8_e5m2, device=logits.device)
    _persistent_kernel[(programs,)](
        logits, targets, loss, grad.view(torch.uint8), logits.stride(0), IGNORE_INDEX, N,
        n_cols=n_cols, BLOCK=block, GRAD_SCALE=FP8_GRAD_SCALE,
        ROWS_EACH=triton.cdiv(N, programs), num_warps=warps,
    )  # fmt: skip
    return loss, grad


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, nargs="+", default=[32768, 16384])
    results.add_out(p)
    args = p.parse_args(argv)
    args.out = results.checked_out(p, args.out, args.force)
    if not torch.cuda.is_available():
        print("benchmarks/ce_rows_in_flight.py needs a CUDA GPU", file=sys.stderr)
        return 2
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = []
    for N in args.rows:
        logits = (torch.randn(N, V, device="cuda") * 2).to(torch.bfloat16)
        targets = torch.randint(0, V, (N,), device="cuda")
        op = fused_ce._cross_entropy_rows_with_e5m2_grad
        moved = 3 * logits.numel()  # bytes: the bf16 logits once, the e5m2 gradient once
        # the reference: the course's kernel with the written-out rounding (_e5m2_bits)
        with mock.patch.object(fused_ce, "E5M2_HARDWARE_CAST", False):
            ref_loss, ref_grad = op(logits, targets)
            ms = bench(lambda: op(logits, targets))  # noqa: B023
        rows.append({"rows": N, "kernel": "one program per row, software e5m2", "ms": ms,
                     "GB_per_s_one_read": moved / ms / 1e6})  # fmt: skip
        print(f"N={N} one program per row, software e5m2: {ms:.3f} ms", flush=True)
        for warps in (4, 8):
            loss, grad = hw_cast(logits, targets, warps)
            assert torch.allclose(loss, ref_loss, rtol=1e-5, atol=1e-5), "loss differs"
            same = (grad.view(torch.uint8) == ref_grad.view(torch.uint8)).float().mean().item()
            ms = bench(lambda: hw_cast(logits, targets, warps))  # noqa: B023
            rows.append({"rows": N, "kernel": "one program per row, hardware e5m2 cast",
                         "warps": warps, "ms": ms, "bytes_equal": same,
                         "GB_per_s_one_read": moved / ms / 1e6})  # fmt: skip
            print(f"N={N} hardware cast, {warps} warps: {ms:.3f} ms ({same:.6f} bytes equal)",
                  flush=True)  # fmt: skip
        for per_sm in (8, 16):
            for block, warps in ((4096, 4),):
                programs = per_sm * sms
                loss, grad = persistent(logits, targets, programs, block, warps)
                # other warps sum a row in another order: equal to fp32 rounding, not bitwise
                assert torch.allclose(loss, ref_loss, rtol=1e-5, atol=1e-5), "loss differs"
                same = (grad.view(torch.uint8) == ref_grad.view(torch.uint8)).float().mean()
                assert same > 0.999, f"only {same:.5f} of the gradient's bytes are equal"
                ms = bench(
                    lambda: persistent(logits, targets, programs, block, warps)  # noqa: B023
                )
                rows.append({"rows": N, "kernel": "persistent", "programs_per_sm": per_sm,
                             "block": block, "warps": warps, "ms": ms,
                             "GB_per_s_one_read": moved / ms / 1e6})  # fmt: skip
                print(f"N={N} {per_sm}/SM BLOCK={block} warps={warps}: {ms:.3f} ms", flush=True)
    results.save_rows(rows, args.out, "cuda")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
