"""The hand-written Triton kernels (the package helpers/core/kernels/) and the switches that use
them.

On a machine without a GPU the kernels run in Triton's CPU interpreter, in a subprocess (the
interpreter is chosen when Triton is imported). On a GPU they run for real, also under
torch.compile.
"""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from helpers.core import kernels, train
from helpers.core.kernels import _triton, fp8, fused_ce
from helpers.core.model import GPT, GPTConfig

needs_triton = pytest.mark.skipif(
    kernels.triton is None or kernels.TRITON_OP_MISSING is not None,
    reason="the 'triton' package is not installed, or torch < 2.6",
)
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

# Compares kernels.cross_entropy with F.cross_entropy(logits.float()) forward and backward, on
# shapes with a partial last block, the GPT-2 padded vocab, bf16/fp16/fp32 logits, ignored rows, a
# strided view, and logits large enough that a softmax without the max shift would overflow.
CHECK = textwrap.dedent(
    """
    import sys, torch, torch.nn.functional as F
    from helpers.core import kernels
    from helpers.core.kernels import fused_ce
    device = sys.argv[1]
    torch.manual_seed(0)
    cases = [(5, 7, torch.float32, 1.0), (9, 4097, torch.bfloat16, 3.0),
             (4, 50304, torch.bfloat16, 4.0), (6, 1000, torch.float16, 2.0),
             (3, 300, torch.float32, 200.0)]
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
            assert torch.allclose(la, lb, rtol=1e-5, atol=1e-5), (
                N, V, dtype, name, la.item(), lb.item())
            tol = 1e-6 if dtype == torch.float32 else 2e-3
            err = (a.grad.float() - b.grad.float()).abs().max().item()
            assert err <= tol, (N, V, dtype, name, err)
            assert a.grad[1].abs().max().item() == 0.0  # the ignored row gets no gradient
    x = torch.randn(3, 10, device=device, requires_grad=True)
    # ids outside [0, V): nan, no stray read
    loss = kernels.cross_entropy(x, torch.tensor([1, 10, -5], device=device))
    loss.backward()
    assert torch.isnan(loss) and torch.isnan(x.grad[1:]).all() and not torch.isnan(x.grad[0]).any()
    # the fused LM head + CE: the loss and the gradients of x and W against
    # x @ W.T + F.cross_entropy, in fp32 and under bf16 autocast, with an ignored row, the GPT-2
    # padded vocab, and rows in 1 or 3 chunks
    fused_ce.FUSED_CHUNK_ROWS = 4
    for N, C, V, amp in [(6, 16, 37, False), (9, 32, 4099, True), (5, 8, 50304, False),
                         (3, 8, 100, True)]:
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
    # every row ignored, no rows, a non-contiguous x, a W tied to an embedding, x without grad, two
    # accumulated backward passes, a bad chunk size: as F.cross_entropy does (loss nan, gradients 0
    # for the first two)
    for t_all, n_rows in ((torch.full((5,), kernels.IGNORE_INDEX, device=device), 5),
                          (torch.zeros(0, dtype=torch.int64, device=device), 0)):
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
            loss = (kernels.linear_cross_entropy(x, emb.weight, t) if fused
                    else F.cross_entropy(x @ emb.weight.t(), t))
            (loss * 0.3).backward()
        got.append(emb.weight.grad.clone())
    assert (got[0] - got[1]).abs().max().item() <= 1e-5 * got[1].abs().max().item()
    fused_ce.FUSED_CHUNK_ROWS = 0
    try:
        kernels.linear_cross_entropy(base.t(), emb.weight, t)
        raise AssertionError("FUSED_CHUNK_ROWS = 0 accepted")
    except ValueError as e:
        assert "FUSED_CHUNK_ROWS" in str(e)
    fused_ce.FUSED_CHUNK_ROWS = 4
    x0, w0 = torch.randn(9, 32, device=device), torch.randn(4099, 32, device=device) * 0.5
    t = torch.randint(0, 4099, (9,), device=device)
    # refused: the gradient would round before the loss scale
    with torch.autocast(device, dtype=torch.float16):
        try:
            kernels.linear_cross_entropy(x0, w0, t)
            raise AssertionError("fp16 accepted")
        except RuntimeError as e:
            assert "fp16" in str(e)
    with torch.no_grad():  # no gradient wanted: the loss alone (3 chunks), no backward matmuls
        assert abs(kernels.linear_cross_entropy(x0, w0, t).item()
                   - F.cross_entropy(x0 @ w0.t(), t).item()) < 1e-4
    from helpers.core import train
    compiled = train.RunConfig(autocast="bf16", loss_kernel="triton", compile="default")
    # the interpreter runs the kernels eagerly only: a compiled rung is refused, not failed
    if device == "cpu":
        assert "compiled only" in train.unsupported_reason(compiled, "cpu")
        assert "compiled only" in train.unsupported_reason(
            compiled.replace(loss_kernel="fused"), "cpu")
        assert train.unsupported_reason(compiled.replace(compile=None), "cpu") is None
    print("kernels OK")
    """
)


