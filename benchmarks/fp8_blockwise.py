"""Would the MLP's weight gradients gain from fp8 with 128-element block scales (DeepSeek-V3's
recipe, https://arxiv.org/abs/2412.19437 section 3.3)? Times, at one B=64 layer's size (M = 65536
rows, C = 768), on a CUDA GPU with fp8 blockwise matmuls (Hopper, CUDA >= 12.9):

- the two weight-gradient matmuls ``dy.T @ a`` (C x 4C) and ``dh.T @ x`` (4C x C) in bf16 (as the
  "+ fp8 MLP" rung runs them), in fp8 with one scale per row / column (the ceiling: such scales
  need a whole column's amax over all M rows first) and in fp8 with one scale per 128 rows of
  each column (1x128 blocks along the summed dimension: computable tile by tile);
- the forward and input-gradient matmuls at the same shapes with rowwise scales (as the rung runs
  them) against 1x128 activation blocks times 128x128 weight blocks (what a GELU kernel writing
  both layouts tile by tile would feed them);
- a Triton kernel that casts a (M, N) bf16 tensor to e4m3 transposed, (N, M), one scale per 128
  rows of each column: the copy of x and dy the fp8 weight gradients would need.

    python benchmarks/fp8_blockwise.py --out results/h200-fp8-blockwise-DATE.json
"""

from __future__ import annotations

import argparse
import json
import sys

import torch
import torch.nn.functional as F

from helpers.core.kernels.fp8 import E4M3_MAX, rowwise_e4m3, scaled_mm
from helpers.measure import results

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from fp8_matmuls import bench  # noqa: E402  (this folder's CUDA-event timer)

E4M3 = torch.float8_e4m3fn
BLOCK = 128


def _time(fn) -> float:
    """Median ms of 30 CUDA-event-timed calls after 3 warm-up calls (``fp8_matmuls.bench``)."""
    return bench(fn, n=30, warmup=3)


