"""The hand-written Triton cross-entropy (helpers/kernels.py) and the switches that use it.

On a machine without a GPU the kernels run in Triton's CPU interpreter, in a subprocess (the
interpreter is chosen when Triton is imported). On a GPU they run for real, also under torch.compile.
"""

import dataclasses
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from helpers import kernels, train
from helpers.model import GPT, GPTConfig

needs_triton = pytest.mark.skipif(kernels.triton is None, reason="the 'triton' package is not installed")
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

# Compares kernels.cross_entropy with F.cross_entropy(logits.float()) forward and backward, on shapes
# with a partial last block, the GPT-2 padded vocab, bf16/fp16/fp32 logits, ignored rows, a strided
# view, and logits large enough that a softmax without the max shift would overflow.
CHECK = textwrap.dedent(
    """
    import sys, torch, torch.nn.functional as F
    from helpers import kernels
    device = sys.argv[1]
    torch.manual_seed(0)
    cases = [(5, 7, torch.float32, 1.0), (9, 4097, torch.bfloat16, 3.0), (4, 50304, torch.bfloat16, 4.0),
             (6, 1000, torch.float16, 2.0), (3, 300, torch.float32, 200.0)]
    for N, V, dtype, scale in cases:
        base = (torch.randn(N, V + 3, device=device) * scale).to(dtype)
        t = torch.randint(0, V, (N,), device=device)
        t[1] = kernels.IGNORE_INDEX
        for name, x in (("contiguous", base[:, :V].contiguous()), ("strided rows", base[:, :V])):
            a = x.detach().clone().requires_grad_()
            b = x.detach().clone().requires_grad_()
            la = kernels.cross_entropy(a, t)
            lb = F.cross_entropy(b.float(), t)
            (la * 0.5).backward()
            (lb * 0.5).backward()
            assert a.grad.dtype == dtype, a.grad.dtype
            assert torch.allclose(la, lb, rtol=1e-5, atol=1e-5), (N, V, dtype, name, la.item(), lb.item())
            tol = 1e-6 if dtype == torch.float32 else 2e-3
            err = (a.grad.float() - b.grad.float()).abs().max().item()
            assert err <= tol, (N, V, dtype, name, err)
            assert a.grad[1].abs().max().item() == 0.0  # the ignored row gets no gradient
    x = torch.randn(3, 10, device=device, requires_grad=True)
    loss = kernels.cross_entropy(x, torch.tensor([1, 10, -5], device=device))  # ids outside [0, V): nan, no stray read
    loss.backward()
    assert torch.isnan(loss) and torch.isnan(x.grad[1:]).all() and not torch.isnan(x.grad[0]).any()
    # the fused LM head + CE: the loss and the gradients of x and W against x @ W.T + F.cross_entropy,
    # in fp32 and under bf16 autocast, with an ignored row, the GPT-2 padded vocab, and rows in 1 or 3 chunks
    kernels.FUSED_CHUNK_ROWS = 4
    for N, C, V, amp in [(6, 16, 37, False), (9, 32, 4099, True), (5, 8, 50304, False), (3, 8, 100, True)]:
        x0, w0 = torch.randn(N, C, device=device), torch.randn(V, C, device=device) * 0.5
        t = torch.randint(0, V, (N,), device=device)
        t[2] = kernels.IGNORE_INDEX
        res = []
        for fused in (True, False):
            x, w = x0.clone().requires_grad_(), w0.clone().requires_grad_()
            with torch.autocast(device, dtype=torch.bfloat16, enabled=amp):
                if fused:
                    loss = kernels.linear_cross_entropy(x, w, t)
                else:
                    dt = torch.bfloat16 if amp else torch.float32
                    loss = F.cross_entropy((x.to(dt) @ w.to(dt).t()).float(), t)
            (loss * 0.7).backward()
            res.append((loss.item(), x.grad, w.grad))
        (l1, gx1, gw1), (l2, gx2, gw2) = res
        tol = 2e-2 if amp else 1e-5
        assert abs(l1 - l2) <= tol * abs(l2), (N, V, amp, l1, l2)
        assert gx1.dtype == gw1.dtype == torch.float32
        for a, b in ((gx1, gx2), (gw1, gw2)):
            assert (a - b).abs().max().item() <= tol * b.abs().max().item(), (N, V, amp)
    # every row ignored, no rows, a non-contiguous x, a W tied to an embedding, x without grad, two accumulated
    # backward passes, a bad chunk size: as F.cross_entropy does (loss nan, gradients 0 for the first two)
    for t_all, n_rows in ((torch.full((5,), kernels.IGNORE_INDEX, device=device), 5), (torch.zeros(0, dtype=torch.int64, device=device), 0)):
        x = torch.randn(n_rows, 8, device=device, requires_grad=True)
        w = torch.randn(16, 8, device=device, requires_grad=True)
        loss = kernels.linear_cross_entropy(x, w, t_all)
        loss.backward()
        assert torch.isnan(loss) and not torch.isnan(x.grad).any(), n_rows
        assert not torch.isnan(w.grad).any() and w.grad.abs().max() == 0, n_rows
    emb = torch.nn.Embedding(40, 8).to(device)
    base = torch.randn(8, 12, device=device)
    t = torch.randint(0, 40, (12,), device=device)
    got = []
    for fused in (True, False):
        emb.zero_grad()
        x = base.t()  # (12, 8), not contiguous; no grad: only W gets one
        for _ in range(2):  # accumulate
            loss = kernels.linear_cross_entropy(x, emb.weight, t) if fused else F.cross_entropy(x @ emb.weight.t(), t)
            (loss * 0.3).backward()
        got.append(emb.weight.grad.clone())
    assert (got[0] - got[1]).abs().max().item() <= 1e-5 * got[1].abs().max().item()
    kernels.FUSED_CHUNK_ROWS = 0
    try:
        kernels.linear_cross_entropy(base.t(), emb.weight, t)
        raise AssertionError("FUSED_CHUNK_ROWS = 0 accepted")
    except ValueError as e:
        assert "FUSED_CHUNK_ROWS" in str(e)
    kernels.FUSED_CHUNK_ROWS = 4
    x0, w0 = torch.randn(9, 32, device=device), torch.randn(4099, 32, device=device) * 0.5
    t = torch.randint(0, 4099, (9,), device=device)
    with torch.autocast(device, dtype=torch.float16):  # refused: the gradient would round before the loss scale
        try:
            kernels.linear_cross_entropy(x0, w0, t)
            raise AssertionError("fp16 accepted")
        except RuntimeError as e:
            assert "fp16" in str(e)
    with torch.no_grad():  # no gradient wanted: the loss alone (3 chunks), no backward matmuls
        assert abs(kernels.linear_cross_entropy(x0, w0, t).item() - F.cross_entropy(x0 @ w0.t(), t).item()) < 1e-4
    from helpers import train
    compiled = train.RunConfig(autocast="bf16", loss_kernel="triton", compile="default")
    if device == "cpu":  # the interpreter runs the kernels eagerly only: a compiled rung is refused, not failed
        assert "compiled only" in train.unsupported_reason(compiled, "cpu")
        assert "compiled only" in train.unsupported_reason(compiled.replace(loss_kernel="fused"), "cpu")
        assert train.unsupported_reason(compiled.replace(compile=None), "cpu") is None
    print("kernels OK")
    """
)