def run_check(script: str, device: str = "cpu") -> subprocess.CompletedProcess:
    """Run a check script in a fresh interpreter:
    with Triton's CPU interpreter on "cpu" (chosen at import)."""
    env = {**os.environ, "TRITON_INTERPRET": "1"} if device == "cpu" else None
    return subprocess.run(
        [sys.executable, "-c", script, device], env=env, capture_output=True, text=True, timeout=300
    )


@needs_triton
def test_cross_entropy_matches_pytorch_in_the_triton_interpreter():
    out = run_check(CHECK)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "kernels OK" in out.stdout


@needs_triton
def test_a_wrong_kernel_fails_the_check(tmp_path):
    """The check above can fail: a loss that skips the last column (an off-by-one in a block loop)
    is caught."""
    broken = CHECK.replace(
        "from helpers.core import kernels",
        "from helpers.core import kernels\n"
        "kernels.cross_entropy = lambda x, t: "
        "F.cross_entropy(x.float()[:, :-1], t.clamp(max=x.shape[1] - 2))",
    )
    out = run_check(broken)
    assert out.returncode != 0 and "AssertionError" in out.stderr


@needs_triton
def test_a_wrong_fused_gradient_fails_the_check():
    """The fused LM-head CE's check looks at gradients, not only the loss: a dW off by a factor
    n / (n + 1) (a right loss, a wrong backward scale) is caught."""
    broken = CHECK.replace(
        "fused_ce.FUSED_CHUNK_ROWS = 4",
        "fused_ce.FUSED_CHUNK_ROWS = 4\n"
        "fused_ce._LinearCrossEntropy.backward = staticmethod(lambda ctx, g: (lambda dx, dw, n: "
        "(dx * g / n, dw * g / (n + 1), None, None, None))(*ctx.saved_tensors))",
    )
    assert broken != CHECK
    out = run_check(broken)
    assert out.returncode != 0 and "AssertionError" in out.stderr, out.stderr[-2000:]


