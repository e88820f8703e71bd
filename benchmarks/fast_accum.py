"""Microbenchmark: the fp8 gradient matmuls with and without Hopper's fast fp8 accumulation.

    python benchmarks/fast_accum.py --out results/h200-fast-accum-DATE.json
        (a CUDA GPU of compute capability >= 8.9)

``torch._scaled_mm(..., use_fast_accum=True)`` lets the tensor cores keep partial sums in their
reduced-precision accumulator instead of promoting them to fp32 every few K-steps (the DeepSeek-V3
report, arXiv:2412.19437 section 3.3.2, measured that accumulator at about 14 bits on Hopper).
torchao's float8 recipes use it for the forward matmul only. This file times each of the course's
fp8 gradient matmuls at B=64 both ways (5 warm-up calls, median of 20 CUDA-event timings) and
gives each result's relative error, ``||out - ref|| / ||ref||``, against the fp32 product of the
same fp8 operands (what exact accumulation would give), so speed and error are read side by side:

- the fp8 MLP's input gradients (``helpers.core.kernels.fp8_mlp``): ``da = dy8 @ W_proj`` (K = 768)
  and ``dx = dh8 @ W_fc`` (K = 3072), e4m3 with rowwise scales;
- the fp8 LM head's gradients (``helpers.core.kernels.fused_ce``, one 32768-row chunk):
  ``dx = G @ W`` (K = 50304) and ``dW = G.T @ x`` (K = 32768), G in e5m2.

Operands are random normal (G: a softmax minus one-hot per row, as the cross-entropy's gradient).
"""

from __future__ import annotations

import argparse
import sys

import torch

from helpers.measure import results

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from fp8_matmuls import bench  # noqa: E402

E4, E5 = torch.float8_e4m3fn, torch.float8_e5m2


def to_fp8(t: torch.Tensor, dtype: torch.dtype, rowwise: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(t cast to ``dtype`` with each row's amax (rowwise) or the tensor's at the dtype's largest
    value, the inverse scales: (rows, 1) or 0-d fp32)."""
    amax = (t.abs().amax(dim=1, keepdim=True) if rowwise else t.abs().amax()).float()
    amax = amax.clamp(min=1e-12)
    scale = torch.finfo(dtype).max / amax
    return (t.float() * scale).to(dtype).contiguous(), scale.reciprocal()


def case(name: str, a: torch.Tensor, b: torch.Tensor, a_dtype: torch.dtype, rowwise: bool) -> dict:
    """``a @ b.t()`` with a (M, K) and b (N, K): fp8 (rowwise scales as the fp8 MLP, or one per
    tensor as the fp8 LM head) with and without fast accumulation, timed, each with its relative
    error against the fp32 product of the fp8 operands."""
    a8, a_inv = to_fp8(a, a_dtype, rowwise)
    b8, b_inv = to_fp8(b, E4, rowwise)
    ref = (a8.float() * a_inv) @ (b8.float() * b_inv).t()
    row = {"name": name, "M": a.shape[0], "N": b.shape[0], "K": a.shape[1]}
    for fast in (False, True):

        def mm(fast=fast):
            return torch._scaled_mm(
                a8,
                b8.t(),
                scale_a=a_inv,
                scale_b=b_inv.t(),
                out_dtype=torch.bfloat16,
                use_fast_accum=fast,
            )

        key = "fast" if fast else "exact"
        row[f"{key}_ms"] = bench(mm)
        err = (mm().float() - ref).norm() / ref.norm()
        row[f"{key}_rel_err"] = err.item()
    row["speedup"] = row["exact_ms"] / row["fast_ms"]
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    results.add_out(p, help="write the rows as JSON to this file")
    args = p.parse_args()
    args.out = results.checked_out(p, args.out, args.force)
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9):
        sys.exit("needs a CUDA GPU with fp8 tensor cores (compute capability >= 8.9)")
    torch.manual_seed(0)
    dev, bf = "cuda", torch.bfloat16
    M, C, V, R = 65536, 768, 50304, 32768
    rows = [
        case("mlp da = dy @ W_proj", torch.randn(M, C, device=dev, dtype=bf),
             torch.randn(4 * C, C, device=dev, dtype=bf) * 0.02, E4, True),
        case("mlp dx = dh @ W_fc", torch.randn(M, 4 * C, device=dev, dtype=bf),
             torch.randn(C, 4 * C, device=dev, dtype=bf) * 0.02, E4, True),
    ]  # fmt: skip
    logits = torch.randn(R, V, device=dev) * 2
    G = torch.softmax(logits, dim=1)
    G[torch.arange(R, device=dev), torch.randint(0, V, (R,), device=dev)] -= 1.0
    del logits
    G = G.to(bf)
    x = torch.randn(R, C, device=dev, dtype=bf)
    w = torch.randn(C, V, device=dev, dtype=bf) * 0.02
    rows.append(case("lm head dx = G @ W", G, w, E5, False))
    rows.append(case("lm head dW = G.T @ x", G.t().contiguous(), x.t().contiguous(), E5, False))
    for r in rows:
        print(
            f"{r['name']:<24} M={r['M']:>5} N={r['N']:>5} K={r['K']:>5}"
            f"  exact {r['exact_ms']:.3f} ms (err {r['exact_rel_err']:.1e})"
            f"  fast {r['fast_ms']:.3f} ms (err {r['fast_rel_err']:.1e})  x{r['speedup']:.2f}"
        )
    results.save_rows(rows, args.out, "cuda")


if __name__ == "__main__":
    main()
