"""Rung "+ fp8 MLP" (helpers.core.kernels.fp8_mlp): its two one-pass Triton kernels and the fp8
MLP against PyTorch, in Triton's CPU interpreter (a subprocess, since the interpreter is chosen at
import) and, on a machine with fp8 tensor cores, on the GPU; the model's switch and its
requirements. The speed is measured on the H200 (benchmarks/fp8_mlp.py, benchmarks/perf.py)."""

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
    sys.path[:1] = ["."]  # the repository, not the script's own (temporary) folder
    import torch
    import torch.nn.functional as F
    import helpers.core.kernels.fp8_mlp as fp8_mlp
    from helpers.core.kernels._triton import tl, triton
    from helpers.core.kernels.fp8 import rowwise_e4m3

    device = sys.argv[1]
    BREAK = sys.argv[2]  # "none", or one deliberate mistake the checks must catch

    def rel(a, b):
        return ((a.float() - b.float()).norm() / b.float().norm()).item()

    def check_rowwise(t, t8, inv):
        # t8 * inv against t, element by element: e4m3 keeps 3 mantissa bits (error at most 1/16
        # of the value) down to its subnormal step 2**-9 of the scale (error at most half of it);
        # each nonzero row's largest element lands on 448; the scales as rowwise_e4m3's
        t, inv = t.float(), inv.float()
        err = (t8.float() * inv - t).abs()
        assert (err <= (t.abs() / 16 + inv * 2**-10) * (1 + 1e-5) + 1e-30).all(), "e4m3 values"
        nonzero = t.abs().amax(1) > 0
        assert (t8.float().abs().amax(1)[nonzero] == 448).all(), "a row's amax is not at 448"
        assert torch.allclose(inv, rowwise_e4m3(t)[1], rtol=1e-6, atol=0), "scales"

    def lower_row_max(t8):
        # a mistake confined to one element per row: each row's amax one e4m3 step low
        f = t8.float()
        i = f.abs().argmax(1)
        f[torch.arange(f.shape[0]), i] *= 416 / 448
        return f.to(torch.float8_e4m3fn)

    @triton.jit
    def bits_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
        i = tl.arange(0, BLOCK)
        m = i < n
        tl.store(y_ptr + i, fp8_mlp._e4m3_bits(tl.load(x_ptr + i, mask=m)), mask=m)

    # 1. the hand-written e4m3 rounding equals torch's cast, bit for bit: every e4m3 value, the
    # midpoints between neighbours (ties to even), values just off them, random ones
    every = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    every = every[torch.isfinite(every)].unique()
    mids = (every[1:] + every[:-1]) / 2
    x = torch.cat([every, mids, mids * (1 + 2**-20), mids * (1 - 2**-20),
                   (torch.randn(4000) * 60).clamp(-448, 448), torch.randn(500) * 1e-3])
    x = torch.cat([x, -x]).contiguous().to(device)
    y = torch.empty(x.shape, dtype=torch.uint8, device=device)
    BLOCK = triton.next_power_of_2(x.numel())
    bits_kernel[(1,)](x, y, x.numel(), BLOCK=BLOCK)
    want = x.to(torch.float8_e4m3fn).view(torch.uint8)
    if BREAK == "bits":
        y = (y.int() + (x.abs() > 100).int()).to(torch.uint8)  # round big values one step up
    assert torch.equal(y, want), f"{(y != want).sum().item()} e4m3 casts differ from torch's"

    # 2. the forward kernel: GELU in bf16, its rowwise e4m3 cast
    torch.manual_seed(0)
    M, N = 48, 3072
    h = (torch.randn(M, N) * torch.logspace(-3, 1, M)[:, None]).to(torch.bfloat16).to(device)
    h[5] = 0
    a, a8, inv = fp8_mlp.gelu_rowwise_e4m3(h)
    # the reference in float64: in fp32, 1 + tanh(u) cancels for h below about -4 (torch's CPU
    # GELU gives -0 there; the kernel's h * sigmoid(2u) does not cancel)
    a_ref = F.gelu(h.double(), approximate="tanh").to(torch.bfloat16)
    if BREAK == "gelu":
        a = F.gelu(h.float()).to(torch.bfloat16)  # the exact erf GELU, not GPT-2's tanh one
    # one bf16 step (2**-8 relative) apart at most: the interpreter rounds fp32 to bf16 toward
    # zero, a GPU to nearest, and the reference rounds too
    assert ((a.float() - a_ref.float()).abs() <= a_ref.float().abs() * 2**-7 + 1e-12).all()
    if BREAK == "scale":
        inv = inv * 2
    if BREAK == "rowmax":
        a8 = lower_row_max(a8)
    check_rowwise(a, a8, inv)
    a8_ref = rowwise_e4m3(a)[0]
    assert (a8.view(torch.uint8) != a8_ref.view(torch.uint8)).float().mean() < 1e-3
    assert torch.isfinite(inv).all() and (a8[5].float() == 0).all()

    # a NaN in h stays NaN in the e4m3 values (so the matmul's output row shows it: a cast to
    # -448 or 448 would hide it); the row's scale and the other rows are those of the other values
    h_nan = h.clone()
    h_nan[3, 7] = float("nan")
    _, a8_nan, inv_nan = fp8_mlp.gelu_rowwise_e4m3(h_nan)
    if BREAK == "nan":
        a8_nan = torch.where(a8_nan.float().isnan(), -448.0, a8_nan.float()).to(a8.dtype)
    assert a8_nan[3, 7].float().isnan() and a8_nan.float().isnan().sum() == 1, "a NaN was hidden"
    assert ((a8_nan.float() * inv_nan) @ torch.ones(N, 1, device=device))[3].isnan().all()
    assert torch.isfinite(inv_nan).all()
    rest = torch.arange(M, device=device) != 3
    assert torch.equal(a8_nan[rest].view(torch.uint8), a8[rest].view(torch.uint8))

    # 3. the backward kernel: dh = da * GELU'(h) in bf16 and e4m3, the bias gradient (M not a
    # multiple of the kernel's rows per program: the last program's rows are masked)
    M = 70
    h = torch.randn(M, N).to(torch.bfloat16).to(device)
    da = (torch.randn(M, N) * 1e-3).to(torch.bfloat16).to(device)
    hf = h.double().requires_grad_()
    F.gelu(hf, approximate="tanh").backward(da.double())
    dh_ref = hf.grad.to(torch.bfloat16)
    dh, dh8, inv, db = fp8_mlp.gelu_backward_rowwise_e4m3(da, h)
    if BREAK == "dbias":
        db = db - dh[-1].float()  # the last, masked program's row left out
    assert ((dh.float() - dh_ref.float()).abs() <= dh_ref.float().abs() * 2**-7 + 1e-12).all()
    assert torch.allclose(db, dh.float().sum(0), rtol=1e-5, atol=1e-6)
    check_rowwise(dh, dh8, inv)
    dh8_ref = rowwise_e4m3(dh)[0]
    assert (dh8.view(torch.uint8) != dh8_ref.view(torch.uint8)).float().mean() < 1e-3

    # 3b. every config of the kernels (rows per tile, tiles per program, the prefetching loop)
    # writes the same bytes as the one checked above: in the interpreter, the plain loop and
    # other tilings (the checks above ran its prefetching config); on a GPU, all autotune configs
    launch_as_is = lambda kernel: kernel  # the raw kernel, outside torch.compile
    fwd_configs, bwd_configs = fp8_mlp.FORWARD_CONFIGS, fp8_mlp.BACKWARD_CONFIGS
    if device == "cpu":
        fwd_configs = [{"ROWS": 1, "GROUPS": 1, "PREFETCH": False, "num_warps": 4},
                       {"ROWS": 4, "GROUPS": 3, "PREFETCH": False, "num_warps": 4},
                       {"ROWS": 1, "GROUPS": 7, "PREFETCH": True, "num_warps": 4}]
        bwd_configs = [{"ROWS": 2, "GROUPS": 16, "PREFETCH": False, "num_warps": 4},
                       {"ROWS": 4, "GROUPS": 5, "PREFETCH": True, "num_warps": 4}]
    h_fwd = h[:47].contiguous()  # rows no config's program count divides
    want = [t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t
            for t in fp8_mlp.gelu_rowwise_e4m3(h_fwd)]
    for i, config in enumerate(fwd_configs):
        got = fp8_mlp._gelu_impl(h_fwd, launch_as_is, config)
        got = [t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t for t in got]
        if BREAK == "config" and i == len(fwd_configs) - 1:
            got[0][-1] = 0  # one config misses the last row
        assert all(torch.equal(a, b) for a, b in zip(got, want)), f"forward {config}"
    want = [dh, dh8.view(torch.uint8), inv]
    for config in bwd_configs:
        got = fp8_mlp._gelu_backward_impl(da, h, launch_as_is, config)
        assert torch.equal(got[0], want[0]) and torch.equal(got[2], want[2]), f"backward {config}"
        assert torch.equal(got[1].view(torch.uint8), want[1]), f"backward {config}"
        assert torch.allclose(got[3], db, rtol=1e-5, atol=1e-6), f"backward {config}"

    # 4. the whole MLP against the bf16 one, value and gradients; the model's fp8 MLP is it
    from helpers.core.model import MLP, GPTConfig
    cfg = GPTConfig(n_embd=256, n_head=4, dropout=0.0)
    torch.manual_seed(0)
    mlp = MLP(cfg).to(device)
    torch.manual_seed(0)
    mlp8 = MLP(cfg, fp8=True).to(device)
    x = torch.randn(2, 32, 256, device=device, requires_grad=True)
    g = torch.randn(2, 32, 256, device=device)
    def run(module, fn):
        for t in [x, *module.parameters()]:
            t.grad = None
        y = fn()
        y.float().backward(g)
        return [y, x.grad, *[p.grad for p in module.parameters()]]
    if BREAK == "bias":  # the fp8 matmuls drop their bias
        with_bias = fp8_mlp.scaled_mm
        fp8_mlp.scaled_mm = lambda a, b, sa, sb, fast, bias=None: with_bias(a, b, sa, sb, fast)
    with torch.autocast(device, dtype=torch.bfloat16):
        ref = run(mlp, lambda: mlp(x))
        weights = (mlp.c_fc.weight, mlp.c_fc.bias, mlp.c_proj.weight, mlp.c_proj.bias)
        got = run(mlp, lambda: fp8_mlp.mlp_fp8(x, *weights))
        model_path = run(mlp8, lambda: mlp8(x))
    # e4m3's rounding alone gives 0.052-0.057 here (value and input gradient, 9 seeds)
    errs = [rel(a, b) for a, b in zip(got, ref)]
    assert max(errs) < 0.06, errs
    assert all(torch.equal(a, b) for a, b in zip(model_path, got)), "MLP(fp8=True) differs"

    # 5. fast fp8 accumulation: the forward's two matmuls always take it; the backward's two
    # (da, dx) take it exactly when MLP(grad_fast_accum=True) asks
    plain_mm, flags = fp8_mlp.scaled_mm, []
    def recording_mm(a, b, sa, sb, fast, bias=None):
        flags.append(fast)
        return plain_mm(a, b, sa, sb, fast, bias)
    fp8_mlp.scaled_mm = recording_mm
    for fast in (False, True):
        flags.clear()
        mlp_fast = MLP(cfg, fp8=True, grad_fast_accum=fast).to(device)
        if BREAK == "fast":  # the MLP forgets to pass the switch on
            mlp_fast.grad_fast_accum = False
        with torch.autocast(device, dtype=torch.bfloat16):
            run(mlp_fast, lambda: mlp_fast(x))
        assert flags == [True, True, fast, fast], (fast, flags)
    fp8_mlp.scaled_mm = plain_mm
    if device == "cuda":  # compiled: inductor launches the traced kernels itself
        torch._dynamo.reset()
        step = torch.compile(lambda: fp8_mlp.mlp_fp8(x, *weights))
        with torch.autocast(device, dtype=torch.bfloat16):
            errs = [rel(a, b) for a, b in zip(run(mlp, step), ref)]
        assert max(errs) < 0.06, errs
    print("fp8 mlp OK")
    """
)


def run_check(device: str, broken: str = "none") -> subprocess.CompletedProcess:
    return run_script(CHECK, "check_fp8_mlp", device, broken)


@needs_triton
def test_the_fp8_mlp_kernels_match_pytorch_in_the_triton_interpreter():
    out = run_check("cpu")
    assert out.returncode == 0, out.stderr[-3000:]
    assert "fp8 mlp OK" in out.stdout


@needs_triton
@pytest.mark.parametrize(
    "broken", ["bits", "gelu", "scale", "rowmax", "nan", "dbias", "config", "bias", "fast"]
)
def test_each_check_rejects_its_mistake(broken):
    out = run_check("cpu", broken)
    assert out.returncode != 0 and "AssertionError" in out.stderr, out.stderr[-2000:]


@pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9),
    reason="needs a GPU with fp8 tensor cores (compute capability >= 8.9)",
)
def test_the_fp8_mlp_kernels_match_pytorch_on_the_gpu():
    out = run_check("cuda")
    assert out.returncode == 0, out.stderr[-3000:]
    assert "fp8 mlp OK" in out.stdout


def test_the_model_refuses_what_the_fp8_mlp_cannot_run():
    from helpers.core.model import GPT, GPTConfig

    tiny = dict(n_layer=1, n_head=2, block_size=16, vocab_size=64)
    with pytest.raises(ValueError, match="dropout=0"):
        GPT(GPTConfig(**tiny, n_embd=64, dropout=0.1), mlp_fp8=True)
    with pytest.raises(ValueError, match="multiple of 16"):
        GPT(GPTConfig(**tiny, n_embd=72), mlp_fp8=True)
    with pytest.raises(ValueError, match="4096"):
        GPT(GPTConfig(**tiny, n_embd=1040), mlp_fp8=True)
    from helpers.core.kernels import _triton

    if not _triton._INTERPRETED_AT_IMPORT:  # a CPU without the interpreter: a clear error
        model = GPT(GPTConfig(**tiny, n_embd=64), mlp_fp8=True)
        with pytest.raises(RuntimeError, match="CUDA GPU .* x is on cpu"):
            model(torch.zeros(1, 4, dtype=torch.long))


def test_a_run_says_why_the_fp8_mlp_is_skipped():
    from unittest import mock

    from helpers.core import kernels, train

    on_cpu = train.unsupported_reason(
        train.RunConfig(autocast="bf16", mlp_fp8=True), torch.device("cpu")
    )
    assert on_cpu.startswith("the fp8 MLP cannot run") and "8.9" in on_cpu
    with mock.patch.object(kernels, "fp8_available", return_value=(True, "")):
        fp32 = train.unsupported_reason(train.RunConfig(mlp_fp8=True), torch.device("cpu"))
        assert "autocast='bf16'" in fp32
        ok = train.unsupported_reason(
            train.RunConfig(autocast="bf16", mlp_fp8=True), torch.device("cpu")
        )
        assert ok is None
        compiled = train.unsupported_reason(
            train.RunConfig(autocast="bf16", mlp_fp8=True, compile="default"), torch.device("cpu")
        )
        assert "compiled only on a CUDA GPU" in compiled


@pytest.mark.parametrize(
    "x_shape, x_dtype, proj_shape, message",
    [
        ((64,), torch.float32, (64, 256), "at least 2-D"),
        ((4, 64), torch.float16, (64, 256), "fp32 or bf16"),
        ((4, 40), torch.float32, (40, 160), "multiple of 16"),
        ((4, 1040), torch.float32, (1040, 4160), "4160 > 4096"),
        ((4, 64), torch.float32, (64, 257), "w_proj must have shape \\(64, 256\\)"),
    ],
)
def test_mlp_fp8_refuses_inputs_its_kernels_cannot_take(x_shape, x_dtype, proj_shape, message):
    from helpers.core import kernels

    C = x_shape[-1]
    args = (torch.randn(4 * C, C), torch.randn(4 * C), torch.randn(*proj_shape), torch.randn(C))
    with pytest.raises(ValueError, match=message):
        kernels.mlp_fp8(torch.zeros(x_shape, dtype=x_dtype), *args)
