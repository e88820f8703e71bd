"""LM head + cross-entropy alone, three ways, on the GPU (the fused LM-head CE rung's experiment).

    python benchmarks/lm_head_ce.py --tokens 16384 65536 --out results/h200-lm-head-ce.json

Times forward + backward of ``logits = x @ W.T`` and the mean cross-entropy (x: (N, 768), W:
(50304, 768), bf16, random ids) for: PyTorch (``F.cross_entropy(logits.float())``), the two-kernel
Triton CE (``kernels.cross_entropy``: forward reads the logits, backward reads them again and writes
their gradient) and the fused one (``kernels.linear_cross_entropy``: one kernel writes loss and
gradient, the backward matmuls run in the forward), the two-kernel CE for 4, 8 and 16 warps per
row and the fused one for several chunk sizes. Then the fused kernel alone for a few launch
settings (warps per row, columns per iteration), with its effective bandwidth, and the LM head's
matmuls (two layouts of the weight gradient). Timing: ``helpers.measure.timing.measure`` (CUDA
events, median). The launch settings it varies (``triton_ce.NUM_WARPS``, ``fused_ce.FUSED_*`` of
``helpers.core.kernels``) are restored afterwards.
"""

from __future__ import annotations

import argparse
import sys

import torch
import torch.nn.functional as F

from helpers.core import kernels
from helpers.core.kernels import fused_ce, triton_ce
from helpers.measure import results, timing


def fwd_bwd(kind: str, x: torch.Tensor, w: torch.Tensor, t: torch.Tensor):
    def step():
        x.grad = w.grad = None
        if kind == "fused":
            loss = kernels.linear_cross_entropy(x, w, t)
        else:
            logits = x @ w.t()
            loss = (
                kernels.cross_entropy(logits, t)
                if kind == "triton"
                else F.cross_entropy(logits.float(), t)
            )
        loss.backward()

    return step


def bench(N: int, V: int, C: int, iters: int, dev: torch.device) -> list[dict]:
    """All measurements at N rows (see the module docstring)."""
    rows = []
    torch.manual_seed(0)
    x = (torch.randn(N, C, device=dev)).bfloat16().requires_grad_()
    w = (torch.randn(V, C, device=dev) * 0.02).bfloat16().requires_grad_()
    t = torch.randint(
        0, min(V, 50257), (N,), device=dev
    )  # real GPT-2 ids; padded columns never targets
    saved = (
        triton_ce.NUM_WARPS,
        fused_ce.FUSED_CHUNK_ROWS,
        fused_ce.FUSED_NUM_WARPS,
        fused_ce.FUSED_BLOCK,
    )

    def record(what: str, ms: float, **extra) -> None:
        rows.append({"N": N, "what": what, "ms": ms, **extra})
        more = "  ".join(f"{v:,.0f} {k}" for k, v in extra.items())
        print(f"N={N:<6} {what:<48} {ms:8.2f} ms  {more}", flush=True)

    for kind in ("pytorch", "triton"):
        for warps in (4, 8, 16) if kind == "triton" else (None,):
            if warps:
                triton_ce.NUM_WARPS = warps
            record(
                f"LM head + CE forward+backward, {kind}" + (f", {warps} warps" if warps else ""),
                timing.measure(fwd_bwd(kind, x, w, t), dev, warmup=3, iters=iters).median_ms,
            )
    triton_ce.NUM_WARPS = saved[0]
    for chunk in (None, 32768, 16384, 8192, 4096):
        if chunk is None or chunk < N:
            fused_ce.FUSED_CHUNK_ROWS = chunk
            record(
                f"LM head + CE forward+backward, fused, chunks of {chunk or N} rows",
                timing.measure(fwd_bwd("fused", x, w, t), dev, warmup=3, iters=iters).median_ms,
            )
    fused_ce.FUSED_CHUNK_ROWS = saved[1]
    with torch.no_grad():
        logits = x @ w.t()
        nbytes = (
            2 * logits.numel() * logits.element_size()
        )  # one read + one write: the least it can move
        for warps in (2, 4, 8, 16):
            for block in (4096, 8192):
                fused_ce.FUSED_NUM_WARPS, fused_ce.FUSED_BLOCK = warps, block
                ms = timing.measure(
                    lambda: fused_ce._cross_entropy_rows_with_grad(logits, t),
                    dev,
                    warmup=2,
                    iters=iters,
                ).median_ms
                record(
                    f"fused kernel, {warps} warps, block {block}",
                    ms,
                    GB_per_s_at_one_read_one_write=nbytes / ms / 1e6,
                )
        fused_ce.FUSED_NUM_WARPS, fused_ce.FUSED_BLOCK = saved[2], saved[3]
        g = logits  # same shape and dtype as the gradient G
        for what, fn in (
            ("logits = x @ W.T", lambda: x @ w.t()),
            ("dx = G @ W", lambda: g @ w),
            ("dW = G.T @ x", lambda: g.t() @ x),
            ("dW = (x.T @ G).T", lambda: (x.t() @ g).t()),
        ):
            ms = timing.measure(fn, dev, warmup=2, iters=iters).median_ms
            record(f"matmul {what}", ms, TFLOP_per_s=2 * N * V * C / ms / 1e9)
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, nargs="+", default=[16384, 65536], help="N = B*T rows")
    p.add_argument("--vocab", type=int, default=50304)
    p.add_argument("--n-embd", type=int, default=768)
    p.add_argument("--iters", type=int, default=20)
    results.add_out(p)
    args = p.parse_args(argv)
    args.out = results.checked_out(p, args.out, args.force)
    if not torch.cuda.is_available():
        print("benchmarks/lm_head_ce.py needs a CUDA GPU", file=sys.stderr)
        return 2
    dev = torch.device("cuda")
    rows = []
    V, C = args.vocab, args.n_embd
    for N in args.tokens:
        rows += bench(N, V, C, args.iters, dev)
    out = {
        **results.provenance(dev),
        "vocab": V,
        "n_embd": C,
        "timing": f"median of {args.iters} CUDA-event-timed calls",
        "rows": rows,
    }
    results.save(out, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