def quant_1x128(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(R, K) -> e4m3 (R, K) and dequant scales (R, K / 128) fp32, stride (1, R) (outer-dim-major,
    as cuBLAS's 1x128 mode reads them)."""
    R, K = x.shape
    xb = x.float().view(R, K // BLOCK, BLOCK)
    s = xb.abs().amax(-1).clamp(min=1e-12) / E4M3_MAX  # (R, K / 128)
    x8 = (xb / s[..., None]).to(E4M3).view(R, K)
    return x8, s.t().contiguous().t()


def quant_128x128(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, K) -> e4m3 (N, K) and dequant scales laid out as cuBLAS's 128x128 mode reads them for
    the second operand: (L4, N / 128) with stride (1, L4), L4 = K / 128 rounded up to 4."""
    N, K = w.shape
    wb = w.float().view(N // BLOCK, BLOCK, K // BLOCK, BLOCK)
    s = wb.abs().amax(dim=(1, 3)).clamp(min=1e-12) / E4M3_MAX  # (N / 128, K / 128)
    w8 = (wb / s[:, None, :, None]).to(E4M3).view(N, K)
    L4 = -(-(K // BLOCK) // 4) * 4
    padded = torch.zeros(N // BLOCK, L4, device=w.device)
    padded[:, : K // BLOCK] = s
    return w8, padded.t()


def dequant_1x128(x8, s):
    R, K = x8.shape
    return (x8.float().view(R, K // BLOCK, BLOCK) * s[..., None]).view(R, K)


def rowwise_mm(a8, b8, sa, sb):
    """a8 (M, K) @ b8 (N, K).T with rowwise dequant scales sa (M, 1), sb (N, 1): bf16 (M, N)
    (the fp8 MLP's own ``scaled_mm``, no fast accumulation)."""
    return scaled_mm(a8, b8.t(), sa, sb.t(), False)


def block_mm(a8, b8, sa, ra, sb, rb):
    """a8 (M, K) @ b8 (N, K).T with blockwise scales, recipes ra / rb "1x128" or "128x128"."""
    ST = F.ScalingType
    return F.scaled_mm(
        a8, b8.t(), sa, getattr(ST, f"BlockWise{ra}"), sb, getattr(ST, f"BlockWise{rb}"),
        output_dtype=torch.bfloat16,
    )  # fmt: skip


if torch.cuda.is_available():
    import triton
    import triton.language as tl

    @triton.jit
    def _cast_t_1x128_kernel(x_ptr, y_ptr, s_ptr, M, N, BN: tl.constexpr):
        # y (N, M) e4m3 = x (M, N).T / s, s[kb, n] = amax(|x[kb*128:(kb+1)*128, n]|) / 448,
        # stored at s_ptr + kb * N + n (the (N, M / 128) scale, stride (1, N))
        rm = tl.program_id(0).to(tl.int64) * 128 + tl.arange(0, 128)
        rn = tl.program_id(1).to(tl.int64) * BN + tl.arange(0, BN)
        x = tl.load(x_ptr + rm[:, None] * N + rn[None, :]).to(tl.float32)
        s = tl.maximum(tl.max(tl.abs(x), axis=0), 1e-12) / 448.0
        q = (x / s[None, :]).to(tl.float8e4nv)
        tl.store(y_ptr + rn[None, :] * M + rm[:, None], q)
        tl.store(s_ptr + tl.program_id(0) * N + rn, s)

    def cast_t_1x128(x: torch.Tensor, BN: int = 64, warps: int = 4):
        M, N = x.shape
        y = torch.empty((N, M), dtype=E4M3, device=x.device)
        s = torch.empty((M // BLOCK, N), dtype=torch.float32, device=x.device)
        _cast_t_1x128_kernel[(M // BLOCK, N // BN)](x, y, s, M, N, BN=BN, num_warps=warps)
        return y, s.t()  # (N, M / 128), stride (1, N)


def rel_err(a, b) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rows", type=int, nargs="+", default=[65536, 16384])
    p.add_argument("--n-embd", type=int, default=768)
    results.add_out(p)
    args = p.parse_args(argv)
    args.out = results.checked_out(p, args.out, args.force)
    if not torch.cuda.is_available():
        print("needs a CUDA GPU with fp8 blockwise matmuls (Hopper)", file=sys.stderr)
        return 2
    torch.manual_seed(0)
    C = args.n_embd
    rows = []
    for M in args.rows:
        dev = "cuda"
        x = torch.randn(M, C, device=dev, dtype=torch.bfloat16)  # LayerNorm output
        a = F.gelu(torch.randn(M, 4 * C, device=dev), approximate="tanh").bfloat16()
        dy = torch.randn(M, C, device=dev, dtype=torch.bfloat16) * 1e-3
        dh = torch.randn(M, 4 * C, device=dev, dtype=torch.bfloat16) * 1e-3
        w_proj = torch.randn(C, 4 * C, device=dev) * 0.02
        w_fc = torch.randn(4 * C, C, device=dev) * 0.02
        r = {"M": M, "C": C, "ms": {}, "rel_err": {}, "errors": {}}

        def run(r, name, ref, fn, *fn_args):
            # time fn(*fn_args), its relative error against ref
            try:
                r["rel_err"][name] = rel_err(fn(*fn_args), ref)
                r["ms"][name] = _time(lambda: fn(*fn_args))
            except Exception as e:  # an unsupported recipe or layout: record why
                r["errors"][name] = f"{type(e).__name__}: {str(e)[:300]}"

        # weight gradients: dW_proj (C, 4C) = dy.T @ a, dW_fc (4C, C) = dh.T @ x
        for wname, g, act in (("wgrad_proj", dy, a), ("wgrad_fc", dh, x)):
            ref = g.float().t() @ act.float()
            run(r, f"{wname}_bf16", ref, lambda g, act: g.t() @ act, g, act)
            gT, actT = g.t().contiguous(), act.t().contiguous()
            g8r, gsr = rowwise_e4m3(gT)
            a8r, asr = rowwise_e4m3(actT)
            run(r, f"{wname}_fp8_rowwise", ref, rowwise_mm, g8r, a8r, gsr, asr)
            g8b, gsb = quant_1x128(gT)
            a8b, asb = quant_1x128(actT)
            run(r, f"{wname}_fp8_1x128", ref, block_mm, g8b, a8b, gsb, "1x128", asb, "1x128")
        # forward c_proj y = a @ W_proj.T and input gradient dx = dh @ W_fc: (M, 4C) @ (4C, C)
        for fname, act, w in (("fwd_proj", a, w_proj), ("dgrad_fc", dh, w_fc.t().contiguous())):
            ref = act.float() @ w.float().t()
            a8r, asr = rowwise_e4m3(act)
            w8r, wsr = rowwise_e4m3(w)
            run(r, f"{fname}_fp8_rowwise", ref, rowwise_mm, a8r, w8r, asr, wsr)
            a8b, asb = quant_1x128(act)
            w8b, wsb = quant_128x128(w)
            name = f"{fname}_fp8_1x128_128x128"
            run(r, name, ref, block_mm, a8b, w8b, asb, "1x128", wsb, "128x128")
            run(r, f"{fname}_bf16", ref, lambda act, w: act @ w.t(), act, w.bfloat16())
        # the transposed blockwise cast of x (M, C) and of a (M, 4C)
        for tname, t in (("cast_t_x", x), ("cast_t_a", a)):
            for BN, warps in ((32, 4), (64, 4), (64, 8), (128, 8)):
                name = f"{tname}_BN{BN}_w{warps}"

                def cast(t=t, BN=BN, warps=warps):
                    return cast_t_1x128(t, BN, warps)

                try:
                    y8, s = cast()
                    r["rel_err"][name] = rel_err(dequant_1x128(y8, s), t.t())
                    ms = _time(cast)
                    r["ms"][name] = ms
                    r.setdefault("GB/s", {})[name] = 3 * t.numel() / ms / 1e6
                except Exception as e:
                    r["errors"][name] = f"{type(e).__name__}: {str(e)[:300]}"
            r["ms"][f"{tname}_copy_bf16"] = _time(lambda t=t: t.clone())
        rows.append(r)
        print(json.dumps(r, indent=1), flush=True)
    results.save_rows(rows, args.out, "cuda")
    return 0


if __name__ == "__main__":
    sys.exit(main())