# The fp8 LM head (linear_cross_entropy(fp8=True)) against the same arithmetic done by PyTorch: the
# e5m2 gradient bits against torch's own rounding, the tiled transpose against .t().contiguous(),
# and loss and gradients against an fp32 LM head on the fp8-rounded x and W (the matmuls'
# accumulation is the only difference left), with rows that are not a multiple of 16, an ignored
# row, several chunks, and the loss-only path; plus the fp32 truth, loosely.
FP8_CHECK = textwrap.dedent(
    """
    import sys, torch, torch.nn.functional as F
    from helpers.core import kernels
    from helpers.core.kernels import fp8, fused_ce
    device = sys.argv[1]
    torch.manual_seed(0)
    # 1. the kernel's gradient bits: (softmax - onehot) * 2**15 rounded to e5m2 as torch rounds it
    logits = torch.randn(37, 4100, device=device) * 4
    t = torch.randint(0, 4100, (37,), device=device)
    t[3] = kernels.IGNORE_INDEX
    loss_rows, g8 = fused_ce._cross_entropy_rows_with_e5m2_grad(logits, t)
    assert g8.dtype == torch.float8_e5m2 and g8.shape == logits.shape
    ref = (torch.softmax(logits, -1) - F.one_hot(t.clamp(min=0), 4100)) * fp8.FP8_GRAD_SCALE
    ref[3] = 0
    ref8 = ref.to(torch.float8_e5m2)
    # the kernel's softmax is computed differently from torch's: a value within fp32 rounding of an
    # e5m2 rounding boundary may land on the other side (then one e5m2 step apart); anything more is
    # a bug
    differ = (g8.view(torch.uint8) != ref8.view(torch.uint8))
    assert differ.float().mean().item() < 1e-4, differ.float().mean().item()
    step = (g8.view(torch.uint8).int() - ref8.view(torch.uint8).int()).abs()
    assert step.max().item() <= 1, step.max().item()
    assert torch.allclose(loss_rows, F.cross_entropy(logits, t, reduction="none"), atol=1e-5)
    if device == "cuda":  # the GPU's own e5m2 conversion and the written-out rounding agree
        hardware_cast = fused_ce.E5M2_HARDWARE_CAST
        fused_ce.E5M2_HARDWARE_CAST = False
        try:
            g8_bits = fused_ce._cross_entropy_rows_with_e5m2_grad(logits, t)[1]
        finally:
            fused_ce.E5M2_HARDWARE_CAST = hardware_cast
        assert torch.equal(g8_bits.view(torch.uint8), g8.view(torch.uint8))
    # 2. the transpose, on shapes that are and are not multiples of its tiles: autotuned, and at
    # each tile config (every autotune config on a GPU; two in the interpreter, which cannot time)
    tiles = (fp8.TRANSPOSE_CONFIGS if device == "cuda"
             else [fp8.INTERPRETER_TRANSPOSE, {"BM": 128, "BN": 256, "num_warps": 8}])
    for M, N in ((1, 1), (70, 130), (128, 64), (3, 200), (300, 257)):
        a = torch.randn(M, N, device=device).to(torch.float8_e4m3fn)
        want = a.t().contiguous().view(torch.uint8)
        assert torch.equal(kernels.transpose_fp8(a).view(torch.uint8), want), (M, N)
        for tile in tiles:
            assert torch.equal(fp8._transpose_impl(a, tile).view(torch.uint8), want), (M, N, tile)
    # 3. the whole fp8 LM head + CE
    # the fp8 value of a in the forward, the identity in backward (no fp8 gradients here)
    def rounded(a):
        a8, inv = kernels.to_fp8_e4m3(a)
        return a + (a8.float() * inv - a).detach()
    def emulated(x, w, t):  # the same fp8 rounding of x and W, then an fp32 LM head
        return F.cross_entropy(rounded(x) @ rounded(w).t(), t)
    fused_ce.FUSED_CHUNK_ROWS = 16
    for N, C, V, amp in [(37, 32, 4096, False), (16, 64, 50304, True), (50, 16, 160, True)]:
        x0, w0 = torch.randn(N, C, device=device), torch.randn(V, C, device=device) * 0.5
        t = torch.randint(0, V, (N,), device=device)
        t[2] = kernels.IGNORE_INDEX
        res = {}
        for kind in ("fp8", "emulated", "fp32"):
            x, w = x0.clone().requires_grad_(), w0.clone().requires_grad_()
            with torch.autocast(device, dtype=torch.bfloat16, enabled=amp and kind == "fp8"):
                if kind == "fp8":
                    loss = kernels.linear_cross_entropy(x, w, t, fp8=True)
                elif kind == "emulated":
                    loss = emulated(x, w, t)
                else:
                    loss = F.cross_entropy(x @ w.t(), t)
            (loss * 0.7).backward()
            res[kind] = (loss.item(), x.grad, w.grad)
        (l8, gx8, gw8), (le, gxe, gwe), (l32, gx32, gw32) = res["fp8"], res["emulated"], res["fp32"]
        assert gx8.dtype == gw8.dtype == torch.float32 and gx8.shape == (N, C)
        assert abs(l8 - le) <= 1e-2 * abs(le), (N, V, amp, l8, le)  # bf16 logits under autocast
        def rel(a, b):
            return ((a - b).norm() / b.norm()).item()
        # e5m2 keeps 2 mantissa bits: each gradient element is off by up to 1/8; summed over V or N
        # columns the errors mostly cancel
        for a, b in ((gx8, gxe), (gw8, gwe)):
            assert rel(a, b) < 0.05, (N, V, amp, rel(a, b))
        assert abs(l8 - l32) <= 0.03 * abs(l32), (N, V, amp, l8, l32)
        for a, b in ((gx8, gx32), (gw8, gw32)):
            assert rel(a, b) < 0.1, (N, V, amp, rel(a, b))
        assert gx8[2].abs().max().item() == 0.0  # the ignored row
        with torch.no_grad():
            assert (abs(kernels.linear_cross_entropy(x0, w0, t, fp8=True).item() - le)
                    <= 1e-3 * abs(le))
    try:
        kernels.linear_cross_entropy(torch.randn(4, 12, device=device),
                                     torch.randn(32, 12, device=device),
                                     torch.zeros(4, dtype=torch.int64, device=device), fp8=True)
        raise AssertionError("C=12 accepted")
    except ValueError as e:
        assert "multiples of 16" in str(e)
    # 4. fast fp8 accumulation: the logits' matmul takes it; the two gradient matmuls (dx, dW)
    # never do (measured slower and less accurate there)
    plain_mm, flags = torch._scaled_mm, []
    def recording_mm(*args, **kwargs):
        if "use_fast_accum" in kwargs:  # not fp8_available's CPU probe, which leaves it out
            flags.append(kwargs["use_fast_accum"])
        return plain_mm(*args, **kwargs)
    torch._scaled_mm = recording_mm
    x = torch.randn(16, 32, device=device, requires_grad=True)
    w = torch.randn(64, 32, device=device, requires_grad=True)
    t = torch.randint(0, 64, (16,), device=device)
    kernels.linear_cross_entropy(x, w, t, fp8=True).backward()
    assert flags == [True, False, False], flags
    torch._scaled_mm = plain_mm
    print("fp8 OK")
    """
)


