"""helpers/core/kernels/qkv_grad.py (rung "+ one-pass QKV grad", results/perf-log.md): its
one-pass concatenation + column-sum kernel and the attention that uses it against PyTorch, in
Triton's CPU interpreter (a subprocess: the interpreter is chosen at import) and, where a CUDA
GPU is present, on it. Each deliberate mistake must make the check fail."""

import textwrap

import pytest
import torch
from kernel_check import assert_caught, needs_triton, run_script

CHECK = textwrap.dedent(
    """
    import sys
    sys.path[:1] = ["."]  # the repository, not the script's (temporary) folder
    import torch
    from helpers.core.kernels import qkv_grad
    from helpers.core.model import CausalSelfAttention, GPTConfig

    device = sys.argv[1]
    BREAK = sys.argv[2]  # "none", or one deliberate mistake the checks must catch

    # 1. the kernel, on both memory orders SDPA's backends return: (B, nh, T, hs) and
    # (B, T, nh, hs). M = B*T = 70 is not a multiple of its 64 rows per program (the last is masked)
    torch.manual_seed(0)
    B, nh, T, hs = 2, 4, 35, 128
    for order, opaque in [(o, op) for o in ("BHTD", "BTHD") for op in (False, True)]:
        if order == "BHTD":
            g = [torch.randn(B, nh, T, hs, device=device) for _ in range(3)]
        else:
            g = [torch.randn(B, T, nh, hs, device=device).transpose(1, 2) for _ in range(3)]
        dq, dk, dv = (t.to(torch.bfloat16) for t in g)
        if BREAK == "order":
            dk, dv = dv, dk
        out, colsum = qkv_grad.qkv_grad_cat(dq, dk, dv, opaque=opaque)
        if BREAK == "colsum":
            colsum = colsum - out[-1].float()  # the masked last program's row left out
        if BREAK == "order":
            dk, dv = dv, dk
        ref = torch.cat([t.transpose(1, 2).reshape(B * T, nh * hs) for t in (dq, dk, dv)], 1)
        assert torch.equal(out, ref), f"the concatenation ({order})"
        assert torch.allclose(colsum, ref.float().sum(0), rtol=1e-5, atol=1e-4), "column sums"

    # 2. the rung's attention module, with the kernel from the opaque op and from the traced op,
    # against CausalSelfAttention without the rung: same output, same gradients for x, c_attn's
    # weight and bias (bf16 matmuls in both, as under autocast)
    cfg = GPTConfig(block_size=32, vocab_size=64, n_layer=1, n_head=4, n_embd=256)
    attn = CausalSelfAttention(cfg, attention="sdpa").to(device)
    rung = CausalSelfAttention(cfg, attention="sdpa", qkv_grad=True).to(device)
    rung.load_state_dict(attn.state_dict())
    x = torch.randn(2, 32, 256, device=device, requires_grad=True)

    def run(module):
        module.zero_grad()
        x.grad = None
        with torch.autocast(device, dtype=torch.bfloat16):
            y = module(x)
        (y.float() * torch.linspace(-1, 1, y.numel(), device=device).view_as(y)).sum().backward()
        w = module.c_attn
        return y.float(), x.grad.clone(), w.weight.grad.clone(), w.bias.grad

    plain = run(attn)
    for name, opaque in (("opaque", True), ("traced", False)):
        qkv_grad.OPAQUE = opaque
        fused = run(rung)
        if BREAK == "bias":
            fused = (*fused[:3], fused[3] * 1.01)
        for what, a, b in zip(("output", "dx", "dW", "db"), fused, plain):
            err = ((a - b).norm() / b.norm()).item()
            assert err < 5e-3, f"{name} {what}: relative error {err:.2e}"
    qkv_grad.OPAQUE = True
    print("OK")
    """
)


@needs_triton
@pytest.mark.parametrize("broken", ["none", "order", "colsum", "bias"])
def test_qkv_grad_in_the_interpreter(broken):
    r = run_script(CHECK, "qkv_grad_check", "cpu", broken)
    assert_caught(r, broken)


@needs_triton
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_qkv_grad_on_the_gpu():
    r = run_script(CHECK, "qkv_grad_check", "cuda")
    assert_caught(r)


