"""The column sums of the step's partial-sum workspaces (``helpers.core.kernels.colsum``) against
PyTorch's eager ``x.sum(dim=0)``, at each block config, on a CUDA GPU:

    python benchmarks/colsum.py --out results/h200-colsum-DATE.json

Shapes: what inductor's mix-order reductions leave per LayerNorm gradient at B=16 and B=64 on a
132-SM GPU (split 16 -> (1024, 768), split 32 -> (2048, 768)), and the one-pass QKV gradient's
partial sums at B=16 and B=64 ((256, 2304), (1024, 2304)), all fp32. Each is timed with
``triton.testing.do_bench_cudagraph`` (the calls replayed from a CUDA graph, as in the step's
"+ CUDA graphs" rung, so the launch cost is not what is measured), and each config is checked
against ``x.double().sum(0)`` first. The step without them: ``python benchmarks/perf.py
--variants final eager-final-sums --profile``.
"""

from __future__ import annotations

import sys

import torch

from helpers.core.kernels import colsum
from helpers.measure import results

SHAPES = ((1024, 768), (2048, 768), (256, 2304), (1024, 2304))
CONFIGS = [
    {"block_r": r, "block_n": n, "num_warps": w}
    for r in (32, 64)
    for n in (16, 32, 64)
    for w in (2, 4)
]


def sweep(R: int, N: int) -> dict:
    """Time the column sums of one (R, N) fp32 tensor.

    Returns:
        {"torch_sum": {"ms", "GB/s"}, "shipped": {"ms", "GB/s", "config"}, "configs": [{**config,
        "ms", "GB/s"}, ...] fastest first}; ms per call from ``do_bench_cudagraph``, GB/s counts
        the R * N * 4 bytes read.

    Raises:
        AssertionError: a config's sums differ from float64 sums by more than 1e-4 (relative).
    """
    from triton.testing import do_bench_cudagraph

    x = torch.randn(R, N, device="cuda")
    want = x.double().sum(0)
    gbs = lambda ms: R * N * 4 / ms / 1e6  # noqa: E731
    ms = do_bench_cudagraph(lambda: x.sum(dim=0))
    out = {"torch_sum": {"ms": ms, "GB/s": gbs(ms)}, "configs": []}
    for config in CONFIGS:
        got = colsum._colsum_impl(x, **config).double()
        if not torch.allclose(got, want, rtol=1e-4, atol=1e-3):
            raise AssertionError(f"colsum config {config} gave wrong sums at {(R, N)}")
        ms = do_bench_cudagraph(lambda c=config: colsum._colsum_impl(x, **c))
        out["configs"].append({**config, "ms": ms, "GB/s": gbs(ms)})
    out["configs"].sort(key=lambda r: r["ms"])
    ms = do_bench_cudagraph(lambda: colsum.colsum(x))
    shipped = {"block_r": colsum.BLOCK_R, "block_n": colsum.BLOCK_N}
    out["shipped"] = {"ms": ms, "GB/s": gbs(ms), "config": shipped}
    return out


def measure(args) -> dict:
    """Every shape's sweep, with one summary line each printed."""
    shapes = {f"{R}x{N}": sweep(R, N) for R, N in SHAPES}
    for shape, r in shapes.items():
        best = r["configs"][0]
        print(
            f"{shape:>10}: torch sum {r['torch_sum']['ms'] * 1e3:6.1f} us, colsum as shipped "
            f"{r['shipped']['ms'] * 1e3:6.1f} us, best {best['ms'] * 1e3:6.1f} us at "
            f"{ {k: best[k] for k in ('block_r', 'block_n', 'num_warps')} }"
        )
    return {"shapes": shapes}


def main(argv=None) -> int:
    return results.gpu_benchmark_main(
        argv, __doc__, __file__, "a CUDA GPU with Triton", measure,
        available=lambda: colsum.available("cuda"),
    )  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