# the interpreter checks run the fp8 matmuls with PyTorch's CPU _scaled_mm (oneDNN),
# which some CPUs lack
needs_cpu_fp8 = pytest.mark.skipif(
    kernels.triton is not None and not fp8._cpu_scaled_mm_fp8()[0],
    reason="PyTorch's CPU _scaled_mm has no fp8 kernel for this CPU (oneDNN, e.g. AVX2 only)",
)


def run_fp8_check(code: str):
    """run_check, skipped where oneDNN refuses this CPU an fp8 matmul of the check's shapes (the
    small probe of needs_cpu_fp8 can pass where a larger shape is still refused, e.g. with AVX2
    alone)."""
    out = run_check(code)
    if "could not create a primitive descriptor for the matmul primitive" in out.stderr:
        pytest.skip(
            "PyTorch's CPU _scaled_mm (oneDNN) has no fp8 kernel for these shapes on this CPU"
        )
    return out


def fp8_check_fails(broken: str, check: str):
    """Run ``broken``, a copy of ``check`` with a bug put in, and assert it fails with an
    AssertionError; returns the run for further assertions."""
    assert broken != check
    out = run_fp8_check(broken)
    assert out.returncode != 0 and "AssertionError" in out.stderr, out.stderr[-2000:]
    return out


@needs_triton
@needs_cpu_fp8
def test_fp8_lm_head_matches_its_emulation_in_the_triton_interpreter():
    out = run_fp8_check(FP8_CHECK)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "fp8 OK" in out.stdout