# Under torch.compile (inductor on the CPU, the kernel in the interpreter): the opaque op is
# handed the gradients in the memory order their producer returned them, with no copy first.
# The producer stands in for cuDNN's backward: an opaque op returning (B, nh, T, hs) gradients
# stored in (B, T, nh, hs) order.
COMPILED = textwrap.dedent(
    """
    import sys
    sys.path[:1] = ["."]
    from unittest import mock
    import torch
    from helpers.core.kernels import qkv_grad

    BREAK = sys.argv[2]  # "none", or "copy": the backward copies the gradients first
    B, T, nh, hs = 2, 16, 2, 128
    C = nh * hs
    order = (T * C, hs, C, 1)  # (B, nh, T, hs) strides of a (B, T, nh, hs) layout

    def btnh_like(g):
        return g.new_empty(B, T, nh, hs).transpose(1, 2)

    @torch.library.custom_op("probe::attn_bwd", mutates_args=())
    def attn_bwd(g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        outs = tuple(btnh_like(g) for _ in range(3))
        for s, o in zip((1.0, 2.0, 3.0), outs):
            o.copy_(g * s)
        return outs

    @attn_bwd.register_fake
    def _(g):
        return tuple(btnh_like(g) for _ in range(3))

    class Attn(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v):
            return q + 2.0 * k + 3.0 * v

        @staticmethod
        def backward(ctx, g):
            return attn_bwd(g)

    seen = []
    run = qkv_grad._qkv_grad_run

    def spy(dq, dk, dv, launcher):
        seen.append(dq.stride())
        return run(dq, dk, dv, launcher)

    cat = qkv_grad.qkv_grad_cat

    def copying(dq, dk, dv, opaque=False):
        return cat(*(t.contiguous() for t in (dq, dk, dv)), opaque=opaque)

    def f(x, w, b):
        q, k, v = qkv_grad.qkv_heads(x, w, b, nh, opaque=True)
        return Attn.apply(q, k, v)

    torch.manual_seed(0)
    x = torch.randn(B, T, C, requires_grad=True)
    w = (torch.randn(3 * C, C) * 0.05).requires_grad_()
    b = torch.randn(3 * C, requires_grad=True)
    grads = []
    with mock.patch.object(qkv_grad, "_qkv_grad_run", spy):
        if BREAK == "copy":
            mock.patch.object(qkv_grad, "qkv_grad_cat", copying).start()
        for fn in (f, torch.compile(f)):
            for t in (x, w, b):
                t.grad = None
            fn(x, w, b).float().sum().backward()
            grads.append([t.grad.clone() for t in (x, w, b)])
    for name, a, e in zip(("dx", "dW", "db"), grads[1], grads[0]):
        assert torch.allclose(a, e, rtol=1e-2, atol=1e-2), name
    assert seen[-1] == order, f"the compiled op got strides {seen[-1]}, not {order}: a copy"
    print("OK")
    """
)


@needs_triton
@pytest.mark.parametrize("broken", ["none", "copy"])
def test_the_opaque_op_gets_the_gradients_without_a_copy_under_compile(broken):
    r = run_script(COMPILED, "qkv_grad_compiled", "cpu", broken)
    if broken == "none":
        assert_caught(r)
    else:
        assert r.returncode != 0 and "a copy" in r.stderr, r.stderr[-3000:]


def test_the_rung_says_why_it_cannot_run(monkeypatch):
    """unsupported_reason names the kernel on a CPU without the interpreter, and bf16 autocast
    where the kernel could run; GPT refuses a width its kernel cannot copy."""
    from helpers.core import kernels, train
    from helpers.core.model import GPT, GPTConfig

    run = train.RunConfig(qkv_grad=True, autocast="bf16", attention="sdpa")
    if not kernels.available("cpu")[0]:
        assert "QKV gradient kernel cannot run" in train.unsupported_reason(run, "cpu")
    monkeypatch.setattr(kernels, "available", lambda device: (True, ""))
    assert train.unsupported_reason(run, "cpu") is None
    assert "autocast='bf16'" in train.unsupported_reason(run.replace(autocast="fp16"), "cpu")
    assert "compiled only on a CUDA GPU" in train.unsupported_reason(
        run.replace(compile="default"), "cpu"
    )
    cfg = GPTConfig(block_size=16, vocab_size=64, n_layer=1, n_head=2, n_embd=128)
    with pytest.raises(ValueError, match="multiple of 256"):
        GPT(cfg, attention="sdpa", qkv_grad=True)


def test_the_rung_computes_the_plain_function_without_bf16_autocast():
    """A model built with qkv_grad=True and used without bf16 autocast (generation after training,
    fp32 evaluation) takes the plain path: the same fp32 logits as the model without the switch;
    under bf16 autocast it takes the one-pass path (its forward needs no kernel) and agrees to bf16
    rounding."""
    from helpers.core.model import GPT, GPTConfig

    cfg = GPTConfig(block_size=16, vocab_size=64, n_layer=1, n_head=2, n_embd=256)
    torch.manual_seed(0)
    plain = GPT(cfg, attention="sdpa").eval()
    rung = GPT(cfg, attention="sdpa", qkv_grad=True).eval()
    rung.load_state_dict(plain.state_dict())
    idx = torch.randint(0, 64, (2, 16))
    with torch.no_grad():
        assert torch.equal(rung(idx)[0], plain(idx)[0])
        with torch.autocast("cpu", dtype=torch.float16):  # not the rung's dtype: the plain path
            assert torch.equal(rung(idx)[0], plain(idx)[0])
        with torch.autocast("cpu", dtype=torch.bfloat16):
            a, b = rung(idx)[0].float(), plain(idx)[0].float()
    assert ((a - b).norm() / b.norm()).item() < 2e-2


def test_qkv_grad_cat_refuses_what_it_cannot_copy():
    """Checked before any launch (no GPU needed): tensors only, a float dtype shared by all three,
    one device, and C = nh * hs a positive multiple of 256."""
    from helpers.core.kernels import qkv_grad

    g = torch.zeros(2, 4, 8, 64, dtype=torch.bfloat16)
    with pytest.raises(TypeError, match="three tensors"):
        qkv_grad.qkv_grad_cat(None, g, g)
    for bad, words in [
        ((g.int(), g.int(), g.int()), "bf16, fp16 or fp32"),
        ((g, g.to("meta"), g), "device"),
        ((g, g.float(), g), "one dtype"),
        ((g[:, :0], g[:, :0], g[:, :0]), "positive multiple of 256"),
        ((g[..., :32], g[..., :32], g[..., :32]), "positive multiple of 256"),
    ]:
        for opaque in (False, True):
            with pytest.raises(ValueError, match=words):
                qkv_grad.qkv_grad_cat(*bad, opaque=opaque)
