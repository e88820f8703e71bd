"""The fp8 MLP's two one-pass Triton kernels alone (rung "+ fp8 MLP",
``helpers.core.kernels.fp8_mlp``) against the bf16 GELU kernels torch.compile generates for the
rung before, at one B=64 layer's size, on a CUDA GPU with fp8 (compute capability >= 8.9):

    python benchmarks/fp8_mlp.py --out results/h200-fp8-mlp-kernels-DATE.json

The step with and without the rung: ``python benchmarks/perf.py --variants final bf16-mlp``.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

from helpers.core.kernels import fp8_available
from helpers.core.kernels.fp8_mlp import (
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
        {name: {"ms": median ms per call (triton.testing.do_bench), "GB/s": bytes that must move
        / time, "config": autotune's pick}}
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


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=None, help="write the JSON here too")
    args = p.parse_args(argv)
    ok, why = fp8_available("cuda") if torch.cuda.is_available() else (False, "no CUDA GPU")
    if not ok:
        print(f"benchmarks/fp8_mlp.py needs a GPU with fp8 tensor cores: {why}", file=sys.stderr)
        return 2
    out = {**results.provenance(torch.device("cuda")), "kernels": bench_kernels()}
    text = json.dumps(out, indent=1)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
