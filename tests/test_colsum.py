"""The column-sum kernel (``helpers.core.kernels.colsum``) in Triton's CPU interpreter and on a GPU,
with a broken variant that must be caught; the rewrite of inductor's mix-order final sums."""

import inspect
import textwrap

import pytest
import torch
from kernel_check import assert_caught, needs_triton, run_script

from helpers.core.kernels import colsum

CHECK = textwrap.dedent(
    """
    import sys
    import torch
    from helpers.core.kernels import colsum

    device, BREAK = sys.argv[1], sys.argv[2]
    if BREAK == "last-row":  # the kernel is told one row fewer than there are
        kernel = colsum._colsum_kernel
        colsum._colsum_kernel = type("K", (), {"__getitem__": lambda self, grid: (
            lambda x, out, R, N, **kw: kernel[grid](x, out, R - 1, N, **kw))})()
    torch.manual_seed(0)
    # ragged rows and columns, one block, many blocks, a single row
    for R, N in ((1024, 768), (100, 70), (1, 33), (64, 32), (257, 2304)):
        x = torch.randn(R, N, device=device)
        got, want = colsum.colsum(x), x.double().sum(0).float()
        assert got.shape == (N,) and got.dtype == torch.float32, (R, N)
        assert torch.allclose(got, want, rtol=1e-5, atol=1e-4), (R, N, (got - want).abs().max())
    # the op as the rewritten wrapper line calls it
    ws = torch.randn(3 * 16 * 8, device=device)
    a = torch.ops.fastgpt2.colsum(ws[16 * 8 : 2 * 16 * 8].view(16, 8))
    assert torch.allclose(a, ws[16 * 8 : 2 * 16 * 8].view(16, 8).sum(dim=0), atol=1e-5)
    print("OK")
    """
)


@needs_triton
@pytest.mark.parametrize("broken", ["none", "last-row"])
def test_colsum_in_the_interpreter(broken):
    assert_caught(run_script(CHECK, "colsum_check", "cpu", broken), broken)


@needs_triton
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_colsum_on_the_gpu():
    assert_caught(run_script(CHECK, "colsum_check", "cuda"))


@pytest.mark.skipif(not hasattr(torch.ops.fastgpt2, "colsum"), reason="needs Triton")
@pytest.mark.parametrize("call", ["colsum", "op"])
def test_colsum_refuses_what_it_cannot_sum(call):
    """The wrapper and the op itself (which the rewritten wrapper line calls) check their input."""
    f = colsum.colsum if call == "colsum" else torch.ops.fastgpt2.colsum
    with pytest.raises(TypeError, match="float32"):
        f(torch.zeros(4, 4, dtype=torch.float64))
    with pytest.raises(ValueError, match="contiguous"):
        f(torch.zeros(4, 4).t())
    with pytest.raises(ValueError, match=r"\(R, N\)"):
        f(torch.zeros(4))


@pytest.mark.parametrize(
    "line, want",
    [
        (
            "buf12 = ws[0 : (1024) * (768)].view(1024, 768).sum(dim=0)",
            "buf12 = torch.ops.fastgpt2.colsum(ws[0 : (1024) * (768)].view(1024, 768))",
        ),
        (
            "    buf3 = ws_1[1 * (64) * (768) : (1 + 1) * (64) * (768)].view(64, 768).sum(dim=0)"
            ".view([768]).to(torch.bfloat16)",
            "    buf3 = torch.ops.fastgpt2.colsum(ws_1[1 * (64) * (768) : (1 + 1) * (64) * (768)]"
            ".view(64, 768)).view([768]).to(torch.bfloat16)",
        ),
        (  # another reduction, and other lines, are left alone
            "buf4 = ws[0 : 64 * 768].view(64, 768).amax(dim=0)",
            "buf4 = ws[0 : 64 * 768].view(64, 768).amax(dim=0)",
        ),
        ("buf5 = torch.sum(x, dim=0)", "buf5 = torch.sum(x, dim=0)"),
        (  # sizes with parentheses in the view, a newline kept
            "buf6 = ws[0 : ((s0 + 15) // 16) * 768].view((s0 + 15) // 16, 768).sum(dim=0)\n",
            "buf6 = torch.ops.fastgpt2.colsum(ws[0 : ((s0 + 15) // 16) * 768]"
            ".view((s0 + 15) // 16, 768))\n",
        ),
        (  # something between the view and the sum: not the workspace's final sum
            "buf7 = ws[0 : 8].view(2, 4).to(torch.float32).sum(dim=0)",
            "buf7 = ws[0 : 8].view(2, 4).to(torch.float32).sum(dim=0)",
        ),
        (  # two sums on one line: only the first, whole, is the buffer's source
            "buf8 = ws[0 : 8].view(2, 4).sum(dim=0) + ws[8 : 16].view(2, 4).sum(dim=0)",
            "buf8 = torch.ops.fastgpt2.colsum(ws[0 : 8].view(2, 4))"
            " + ws[8 : 16].view(2, 4).sum(dim=0)",
        ),
    ],
)
def test_rewrite_final_sum(line, want):
    assert colsum.rewrite_final_sum(line) == want
    compile(want.strip(), "<wrapper>", "exec")


