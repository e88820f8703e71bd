"""The fp8 LM head's transpose (``helpers.core.kernels.transpose_fp8``) at every tile config of its
autotune list, on a CUDA GPU:

    python benchmarks/fp8_transpose.py --out results/h200-fp8-transpose-DATE.json

The LM head's weight gradient G.T @ x runs on fp8 tensor cores, which take both operands with the
summed dimension (the tokens) contiguous, so each chunk's e5m2 gradient G (rows x 50304) is
transposed in memory once per step. Each shape is timed at each config of ``TRANSPOSE_CONFIGS``
(tile bytes BM x BN, warps), as autotuned, and next to a plain copy of the same bytes
(``Tensor.copy_``: the bandwidth a one-pass kernel can hope for). Shapes: the fused CE's chunk at
B=64 (32768 rows of the 65536) and the whole B=16 step (16384 rows).

The step with and without the larger tiles: ``python benchmarks/perf.py --variants
transpose-tile-64 final``.
"""

from __future__ import annotations

import sys

import torch

from helpers.core.kernels import fp8, fp8_available
from helpers.measure import results

SHAPES = ((32768, 50304), (16384, 50304))


def sweep(M: int, N: int) -> dict:
    """Time the transposes of one (M, N) float8_e5m2 tensor.

    Returns:
        {"copy": {"ms", "GB/s"}, "autotuned": {"ms", "GB/s", "config"},
        "configs": [{**config, "ms", "GB/s"}, ...] fastest first}; ms is the mean per call
        (``triton.testing.do_bench``'s default), GB/s counts the 2 * M * N bytes read and written.
    """
    from triton.testing import do_bench

    g = (torch.randn(M, N, device="cuda") * 1e3).to(torch.float8_e5m2)
    want = g.t().contiguous().view(torch.uint8)
    gbs = lambda ms: 2 * M * N / ms / 1e6  # noqa: E731
    dst = torch.empty_like(g)
    copy_ms = do_bench(lambda: dst.copy_(g), warmup=25, rep=200)
    out = {"copy": {"ms": copy_ms, "GB/s": gbs(copy_ms)}, "configs": []}
    for config in fp8.TRANSPOSE_CONFIGS:
        if not torch.equal(fp8._transpose_impl(g, config).view(torch.uint8), want):
            raise AssertionError(f"transpose config {config} gave a wrong result at {(M, N)}")
        ms = do_bench(lambda c=config: fp8._transpose_impl(g, c), warmup=25, rep=100)
        out["configs"].append({**config, "ms": ms, "GB/s": gbs(ms)})
    out["configs"].sort(key=lambda r: r["ms"])
    ms = do_bench(lambda: fp8.transpose_fp8(g), warmup=25, rep=100)
    out["autotuned"] = {"ms": ms, "GB/s": gbs(ms), "config": str(fp8._transpose_tuned.best_config)}
    return out


def main(argv=None) -> int:
    return results.gpu_benchmark_main(
        argv, __doc__, __file__, "a GPU with fp8",
        lambda args: {"shapes": {f"{M}x{N}": sweep(M, N) for M, N in SHAPES}},
        available=lambda: fp8_available("cuda"),
    )  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
