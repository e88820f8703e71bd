"""benchmarks/qkv_grad.py (the qkv-grad experiment of results/perf-log.md, 2026-12-06): its
one-pass concatenation + column-sum kernel and the attention that uses it against PyTorch, in
Triton's CPU interpreter (a subprocess: the interpreter is chosen at import) and, where a CUDA
GPU is present, on it. Each deliberate mistake must make the check fail."""

import textwrap

import pytest
import torch
from kernel_check import needs_triton, run_script

CHECK = textwrap.dedent(
    """
    import sys
    sys.path[:1] = [".", "benchmarks"]  # the repository, not the script's (temporary) folder
    import torch
    import qkv_grad
    from helpers.core.model import CausalSelfAttention, GPTConfig

    device = sys.argv[1]
    BREAK = sys.argv[2]  # "none", or one deliberate mistake the checks must catch

    # 1. the kernel, on both memory orders SDPA's backends return: (B, nh, T, hs) and
    # (B, T, nh, hs). M = B*T = 70 is not a multiple of its 64 rows per program (the last is masked)
    torch.manual_seed(0)
    B, nh, T, hs = 2, 4, 35, 128
    for order in ("BHTD", "BTHD"):
        if order == "BHTD":
            g = [torch.randn(B, nh, T, hs, device=device) for _ in range(3)]
        else:
            g = [torch.randn(B, T, nh, hs, device=device).transpose(1, 2) for _ in range(3)]
        dq, dk, dv = (t.to(torch.bfloat16) for t in g)
        if BREAK == "order":
            dk, dv = dv, dk
        out, colsum = qkv_grad.qkv_grad_cat(dq, dk, dv)
        if BREAK == "colsum":
            colsum = colsum - out[-1].float()  # the masked last program's row left out
        if BREAK == "order":
            dk, dv = dv, dk
        ref = torch.cat([t.transpose(1, 2).reshape(B * T, nh * hs) for t in (dq, dk, dv)], 1)
        assert torch.equal(out, ref), f"the concatenation ({order})"
        assert torch.allclose(colsum, ref.float().sum(0), rtol=1e-5, atol=1e-4), "column sums"

    # 2. the attention with qkv_heads against CausalSelfAttention's own forward: same output,
    # same gradients for x, c_attn's weight and bias (bf16 matmuls in both, as under autocast)
    cfg = GPTConfig(block_size=32, vocab_size=64, n_layer=1, n_head=4, n_embd=256)
    attn = CausalSelfAttention(cfg, attention="sdpa").to(device)
    x = torch.randn(2, 32, 256, device=device, requires_grad=True)

    def run(forward):
        attn.zero_grad()
        x.grad = None
        with torch.autocast(device, dtype=torch.bfloat16):
            y = forward(attn, x)
        (y.float() * torch.linspace(-1, 1, y.numel(), device=device).view_as(y)).sum().backward()
        return y.float(), x.grad.clone(), attn.c_attn.weight.grad.clone(), attn.c_attn.bias.grad

    plain = run(CausalSelfAttention.forward)
    fused = run(qkv_grad.attention_forward)
    if BREAK == "bias":
        fused = (*fused[:3], fused[3] * 1.01)
    for name, a, b in zip(("output", "dx", "dW", "db"), fused, plain):
        err = ((a - b).norm() / b.norm()).item()
        assert err < 5e-3, f"{name}: relative error {err:.2e}"
    print("OK")
    """
)


@needs_triton
@pytest.mark.parametrize("broken", ["none", "order", "colsum", "bias"])
def test_qkv_grad_in_the_interpreter(broken):
    r = run_script(CHECK, "qkv_grad_check", "cpu", broken)
    if broken == "none":
        assert r.returncode == 0 and "OK" in r.stdout, r.stderr[-3000:]
    else:
        assert r.returncode != 0 and "AssertionError" in r.stderr, (broken, r.stderr[-3000:])


@needs_triton
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_qkv_grad_on_the_gpu():
    r = run_script(CHECK, "qkv_grad_check", "cuda")
    assert r.returncode == 0 and "OK" in r.stdout, r.stderr[-3000:]