def test_inductor_still_writes_the_line_the_rewrite_expects():
    """If a torch release changes how inductor writes a mix-order reduction's last sum, the
    experiment would silently rewrite nothing: this reads inductor's own source."""
    from torch._inductor.codegen import simd

    src = inspect.getsource(simd.SIMDScheduling._codegen_mix_order_reduction)
    assert ".view({nsplit}, {rnumel}).{opname}(dim=0)" in src
    assert "wrapper_code.writeline(final_reduce)" in src


def test_triton_final_sums_rewrites_lines_written_inside_inductors_codegen_only(monkeypatch):
    from torch._inductor import virtualized
    from torch._inductor.codegen import simd

    from helpers.core.kernels import qkv_grad

    written = []

    class Wrapper:
        def writeline(self, line):
            written.append(line)

    wrapper = Wrapper()
    graph = type("Graph", (), {"wrapper_code": wrapper})()
    sum_line = "buf1 = ws[0 : 16 * 8].view(16, 8).sum(dim=0)"

    def fake_codegen(self, node1, node2):  # what inductor's method does with the wrapper
        virtualized.V.graph.wrapper_code.writeline(sum_line)

    monkeypatch.setattr(simd.SIMDScheduling, "_codegen_mix_order_reduction", fake_codegen)
    with virtualized.V.set_graph_handler(graph):
        with colsum.triton_final_sums():
            simd.SIMDScheduling._codegen_mix_order_reduction(None, None, None)
            wrapper.writeline(sum_line)  # outside the mix-order codegen: unchanged
            assert torch._inductor.config.force_disable_caches
            assert qkv_grad._sum_partials is colsum.colsum
        simd.SIMDScheduling._codegen_mix_order_reduction(None, None, None)  # patch gone
    assert written == [colsum.rewrite_final_sum(sum_line), sum_line, sum_line]
    assert "writeline" not in wrapper.__dict__
    part = torch.randn(5, 6)
    assert torch.equal(qkv_grad._sum_partials(part), part.sum(0))  # restored
    assert written[0].startswith("buf1 = torch.ops.fastgpt2.colsum(")


@pytest.mark.skipif(
    torch.cuda.is_available(), reason="checks the refusal on a machine without a GPU"
)
def test_colsum_benchmark_says_it_needs_a_gpu():
    import subprocess
    import sys

    from kernel_check import ROOT

    r = subprocess.run(
        [sys.executable, "benchmarks/colsum.py"], cwd=ROOT, capture_output=True, text=True
    )
    assert r.returncode == 2 and "needs a CUDA GPU" in r.stderr, r.stderr[-2000:]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_compiled_layernorm_backward_adds_its_partial_sums_with_colsum_on_the_gpu():
    """The rewrite happens in real generated code (a LayerNorm's weight and bias gradients at the
    B=16 step's shape), and the gradients it gives are eager PyTorch's."""
    from torch._inductor.utils import run_and_get_code

    torch.manual_seed(0)
    x = torch.randn(16384, 768, device="cuda", requires_grad=True)
    ln = torch.nn.LayerNorm(768).cuda()

    def step(f):
        ln.zero_grad(set_to_none=True)
        x.grad = None
        f(x).float().pow(2).sum().backward()
        return x.grad.clone(), ln.weight.grad.clone(), ln.bias.grad.clone()

    want = step(ln)
    torch._dynamo.reset()
    with colsum.triton_final_sums():
        got, codes = run_and_get_code(step, torch.compile(ln))
    torch._dynamo.reset()
    assert any("torch.ops.fastgpt2.colsum(" in c for c in codes), "no final sum was rewritten"
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-3)