@needs_triton
def test_cross_entropy_matches_pytorch_in_the_triton_interpreter():
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    out = subprocess.run([sys.executable, "-c", CHECK, "cpu"], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "kernels OK" in out.stdout


@needs_triton
def test_a_wrong_kernel_fails_the_check(tmp_path):
    """The check above can fail: a loss that skips the last column (an off-by-one in a block loop) is caught."""
    broken = CHECK.replace("from helpers import kernels",
                           "from helpers import kernels\n"
                           "kernels.cross_entropy = lambda x, t: F.cross_entropy(x.float()[:, :-1], t.clamp(max=x.shape[1] - 2))")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    out = subprocess.run([sys.executable, "-c", broken, "cpu"], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode != 0 and "AssertionError" in out.stderr


@needs_triton
def test_a_wrong_fused_gradient_fails_the_check():
    """The fused LM-head CE's check looks at gradients, not only the loss: a dW off by a factor n / (n + 1)
    (a right loss, a wrong backward scale) is caught."""
    broken = CHECK.replace("kernels.FUSED_CHUNK_ROWS = 4",
                           "kernels.FUSED_CHUNK_ROWS = 4\n"
                           "kernels._LinearCrossEntropy.backward = staticmethod(lambda ctx, g: (lambda dx, dw, n: "
                           "(dx * g / n, dw * g / (n + 1), None))(*ctx.saved_tensors))")
    assert broken != CHECK
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    out = subprocess.run([sys.executable, "-c", broken, "cpu"], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode != 0 and "AssertionError" in out.stderr, out.stderr[-2000:]


@needs_cuda
@needs_triton
def test_cross_entropy_matches_pytorch_on_the_gpu():
    out = subprocess.run([sys.executable, "-c", CHECK, "cuda"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]


@needs_cuda
@needs_triton
def test_compiled_model_with_the_triton_loss_matches_pytorch_loss():
    """Inside torch.compile (one graph, custom op traced) the step gives the loss and gradients of F.cross_entropy."""
    cfg = GPTConfig(block_size=128, n_layer=2, n_head=4, n_embd=128, vocab_multiple=64)
    torch.manual_seed(0)
    x = torch.randint(0, cfg.vocab_size, (4, 128), device="cuda")
    y = torch.randint(0, cfg.vocab_size, (4, 128), device="cuda")
    results = {}
    for kernel in ("pytorch", "triton", "fused"):
        torch._dynamo.reset()
        torch.manual_seed(1)
        model = GPT(dataclasses.replace(cfg, loss_kernel=kernel)).cuda()
        step = torch.compile(model, fullgraph=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            _, loss = step(x, y)
        loss.backward()
        results[kernel] = (loss.item(), model.lm_head.weight.grad.float().clone())
    lp, gp = results["pytorch"]
    for kernel in ("triton", "fused"):
        lt, gt = results[kernel]
        assert abs(lp - lt) < 1e-3 * abs(lp), kernel
        assert (gp - gt).abs().max().item() <= 1e-2 * gp.abs().max().item(), kernel


def test_cross_entropy_says_why_it_cannot_run_on_a_cpu(monkeypatch):
    monkeypatch.setattr(kernels, "_INTERPRETED_AT_IMPORT", False)  # the module reads TRITON_INTERPRET at import
    ok, reason = kernels.available("cpu")
    assert not ok and ("CUDA GPU" in reason or "not installed" in reason)
    with pytest.raises(RuntimeError, match="Use F.cross_entropy"):
        kernels.cross_entropy(torch.randn(4, 10), torch.zeros(4, dtype=torch.int64))


def test_cross_entropy_rejects_bad_shapes_and_dtypes():
    with pytest.raises(ValueError, match=r"\(N, V\)"):
        kernels.cross_entropy(torch.randn(2, 4, 10), torch.zeros(8, dtype=torch.int64))
    with pytest.raises(ValueError, match="int64 targets"):
        kernels.cross_entropy(torch.randn(4, 10), torch.zeros(4, dtype=torch.int32))


def test_unsupported_reason_names_the_triton_kernel_on_a_cpu(monkeypatch):
    monkeypatch.setattr(kernels, "_INTERPRETED_AT_IMPORT", False)  # the module reads TRITON_INTERPRET at import
    run = train.RunConfig(autocast="bf16", loss_kernel="triton")
    assert "Triton cross-entropy" in train.unsupported_reason(run, "cpu")
    with pytest.raises(ValueError, match="Triton cross-entropy"):
        train.build(run, train.small_model_config(), "cpu")


def test_residual_stream_is_bf16_only_when_asked(tiny_config):
    seen = {}
    for dtype in ("fp32", "bf16"):
        torch.manual_seed(0)
        model = GPT(dataclasses.replace(tiny_config, residual_dtype=dtype))
        model.transformer.h[1].register_forward_pre_hook(lambda mod, args, d=dtype: seen.__setitem__(d, args[0].dtype))
        idx = torch.randint(0, tiny_config.vocab_size, (2, 16))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            _, loss = model(idx, idx)
        loss.backward()
        seen[dtype + " loss"] = loss.item()
        assert model.transformer.wte.weight.grad.dtype == torch.float32  # master weights stay fp32
    assert seen["fp32"] == torch.float32 and seen["bf16"] == torch.bfloat16
    model(idx)  # outside autocast (generation, evaluation) the stream stays fp32: no dtype clash with the weights
    assert seen["bf16"] == torch.float32
    with torch.autocast("cpu", dtype=torch.float16):  # fp16 autocast: no bf16 cast (it would only mix dtypes)
        model(idx)
    assert seen["bf16"] == torch.float32
    assert abs(seen["fp32 loss"] - seen["bf16 loss"]) < 0.02 * seen["fp32 loss"]


def test_bf16_residual_needs_bf16_autocast():
    assert "bf16 autocast" in train.unsupported_reason(train.RunConfig(residual_dtype="bf16"), "cpu")
    assert train.unsupported_reason(train.RunConfig(residual_dtype="bf16", autocast="bf16"), "cpu") is None
    with pytest.raises(ValueError, match="residual_dtype"):
        train.RunConfig(residual_dtype="fp8")
    with pytest.raises(ValueError, match="loss_kernel"):
        GPTConfig(loss_kernel="cuda")


def _train_steps(run, steps=3):
    trainer = train.build(run, GPTConfig(block_size=32, n_layer=2, n_head=2, n_embd=32), "cpu")
    data = torch.randint(0, 50257, (steps, 2, 33), generator=torch.Generator().manual_seed(0))

    class Batches:
        i = 0

        def next_batch(self):
            self.i += 1
            return data[self.i - 1, :, :-1].contiguous(), data[self.i - 1, :, 1:].contiguous()

    batches = Batches()
    for _ in range(steps):
        trainer.step(batches)
    return torch.cat([p.detach().flatten() for p in trainer.model.parameters()])


def test_fused_clip_gives_the_update_of_clip_grad_norm():
    base = train.RunConfig(optimizer="fused", batch_size=2, seq_len=32, lr=1e-2, grad_clip=0.05)
    separate = _train_steps(base)
    fused = _train_steps(base.replace(fused_clip=True))
    unclipped = _train_steps(base.replace(grad_clip=None))
    assert torch.allclose(separate, fused, atol=2e-5, rtol=0)  # Adam amplifies g*c vs g/(1/c) rounding a little
    assert not torch.allclose(separate, unclipped, atol=1e-4)  # the clip is active: the comparison can fail


def test_clip_divisor_is_the_reciprocal_of_the_clip_coefficient():
    p = torch.nn.Parameter(torch.zeros(4))
    p.grad = torch.tensor([3.0, 4.0, 0.0, 0.0])  # norm 5
    assert abs(train.clip_divisor([p], 1.0).item() - 5.0) < 1e-5
    assert train.clip_divisor([p], 10.0).item() == 1.0  # below max_norm: no clipping


def test_fused_clip_needs_fused_adamw_and_no_grad_scaler():
    assert "fused_clip" in train.unsupported_reason(train.RunConfig(fused_clip=True, optimizer="foreach"), "cpu")
    assert "fused_clip" in train.unsupported_reason(train.RunConfig(fused_clip=True, optimizer="fused", autocast="fp16"), "cpu")
    assert train.unsupported_reason(train.RunConfig(fused_clip=True, optimizer="fused"), "cpu") is None


def test_detached_logits_keep_values_and_the_loss_gradient(tiny_config):
    idx = torch.randint(0, tiny_config.vocab_size, (2, 16))
    out = {}
    for detach in (False, True):
        torch.manual_seed(0)
        model = GPT(dataclasses.replace(tiny_config, detach_logits=detach))
        logits, loss = model(idx, idx)
        loss.backward()
        out[detach] = (logits, loss, model.lm_head.weight.grad)
        assert logits.requires_grad is (not detach)
        assert model(idx)[0].requires_grad  # without targets the logits are never detached
    assert torch.equal(out[False][0].detach(), out[True][0]) and torch.equal(out[False][2], out[True][2])


def test_triton_kernel_needs_compute_capability_7(monkeypatch):
    if kernels.triton is None:
        pytest.skip("the 'triton' package is not installed")
    from helpers import hardware

    monkeypatch.setattr(hardware, "capability", lambda d=None: (6, 1))
    ok, reason = kernels.available("cuda")
    assert not ok and "7.0" in reason
    monkeypatch.setattr(hardware, "capability", lambda d=None: (7, 5))
    assert kernels.available("cuda") == (True, "")
