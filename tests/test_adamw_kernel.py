"""The Triton AdamW (``helpers.core.kernels.adamw.TritonAdamW``, optimizer="triton"): PyTorch's
AdamW update, step for step, in Triton's CPU interpreter and on a GPU; each broken variant must be
caught."""

import textwrap

import pytest
import torch
from kernel_check import assert_caught, needs_triton, run_script

from helpers.core import train

CHECK = textwrap.dedent(
    """
    import sys
    from unittest import mock
    import torch
    from helpers.core import train
    from helpers.core.kernels import adamw
    from helpers.core.model import GPTConfig

    device, BREAK = sys.argv[1], sys.argv[2]
    adamw.BLOCK = 64 if device == "cpu" else adamw.BLOCK  # several programs per tensor
    if BREAK == "bias-correction":  # sqrt(1 - beta2**t) replaced by 1 - beta2**t
        mock.patch.object(adamw.math, "sqrt", lambda x: x).start()
    if BREAK == "stale-addresses":  # the address tables made once, never again
        first = {}
        make = adamw._address_tables
        mock.patch.object(
            adamw, "_address_tables", lambda s: first.setdefault("t", make(s))
        ).start()

    torch.manual_seed(0)
    shapes = [(40, 7), (300,), (33, 5), (1,)]
    start = [torch.randn(s, device=device) for s in shapes]
    ref = [p.clone().requires_grad_() for p in start]
    mine = [p.clone().requires_grad_() for p in start]
    kw = dict(lr=1e-2, betas=(0.9, 0.95), eps=1e-8)
    groups = lambda ps: [
        {"params": ps[:2], "weight_decay": 0.1}, {"params": ps[2:], "weight_decay": 0.0}
    ]
    want = torch.optim.AdamW(groups(ref), foreach=False, **kw)
    got = adamw.TritonAdamW(groups(mine), **kw)
    kept = []  # every gradient stays alive: a stale table reads old values, not freed memory
    for step in range(6):
        grads = [torch.randn(s, device=device) for s in shapes]
        kept.append(grads)
        scale = torch.tensor(1.0 + 0.3 * step, device=device)
        for i, (r, m, g) in enumerate(zip(ref, mine, grads)):
            missed = step == 2 and i == 1  # a tensor without a gradient: its step count lags
            r.grad = None if missed else g / scale
            m.grad = None if missed else g.clone()
        want.step()
        got.grad_scale = scale  # the fused clip's divisor, read by the kernel
        got.step()
        del got.grad_scale
        for r, m in zip(ref, mine):
            err = (r - m).abs().max().item()
            assert err < 1e-6, f"step {step}: weights differ by {err:.2e}"
    # the state is PyTorch's: it loads into torch's AdamW and the next steps agree
    steps = [got.state[p]["step"].item() for p in mine]
    assert steps == [6, 5, 6, 6], steps
    torch_again = torch.optim.AdamW(groups(mine), foreach=False, **kw)
    torch_again.load_state_dict(got.state_dict())
    for p in mine + ref:
        p.grad = torch.ones_like(p)
    torch_again.step()
    want.step()
    assert max((r - m).abs().max().item() for r, m in zip(ref, mine)) < 1e-6

    # behind a GradScaler (a T4's fp16 path): PyTorch's generic unscale_, then step(); a step
    # whose gradients hold an inf is skipped by both
    def scaled_steps(make):
        ps = [p.clone().requires_grad_() for p in start]
        opt = make(groups(ps))
        scaler = torch.amp.GradScaler(device, init_scale=2.0**10)
        for step in range(4):
            loss = sum((p * p * (i + 1)).sum() for i, p in enumerate(ps)) * (step + 1)
            if step == 1:
                loss = loss * float("inf")
            opt.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.unscale_(opt)
            scaler.step(opt)
            scaler.update()
        return ps, scaler.get_scale()
    (a, scale_a), (b, scale_b) = (
        scaled_steps(lambda g: torch.optim.AdamW(g, foreach=False, **kw)),
        scaled_steps(lambda g: adamw.TritonAdamW(g, **kw)),
    )
    assert scale_a == scale_b == 2.0**9, (scale_a, scale_b)  # one skipped step halved it
    err = max((x - y).abs().max().item() for x, y in zip(a, b))
    assert err < 1e-6, f"behind a GradScaler the weights differ by {err:.2e}"

    # in the trainer: optimizer="triton" with the fused clip is fused AdamW's update
    adamw.BLOCK = 8192  # the interpreter runs one program at a time: few, large ones
    def train_steps(run):
        trainer = train.build(run, GPTConfig(block_size=16, n_layer=1, n_head=2, n_embd=32), device)
        data = torch.randint(0, 50257, (3, 2, 17), generator=torch.Generator().manual_seed(0))
        for i in range(3):
            x, y = data[i, :, :-1].contiguous().to(device), data[i, :, 1:].contiguous().to(device)
            trainer.step(type("Batches", (), {"next_batch": lambda self: (x, y)})())
        return torch.cat([p.detach().flatten() for p in trainer.model.parameters()])
    base = train.RunConfig(batch_size=2, seq_len=16, lr=1e-2, grad_clip=0.05, fused_clip=True)
    a = train_steps(base.replace(optimizer="fused"))
    b = train_steps(base.replace(optimizer="triton"))
    assert (a - b).abs().max().item() < 2e-5, (a - b).abs().max().item()
    # what the kernel cannot read is refused with the reason, before anything is launched
    p = torch.nn.Parameter(torch.zeros(4, device=device))
    opt = adamw.TritonAdamW([p])
    if hasattr(p, "grad_dtype"):  # where torch lets a gradient have another dtype than its tensor
        p.grad_dtype = None
        p.grad = torch.zeros(4, device=device, dtype=torch.bfloat16)
        try:
            opt.step()
            raise AssertionError("bf16 gradients were read as fp32")
        except ValueError as e:
            assert "fp32 gradients" in str(e), e
    p.grad = torch.zeros(4, device=device)
    opt.grad_scale = 2.0
    try:
        opt.step()
        raise AssertionError("a float grad_scale was handed to the kernel as a pointer")
    except ValueError as e:
        assert "grad_scale" in str(e), e
    print("OK")
    """
)


