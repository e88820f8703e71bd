"""benchmarks/fp8_linears.py (the fp8-linears experiment of results/perf-log.md, 2026-12-03): its
arithmetic on a CPU, where the fp8 matmul is emulated in fp32; the speed needs fp8 tensor cores
and was measured on the H200."""

import importlib.util
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def fp8_linears():
    spec = importlib.util.spec_from_file_location("fp8_linears", ROOT / "benchmarks/fp8_linears.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def test_rowwise_scales_undo_the_cast_row_by_row(fp8_linears):
    t = torch.randn(8, 32) * torch.logspace(-4, 3, 8)[:, None]  # rows 7 decades apart
    t[3] = 0.0
    t8, inv = fp8_linears.rowwise_e4m3(t)
    assert t8.dtype == torch.float8_e4m3fn and inv.shape == (8, 1) and torch.isfinite(inv).all()
    back = t8.float() * inv
    assert (back[3] == 0).all()
    # e4m3 keeps 3 mantissa bits: each value within 1/16 of itself (normal range of its row)
    big = t.abs() > t.abs().amax(dim=1, keepdim=True) * 2**-6 / 448 * 8
    assert ((back - t).abs() <= t.abs() / 16 + 1e-30)[big].all()
    with pytest.raises(ValueError, match="2-D"):
        fp8_linears.rowwise_e4m3(torch.randn(2, 3, 4))


def _grads(fn, x, w, b, g):
    for t in (x, w, b):
        t.grad = None
    y = fn(x, w, b)
    y.backward(g.to(y.dtype))
    return y, [t.grad.clone() for t in (x, w, b)]


@pytest.mark.parametrize("backward_fp8", [True, False])
def test_fp8_linear_matches_linear_in_value_and_gradients(fp8_linears, monkeypatch, backward_fp8):
    monkeypatch.setattr(fp8_linears, "BACKWARD_FP8", backward_fp8)
    torch.manual_seed(0)
    x = torch.randn(2, 64, 96, requires_grad=True)
    w = (torch.randn(48, 96) * 0.02).requires_grad_()
    b = torch.randn(48).requires_grad_()
    g = torch.randn(2, 64, 48)
    y, grads = _grads(fp8_linears.fp8_linear, x, w, b, g)
    y_ref, ref = _grads(F.linear, x, w, b, g)
    assert y.dtype == torch.bfloat16 and [t.dtype for t in grads] == [torch.float32] * 3
    # e4m3 rounds each input by up to 1/16 of itself: a few % of the output's size
    assert rel(y, y_ref) < 0.05 and rel(grads[0], ref[0]) < 0.05
    assert rel(grads[1], ref[1]) < 0.01  # the weight gradient: a bf16 matmul
    assert rel(grads[2], ref[2]) < 0.01


def test_a_wrong_scale_is_caught_by_the_same_tolerance(fp8_linears, monkeypatch):
    # a per-row scale applied to the wrong operand (the weight's scales broadcast over x's rows)
    def wrong(a8, b8, scale_a, scale_b, fast_accum, bias=None):
        a = a8.float() * scale_b.t()[: a8.shape[0]]
        out = a @ (b8.float() * scale_a.t()[:, : b8.shape[1]])
        return (out if bias is None else out + bias.float()).to(torch.bfloat16)

    monkeypatch.setattr(fp8_linears, "scaled_mm", wrong)
    torch.manual_seed(0)
    x = torch.randn(64, 64)
    w = torch.randn(64, 64) * torch.linspace(0.01, 1, 64)[:, None]
    assert rel(fp8_linears.fp8_linear(x, w), F.linear(x, w)) > 0.05


def test_shapes_that_fp8_tensor_cores_cannot_take_are_refused(fp8_linears):
    with pytest.raises(ValueError, match="multiples of 16"):
        fp8_linears.fp8_linear(torch.randn(4, 24), torch.randn(16, 24))
    with pytest.raises(ValueError, match="unknown fp8-linears variant"):
        fp8_linears.experiment("fp8-everything")


def test_a_variant_routes_every_linear_through_fp8_and_restores_it(fp8_linears):
    plain = torch.nn.Linear.forward
    layer = torch.nn.Linear(32, 16)
    x = torch.randn(4, 32)
    with fp8_linears.experiment("fp8-linears-fwd"):
        assert fp8_linears.BACKWARD_FP8 is False
        assert layer(x).dtype == torch.bfloat16  # the fp8 path returns bf16
    assert torch.nn.Linear.forward is plain and fp8_linears.BACKWARD_FP8 is True
    assert layer(x).dtype == torch.float32
