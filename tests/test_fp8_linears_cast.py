"""benchmarks/fp8_linears.py's variants fp8-attn(-hw) (results/perf-log.md, 2026-12-04 evening):
its one-pass cast kernel and the fp8 linear that uses it against PyTorch, in Triton's CPU
interpreter (a subprocess, since the interpreter is chosen at import) and, on a machine with fp8
tensor cores, on the GPU. The speed was measured on the H200 (benchmarks/perf.py)."""

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from kernel_check import needs_triton, run_script

ROOT = Path(__file__).resolve().parents[1]

CHECK = textwrap.dedent(
    """
    import sys
    sys.path[:1] = [".", "benchmarks"]  # the repository, not the script's (temporary) folder
    import torch
    import torch.nn.functional as F
    import fp8_linears as fp8_linear
    from helpers.core.kernels.fp8 import rowwise_e4m3

    device = sys.argv[1]
    BREAK = sys.argv[2]  # "none", or one deliberate mistake the checks must catch

    def rel(a, b):
        return ((a.float() - b.float()).norm() / b.float().norm()).item()

    # 1. the one-pass cast: rowwise_e4m3's bytes and scales, and the column sums. M is not a
    # multiple of the rows per program (the last program's rows are masked); rows 5 decades apart
    torch.manual_seed(0)
    M, N = 70, 2304
    x = (torch.randn(M, N) * torch.logspace(-3, 2, M)[:, None]).to(torch.bfloat16).to(device)
    x[5] = 0
    x[9, 11] = float("nan")
    x8, inv, colsum = fp8_linear.rowwise_e4m3_colsum(x)
    if BREAK == "scale":
        inv = inv * 2
    if BREAK == "colsum":
        colsum = colsum - x[-1].float()  # the last, masked program's row left out
    if BREAK == "rowmax":  # each row's largest element one e4m3 step low
        f = x8.float()
        i = f.nan_to_num().abs().argmax(1)
        f[torch.arange(M), i] *= 416 / 448
        x8 = f.to(torch.float8_e4m3fn)
    finite = torch.arange(M, device=device) != 9
    x8_ref, inv_ref = rowwise_e4m3(x[finite])
    same = (x8[finite].view(torch.uint8) == x8_ref.view(torch.uint8)).float().mean().item()
    assert same > 0.999, f"only {same:.4f} of the e4m3 bytes equal rowwise_e4m3's"
    assert torch.allclose(inv[finite], inv_ref, rtol=1e-6, atol=0), "scales"
    assert (x8[finite].float().abs().amax(1)[x[finite].float().abs().amax(1) > 0] == 448).all()
    assert torch.isfinite(inv).all() and (x8[5].float() == 0).all()
    # a NaN stays NaN in its element (the matmul's row shows it) and not in the row's scale
    assert x8[9, 11].float().isnan() and x8.float().isnan().sum() == 1, "a NaN was hidden"
    ref_sum = x.float().nan_to_num().sum(0)
    ref_sum[11] = float("nan")
    assert torch.allclose(colsum, ref_sum, rtol=1e-5, atol=1e-4, equal_nan=True), "column sums"

    # 2. the linear against F.linear under bf16 autocast, value and gradients, for c_attn's
    # widths (the wide gradient through the kernel) and c_proj's (through torch ops)
    for K, N in [(256, 768), (256, 256)]:
        torch.manual_seed(1)
        x = torch.randn(2, 32, K, device=device, requires_grad=True)
        w = (torch.randn(N, K, device=device) * 0.05).requires_grad_()
        b = torch.randn(N, device=device).requires_grad_()
        g = torch.randn(2, 32, N, device=device)
        def run(fn):
            for t in (x, w, b):
                t.grad = None
            with torch.autocast(device, dtype=torch.bfloat16):
                y = fn(x, w, b)
            y.float().backward(g)
            return [y, x.grad, w.grad, b.grad]
        linear = fp8_linear.fp8_linear
        if BREAK == "bias":  # the forward's fp8 matmul drops its bias
            with_bias = fp8_linear.scaled_mm
            def no_bias(a, b, sa, sb, fast_accum, bias=None):
                return with_bias(a, b, sa, sb, fast_accum)
            fp8_linear.scaled_mm = no_bias
        if BREAK == "wt_scale":  # the input gradient's weight scales twice too large
            rowwise = fp8_linear.rowwise_e4m3
            def doubled(t):
                t8, inv = rowwise(t)
                return t8, inv * 2 if not t.is_contiguous() else inv  # only W.T (backward)
            fp8_linear.rowwise_e4m3 = doubled
        # the wide case (N=768 here, as c_attn's 2304) through the one-pass kernel
        fp8_linear.ONE_PASS_MIN_WIDTH = 512 if BREAK != "threshold" else 10**6
        calls = []
        kernel = fp8_linear.rowwise_e4m3_colsum
        fp8_linear.rowwise_e4m3_colsum = lambda t: calls.append(t.shape) or kernel(t)
        ref, got = run(F.linear), run(linear)
        fp8_linear.rowwise_e4m3_colsum = kernel
        assert len(calls) == (N >= 512), f"the one-pass cast ran for {calls}, N={N}"
        errs = [rel(a, b) for a, b in zip(got, ref)]
        # e4m3's rounding alone: about 0.012 in the value, 0.037 in the input gradient; the
        # weight gradient is a bf16 matmul as in F.linear, the bias gradient an fp32 sum
        assert errs[0] < 0.03 and errs[1] < 0.06 and errs[2] < 1e-6 and errs[3] < 5e-3, errs
        assert got[0].dtype == torch.bfloat16 and all(t.dtype == torch.float32 for t in got[1:])
        if device == "cuda":  # compiled: inductor launches the traced kernel itself
            torch._dynamo.reset()
            step = torch.compile(linear)
            errs = [rel(a, b) for a, b in zip(run(step), ref)]
            assert errs[0] < 0.03 and errs[1] < 0.06 and errs[3] < 5e-3, errs
    print("fp8 linear OK")
    """
)


