"""Microbenchmark: bf16 matmul vs torch._scaled_mm (fp8) on GPT-2 124M's matmul shapes at
B=64, T=1024.

    python benchmarks/fp8_matmuls.py results/h200-fp8-matmul-DATE.json
        (a CUDA GPU of compute capability >= 8.9)

Made ``results/h200-fp8-matmul-2026-11-30.json`` (with the same shapes, dtypes and timing as this
file; ``...-rerun-2026-11-30.json`` is this file's own run). Each matmul: 5 warm-up calls, then the
median of 20 CUDA-event-timed calls. ``a`` is (M, K) row-major and ``b`` (N, K), so ``b.t()`` is the
column-major operand ``_scaled_mm`` needs; scales are 1 (the timing does not depend on them). The
LM-head rows use one chunk of the fused LM-head CE (32768 rows); the gradient operand is e5m2 and
the backward matmuls run without fast accumulation, as ``helpers.core.kernels.fused_ce`` always runs
them.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from helpers.measure import results
from helpers.tools import cli

E4, E5 = torch.float8_e4m3fn, torch.float8_e5m2


def bench(fn, n: int = 20, warmup: int = 5) -> float:
    """Median ms of ``n`` CUDA-event-timed calls of ``fn`` after ``warmup`` untimed ones."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(n):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    times.sort()
    return times[len(times) // 2]


def mm_pair(M: int, N: int, K: int, a_dtype=E4, b_dtype=E4, fast: bool = True) -> dict:
    """bf16 (M, K) @ (K, N) against the same shapes in fp8 through torch._scaled_mm
    (bf16 output)."""
    one = torch.ones((), device="cuda")
    a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(N, K, device="cuda", dtype=torch.bfloat16)
    t_bf16 = bench(lambda: a @ b.t())
    a8, b8 = a.to(a_dtype), b.to(b_dtype)
    try:
        t_f8 = bench(
            lambda: torch._scaled_mm(
                a8, b8.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16, use_fast_accum=fast
            )
        )
    except (
        Exception
    ) as e:  # a shape or dtype pair this GPU's fp8 matmul refuses: reported, not faked
        t_f8 = repr(e)[:200]
    flops = 2 * M * N * K
    return dict(
        M=M,
        N=N,
        K=K,
        a=str(a_dtype),
        b=str(b_dtype),
        fast_accum=fast,
        bf16_ms=t_bf16,
        fp8_ms=t_f8,
        bf16_tflops=flops / t_bf16 / 1e9,
        fp8_tflops=(flops / t_f8 / 1e9 if isinstance(t_f8, float) else None),
    )


def main(out_path: Path) -> None:
    torch.backends.cuda.matmul.allow_tf32 = True
    rows = []
    R, V, C = 32768, 50304, 768  # one chunk of the fused LM-head CE at B=64
    rows.append(dict(name="lm_head logits (x @ W.T)", **mm_pair(R, V, C)))
    rows.append(dict(name="lm_head dx (G @ W)", **mm_pair(R, C, V, E5, E4, False)))
    rows.append(dict(name="lm_head dW (G.T @ x)", **mm_pair(V, C, R, E5, E4, False)))
    M = 65536
    shapes = {
        "c_attn fwd": (M, 3 * C, C),
        "attn c_proj fwd": (M, C, C),
        "c_fc fwd": (M, 4 * C, C),
        "mlp c_proj fwd": (M, C, 4 * C),
        "c_fc dx": (M, C, 4 * C),
        "c_fc dW": (4 * C, C, M),
        "mlp c_proj dx": (M, 4 * C, C),
        "mlp c_proj dW": (C, 4 * C, M),
    }
    for name, (m, n, k) in shapes.items():
        rows.append(dict(name=name, **mm_pair(m, n, k, E4, E4, True)))
    # overheads: transposing the fp8 gradient with PyTorch's copy, casting with a tensorwise amax
    g8 = torch.randn(R, V, device="cuda", dtype=torch.bfloat16).to(E5)
    x = torch.randn(R, C, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(V, C, device="cuda", dtype=torch.bfloat16)

    def cast(t):
        s = 448.0 / t.abs().amax().float().clamp(min=1e-12)
        return (t.float() * s).to(E4), s.reciprocal()

    compiled_cast = torch.compile(cast)
    over = {
        "transpose G8 (32768x50304 fp8) ms": bench(lambda: g8.t().contiguous()),
        "amax+cast x chunk (eager) ms": bench(lambda: cast(x)),
        "amax+cast W (eager) ms": bench(lambda: cast(w)),
        "amax+cast W (compiled) ms": bench(lambda: compiled_cast(w)),
    }
    out = dict(
        gpu=torch.cuda.get_device_name(),
        torch=torch.__version__,
        cuda=torch.version.cuda,
        rows=rows,
        overheads=over,
    )
    results.save(out, out_path)
    for r in rows:
        f8 = (
            r["fp8_ms"]
            if isinstance(r["fp8_ms"], str)
            else f"{r['fp8_ms']:.3f} ms ({r['fp8_tflops']:.0f} TFLOP/s)"
        )
        print(
            f"{r['name']:<26} {r['M']:6d}x{r['N']:6d}x{r['K']:6d} bf16 {r['bf16_ms']:.3f} ms "
            f"({r['bf16_tflops']:.0f} TFLOP/s)  fp8 {f8}"
        )
    for k, v in over.items():
        print(k, round(v, 3))


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path, help="the JSON file to write (OUT.json)")
    cli.add_force(p, "OUT.json")
    args = p.parse_args()
    out_file = results.checked_out(p, args.out, args.force, flag="OUT")
    if not torch.cuda.is_available():
        p.error("needs a CUDA GPU of compute capability >= 8.9")
    main(out_file)
