"""benchmarks/ce_transposed_grad.py (an experiment for the fp8 LM head, results/perf-log.md): its
row-tile kernel against fused_ce's own, and the fp8 LM head with it against without, in Triton's
CPU interpreter (a subprocess: the interpreter is chosen at import) and on a GPU with fp8 tensor
cores. Its speed is for the H200 (benchmarks/perf.py --variants ce-transposed-grad)."""

import subprocess
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
    import ce_transposed_grad as exp
    from helpers.core import kernels
    from helpers.core.kernels import fused_ce

    device, BREAK = sys.argv[1], sys.argv[2]
    if BREAK == "gt_roll":  # G.T with its columns (the rows of G) one place off
        both = exp._both_op
        exp._both_op = lambda l, t: (lambda r: (r[0], r[1], r[2].roll(1, 1)))(both(l, t))
    if BREAK == "loss":  # one row's loss dropped
        both = exp._both_op
        exp._both_op = lambda l, t: (lambda r: (r[0] * (torch.arange(r[0].numel(),
            device=r[0].device) != 5), r[1], r[2]))(both(l, t))

    # 1. the kernel against fused_ce's: rows not a multiple of ROWS, V not one of BLOCK, an
    # ignored row, a target outside [0, V)
    torch.manual_seed(0)
    N, V = 37, 1000
    logits = (torch.randn(N, V, device=device) * 4).to(torch.bfloat16)
    t = torch.randint(0, V, (N,), device=device)
    t[3] = kernels.IGNORE_INDEX
    t[7] = V + 5
    loss, g, gt = exp.rows_with_e5m2_grad_both(logits, t)
    ref_loss, ref_g = fused_ce._cross_entropy_rows_with_e5m2_grad(logits, t)
    assert g.dtype == gt.dtype == torch.float8_e5m2 and gt.shape == (V, N) and gt.is_contiguous()
    assert torch.allclose(loss, ref_loss, rtol=1e-5, atol=1e-5, equal_nan=True), "loss"
    assert loss[7].isnan() and loss[3] == 0
    finite = torch.arange(N, device=device) != 7  # the out-of-range row's gradient is nan
    same = (g[finite].view(torch.uint8) == ref_g[finite].view(torch.uint8)).float().mean()
    assert same > 0.999, f"only {same:.4f} of G's bytes equal fused_ce's"
    assert torch.equal(gt.view(torch.uint8), g.t().contiguous().view(torch.uint8)), "G.T"

    # 2. the fp8 LM head with it: the same loss and gradients as without (G's bytes agree)
    fused_ce.FUSED_CHUNK_ROWS = 16
    N, C, V = 40, 32, 512
    x0 = torch.randn(N, C, device=device)
    w0 = torch.randn(V, C, device=device) * 0.5
    t = torch.randint(0, V, (N,), device=device)
    res = []
    for ctx in (exp.experiment("ce-transposed-grad"), __import__("contextlib").nullcontext()):
        x, w = x0.clone().requires_grad_(), w0.clone().requires_grad_()
        with ctx:
            loss = kernels.linear_cross_entropy(x, w, t, fp8=True)
        loss.backward()
        res.append((loss.item(), x.grad, w.grad))
    (l1, gx1, gw1), (l0, gx0, gw0) = res
    assert abs(l1 - l0) <= 1e-5 * abs(l0), (l1, l0)
    for a, b in ((gx1, gx0), (gw1, gw0)):
        assert ((a - b).norm() / b.norm()).item() < 1e-3, ((a - b).norm() / b.norm()).item()
    print("transposed grad OK")
    """
)


def run_check(device: str, broken: str = "none") -> subprocess.CompletedProcess:
    return run_script(CHECK, "check_ce_transposed_grad", device, broken)


def _skip_without_cpu_fp8(out: subprocess.CompletedProcess) -> None:
    if "could not create a primitive descriptor for the matmul primitive" in out.stderr:
        pytest.skip("PyTorch's CPU _scaled_mm (oneDNN) has no fp8 kernel for this CPU")


@needs_triton
def test_the_kernel_and_the_lm_head_match_fused_ce_in_the_interpreter():
    out = run_check("cpu")
    _skip_without_cpu_fp8(out)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "transposed grad OK" in out.stdout


@needs_triton
@pytest.mark.parametrize("broken", ["gt_roll", "loss"])
def test_each_check_rejects_its_mistake(broken):
    out = run_check("cpu", broken)
    assert out.returncode != 0 and "AssertionError" in out.stderr, out.stderr[-2000:]


@pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9),
    reason="needs a GPU with fp8 tensor cores (compute capability >= 8.9)",
)
def test_the_kernel_and_the_lm_head_match_fused_ce_on_the_gpu():
    out = run_check("cuda")
    assert out.returncode == 0, out.stderr[-3000:]
