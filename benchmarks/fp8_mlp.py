"""The fp8 MLP's two one-pass Triton kernels alone (rung "+ fp8 MLP",
``helpers.core.kernels.fp8_mlp``) against the bf16 GELU kernels torch.compile generates for the
rung before, at one B=64 layer's size, on a CUDA GPU with fp8 (compute capability >= 8.9):

    python benchmarks/fp8_mlp.py --out results/h200-fp8-mlp-kernels-DATE.json
    python benchmarks/fp8_mlp.py --sweep --out ...   # also every tile config, and a plain copy

``--sweep`` times each kernel at every config of its autotune list (``FORWARD_CONFIGS``,
``BACKWARD_CONFIGS``: rows per tile, tiles per program, prefetching loop or not, warps) and, for
the backward, other rows per program than ``BACKWARD_ROWS``, next to a bf16 copy of the same
(M, N) (``Tensor.copy_``: the bandwidth a one-pass kernel can hope for).

The step with and without the rung: ``python benchmarks/perf.py --variants final bf16-mlp``.
"""

from __future__ import annotations

import sys

import torch

from helpers.core.kernels import fp8_available
from helpers.core.kernels.fp8_mlp import (
    BACKWARD_CONFIGS,
    FORWARD_CONFIGS,
    _bwd_kernel,
    _fwd_kernel,
    gelu_backward_rowwise_e4m3,
    gelu_rowwise_e4m3,
)
from helpers.measure import results


def bench_kernels(M: int = 65536, N: int = 3072) -> dict:
    """Time the two kernels at (M, N) = (64 * 1024 rows, 4 * 768) against inductor's bf16 GELU
    forward and its backward with the bias gradient (what the rung before runs there).

    Returns:
        {name: {"ms": mean ms per call (triton.testing.do_bench's default), "GB/s": bytes that
        must move / time, "config": autotune's pick}}
    """
    from triton.testing import do_bench

    h = torch.randn(M, N, device="cuda", dtype=torch.bfloat16)
    da = torch.randn(M, N, device="cuda", dtype=torch.bfloat16) * 1e-3
    gelu = torch.compile(lambda t: torch.nn.functional.gelu(t, approximate="tanh"))

    def gelu_bwd_bias(d, t):
        t = t.detach().requires_grad_()
        g = torch.autograd.grad(torch.nn.functional.gelu(t, approximate="tanh"), t, d)[0]
        return g, g.float().sum(0)

    gelu_bwd_c = torch.compile(gelu_bwd_bias)
    el = M * N
    cases = {
        # bytes: bf16 in and out (+ fp8 out) per element; the backward reads two tensors
        "gelu_rowwise_e4m3": (lambda: gelu_rowwise_e4m3(h), 5 * el),
        "inductor GELU (bf16)": (lambda: gelu(h), 4 * el),
        "gelu_backward_rowwise_e4m3": (lambda: gelu_backward_rowwise_e4m3(da, h), 7 * el),
        "inductor GELU backward + bias sum (bf16)": (lambda: gelu_bwd_c(da, h), 6 * el),
    }
    out = {}
    for name, (fn, nbytes) in cases.items():
        ms = do_bench(fn, warmup=25, rep=200)
        out[name] = {"ms": ms, "GB/s": nbytes / ms / 1e6}
    out["gelu_rowwise_e4m3"]["config"] = str(_fwd_kernel.best_config)
    out["gelu_backward_rowwise_e4m3"]["config"] = str(_bwd_kernel.best_config)
    return out


def sweep_configs(M: int = 65536, N: int = 3072) -> dict:
    """Each GELU kernel at fixed configs (not autotuned): every autotune config, and for the
    backward also other rows per program; next to a bf16 copy of (M, N).

    Returns:
        {"copy": {"ms", "GB/s"}, "forward": [{**config, "ms", "GB/s"}, ...],
        "backward": [{**config, "rows_per_program", "ms", "GB/s"}, ...]}, fastest first; GB/s
        counts the bytes that must move (5 B/element forward, 7 backward, 4 for the copy).
    """
    from triton.testing import do_bench

    from helpers.core.kernels import fp8_mlp

    h = torch.randn(M, N, device="cuda", dtype=torch.bfloat16)
    da = torch.randn(M, N, device="cuda", dtype=torch.bfloat16) * 1e-3
    a = torch.empty_like(h)
    el = M * N
    copy_ms = do_bench(lambda: a.copy_(h), warmup=25, rep=200)
    out = {"copy": {"ms": copy_ms, "GB/s": 4 * el / copy_ms / 1e6}, "forward": [], "backward": []}
    as_is = lambda kernel: kernel  # noqa: E731  (launch the raw kernel with the config given)
    for config in FORWARD_CONFIGS:
        ms = do_bench(lambda c=config: fp8_mlp._gelu_impl(h, as_is, c), warmup=25, rep=100)
        out["forward"].append({**config, "ms": ms, "GB/s": 5 * el / ms / 1e6})
    backward = [*BACKWARD_CONFIGS]
    for per_program in (16, 64):  # other programs than BACKWARD_ROWS (each its partial sums)
        for c in BACKWARD_CONFIGS:
            backward.append({**c, "GROUPS": per_program // c["ROWS"]})
    for config in backward:
        per_program = config["ROWS"] * config["GROUPS"]
        ms = do_bench(
            lambda c=config: fp8_mlp._gelu_backward_impl(da, h, as_is, c), warmup=25, rep=100
        )
        out["backward"].append(
            {**config, "rows_per_program": per_program, "ms": ms, "GB/s": 7 * el / ms / 1e6}
        )
    for key in ("forward", "backward"):
        out[key].sort(key=lambda r: r["ms"])
    return out


def measure(args) -> dict:
    out = {"kernels": bench_kernels()}
    if args.sweep:
        out["sweep"] = sweep_configs()
    return out


def main(argv=None) -> int:
    return results.gpu_benchmark_main(
        argv,
        __doc__,
        __file__,
        "a GPU with fp8 tensor cores",
        measure,
        available=lambda: fp8_available("cuda"),
        add_args=lambda p: p.add_argument(
            "--sweep", action="store_true", help="also time every tile config and a copy"
        ),
    )


if __name__ == "__main__":
    sys.exit(main())