@needs_triton
@pytest.mark.parametrize("broken", ["none", "bias-correction", "stale-addresses"])
def test_triton_adamw_in_the_interpreter(broken):
    r = run_script(CHECK, "adamw_check", "cpu", broken)
    assert_caught(r, broken)


@needs_triton
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_triton_adamw_on_the_gpu():
    r = run_script(CHECK, "adamw_check", "cuda")
    assert_caught(r)


@needs_triton
def test_triton_adamw_refuses_what_it_cannot_update():
    from helpers.core.kernels.adamw import TritonAdamW

    with pytest.raises(ValueError, match="amsgrad"):
        TritonAdamW([torch.nn.Parameter(torch.zeros(2))], amsgrad=True)
    with pytest.raises(ValueError, match="fp32"):
        TritonAdamW([torch.nn.Parameter(torch.zeros(2, dtype=torch.float16))])
    if not torch.cuda.is_available():  # this process did not set TRITON_INTERPRET
        with pytest.raises(ValueError, match="CUDA GPU"):
            TritonAdamW([torch.nn.Parameter(torch.zeros(2))])


def test_the_fused_clip_runs_with_the_triton_optimizer_only_where_triton_runs():
    run = train.RunConfig(optimizer="triton", fused_clip=True)
    reason = train.unsupported_reason(run, "cpu")  # no TRITON_INTERPRET in this process
    assert reason is not None and "Triton AdamW" in reason
    assert "fused_clip" in train.unsupported_reason(
        train.RunConfig(fused_clip=True, optimizer="foreach"), "cpu"
    )