FP8_BUGS = {
    # the gradient stored at twice the scale the matmuls undo
    "grad_scale": "_g = fused_ce._cross_entropy_rows_with_e5m2_grad\n"
    "fused_ce._cross_entropy_rows_with_e5m2_grad = lambda l, t: "
    "(lambda r: (r[0], (r[1].float() * 2).to(torch.float8_e5m2)))(_g(l, t))",
    # a transpose that loses its last column (the last row of the source)
    "transpose": "_t = fused_ce.transpose_fp8\n"
    "fused_ce.transpose_fp8 = lambda a: "
    "torch.cat([_t(a)[:, :-1], torch.zeros_like(_t(a)[:, :1])], 1)",
    # the gradient matmuls with fast accumulation (every _scaled_mm fused_ce calls takes it)
    "fast_accum": "import types\n"
    "fused_ce.torch = types.SimpleNamespace(**{**vars(torch), '_scaled_mm': "
    "lambda *a, **k: torch._scaled_mm(*a, **{**k, 'use_fast_accum': True})})",
}


@needs_triton
@needs_cpu_fp8
@pytest.mark.parametrize("bug", sorted(FP8_BUGS))
def test_a_wrong_fp8_lm_head_fails_its_check(bug):
    """The fp8 check can fail: a gradient at twice its scale, a transpose that drops data, or
    gradient matmuls with fast accumulation, is caught."""
    broken = FP8_CHECK.replace(
        "\nfused_ce.FUSED_CHUNK_ROWS = 16\n",
        "\nfused_ce.FUSED_CHUNK_ROWS = 16\n" + FP8_BUGS[bug] + "\n",
    )
    fp8_check_fails(broken, FP8_CHECK)


@needs_triton
@needs_cpu_fp8
def test_a_wrong_transpose_tile_fails_the_fp8_check():
    """Each transpose tile config is checked on its own: one that drops its last column fails,
    though the autotuned transpose (config None) stays right."""
    bug = (
        "_impl = fp8._transpose_impl\n"
        "fp8._transpose_impl = lambda a, c=None: _impl(a) if c is None else "
        "torch.cat([_impl(a, c)[:, :-1], torch.zeros_like(_impl(a, c)[:, :1])], 1)\n"
    )
    broken = FP8_CHECK.replace("# 2. the transpose", bug + "# 2. the transpose")
    out = fp8_check_fails(broken, FP8_CHECK)
    assert "AssertionError: (1, 1, {'BM'" in out.stderr, out.stderr[-2000:]  # a tile's check


@needs_cuda
@needs_triton
def test_fp8_lm_head_matches_its_emulation_on_the_gpu():
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("fp8 tensor cores need compute capability >= 8.9")
    out = run_check(FP8_CHECK, "cuda")
    assert out.returncode == 0, out.stderr[-3000:]


@needs_cuda
@needs_triton
def test_cross_entropy_matches_pytorch_on_the_gpu():
    out = run_check(CHECK, "cuda")
    assert out.returncode == 0, out.stderr[-3000:]


