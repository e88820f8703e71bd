"""Microbenchmark: the fp8 LM head's cross-entropy kernel, one read of each row against two.

The kernel reading each row of logits once, from registers, against the kernel that reads it twice:

    python benchmarks/ce_one_read.py --out results/h200-ce-one-read-DATE.json

``fused_ce._ce_fused_e5m2_kernel`` takes a row's log-sum-exp in one pass over its 50304 bf16 logits
and writes the e5m2 gradient in a second: 5 bytes of HBM traffic per logit, since more rows are in
flight than L2 keeps (``ce_rows_in_flight.py``). ``_ce_row_in_registers_e5m2_kernel`` loads the
whole row into the registers of one program (blocks of 32768 + 16384 + 2048 columns,
``fused_ce.row_parts``) and writes the gradient from there: 3 bytes per logit. Each config: warps
per program and whether exp(x - max) is kept for the gradient (``keep_exp``, more registers) or
computed again. Checked against the two-read kernel before timing: the same losses to fp32 rounding
and the gradient's e5m2 bytes (at most one step apart where a value sits on a rounding boundary).
Timing: 5 warm-up calls, median of 20 CUDA-event-timed calls (``fp8_matmuls.bench``); one call =
one chunk of the fused LM-head CE (32768 rows at B=64, two per step; 16384 at B=16, one), logits
~ N(0, 2^2) in bf16, random targets. "GB/s" counts 3 bytes per logit for both kernels (the bytes a
one-read kernel must move), so the two-read kernel's figure is below its real traffic.

The step with it: ``python benchmarks/perf.py --variants final ce-one-read-16`` (and the other
``ce-one-read-*`` variants).
"""

from __future__ import annotations

import argparse
import sys
from unittest import mock

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from fp8_matmuls import bench  # noqa: E402

from helpers.core.kernels import fused_ce  # noqa: E402
from helpers.measure import results  # noqa: E402

V = 50304
CONFIGS = [(w, keep) for w in (4, 8, 16, 32) for keep in (False, True)]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, nargs="+", default=[32768, 16384])
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("benchmarks/ce_one_read.py needs a CUDA GPU", file=sys.stderr)
        return 2
    op = fused_ce._cross_entropy_rows_with_e5m2_grad
    rows = []

    def add(row: dict) -> None:  # written after each config, so a call cut short keeps its rows
        rows.append(row)
        results.save_rows(rows, args.out, "cuda")

    for N in args.rows:
        logits = (torch.randn(N, V, device="cuda") * 2).to(torch.bfloat16)
        targets = torch.randint(0, V, (N,), device="cuda")
        moved = 3 * logits.numel()  # bytes: the bf16 logits read once, the e5m2 gradient written
        with mock.patch.object(fused_ce, "ONE_READ_WARPS", None):
            ref_loss, ref_grad = op(logits, targets)
            ms = bench(lambda: op(logits, targets))  # noqa: B023
        add({"rows": N, "kernel": "two reads", "warps": fused_ce.FUSED_NUM_WARPS,
                     "ms": ms, "GB_per_s_3_bytes": moved / ms / 1e6})  # fmt: skip
        print(f"N={N} two reads ({fused_ce.FUSED_NUM_WARPS} warps): {ms:.3f} ms", flush=True)
        for warps, keep in CONFIGS:
            patch = {"ONE_READ_WARPS": warps, "ONE_READ_KEEP_EXP": keep}
            with mock.patch.multiple(fused_ce, **patch):
                try:
                    loss, grad = op(logits, targets)
                    torch.cuda.synchronize()
                except Exception as e:  # e.g. out of registers or shared memory at this config
                    add({"rows": N, "kernel": "one read", "warps": warps,
                         "keep_exp": keep, "error": repr(e)[:300]})  # fmt: skip
                    print(f"N={N} one read, {warps} warps, keep_exp={keep}: {e!r}"[:300])
                    continue
                assert torch.allclose(loss, ref_loss, rtol=1e-5, atol=1e-5), "loss differs"
                a, b = grad.view(torch.uint8).int(), ref_grad.view(torch.uint8).int()
                equal = (a == b).float().mean().item()
                assert (a - b).abs().max().item() <= 1 and equal > 0.999, equal
                ms = bench(lambda: op(logits, targets))  # noqa: B023
            add({"rows": N, "kernel": "one read", "warps": warps, "keep_exp": keep,
                         "ms": ms, "bytes_equal": equal,
                         "GB_per_s_3_bytes": moved / ms / 1e6})  # fmt: skip
            gbs = moved / ms / 1e6
            print(f"N={N} one read, {warps} warps, keep_exp={keep}: {ms:.3f} ms "
                  f"({gbs:.0f} GB/s, {equal:.6f} bytes equal)", flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