def run_check(device: str, broken: str = "none") -> subprocess.CompletedProcess:
    return run_script(CHECK, "check_fp8_linear", device, broken)


@needs_triton
def test_the_fp8_linear_matches_pytorch_in_the_triton_interpreter():
    out = run_check("cpu")
    assert out.returncode == 0, out.stderr[-3000:]
    assert "fp8 linear OK" in out.stdout


@needs_triton
@pytest.mark.parametrize("broken", ["scale", "colsum", "rowmax", "bias", "wt_scale", "threshold"])
def test_each_check_rejects_its_mistake(broken):
    out = run_check("cpu", broken)
    assert out.returncode != 0 and "AssertionError" in out.stderr, out.stderr[-2000:]


@pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9),
    reason="needs a GPU with fp8 tensor cores (compute capability >= 8.9)",
)
def test_the_fp8_linear_matches_pytorch_on_the_gpu():
    out = run_check("cuda")
    assert out.returncode == 0, out.stderr[-3000:]
    assert "fp8 linear OK" in out.stdout


@needs_triton
def test_the_cast_kernel_refuses_what_it_cannot_take():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from fp8_linears import rowwise_e4m3_colsum
    finally:
        sys.path.pop(0)

    with pytest.raises(ValueError, match="2-D bf16"):
        rowwise_e4m3_colsum(torch.zeros(4, 64))
    with pytest.raises(ValueError, match="up to 4096"):
        rowwise_e4m3_colsum(torch.zeros(4, 4112, dtype=torch.bfloat16))
    from helpers.core.kernels import _triton

    if not _triton._INTERPRETED_AT_IMPORT:  # a CPU tensor without the interpreter: said so
        with pytest.raises(RuntimeError, match="CUDA GPU .* x is on cpu"):
            rowwise_e4m3_colsum(torch.zeros(4, 64, dtype=torch.bfloat16))