def _compiled_step_results(configs: dict) -> dict:
    """{key: (loss, LM-head weight gradient)} of one compiled (fullgraph) bf16-autocast
    forward+backward of a small GPT per config, from the same weights and batch."""
    torch.manual_seed(0)
    x = torch.randint(0, GPTConfig().vocab_size, (4, 128), device="cuda")
    y = torch.randint(0, GPTConfig().vocab_size, (4, 128), device="cuda")
    results = {}
    for key, model_switches in configs.items():
        torch._dynamo.reset()
        torch.manual_seed(1)
        model = GPT(SMALL, **model_switches).cuda()
        step = torch.compile(model, fullgraph=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            _, loss = step(x, y)
        loss.backward()
        results[key] = (loss.item(), model.lm_head.weight.grad.float().clone())
    return results


SMALL = GPTConfig(block_size=128, n_layer=2, n_head=4, n_embd=128, vocab_multiple=64)


@needs_cuda
@needs_triton
def test_compiled_model_with_the_triton_loss_matches_pytorch_loss():
    """Inside torch.compile (one graph, custom op traced) the step gives the loss and gradients of
    F.cross_entropy."""
    results = _compiled_step_results(
        {k: dict(loss_kernel=k) for k in ("pytorch", "triton", "fused")}
    )
    lp, gp = results["pytorch"]
    for kernel in ("triton", "fused"):
        lt, gt = results[kernel]
        assert abs(lp - lt) < 1e-3 * abs(lp), kernel
        assert (gp - gt).abs().max().item() <= 1e-2 * gp.abs().max().item(), kernel


@needs_cuda
@needs_triton
def test_compiled_model_with_the_fp8_lm_head_trains_like_bf16():
    """Compiled with fullgraph (no graph break), the fp8 LM head's loss and LM-head gradient are
    those of the bf16 fused LM head within fp8's rounding."""
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("fp8 tensor cores need compute capability >= 8.9")
    results = _compiled_step_results(
        {use_fp8: dict(loss_kernel="fused", lm_head_fp8=use_fp8) for use_fp8 in (False, True)}
    )
    (lb, gb), (l8, g8) = results[False], results[True]
    assert abs(lb - l8) < 1e-2 * abs(lb), (lb, l8)
    assert ((g8 - gb).norm() / gb.norm()).item() < 0.1


def test_cross_entropy_says_why_it_cannot_run_on_a_cpu(monkeypatch):
    monkeypatch.setattr(
        _triton, "_INTERPRETED_AT_IMPORT", False
    )  # the package reads TRITON_INTERPRET at import
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
    monkeypatch.setattr(
        _triton, "_INTERPRETED_AT_IMPORT", False
    )  # the package reads TRITON_INTERPRET at import
    run = train.RunConfig(autocast="bf16", loss_kernel="triton")
    assert "Triton cross-entropy" in train.unsupported_reason(run, "cpu")
    with pytest.raises(ValueError, match="Triton cross-entropy"):
        train.build(run, train.small_model_config(), "cpu")


def test_residual_stream_is_bf16_only_when_asked(tiny_config):
    seen = {}
    for dtype in ("fp32", "bf16"):
        torch.manual_seed(0)
        model = GPT(tiny_config, residual_dtype=dtype)
        model.transformer.h[1].register_forward_pre_hook(
            lambda mod, args, d=dtype: seen.__setitem__(d, args[0].dtype)
        )
        idx = torch.randint(0, tiny_config.vocab_size, (2, 16))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            _, loss = model(idx, idx)
        loss.backward()
        seen[dtype + " loss"] = loss.item()
        assert model.transformer.wte.weight.grad.dtype == torch.float32  # master weights stay fp32
    assert seen["fp32"] == torch.float32 and seen["bf16"] == torch.bfloat16
    # outside autocast (generation, evaluation) the stream stays fp32:
    # no dtype clash with the weights
    model(idx)
    assert seen["bf16"] == torch.float32
    with torch.autocast(
        "cpu", dtype=torch.float16
    ):  # fp16 autocast: no bf16 cast (it would only mix dtypes)
        model(idx)
    assert seen["bf16"] == torch.float32
    assert abs(seen["fp32 loss"] - seen["bf16 loss"]) < 0.02 * seen["fp32 loss"]


def test_bf16_residual_needs_bf16_autocast():
    assert "bf16 autocast" in train.unsupported_reason(
        train.RunConfig(residual_dtype="bf16"), "cpu"
    )
    assert (
        train.unsupported_reason(train.RunConfig(residual_dtype="bf16", autocast="bf16"), "cpu")
        is None
    )
    with pytest.raises(ValueError, match="residual_dtype"):
        train.RunConfig(residual_dtype="fp8")
    with pytest.raises(ValueError, match="loss_kernel"):
        GPT(GPTConfig(block_size=8, n_layer=1, n_head=1, n_embd=8), loss_kernel="cuda")


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
    assert torch.allclose(
        separate, fused, atol=2e-5, rtol=0
    )  # Adam amplifies g*c vs g/(1/c) rounding a little
    assert not torch.allclose(
        separate, unclipped, atol=1e-4
    )  # the clip is active: the comparison can fail


def test_clip_divisor_is_the_reciprocal_of_the_clip_coefficient():
    p = torch.nn.Parameter(torch.zeros(4))
    p.grad = torch.tensor([3.0, 4.0, 0.0, 0.0])  # norm 5
    assert abs(train.clip_divisor([p], 1.0).item() - 5.0) < 1e-5
    assert train.clip_divisor([p], 10.0).item() == 1.0  # below max_norm: no clipping


def test_fused_clip_needs_fused_adamw_and_no_grad_scaler():
    assert "fused_clip" in train.unsupported_reason(
        train.RunConfig(fused_clip=True, optimizer="foreach"), "cpu"
    )
    assert "fused_clip" in train.unsupported_reason(
        train.RunConfig(fused_clip=True, optimizer="fused", autocast="fp16"), "cpu"
    )
    assert (
        train.unsupported_reason(train.RunConfig(fused_clip=True, optimizer="fused"), "cpu") is None
    )


def test_detached_logits_keep_values_and_the_loss_gradient(tiny_config):
    idx = torch.randint(0, tiny_config.vocab_size, (2, 16))
    out = {}
    for detach in (False, True):
        torch.manual_seed(0)
        model = GPT(tiny_config, detach_logits=detach)
        logits, loss = model(idx, idx)
        loss.backward()
        out[detach] = (logits, loss, model.lm_head.weight.grad)
        assert logits.requires_grad is (not detach)
        assert model(idx)[0].requires_grad  # without targets the logits are never detached
    assert torch.equal(out[False][0].detach(), out[True][0]) and torch.equal(
        out[False][2], out[True][2]
    )


def test_a_torch_without_triton_op_imports_the_kernels_and_skips_their_rungs():
    """torch 2.4/2.5 bring Triton but not torch.library.triton_op: the import must not fail."""
    code = (
        "import torch, torch.library\n"
        "del torch.library.triton_op\n"
        "from helpers import ladder\n"
        "from helpers.core import kernels\n"
        "ok, why = kernels.available('cuda')\n"
        "assert not ok and ('triton_op' in why or 'triton' in why), why\n"
        "reasons = dict((r.name, why) for r, why in ladder.ladder_configs(4, 64, device='cpu'))\n"
        "assert reasons['fp32'] is None and reasons['+ Triton CE'], reasons\n"
        "print('ok')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=Path(__file__).resolve().parents[1],
    )
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


def test_triton_kernel_needs_compute_capability_7(monkeypatch):
    if kernels.triton is None:
        pytest.skip("the 'triton' package is not installed")
    from helpers.measure import hardware

    monkeypatch.setattr(
        torch.cuda, "is_available", lambda: True
    )  # a GPU, as far as available() asks
    monkeypatch.setattr(hardware, "capability", lambda d=None: (6, 1))
    ok, reason = kernels.available("cuda")
    assert not ok and "7.0" in reason
    monkeypatch.setattr(hardware, "capability", lambda d=None: (7, 5))
    assert kernels.available("cuda") == (True, "")


def test_fp8_lm_head_needs_the_fused_loss_and_fp8_tensor_cores(monkeypatch):
    from helpers.measure import hardware

    tiny = dict(block_size=8, n_layer=1, n_head=1, n_embd=16)
    with pytest.raises(ValueError, match="loss_kernel='fused'"):
        GPT(GPTConfig(**tiny), lm_head_fp8=True)
    with pytest.raises(ValueError, match="vocab_multiple=64"):
        GPT(GPTConfig(**tiny), lm_head_fp8=True, loss_kernel="fused")  # 50257 LM-head rows
    GPT(GPTConfig(**tiny, vocab_multiple=64), lm_head_fp8=True, loss_kernel="fused")
    if (
        not torch.cuda.is_available()
    ):  # a CPU-only torch: a reason, not torch's "not compiled with CUDA" assertion
        ok, reason = kernels.fp8_available("cuda")
        assert not ok and "no CUDA GPU" in reason and "8.9" in reason
    # Triton can run, as far as train (through the package), fp8_available and
    # linear_cross_entropy ask
    for module in (kernels, fp8, fused_ce):
        monkeypatch.setattr(module, "available", lambda device: (True, ""))
    for cap, ok in (((7, 5), False), ((8, 0), False), ((8, 9), True), ((9, 0), True)):
        monkeypatch.setattr(hardware, "capability", lambda device, cap=cap: cap)
        got, reason = kernels.fp8_available("cuda")
        assert got == ok and (ok or "8.9" in reason), (cap, reason)
    run = train.RunConfig(autocast="bf16", vocab_multiple=64, lm_head_fp8=True)
    assert "loss_kernel='fused'" in train.unsupported_reason(
        run.replace(loss_kernel="triton"), "cuda"
    )
    assert "multiple of 16" in train.unsupported_reason(
        run.replace(loss_kernel="fused", vocab_multiple=1), "cuda"
    )
    assert train.unsupported_reason(run.replace(loss_kernel="fused"), "cuda") is None
    # refused before any work, even for no rows (which would otherwise return nan quietly)
    monkeypatch.setattr(
        fused_ce, "fp8_available", lambda device: (False, "no fp8 tensor cores here")
    )
    with pytest.raises(RuntimeError, match="no fp8 tensor cores here"):
        kernels.linear_cross_entropy(
            torch.zeros(0, 16), torch.zeros(32, 16), torch.zeros(0, dtype=torch.int64), fp8=True
        )


@pytest.mark.skipif(kernels.triton is None, reason="the 'triton' package is not installed")
def test_fp8_fast_accum_reaches_the_fp8_mlp_only_and_needs_it(monkeypatch):
    """GPT(fp8_fast_accum=True) hands grad_fast_accum=True to every block's fp8 MLP, and not to
    the fp8 LM head, whose gradient matmuls stay exact (recorded here by stand-ins for the two
    kernels, so any CPU runs it); without mlp_fp8 it is refused, by the model and by
    train.unsupported_reason, the fp8 LM head alone included."""
    import torch.nn.functional as F

    tiny = GPTConfig(block_size=8, n_layer=2, n_head=1, n_embd=16, vocab_multiple=64, dropout=0.0)
    fp8_both = dict(loss_kernel="fused", lm_head_fp8=True, mlp_fp8=True)
    for fast in (False, True):
        model = GPT(tiny, **fp8_both, fp8_fast_accum=fast)
        seen = []

        def mlp_stand_in(x, w_fc, b_fc, w_proj, b_proj, grad_fast_accum=False, seen=seen):
            seen.append(("mlp", grad_fast_accum))
            return F.linear(F.gelu(F.linear(x, w_fc, b_fc), approximate="tanh"), w_proj, b_proj)

        def head_stand_in(x, w, t, fp8=False, seen=seen):
            seen.append(("head", fp8))
            return F.cross_entropy(x @ w.t(), t)

        for block in model.transformer.h:
            block.mlp.mlp_fp8 = mlp_stand_in
        model.linear_cross_entropy = head_stand_in
        idx = torch.zeros(1, 8, dtype=torch.long)
        model(idx, idx)
        assert seen == [("mlp", fast), ("mlp", fast), ("head", True)], seen
    for others in ({}, dict(loss_kernel="fused", lm_head_fp8=True)):
        with pytest.raises(ValueError, match="needs mlp_fp8=True"):
            GPT(tiny, **others, fp8_fast_accum=True)
    monkeypatch.setattr(kernels, "fp8_available", lambda device: (True, ""))  # past the hardware
    reason = train.unsupported_reason(train.RunConfig(fp8_fast_accum=True), "cpu")
    assert "needs mlp_fp8" in reason
    # a RunConfig hands it to the model (train.build builds GPT with these keywords)
    assert train.model_switches(train.RunConfig(fp8_fast_accum=True))["fp8_fast_accum"] is True
