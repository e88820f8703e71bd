"""Microbenchmark: the blocks' weight-gradient matmuls ``dW = dy.T @ x`` in bf16, as written and
with the operands swapped (``(x.T @ dy).T``, the same numbers in the other memory order).

    python benchmarks/wgrad_layouts.py --out results/h200-wgrad-layouts-DATE.json

In the B=64 profile of the last rung (``results/h200-perf-fp8-attn-b64-2026-12-04.json``) the MLP's
two weight gradients ran at about 680 TFLOP/s and the attention's at about 865 with the same
M = 65536 summed rows: cuBLAS picks its kernel by shape and layout, so the other order of the
same product may get another kernel. Each matmul: 5 warm-up calls, then the median of 20
CUDA-event-timed calls (``fp8_matmuls.bench``); ``dy`` (M, N) and ``x`` (M, K) contiguous bf16
random.
"""

from __future__ import annotations

import argparse
import sys

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from fp8_matmuls import bench  # noqa: E402

from helpers.measure import results  # noqa: E402

C = 768
LINEARS = {  # name: (N, K) of its weight
    "c_attn": (3 * C, C),
    "attn.c_proj": (C, C),
    "c_fc": (4 * C, C),
    "mlp.c_proj": (C, 4 * C),
}


def layouts(dy: torch.Tensor, x: torch.Tensor) -> dict:
    """The ways to compute dW (N, K) = dy.T @ x, each a zero-argument callable."""
    return {
        "dy.T @ x": lambda: dy.t() @ x,
        "(x.T @ dy).T": lambda: (x.t() @ dy).t(),
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, nargs="+", default=[65536, 16384], help="M = B * T")
    results.add_out(p)
    args = p.parse_args(argv)
    args.out = results.checked_out(p, args.out, args.force)
    if not torch.cuda.is_available():
        print("benchmarks/wgrad_layouts.py needs a CUDA GPU", file=sys.stderr)
        return 2
    rows = []
    for M in args.rows:
        for name, (N, K) in LINEARS.items():
            dy = torch.randn(M, N, device="cuda", dtype=torch.bfloat16)
            x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
            ways = layouts(dy, x)
            ref = ways["dy.T @ x"]().float()
            for way, fn in ways.items():
                assert torch.allclose(fn().float(), ref, rtol=2e-2, atol=1.0), way
                ms = bench(fn)
                tflops = 2 * M * N * K / (ms / 1e3) / 1e12
                rows.append({"M": M, "linear": name, "N": N, "K": K, "way": way, "ms": ms,
                             "tflops": tflops})  # fmt: skip
                print(f"M={M:<6} {name:<12} {way:<14} {ms:7.3f} ms {tflops:6.0f} TFLOP/s",
                      flush=True)  # fmt: skip
    results.save_rows(rows, args.out, "cuda")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
